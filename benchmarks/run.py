"""hookdump's speed and memory against the floor: a bare forward pass plus writing the bytes.

    python benchmarks/run.py            # all five, 5 repetitions each after a warm-up
    python benchmarks/run.py --reps 3 --only overhead,early  # of overhead,memory,early,
                                                            # durability,reuse,peers

Every timing is a median over repetitions that interleave hookdump and its references in
one process (the model built once, outside the timings). Printed as ratios; lower is better.
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import harness
import torch
import torchvision
from safetensors.torch import save_file

from hookdump.engine.options import RunOptions
from hookdump.engine.runner import run
from hookdump.hooks.options import CaptureOptions
from hookdump.hooks.selection import select_modules
from hookdump.inputs.samples import InputOptions
from hookdump.model.prepare import ModelOptions
from hookdump.store.write.direct_io import AppendFile
from hookdump.store.write.writer import DumpOptions

MODEL, BATCH = "resnet50", 32


def median_time(fn: Callable[[], object], reps: int) -> float:
    return statistics.median(timed(fn) for _ in range(reps))


def timed(fn: Callable[[], object]) -> float:
    # the page cache's dirty data of the step before is on disk first: no step pays for the
    # writeback of another (a 4 GB buffered write leaves seconds of it behind)
    os.sync()
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def interleaved(fns: dict[str, Callable[[], object]], reps: int) -> dict[str, float]:
    """Median seconds of each function, run in turns after one warm-up round."""
    times: dict[str, list[float]] = {name: [] for name in fns}
    for rep in range(reps + 1):
        for name, fn in fns.items():
            elapsed = timed(fn)
            if rep:
                times[name].append(elapsed)
    return {name: statistics.median(values) for name, values in times.items()}


class Job:
    """The model, input and scratch folder shared by the benchmarks."""

    def __init__(self, scratch: Path) -> None:
        torch.manual_seed(0)
        self.model = torchvision.models.resnet50(weights=None).eval()
        self.x = torch.randn(BATCH, 3, 224, 224)
        self.scratch = scratch

    def forward(self) -> None:
        with torch.inference_mode():
            self.model(self.x)

    def hookdump(self, layers: list[str], out: str = "hd") -> dict[str, float]:
        options = RunOptions(
            ModelOptions(MODEL), CaptureOptions(layers=tuple(layers)),
            InputOptions(batch_size=BATCH), dump=DumpOptions(self.scratch / out, overwrite=True),
        )  # fmt: skip
        return run(options).timings

    def write(self, tensors: dict[str, torch.Tensor], name: str = "floor") -> None:
        save_file(tensors, str(self.scratch / f"{name}.safetensors"))

    def write_direct(self, tensors: dict[str, torch.Tensor]) -> None:
        """The same bytes written the way hookdump writes them (O_DIRECT where possible)."""
        file = AppendFile(self.scratch / "floor-direct.bin", 0)
        for tensor in tensors.values():
            file.write(memoryview(tensor.reshape(-1).view(torch.uint8).numpy()))
        file.close()


def leaf_outputs(job: Job) -> dict[str, torch.Tensor]:
    """Every leaf's output for the batch, as a hand-written hook loop captures it."""
    captured: dict[str, torch.Tensor] = {}
    calls: Counter[str] = Counter()
    handles = []
    for name, module in select_modules(job.model).items():

        def hook(m: object, a: object, out: torch.Tensor, name: str = name) -> None:
            captured[f"{name}@{calls[name]}" if calls[name] else name] = out.detach().clone()
            calls[name] += 1

        handles.append(module.register_forward_hook(hook))
    try:
        with torch.inference_mode():
            job.model(job.x)
    finally:
        for h in handles:
            h.remove()
    return captured


