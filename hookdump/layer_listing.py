"""Listing the modules a selection picks, with what one forward pass shows about each."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from hookdump.capture import Capture
from hookdump.inputs import random_batches
from hookdump.runner import Prepared, forward


@dataclass
class LayerRow:
    """One selected module: its class, parameter count, calls and output shapes per sample."""

    name: str
    module_type: str
    params: int
    calls: int
    # first call's output parts ("" for a bare tensor) -> per-sample shape, or None when the
    # tensor has no batch dim (its full shape is kept under the same part with `batched` off)
    outputs: dict[str, list[int]] = field(default_factory=dict)
    batched: bool = True

    def as_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "class": self.module_type,
            "params": self.params,
            "calls": self.calls,
            "outputs": self.outputs,
            "batched": self.batched,
        }


def list_layers(
    prepared: Prepared,
    layers: list[str],
    exclude: list[str],
    types: list[str],
    seed: int = 0,
    label: str = "the model",
) -> list[LayerRow]:
    """The selected modules in registration order, after one forward of the default input."""
    model = prepared.loaded.module
    rows_per_batch = 2 if model.training else 1  # BatchNorm in train mode needs 2 samples
    batch = next(random_batches(prepared.spec, rows_per_batch, rows_per_batch, seed))
    if prepared.device.type != "cpu":
        batch = batch.to(prepared.device)
    cap = Capture(model, layers, exclude, types, ("output",), store=False)
    with cap, torch.inference_mode():
        forward(cap, model, batch, label)
    rows = {
        name: LayerRow(
            name,
            type(module).__name__,
            sum(p.numel() for p in module.parameters()),
            cap.calls.get(name, 0),
        )
        for name, module in cap.modules.items()
    }
    for info in cap.info.values():
        if info.call != 0:
            continue
        row = rows[info.module]
        if info.shape and info.shape[0] == batch.rows:
            row.outputs[info.part or ""] = list(info.shape[1:])
        else:
            row.outputs[info.part or ""] = list(info.shape)
            row.batched = False
    return list(rows.values())
