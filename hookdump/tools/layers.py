"""Listing the modules a selection picks, with what one forward pass shows about each."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from hookdump.format.keys import called
from hookdump.hooks.attention import is_attention
from hookdump.hooks.capture import Hooks
from hookdump.hooks.forward import forward
from hookdump.hooks.names import Site
from hookdump.hooks.routing import is_moe_block
from hookdump.hooks.selection import ROOT, module_type_name
from hookdump.inputs.samples import SampleForm, random_batches
from hookdump.model.loading import LoadedModel


@dataclass
class LayerRow:
    """One selected module: its class, parameter count, calls and output shapes per sample."""

    name: str
    module_type: str
    params: int
    calls: int
    # first call's output parts ("" for a bare tensor) -> per-sample shape; the parts without a
    # batch dim (LSTM's h, say) are listed in `unbatched` and keep their full shape
    outputs: dict[str, list[int]] = field(default_factory=dict)
    unbatched: list[str] = field(default_factory=list)
    # asked for (`ops`): the ops its own forward calls in one forward, as keys name them
    ops: list[str] | None = None
    attention: bool = False  # takes --capture pattern, scores, q, k, v, z (hooks.attention)
    moe: bool = False  # a mixture-of-experts block: takes --capture routing (hooks.routing)
    # a standard name's row (`hooks.names`): the module and which of its values
    site: Site | None = None

    @property
    def shown_class(self) -> str:
        """What the table's class column says: the class, marked as attention; for a
        standard name, which value of which module it is."""
        if self.site is not None:
            return f"{self.site.side} of {self.site.module}"
        mark = " (attention)" if self.attention else " (experts)" if self.moe else ""
        return self.module_type + mark

    @property
    def depth(self) -> int:
        """How deep in the module tree: 1 for a child of the model, 0 for the model."""
        return 0 if self.name == ROOT else self.name.count(".") + 1

    def as_dict(self) -> dict[str, Any]:
        found = {
            "name": self.name,
            "depth": self.depth,
            "class": self.module_type,
            "params": self.params,
            "calls": self.calls,
            "outputs": self.outputs,
            "unbatched": self.unbatched,
        }
        if self.attention:  # marked where true: an attention module
            found["attention"] = True
        if self.moe:  # and a mixture-of-experts block
            found["moe"] = True
        if self.site is not None:
            found |= {"module": self.site.module, "side": self.site.side}
        return found if self.ops is None else {**found, "ops": self.ops}


def list_layers(
    loaded: LoadedModel,
    form: SampleForm,
    *,
    layers: list[str],
    exclude: list[str],
    types: list[str],
    seed: int = 0,
    ops: bool = False,
) -> list[LayerRow]:
    """The selected modules in registration order, after one forward of random input shaped
    by `form` (the model on its device, as `model.prepare.prepare` leaves it); with `ops`,
    the ops each one's own forward calls (`--capture ops`)."""
    model = loaded.module
    # two samples: with one, a dim 0 of size 1 could not be told from the batch dim
    batch = next(random_batches(form, 2, 2, seed))
    if loaded.device.type != "cpu":
        batch = batch.to(loaded.device)
    cap = Hooks(model, layers, exclude, types, ("output", "ops") if ops else ("output",))
    with cap, torch.inference_mode(), cap.counting_only():
        forward(cap, model, batch, loaded.spec)
    rows = {
        name: _row(
            name,
            name,
            cap,
            ops=[] if ops else None,
            attention=is_attention(module),
            moe=is_moe_block(module),
        )
        for name, module in cap.named.items()
    }
    for sites in cap.sites.values():
        for site in sites:
            rows[site.name] = _row(site.name, site.module, cap, site=site)
    for info in cap.info.values():
        if info.standard_name and info.key == called(info.standard_name, info.call):
            if info.call == 0:  # a standard name's value
                rows[info.standard_name].outputs[""] = list(info.shape)
            continue
        if info.kind == "op":
            listed = rows[info.module].ops
            assert listed is not None
            listed.append(called(str(info.part), info.call))
            continue
        if info.call != 0:
            continue
        row, part = rows[info.module], info.part or ""
        if info.rows == batch.rows:
            row.outputs[part] = list(info.shape)
        else:  # the whole value, as it came
            row.outputs[part] = [info.rows, *info.shape] if info.rows is not None else []
            row.unbatched.append(part)
    return list(rows.values())


def _row(name: str, module: str, cap: Hooks, **extra: Any) -> LayerRow:
    """Row `name` of hooked module `module` (itself, or a standard name's value of it)."""
    found = cap.modules[module]
    params = sum(p.numel() for p in found.parameters())
    return LayerRow(name, module_type_name(found), params, cap.calls.get(module, 0), **extra)


def down_to(rows: list[LayerRow], depth: int | None) -> list[LayerRow]:
    """The tree's rows (the model itself left out) no deeper than `depth` (None: all)."""
    return [r for r in rows if r.depth >= 1 and (depth is None or r.depth <= depth)]


def parameter_totals(module: torch.nn.Module) -> tuple[int, int]:
    """The model's parameters, and how many of them are trainable (`requires_grad`); a
    parameter shared by several modules counts once."""
    unique = {id(p): p for p in module.parameters()}.values()
    return sum(p.numel() for p in unique), sum(p.numel() for p in unique if p.requires_grad)
