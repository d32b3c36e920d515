"""Reading a dump back for training: `Dump.batches` in order and shuffled, against `dd`.

A dump of token-row-like data (rows of 768 float32 plus an int64 id, 16 shards of 64 MiB:
1 GiB) is written once with `hookdump.dump`. Before every pass the shards' pages are dropped
from the page cache (`posix_fadvise(DONTNEED)`), so each pass reads from the disk:

- `dd`: `dd if=SHARD of=/dev/null bs=8M` of every shard in turn, the disk's sequential read;
- `in_order`: `Dump.batches(keys, 4096)`;
- `shuffled`: `Dump.batches(keys, 4096, shuffle=True)` (default buffer, 256 MiB).

`--only memory`: two passes of one `Dump` in one process, in order and shuffled, over rows
of 768 and of 4096 float32 (batches of 12 and 64 MiB): each pass's peak RSS above what the
process held before it, its minor faults and CPU seconds per GiB (issue 55: batch memory
kept for the `Dump`, a pass within its budget plus two batches).

Each pass runs in a fresh child process, which reports its rows/s, MB/s and its peak RSS
above a child that only loads the dump (the memory the pass itself held). Passes run in
turns, `--reps` times; medians with min-max.

    python benchmarks/reader.py [--reps 5] [--only read]

With `READER_LOAD=N` in the environment, N busy processes (`while True: pass`) share the
cores with every pass, `dd`'s included: a machine with a load of about N.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import harness
import torch

ROW = 768  # float32 per row: GPT-2-small's residual stream
ROWS = (1 << 30) // (ROW * 4 + 8)
SHARD_BYTES = 64 << 20
BATCH = 4096

_CHILD = """
import json, os, resource, sys, time
import hookdump
path, how = sys.argv[1:3]
dump = hookdump.load(path)
keys = ["0", "ids"]
def peak_kib():  # VmHWM: this process's own high-water mark (ru_maxrss keeps the parent's)
    for line in open("/proc/self/status"):
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
def cpu():
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime
before = peak_kib()
start, rows, cpu_start = time.perf_counter(), 0, cpu()
if how != "load":
    for batch in dump.batches(keys, 4096, shuffle=how == "shuffled", seed=0):
        rows += len(batch["0"])
    assert rows == dump.num_samples, (rows, dump.num_samples)
seconds, cpu_seconds = time.perf_counter() - start, cpu() - cpu_start
peak = peak_kib()
print(json.dumps({"seconds": seconds, "rows": rows, "bytes": rows * dump.reader.row_bytes(keys),
                  "peak_kib": peak, "before_kib": before, "cpu_seconds": cpu_seconds}))
"""


class Job:
    def __init__(self, scratch: Path) -> None:
        self.scratch = scratch
        self.dump = self.of_width(ROW)

    def of_width(self, width: int) -> Path:
        """A 1 GiB dump of rows of `width` float32 and an int64 id (made once)."""
        import hookdump

        path = self.scratch / f"dump-{width}"
        if path.exists():
            return path
        rows = (1 << 30) // (width * 4 + 8)
        step = max(1, (64 << 20) // (width * 4))
        batches = (
            {
                "x": torch.randn(min(step, rows - s), width),
                "i": torch.arange(s, min(s + step, rows)),
            }
            for s in range(0, rows, step)
        )
        hookdump.dump(_Rows(), batches, path, layers=["0", "ids"], forward=_call,
                      shard_size=SHARD_BYTES, progress=False)  # fmt: skip
        return path


class _Rows(torch.nn.Module):
    """Returns its input: row i of key `0` is batch row i, `ids` its number."""

    def __init__(self) -> None:
        super().__init__()
        self.add_module("0", torch.nn.Identity())
        self.ids = torch.nn.Identity()

    def forward(self, x: torch.Tensor, i: torch.Tensor) -> torch.Tensor:
        self.ids(i)
        return getattr(self, "0")(x)


def _call(model: Any, batch: dict[str, torch.Tensor]) -> Any:
    return model(batch["x"], batch["i"])


def child(path: Path, how: str) -> dict[str, Any]:
    harness.drop_from_page_cache(path)
    done = subprocess.run([sys.executable, "-c", _CHILD, str(path), how], check=True,
                          capture_output=True, text=True)  # fmt: skip
    return json.loads(done.stdout.splitlines()[-1])


def dd(path: Path) -> dict[str, Any]:
    harness.drop_from_page_cache(path)
    shards = sorted(path.glob("*.safetensors"))
    start = time.perf_counter()
    for shard in shards:
        subprocess.run(["dd", f"if={shard}", "of=/dev/null", "bs=8M"], check=True,
                       capture_output=True)  # fmt: skip
    return {"seconds": time.perf_counter() - start,
            "bytes": sum(s.stat().st_size for s in shards)}  # fmt: skip


def spread(values: list[float]) -> dict[str, float]:
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def bench_read(job: Job, reps: int) -> dict[str, Any]:
    import os

    import hookdump

    dump = hookdump.load(job.dump)
    runs: dict[str, list[dict[str, Any]]] = {"dd": [], "in_order": [], "shuffled": []}
    base = child(job.dump, "load")["peak_kib"]
    busy = [subprocess.Popen([sys.executable, "-c", "while True: pass"])
            for _ in range(int(os.environ.get("READER_LOAD", "0")))]  # fmt: skip
    try:
        for _ in range(reps):
            runs["dd"].append(dd(job.dump))
            runs["in_order"].append(child(job.dump, "in_order"))
            runs["shuffled"].append(child(job.dump, "shuffled"))
    finally:
        for process in busy:
            process.kill()
    mb_s = {name: [r["bytes"] / r["seconds"] / 1e6 for r in found] for name, found in runs.items()}
    rows_s = {name: [r["rows"] / r["seconds"] for r in runs[name]]
              for name in ("in_order", "shuffled")}  # fmt: skip
    ratio = {
        name: [s / d for s, d in zip(mb_s[name], mb_s["dd"], strict=True)]
        for name in ("in_order", "shuffled")
    }
    return {
        "rows": dump.num_samples,
        "shards": len(dump.manifest.shards),
        "dump_bytes": runs["dd"][0]["bytes"],
        "mb_per_s": {name: spread(values) for name, values in mb_s.items()},
        "rows_per_s": {name: spread(values) for name, values in rows_s.items()},
        "vs_dd": {name: spread(values) for name, values in ratio.items()},
        "cpu_s_per_gib": {
            name: spread([r["cpu_seconds"] / (r["bytes"] / (1 << 30)) for r in runs[name]])
            for name in ("in_order", "shuffled")
        },
        "peak_rss_mib": {
            "loaded": base / 1024,
            **{
                name: spread([r["peak_kib"] / 1024 for r in runs[name]])
                for name in ("in_order", "shuffled")
            },
        },
    }


# two passes of one Dump in one process: what each holds and faults in
_PASSES = """
import json, os, resource, sys, time
import hookdump
path, how = sys.argv[1:3]
dump = hookdump.load(path)
keys = ["0", "ids"]
def status(field):
    for line in open("/proc/self/status"):
        if line.startswith(field + ":"):
            return int(line.split()[1])
