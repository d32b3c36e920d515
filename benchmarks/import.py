"""`hookdump import vllm` against reading its source: the wall time of an import of 256
request files (512 tokens each, 4 layers of 1024 bfloat16: 4 MiB a file, 1 GiB in all), of
`cat` of the same files to /dev/null, and of `cp` of them beside the dump (read, written,
synced: the bytes an import moves), each from a dropped page cache; MB/s of source read and
the ratios (the target: at least 0.8 of `cat`). The import also writes the dump (1 GiB,
synced)."""

from __future__ import annotations

import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import harness
import torch
from safetensors.torch import save_file

REQUESTS, TOKENS, LAYERS, WIDTH = 256, 512, 4, 1024


class Job:
    def __init__(self, scratch: Path) -> None:
        self.scratch = scratch
        self.source = scratch / "engine"
        self.source.mkdir()
        generator = torch.Generator().manual_seed(0)
        for index in range(REQUESTS):
            hidden = torch.randn(TOKENS, LAYERS, WIDTH, generator=generator).to(torch.bfloat16)
            ids = torch.randint(0, 32000, (TOKENS,), generator=generator)
            save_file(
                {"hidden_states": hidden, "token_ids": ids},
                self.source / f"cmpl-{index:08x}-0.safetensors",
            )
        self.bytes = sum(p.stat().st_size for p in self.source.iterdir())


def _cat(job: Job) -> None:
    harness.drop_from_page_cache(job.source)
    files = sorted(str(p) for p in job.source.iterdir())
    subprocess.run(["cat", *files], stdout=subprocess.DEVNULL, check=True)


def _cp(job: Job) -> None:
    harness.drop_from_page_cache(job.source)
    copy = job.scratch / "copied"
    shutil.rmtree(copy, ignore_errors=True)
    subprocess.run(["cp", "-r", str(job.source), str(copy)], check=True)
    subprocess.run(["sync"], check=True)


def _import(job: Job) -> None:
    harness.drop_from_page_cache(job.source)
    out = job.scratch / "imported"
    shutil.rmtree(out, ignore_errors=True)
    subprocess.run(
        [sys.executable, "-m", "hookdump", "import", "vllm", str(job.source), "--out", str(out),
         "--layer-ids", "1,2,3,4", "--quiet"],
        check=True,
    )  # fmt: skip
    subprocess.run(["sync"], check=True)


def _in_process(job: Job) -> None:
    """The same import in this process: torch and the engine imported, the compiled
    loops loaded by an import before (the fresh process pays both)."""
    from hookdump.engine.importing import Held, import_engine

    harness.drop_from_page_cache(job.source)
    out = job.scratch / "imported"
    shutil.rmtree(out, ignore_errors=True)
    import_engine("vllm", job.source, out, Held(layer_ids=[1, 2, 3, 4]))
    subprocess.run(["sync"], check=True)


def bench_import(job: Job, reps: int) -> dict[str, Any]:
    steps = (("cat", _cat), ("cp", _cp), ("import", _import), ("in process", _in_process))
    seconds: dict[str, list[float]] = {name: [] for name, _ in steps}
    _in_process(job)  # the compiled loops cached and loaded once, as a fresh process finds them
    for _ in range(reps):
        for name, step in steps:
            started = time.perf_counter()
            step(job)
            seconds[name].append(time.perf_counter() - started)
    cat, cp, imported, inside = (statistics.median(seconds[n]) for n, _ in steps)
    return {
        "source_mb": round(job.bytes / 1e6),
        "seconds": {n: [round(s, 2) for s in v] for n, v in seconds.items()},
        "mb_per_s": {
            "cat": round(job.bytes / cat / 1e6),
            "cp": round(job.bytes / cp / 1e6),
            "import": round(job.bytes / imported / 1e6),
            "in process": round(job.bytes / inside / 1e6),
        },
        "import vs cat": round(cat / imported, 2),
        "import vs cp": round(cp / imported, 2),
        "in process vs cat": round(cat / inside, 2),
        "in process vs cp": round(cp / inside, 2),
    }


if __name__ == "__main__":
    harness.main(__doc__.splitlines()[0], {"import": bench_import}, Job)
