"""What the hooks take: which modules, what of them, how reduced (`CaptureOptions`)."""

from __future__ import annotations

from dataclasses import dataclass, field

from hookdump.choices import CaptureKind, Reduction
from hookdump.format.manifest import recipe


@dataclass(frozen=True)
class CaptureOptions:
    """Which modules are hooked and what is kept of them.

    Args:
        layers, exclude: globs over qualified module names (`fnmatch`; the root module is
            `__root__`); no `layers` means every leaf module.
        types: keep only modules of these class names.
        kinds: any of `output`, `input`, `grad`, `ops`, the attention kinds and `routing`
            (see `hooks.values.parse_capture`).
        ops: with `ops`, globs of the op names kept (none: every op but views).
        reduce: `none`, `mean`, `max`, `first`, `last` or `flatten` (see `hooks.reduce`).
        grad_target: the objective of `grad`: `sum`, or an index into dim 1 of the output.
        early_stop: end each forward once every selected module has made all its calls.
        repeat_kv_heads: `k`, `v` and `k_pre_rope` of grouped-query attention with each
            key-value head repeated for the query heads that share it, as the scores use it.
    """

    layers: tuple[str, ...] = field(default=(), metadata=recipe())
    exclude: tuple[str, ...] = field(default=(), metadata=recipe())
    types: tuple[str, ...] = field(default=(), metadata=recipe())
    kinds: tuple[CaptureKind, ...] = field(default=("output",), metadata=recipe("capture"))
    ops: tuple[str, ...] = field(default=(), metadata=recipe())
    reduce: Reduction = field(default="none", metadata=recipe())
    grad_target: str | int = field(default="sum", metadata=recipe())
    early_stop: bool = True
    repeat_kv_heads: bool = field(default=False, metadata=recipe())
