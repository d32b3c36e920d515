"""What the per-feature statistics cost a whole run (issue 43): fresh `hookdump run`
processes of the main job (resnet50, every leaf, 64 samples in batches of 16, 8.2 GB) and
of the token job (`process.py`'s: a GPT-2-small-shaped model, every block per token, 0.30
GB), each with the statistics and without the per-feature ones (`KeySummary.add_features`
made a no-op and `batch_stats` answering None: the whole-key statistics are then made the
older way, one chunked pass, as before the per-feature ones existed).

    python benchmarks/feature_stats.py [--reps 5] [--only vision,tokens] [--none]

`--none`: against a run with no statistics at all (`KeySummary.add_values` a no-op: the
bytes counted, no value read), the baseline issue 55's target is set against; the older
chunked pass the default "without" falls back to has become far slower than the
per-feature one (80 s against 9 s on the main job).

Runs are paired and alternate (with, without, with, ...); each starts after the last one's
files were deleted and synced. Prints the median wall, user and system seconds of each, and
the median of the per-pair ratios with / without (min-max).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from process import job_args, settle


def patched_cli(patch: str) -> str:
    """A script that runs the CLI as `hookdump` runs it, after `patch` (Python source):
    OpenMP's passive wait is set first, as `main()` does, since a patch imports torch."""
    return (
        "import os, sys\n"
        "from hookdump.cli import main, wait_passively\n"
        "wait_passively(os.environ)\n"
        f"{patch}"
        "sys.argv[0] = 'hookdump'\n"
        "main()\n"
    )


# the CLI with the per-feature statistics switched off, nothing else changed
WITHOUT = patched_cli(
    "from hookdump.store import stats\n"
    "stats.batch_stats = lambda *args: None\n"
    "stats.KeySummary.add_features = lambda *args, **kwargs: None\n"
)
# the CLI with no statistics taken at all
NONE = patched_cli(
    "from hookdump.store import stats\nstats.KeySummary.add_values = lambda self, *args: None\n"
)
JOBS = {"vision": "multi", "tokens": "tokens"}


def timed(command: list[str]) -> tuple[float, float, float]:
    """Wall, user and system seconds of a fresh process."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True)
    wall = time.perf_counter() - start
    if done.returncode:
        raise SystemExit(f"{' '.join(command)} failed ({done.returncode}):\n{done.stderr}")
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, after.ru_utime - before.ru_utime, after.ru_stime - before.ru_stime


def spread(values: list[float]) -> str:
    return f"{statistics.median(values):.3g} ({min(values):.3g}-{max(values):.3g})"


def bench(job: str, scratch: Path, reps: int, without: str = WITHOUT) -> dict[str, Any]:
    """`job` in fresh processes as it is and with `without` (a script that patches the CLI
    before it runs), paired and alternating."""
    args, _ = job_args(JOBS[job], scratch)
    out = scratch / "out"
    run = ["run", *args, "--out", str(out), "--quiet"]
    commands = {
        "with": [sys.executable, "-m", "hookdump", *run],
        "without": [sys.executable, "-c", without, *run],
    }
    seconds: dict[str, list[tuple[float, float, float]]] = {name: [] for name in commands}
    for _ in range(reps):
        for name, command in commands.items():
            settle(out)
            seconds[name].append(timed(command))
    settle(out)
    ratios = [w[0] / o[0] for w, o in zip(seconds["with"], seconds["without"], strict=True)]
    return {
        **{
            f"{name}_{what}_s": spread([t[i] for t in times])
            for name, times in seconds.items()
            for i, what in enumerate(("wall", "user", "sys"))
        },
        "with_vs_without_wall": spread(ratios),
    }


def main(without: str = WITHOUT, doc: str = __doc__) -> None:
    """Each job of `--only` as it is and with `without` (see `bench`); `doc`: the script's."""
    parser = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--only", default=",".join(JOBS), help="of " + ",".join(JOBS))
    if without == WITHOUT:
        parser.add_argument("--none", action="store_true", help="against no statistics at all")
    args = parser.parse_args()
    if getattr(args, "none", False):
        without = NONE
    scratch = Path(tempfile.mkdtemp(prefix="hookdump-bench-", dir=os.environ.get("BENCH_DIR")))
    try:
        for job in args.only.split(","):
            print(job, json.dumps(bench(job, scratch, args.reps, without), indent=2), flush=True)
    finally:
        settle(scratch)


if __name__ == "__main__":
    main()
