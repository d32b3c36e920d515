"""Reading a dump from a URL: shuffled `Dump.batches` against a plain sequential read of the
same objects, from an S3 server on the loopback (moto's, the tests' server, in a process of
its own).

A dump of rows of 768 float32 plus an int64 id (256 MiB in shards of 32 MiB) is written
with `hookdump.dump` and uploaded as it is. In turns, `--reps` times:

- `cat`: `fs.cat_file` of every shard object in turn, whole: what the server and client
  give one sequential reader;
- `ranges`: `fs.cat_file` of every 8 MiB range of every shard in turn: the requests the
  reader makes, made one after the other (moto serves a ranged GET far slower per byte
  than a whole object, so this is the server's own ceiling for them);
- `shuffled`: `hookdump.load(URL).batches(keys, 4096, shuffle=True)`, every row once.

Both run in this process against the same server; medians with min-max, and the ratio
(the issue's target: at least 0.8 of `cat`).

    python benchmarks/url_reader.py [--reps 3]
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import fsspec
import torch

import hookdump

ROW = 768
ROWS = (256 << 20) // (ROW * 4 + 8)
SHARD = "32MiB"


def _server() -> subprocess.Popen[bytes]:
    """moto's server in a process of its own (in this one it would share the GIL with the
    reader it serves), on a free loopback port, with the client's environment aimed at it."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    server = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    os.environ.update(
        AWS_ENDPOINT_URL=f"http://127.0.0.1:{port}",
        AWS_ACCESS_KEY_ID="bench",
        AWS_SECRET_ACCESS_KEY="bench",
        AWS_DEFAULT_REGION="us-east-1",
    )
    deadline = time.monotonic() + 120
    while True:  # until it answers (a bound on a hang, not a guess at the speed)
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return server
        except OSError:
            if time.monotonic() > deadline or server.poll() is not None:
                raise RuntimeError("moto's server did not start") from None
            time.sleep(0.1)


def _dump(folder: Path) -> Path:
    generator = torch.Generator().manual_seed(0)
    batches = [{"x": torch.randn(4096, ROW, generator=generator)} for _ in range(-(-ROWS // 4096))]
    out = folder / "d"
    hookdump.dump(
        torch.nn.Sequential(torch.nn.Identity()),
        [b["x"] for b in batches],
        out,
        layers="0",
        shard_size=SHARD,
        num_samples=ROWS,
    )
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=3)
    args = parser.parse_args()
    server = _server()
    try:
        fs = fsspec.filesystem("s3", skip_instance_cache=True)
        fs.mkdir("bench")
        with tempfile.TemporaryDirectory() as scratch:
            local = _dump(Path(scratch))
            for file in sorted(local.iterdir()):
                fs.put_file(str(file), f"bench/d/{file.name}")
        shards = sorted(p for p in fs.ls("bench/d") if p.endswith(".safetensors"))
        total = sum(fs.info(p)["size"] for p in shards)
        rates: dict[str, list[float]] = {"cat": [], "ranges": [], "shuffled": []}
        block = 8 << 20  # the reader's block (`store.read.batches.BLOCK_BYTES`)
        for _ in range(args.reps):
            start = time.perf_counter()
            for path in shards:
                fs.cat_file(path)
            rates["cat"].append(total / (time.perf_counter() - start) / 1e6)
            start = time.perf_counter()
            for path in shards:
                size = fs.info(path)["size"]
                for lo in range(0, size, block):
                    fs.cat_file(path, start=lo, end=min(lo + block, size))
            rates["ranges"].append(total / (time.perf_counter() - start) / 1e6)
            dump = hookdump.load("s3://bench/d")
            start, rows = time.perf_counter(), 0
            for batch in dump.batches(["0"], 4096, shuffle=True, seed=0):
                rows += len(batch["0"])
            assert rows == dump.num_samples
            nbytes = rows * dump.reader.row_bytes(["0"])
            rates["shuffled"].append(nbytes / (time.perf_counter() - start) / 1e6)
    finally:
        server.terminate()
        server.wait()
    summary = {
        name: f"{statistics.median(v):.0f} ({min(v):.0f}-{max(v):.0f})" for name, v in rates.items()
    }
    ratios = [s / c for s, c in zip(rates["shuffled"], rates["cat"], strict=True)]
    by_range = [s / r for s, r in zip(rates["shuffled"], rates["ranges"], strict=True)]
    print(
        json.dumps(
            {
                "dump_mb": round(total / 1e6),
                "mb_per_s": summary,
                "shuffled vs cat": f"{statistics.median(ratios):.2f} "
                f"({min(ratios):.2f}-{max(ratios):.2f})",
                "shuffled vs ranges": f"{statistics.median(by_range):.2f} "
                f"({min(by_range):.2f}-{max(by_range):.2f})",
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