def bench_overhead(job: Job, reps: int) -> dict[str, float]:
    reference = leaf_outputs(job)
    nbytes = sum(t.numel() * t.element_size() for t in reference.values())
    timings: dict[str, float] = {}

    def hookdump_run() -> None:
        timings.update(job.hookdump([]))

    pipeline: list[float] = []

    def hookdump_pipeline() -> None:
        hookdump_run()
        pipeline.append(timings["loop"] + timings["finish"])

    t = interleaved(
        {
            "hookdump": hookdump_pipeline,
            "forward": job.forward,
            "write": lambda: job.write(reference),
            "write_direct": lambda: job.write_direct(reference),
        },
        reps,
    )
    hd = statistics.median(pipeline[1:])
    floor = t["forward"] + t["write"]
    return {
        "bytes": nbytes,
        "hookdump_s": hd,
        "hookdump_with_load_s": t["hookdump"],
        "forward_s": t["forward"],
        "write_s": t["write"],
        "write_direct_s": t["write_direct"],
        "ratio_vs_serial_floor": hd / floor,
        "ratio_vs_max_forward_write": hd / max(t["forward"], t["write"]),
        # the floor again, with the bytes written as hookdump writes them: what is left is
        # the copies, the statistics and the overlap
        "ratio_vs_serial_floor_direct_write": hd / (t["forward"] + t["write_direct"]),
    }


def bench_durability(job: Job, reps: int) -> dict[str, float]:
    """What fsyncing each shard (and the manifest, and the folder) before it is listed costs:
    the overhead job as it is, against the same with `os.fsync` made a no-op; with O_DIRECT
    (the default) and through the page cache (HOOKDUMP_DIRECT_IO=0)."""
    real_fsync = os.fsync

    def dump(sync: bool, direct: bool) -> Callable[[], None]:
        def step() -> None:
            os.environ["HOOKDUMP_DIRECT_IO"] = "1" if direct else "0"
            os.fsync = real_fsync if sync else (lambda fd: None)  # type: ignore[assignment]
            try:
                job.hookdump([])
            finally:
                os.fsync = real_fsync
                os.environ.pop("HOOKDUMP_DIRECT_IO", None)

        return step

    t = interleaved(
        {
            "direct_fsync": dump(True, True),
            "direct_no_fsync": dump(False, True),
            "page_cache_fsync": dump(True, False),
            "page_cache_no_fsync": dump(False, False),
        },
        reps,
    )
    return {
        **{f"{name}_s": value for name, value in t.items()},
        "ratio_direct": t["direct_fsync"] / t["direct_no_fsync"],
        "ratio_page_cache": t["page_cache_fsync"] / t["page_cache_no_fsync"],
    }


def bench_early(job: Job, reps: int) -> dict[str, float]:
    pipeline: list[float] = []

    def early() -> None:
        timings = job.hookdump(["layer1.0.conv1"], "early")
        pipeline.append(timings["loop"] + timings["finish"])

    t = interleaved({"early": early, "forward": job.forward}, reps)
    hd = statistics.median(pipeline[1:])
    return {"hookdump_s": hd, "forward_s": t["forward"], "ratio_vs_full_forward": hd / t["forward"]}


def bench_reuse(job: Job, reps: int) -> dict[str, float]:
    """`layer1.*` in batches of 16 (copies of 12.8 and 51 MiB): the buffer pool as it is
    (copies of 32 MiB and more) against fresh copies for every batch."""
    pipeline: dict[str, list[float]] = {"pool": [], "fresh": []}

    def dump(kind: str) -> None:
        if kind == "fresh":
            os.environ["HOOKDUMP_POOL_MIN_BYTES"] = str(1 << 62)
        try:
            options = RunOptions(
                ModelOptions(MODEL), CaptureOptions(layers=("layer1.*",)),
                InputOptions(batch_size=16, num_samples=64),
                dump=DumpOptions(job.scratch / "reuse", overwrite=True),
            )  # fmt: skip
            timings = run(options).timings
        finally:
            os.environ.pop("HOOKDUMP_POOL_MIN_BYTES", None)
        pipeline[kind].append(timings["loop"] + timings["finish"])

    interleaved({"pool": lambda: dump("pool"), "fresh": lambda: dump("fresh")}, reps)
    pool, fresh = (statistics.median(pipeline[k][1:]) for k in ("pool", "fresh"))
    return {"pool_s": pool, "fresh_copies_s": fresh, "ratio": pool / fresh}


