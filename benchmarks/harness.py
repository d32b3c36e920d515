"""What every benchmark script shares: its command line, a scratch folder, the results."""

from __future__ import annotations

import argparse
import json
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch


def main(
    description: str,
    benchmarks: dict[str, Callable[[Any, int], dict[str, Any]]],
    make_job: Callable[[Path], Any],
) -> None:
    """Parse `--reps`, `--only` and `--json`, build the job in a scratch folder (under
    $BENCH_DIR if set), run the chosen benchmarks and print each one's results."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--only", default=",".join(benchmarks))
    parser.add_argument("--json", type=Path, help="also write the results here")
    args = parser.parse_args()
    import hookdump

    torch.set_num_threads(os.cpu_count() or 1)
    scratch = Path(tempfile.mkdtemp(prefix="hookdump-bench-", dir=os.environ.get("BENCH_DIR")))
    device = torch.cuda.get_device_name() if torch.cuda.is_available() else "no GPU"
    results: dict[str, Any] = {
        "machine": f"{os.cpu_count()} CPU cores, {device}, torch {torch.__version__}, "
        f"hookdump {hookdump.__version__}",
    }
    try:
        job = make_job(scratch)
        for name in args.only.split(","):
            results[name] = benchmarks[name](job, args.reps)
            print(name, json.dumps(results[name], indent=2), flush=True)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    if args.json:
        args.json.write_text(json.dumps(results, indent=2) + "\n")


def in_turns(steps: dict[str, Callable[[], object]], reps: int) -> dict[str, list[float]]:
    """Seconds of each step, `reps` times, the steps run in turns after one warm-up round."""
    import time

    seconds: dict[str, list[float]] = {name: [] for name in steps}
    for step in steps.values():
        step()
    for _ in range(reps):
        for name, step in steps.items():
            started = time.perf_counter()
            step()
            seconds[name].append(time.perf_counter() - started)
    return seconds


def drop_from_page_cache(folder: Path) -> None:
    """Drop the files of `folder` from the page cache, so the next read comes from disk."""
    for path in folder.iterdir():
        fd = os.open(path, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)
