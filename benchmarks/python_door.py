"""`hookdump.dump` against the CLI's engine on the same job, in one process (no start-up):
what the Python door costs over `run(RunOptions)` for the same model, batches and dump.

    python benchmarks/python_door.py              # 5 interleaved repetitions
    python benchmarks/python_door.py --reps 3

The job: resnet18 (random weights), `layer1.*` and `layer2.*` outputs of 64 random samples
in batches of 16, written to a scratch folder on the repository's disk. Each repetition
runs, one after the other: the bare forward passes; `run(RunOptions(...))` (the CLI's path:
it builds the model, timed apart as its `load`, and makes the random input);
`hookdump.dump(model, batches, ...)` with the model built and the same batches made ahead.
Ratios are per repetition, then the median (min-max); lower is better.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch
import torchvision

import hookdump
from hookdump.engine.options import RunOptions
from hookdump.engine.runner import run
from hookdump.hooks.options import CaptureOptions
from hookdump.inputs.samples import InputOptions, random_batches, sample_form
from hookdump.model.prepare import ModelOptions, prepare
from hookdump.store.write.writer import DumpOptions

HERE = Path(__file__).resolve().parent
LAYERS = ("layer1.*", "layer2.*")
SAMPLES, BATCH = 64, 16


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=5)
    args = parser.parse_args()
    torch.set_num_threads(torch.get_num_threads())
    scratch = Path(tempfile.mkdtemp(prefix="hookdump-door-", dir=HERE.parent))
    try:
        figures = measure(scratch, args.reps)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    print(json.dumps(figures, indent=2))


def measure(scratch: Path, reps: int) -> dict[str, object]:
    loaded = prepare(ModelOptions("resnet18", device="cpu"))
    model = loaded.module
    form = sample_form(loaded)
    batches = [b.args[0] for b in random_batches(form, SAMPLES, BATCH, 0)]
    options = RunOptions(
        ModelOptions("resnet18", device="cpu"), CaptureOptions(layers=LAYERS),
        InputOptions(num_samples=SAMPLES, batch_size=BATCH),
        dump=DumpOptions(scratch / "cli", overwrite=True),
    )  # fmt: skip

    def bare() -> None:
        with torch.inference_mode():
            for batch in batches:
                model(batch)

    def cli() -> None:
        timings = run(options).timings  # its model load is timed apart: dump's is the caller's
        seconds["cli without load"].append(timings["loop"] + timings["finish"])

    def door() -> None:
        hookdump.dump(model, batches, scratch / "py", layers=LAYERS, overwrite=True)

    steps: dict[str, Callable[[], None]] = {"forward": bare, "cli": cli, "dump": door}
    seconds: dict[str, list[float]] = {name: [] for name in [*steps, "cli without load"]}
    door()  # once before timing: imports and first-use costs of both paths
    cli()
    seconds["cli without load"].clear()
    for _ in range(reps):
        for name, step in steps.items():
            started = time.perf_counter()
            step()
            seconds[name].append(time.perf_counter() - started)
    ratios = {
        name: [a / b for a, b in zip(seconds[top], seconds[bottom], strict=True)]
        for name, top, bottom in (
            ("dump vs cli engine", "dump", "cli"),
            ("dump vs cli engine without its model load", "dump", "cli without load"),
            ("dump vs forward", "dump", "forward"),
            ("cli engine without load vs forward", "cli without load", "forward"),
        )
    }
    return {
        "job": f"resnet18 {','.join(LAYERS)}, {SAMPLES} samples in batches of {BATCH}",
        "gb": round(sum(p.stat().st_size for p in (scratch / "py").iterdir()) / 1e9, 3),
        "ratios": {name: _summary(values) for name, values in ratios.items()},
        "seconds": {name: _summary(values) for name, values in seconds.items()},
        "torchvision": torchvision.__version__,
    }


def _summary(values: list[float]) -> str:
    return f"{statistics.median(values):.3g} ({min(values):.3g}-{max(values):.3g})"


if __name__ == "__main__":
    main()