def peak_rss_mib(job: str) -> float:
    """The peak RSS of a fresh process running `job` (VmHWM: its own peak, where ru_maxrss
    would include the parent's as of the fork)."""
    code = (
        f"import re, sys\n{job}\n"
        "status = open('/proc/self/status').read()\n"
        "print(re.search(r'VmHWM:\\s+(\\d+)', status).group(1), file=sys.stderr)\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return int(proc.stderr.strip().splitlines()[-1]) / 1024


def hookdump_job(num_samples: int, scratch: Path) -> str:
    return (
        "from hookdump.cli import app\n"
        "try:\n"
        f"    app(['run', '{MODEL}', '--layers', 'layer4.*', '-b', '{BATCH}', '-n',"
        f" '{num_samples}', '-o', r'{scratch / 'mem'}', '--overwrite', '-q'])\n"
        "except SystemExit as e:\n"
        "    assert not e.code, e.code\n"
    )


def forward_job(batches: int) -> str:
    return (
        "import torch, torchvision\n"
        f"model = torchvision.models.{MODEL}(weights=None).eval()\n"
        f"for _ in range({batches}):\n"
        "    with torch.inference_mode():\n"
        f"        model(torch.randn({BATCH}, 3, 224, 224))\n"
    )


def bench_memory(job: Job, reps: int) -> dict[str, float]:
    # The bare forward's own peak grows from its first batch to its tenth (glibc keeps some
    # freed memory): that is the floor under hookdump's ratio. Medians of `reps` processes.
    def median_peak(code: str) -> float:
        return statistics.median(peak_rss_mib(code) for _ in range(reps))

    small = median_peak(hookdump_job(BATCH, job.scratch))
    large = median_peak(hookdump_job(10 * BATCH, job.scratch))
    bare_small, bare_large = median_peak(forward_job(1)), median_peak(forward_job(10))
    return {
        "peak_rss_32_mib": small,
        "peak_rss_320_mib": large,
        "ratio": large / small,
        "bare_forward_1_batch_mib": bare_small,
        "bare_forward_10_batches_mib": bare_large,
        "bare_forward_ratio": bare_large / bare_small,
    }


def bench_peers(job: Job, reps: int) -> dict[str, float]:
    from torchvision.models.feature_extraction import create_feature_extractor

    names = list(select_modules(job.model))
    extractor = create_feature_extractor(job.model, return_nodes=names)

    def hand_written() -> None:
        job.write(leaf_outputs(job), "hand")

    def fx() -> None:
        with torch.inference_mode():
            feats = extractor(job.x)
        # FX hands back aliases (a BatchNorm's output *is* the in-place ReLU's after it, with
        # the ReLU's values); safetensors refuses shared memory, so copy the repeats
        seen: set[int] = set()
        unique = {}
        for key, value in feats.items():
            ptr = value.untyped_storage().data_ptr()
            unique[key] = value.clone() if ptr in seen else value.contiguous()
            seen.add(ptr)
        job.write(unique, "fx")

    fns: dict[str, Callable[[], object]] = {
        "hookdump": lambda: job.hookdump([]),
        "hand_written_hooks": hand_written,
        "create_feature_extractor": fx,
        "forward": job.forward,
    }
    try:  # torchlens 2.x records every tensor operation (not only modules), in memory
        import torchlens as tl

        fns["torchlens_trace_in_memory"] = lambda: tl.trace(job.model, job.x)
    except ImportError:
        pass
    t = interleaved(fns, reps)
    return {f"{name}_s": value for name, value in t.items()}


BENCHMARKS = {
    "overhead": bench_overhead,
    "memory": bench_memory,
    "early": bench_early,
    "durability": bench_durability,
    "reuse": bench_reuse,
    "peers": bench_peers,
}


if __name__ == "__main__":
    harness.main(__doc__.splitlines()[0], BENCHMARKS, Job)