def drop():
    for name in os.listdir(path):
        fd = os.open(os.path.join(path, name), os.O_RDONLY)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        os.close(fd)
passes = []
loaded = status("VmRSS")
for _ in range(2):
    drop()
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # the high-water mark back to the resident size now
    before, usage = status("VmRSS"), resource.getrusage(resource.RUSAGE_SELF)
    start, rows = time.perf_counter(), 0
    for batch in dump.batches(keys, 4096, shuffle=how == "shuffled", seed=0):
        rows += len(batch["0"])
        del batch
    assert rows == dump.num_samples, (rows, dump.num_samples)
    after = resource.getrusage(resource.RUSAGE_SELF)
    passes.append({
        "seconds": time.perf_counter() - start,
        "cpu_seconds": after.ru_utime + after.ru_stime - usage.ru_utime - usage.ru_stime,
        "minor_faults": after.ru_minflt - usage.ru_minflt,
        "peak_above_mib": (status("VmHWM") - before) / 1024,
        "peak_above_loaded_mib": (status("VmHWM") - loaded) / 1024,
        "bytes": rows * dump.reader.row_bytes(keys),
    })
print(json.dumps(passes))
"""


def bench_memory(job: Job, reps: int) -> dict[str, Any]:
    """A first and a second pass of one `Dump` (in order, shuffled) over rows of 768 and
    of 4096 float32 (batches of 4096 rows: 12 and 64 MiB; the default 256 MiB budget):
    peak RSS above what the process held before the pass and above the loaded dump (before
    the first pass: a second pass's counts the memory the first kept), minor faults, CPU s
    per GiB, MB/s (pages dropped before each pass)."""
    found: dict[str, Any] = {}
    for width in (ROW, 4096):
        path = job.of_width(width)
        for how in ("in_order", "shuffled"):
            runs = []
            for _ in range(reps):
                done = subprocess.run([sys.executable, "-c", _PASSES, str(path), how],
                                      check=True, capture_output=True, text=True)  # fmt: skip
                runs.append(json.loads(done.stdout.splitlines()[-1]))
            for index, name in enumerate(("first", "second")):
                each = [r[index] for r in runs]
                found[f"{width}/{how}/{name}"] = {
                    "peak_above_mib": spread([p["peak_above_mib"] for p in each]),
                    "peak_above_loaded_mib": spread([p["peak_above_loaded_mib"] for p in each]),
                    "minor_faults": spread([p["minor_faults"] for p in each]),
                    "cpu_s_per_gib": spread(
                        [p["cpu_seconds"] / (p["bytes"] / (1 << 30)) for p in each]
                    ),
                    "mb_per_s": spread([p["bytes"] / p["seconds"] / 1e6 for p in each]),
                }
    return found


BENCHMARKS = {"read": bench_read, "memory": bench_memory}

if __name__ == "__main__":
    harness.main(__doc__.splitlines()[0], BENCHMARKS, Job)
