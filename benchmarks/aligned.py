"""`hookdump.aligned` over two dumps against `Dump.batches` over one of them.

Two dumps of the same 87,000 rows (768 float32 each, a base and a "tuned" copy: 256 MiB
each, in shards of 64 MiB and 48 MiB, so their shards are cut differently) are written with
`hookdump.dump`. In turns, each pass shuffled, in batches of 4096, with the pages dropped
from the page cache before it:

- `one`: `Dump.batches(["0"])` over the base dump;
- `aligned`: `hookdump.aligned({"base": (base, "0"), "tuned": (tuned, "0")})`, both read.

It prints rows/s and MB/s of each, and the aligned pass's ratio to the single one in MB/s
(the issue's target: at least 0.8) and in rows/s (at most 1: each row is read twice over).

    python benchmarks/aligned.py [--reps 5]
"""

from __future__ import annotations

import statistics
import time
from pathlib import Path
from typing import Any

import harness
import torch

ROW = 768
ROWS = (256 << 20) // (ROW * 4)
BATCH = 4096


class Job:
    def __init__(self, scratch: Path) -> None:
        import hookdump

        self.dumps = []
        for name, shard, offset in (("base", 64 << 20, 0.0), ("tuned", 48 << 20, 0.01)):
            torch.manual_seed(0)
            batches = (torch.randn(min(8192, ROWS - s), ROW) + offset for s in range(0, ROWS, 8192))
            self.dumps.append(
                hookdump.dump(torch.nn.Sequential(torch.nn.Identity()), batches,
                              scratch / name, layers="0", shard_size=shard, progress=False)
            )  # fmt: skip


def bench_read(job: Job, reps: int) -> dict[str, Any]:
    import hookdump

    base, tuned = job.dumps

    def one() -> int:
        rows = 0
        for batch in base.batches(["0"], BATCH, shuffle=True, seed=0):
            rows += len(batch["0"])
        return rows

    def aligned() -> int:
        rows = 0
        sources = {"base": (base, "0"), "tuned": (tuned, "0")}
        for batch in hookdump.aligned(sources).batches(BATCH, shuffle=True, seed=0):
            rows += len(batch["base"])
        return rows

    seconds: dict[str, list[float]] = {"one": [], "aligned": []}
    for rep in range(reps + 1):
        for name, step in (("one", one), ("aligned", aligned)):
            for dump in job.dumps:
                harness.drop_from_page_cache(Path(dump.path))
            started = time.perf_counter()
            assert step() == ROWS
            if rep:  # the first round warms up
                seconds[name].append(time.perf_counter() - started)
    nbytes = {"one": ROWS * ROW * 4, "aligned": 2 * ROWS * ROW * 4}
    mb_s = {n: [nbytes[n] / s / 1e6 for s in v] for n, v in seconds.items()}
    ratio_mb = [a / o for a, o in zip(mb_s["aligned"], mb_s["one"], strict=True)]
    return {
        "rows": ROWS,
        "mb_per_s": {n: statistics.median(v) for n, v in mb_s.items()},
        "rows_per_s": {n: statistics.median([ROWS / s for s in v]) for n, v in seconds.items()},
        "aligned_vs_one_mb_per_s": {
            "median": statistics.median(ratio_mb),
            "min": min(ratio_mb),
            "max": max(ratio_mb),
        },
    }


BENCHMARKS = {"read": bench_read}

if __name__ == "__main__":
    harness.main(__doc__.splitlines()[0], BENCHMARKS, Job)
