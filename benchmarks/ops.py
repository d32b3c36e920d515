"""`--capture ops` against a plain forward: what seeing every op through a
`TorchFunctionMode` costs, in one process.

    python benchmarks/ops.py            # 5 interleaved repetitions
    python benchmarks/ops.py --reps 3

The job: resnet50 (random weights) on 16 random 224x224 images; the 16 Bottleneck blocks'
residual adds (`layerN.M:op.add_`, `ops=["add_"]`), every op of the model seen by the
mode. Each repetition runs the bare forward, then the forward under `hookdump.capture(...,
capture="ops")` keeping each add (a copy, as a run keeps it), then under `capture="output"`
of the same blocks (as many values, of the same size) for comparison. Ratios are per
repetition, then the median (min-max).
"""

from __future__ import annotations

import argparse
import json
import statistics
from collections.abc import Callable

import torch
import torchvision
from harness import in_turns

import hookdump

LAYERS = ["layer?.?"]  # the 16 Bottleneck blocks


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=5)
    args = parser.parse_args()
    model = torchvision.models.resnet50().eval()
    x = torch.randn(16, 3, 224, 224, generator=torch.Generator().manual_seed(0))
    keys: dict[str, int] = {}

    def bare() -> None:
        with torch.no_grad():
            model(x)

    def captured(kind: str) -> Callable[[], None]:
        def step() -> None:
            ops = ["add_"] if kind == "ops" else None
            with hookdump.capture(model, LAYERS, capture=kind, ops=ops) as cap, torch.no_grad():
                model(x)
            keys[kind] = len(cap.tensors)

        return step

    steps = {"forward": bare, "ops": captured("ops"), "outputs": captured("output")}
    seconds = in_turns(steps, args.reps)
    ratio = {
        f"{name} vs forward": _summary(
            [a / b for a, b in zip(seconds[name], seconds["forward"], strict=True)]
        )
        for name in ("ops", "outputs")
    }
    print(json.dumps({
        "job": "resnet50, 16 images of 224x224, the blocks' residual adds",
        "keys": keys,
        "ratios": ratio,
        "seconds": {name: _summary(values) for name, values in seconds.items()},
    }, indent=2))  # fmt: skip


def _summary(values: list[float]) -> str:
    return f"{statistics.median(values):.3g} ({min(values):.3g}-{max(values):.3g})"


if __name__ == "__main__":
    main()
