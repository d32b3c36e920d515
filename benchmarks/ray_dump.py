"""The Ray Data path against `hookdump.dump` on the same job.

resnet18's `layer1.0` for `--samples` random images (a float32 [3, 224, 224] array each,
with an id), in turns, `--reps` times, each in this process:

- `bare`: the forward passes alone, in batches of 16, no hooks, up to `layer1.0` (where
  hookdump's early stop ends the forward: the same work);
- `dump`: `hookdump.dump` of the batches to a local folder;
- `ray`: `hookdump.ray.dump` of a Ray Dataset of the same rows to a local folder, parts of
  `--part-size` rows, an actor pool of `--actors` (Ray started once, before the timings;
  each rep starts its actors anew, as a job would).

Medians with min-max, and the ratios to `bare`.

    python benchmarks/ray_dump.py [--reps 3] [--samples 256] [--actors 2] [--part-size 64]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import ray
import ray.data
import torch
import torchvision

import hookdump
import hookdump.ray

BATCH = 16


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torchvision.models.resnet18(weights=None).eval()


def _timed(job: Callable[[], object]) -> float:
    started = time.perf_counter()
    job()
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--samples", type=int, default=256)
    parser.add_argument("--actors", type=int, default=2)
    parser.add_argument("--part-size", type=int, default=64)
    args = parser.parse_args()
    torch.set_num_threads(os.cpu_count() or 1)
    ray.init(include_dashboard=False, log_to_driver=False, configure_logging=False)
    ray.data.DataContext.get_current().enable_progress_bars = False
    images = np.random.default_rng(0).standard_normal((args.samples, 3, 224, 224), np.float32)
    ids = [f"img-{i:05d}" for i in range(args.samples)]
    dataset = ray.data.from_items([{"id": i, "x": images[n]} for n, i in enumerate(ids)])
    dataset = dataset.materialize()  # the input in the object store, as read by a pipeline
    model = _model()
    batches = [torch.from_numpy(images[i : i + BATCH]) for i in range(0, args.samples, BATCH)]
    scratch = Path(tempfile.mkdtemp(prefix="hookdump-bench-"))
    layers = ["layer1.0"]

    stem = torch.nn.Sequential(model.conv1, model.bn1, model.relu, model.maxpool, model.layer1[0])

    def bare() -> None:
        with torch.inference_mode():
            for batch in batches:
                stem(batch)

    def dump() -> None:
        hookdump.dump(model, batches, scratch / "dump", layers=layers, ids=ids, overwrite=True)

    def on_ray() -> None:
        hookdump.ray.dump(
            dataset,
            _model,
            scratch / "ray",
            layers=layers,
            batch_size=BATCH,
            part_size=args.part_size,
            concurrency=args.actors,
            overwrite=True,
        )

    times: dict[str, list[float]] = {"bare": [], "dump": [], "ray": []}
    try:
        bare()  # warm up
        for _ in range(args.reps):
            for name, job in (("bare", bare), ("dump", dump), ("ray", on_ray)):
                times[name].append(_timed(job))
        same = all(
            torch.equal(hookdump.load(scratch / "dump")[k], hookdump.load(scratch / "ray")[k])
            for k in hookdump.load(scratch / "dump")
        )
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
        ray.shutdown()
    base = statistics.median(times["bare"])
    print(f"{args.samples} images, parts of {args.part_size}, {args.actors} actors, "
          f"{os.cpu_count()} cores; the Ray dump equals hookdump.dump's: {same}")  # fmt: skip
    for name, values in times.items():
        median = statistics.median(values)
        print(f"{name:>5}: {median:6.2f} s ({min(values):.2f}-{max(values):.2f})  "
              f"x{median / base:.2f} of bare")  # fmt: skip


if __name__ == "__main__":
    main()
