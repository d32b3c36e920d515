"""Where a `hookdump run` spends its wall time: a per-phase timeline of one whole process.

    python benchmarks/timeline.py run resnet50 --batch-size 16 --num-samples 64 --out /tmp/d

Runs the CLI in this process with the steps below timed (functions wrapped, nothing else
changed) and prints, per thread, the seconds in each step, then the steps in time order.
Imports are timed from the interpreter's start (`import time` is its first line).
"""

from __future__ import annotations

import time

STARTED = time.perf_counter()

import functools  # noqa: E402
import sys  # noqa: E402
import threading  # noqa: E402
from collections import defaultdict  # noqa: E402
from typing import Any  # noqa: E402

EVENTS: list[tuple[str, str, float, float]] = []  # thread, step, start, stop


def timed(owner: Any, name: str, label: str) -> None:
    original = getattr(owner, name)

    @functools.wraps(original)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter()
        try:
            return original(*args, **kwargs)
        finally:
            EVENTS.append((threading.current_thread().name, label, start, time.perf_counter()))

    setattr(owner, name, wrapper)


def instrument() -> None:
    import torch

    from hookdump.engine import loop, runner
    from hookdump.hooks import forward
    from hookdump.model import prepare
    from hookdump.store import stats
    from hookdump.store.write import direct_io, memory, shards, sink, writer

    EVENTS.append(("MainThread", "import torch + hookdump", STARTED, time.perf_counter()))
    timed(runner, "prepare", "model: import + build")
    timed(loop, "forward", "forward")
    timed(sink.BatchSink, "begin", "wait for a slot")
    timed(memory.BufferPool, "copy", "copy in hook")
    timed(sink.BatchSink, "close", "wait for the writer")
    timed(memory.Budget, "take", "wait for room (512 MiB)")
    timed(stats.KeySummary, "add_values", "statistics")
    timed(shards.ShardFile, "write", "stage (shard)")
    timed(shards.PlannedShard, "write_rows", "stage (planned)")
    timed(direct_io._DiskThread, "take", "wait for a staging buffer")
    timed(direct_io._DiskThread, "_write", "disk write")
    timed(shards, "_write_header", "header")
    timed(writer, "fsync_file", "fsync")
    timed(writer.DumpWriter, "commit_shards", "commit")
    timed(writer.DumpWriter, "write_manifest", "manifest")
    timed(writer.DumpWriter, "finish", "finish")
    timed(torch.Tensor, "to", "cast")
    del prepare, forward


def report() -> None:
    end = time.perf_counter()
    busy: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    counts: dict[tuple[str, str], int] = defaultdict(int)
    for thread, label, start, stop in EVENTS:
        busy[thread][label] += stop - start
        counts[thread, label] += 1
    print(f"\nwall {end - STARTED:.2f} s (from the interpreter's start)", file=sys.stderr)
    for thread, labels in busy.items():
        print(f"  {thread}", file=sys.stderr)
        for label, seconds in sorted(labels.items(), key=lambda kv: -kv[1]):
            print(f"    {label:28s} {seconds:7.2f} s  x{counts[thread, label]}", file=sys.stderr)
    print("\n  share of each second spent in a step (0-9: tenths; . none)", file=sys.stderr)
    seconds = int(end - STARTED) + 1
    rows: dict[str, list[float]] = defaultdict(lambda: [0.0] * seconds)
    for thread, label, start, stop in EVENTS:
        row = rows[f"{thread[:13]}: {label}"]
        t = start - STARTED
        while t < stop - STARTED:
            step = min(stop - STARTED, int(t) + 1) - t
            row[int(t)] += step
            t += step
    print(f"    {'':44s}" + "".join(str(i % 10) for i in range(seconds)), file=sys.stderr)
    for name, row in rows.items():
        shares = "".join("." if v < 0.05 else str(min(9, int(v * 10))) for v in row)
        print(f"    {name:44s}{shares}", file=sys.stderr)


def main() -> None:
    from hookdump.cli import app

    instrument()
    try:
        app(sys.argv[1:], standalone_mode=False)
    finally:
        report()


if __name__ == "__main__":
    main()
