"""Writing a dump to a URL: does the upload overlap the forward passes?

The same `hookdump run` (resnet18's `layer1.0` for random images, shards of 32 MiB) in a
process of its own, in turns, `--reps` times:

- `bare`: no `--out` (the forward and the statistics);
- `folder`: `--out` a local folder;
- `url`: `--out s3://...` on an S3 server on the loopback (moto's, the tests' server, in a
  process of its own), the shards spooled and uploaded while the next batches run;
- `folder + put`: `folder`, then the folder uploaded with `fs.put` (the time it would take
  to write first and upload after, without the overlap).

Medians with min-max, and the ratios `url / folder` and `url / (folder + put)`.

    python benchmarks/url_writer.py [--reps 3] [--samples 256]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import fsspec

sys.path.insert(0, str(Path(__file__).parent))
from url_reader import _server  # a sibling script: the same server

BUCKET = "bench-writer"


def _run(samples: int, out: str | None) -> float:
    command = [sys.executable, "-m", "hookdump", "run", "resnet18", "--layers", "layer1.0",
               "-n", str(samples), "-b", "16", "--shard-size", "32MiB", "-q"]  # fmt: skip
    if out is not None:
        command += ["--out", out]
    started = time.perf_counter()
    subprocess.run(command, check=True, env={**os.environ, "OMP_NUM_THREADS": "2"})
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--samples", type=int, default=256)
    args = parser.parse_args()
    server = _server()
    fs = fsspec.filesystem("s3", skip_instance_cache=True)
    fs.mkdir(BUCKET)
    times: dict[str, list[float]] = {"bare": [], "folder": [], "url": [], "folder + put": []}
    scratch = Path(tempfile.mkdtemp(prefix="hookdump-bench-"))
    try:
        _run(8, None)  # warm the caches (torch's import, the page cache)
        for rep in range(args.reps):
            times["bare"].append(_run(args.samples, None))
            folder = scratch / f"d{rep}"
            times["folder"].append(_run(args.samples, str(folder)))
            started = time.perf_counter()
            fs.put(str(folder) + "/", f"{BUCKET}/put{rep}/", recursive=True)
            times["folder + put"].append(times["folder"][-1] + time.perf_counter() - started)
            shutil.rmtree(folder)
            times["url"].append(_run(args.samples, f"s3://{BUCKET}/url{rep}"))
        size = sum(fs.du(f"{BUCKET}/url{args.reps - 1}", total=False).values())
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
        server.terminate()
    print(f"{args.samples} samples, {size / 2**20:.0f} MiB a dump, {args.reps} reps")
    for name, values in times.items():
        median, low, high = statistics.median(values), min(values), max(values)
        print(f"{name:>13}: {median:6.2f} s ({low:.2f}-{high:.2f})")
    url = statistics.median(times["url"])
    print(f"url / folder: {url / statistics.median(times['folder']):.2f}")
    print(f"url / (folder + put): {url / statistics.median(times['folder + put']):.2f}")
    print(f"url / bare: {url / statistics.median(times['bare']):.2f}")


if __name__ == "__main__":
    main()
