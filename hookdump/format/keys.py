"""Tensor keys (`M`, `M:input.x`, `M:pattern@1`) and where each captured tensor came from."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch
    from torch import nn

# keys the dump keeps for the input itself and for token rows: never a module's
INPUT_IDS, ATTENTION_MASK = "__input_ids__", "__attention_mask__"  # a text dump's input
# the columns of token rows: each row's token, its sequence, its position in the sequence
TOKEN_IDS, SAMPLE, POSITION = "__token_ids__", "__sample__", "__position__"
TOKEN_KEYS = (TOKEN_IDS, SAMPLE, POSITION)
# beside them, with --generate or --chat: 1 for a token of the model's response, 0 else
RESPONSE = "__response__"
RESERVED_KEYS = (INPUT_IDS, ATTENTION_MASK, *TOKEN_KEYS, RESPONSE)
# set on a module to show this class name instead of its own (unflattened export modules)
TYPE_ATTRIBUTE = "_hookdump_type"
ROOT = "__root__"  # the model itself, in module names and keys


def module_type_name(module: nn.Module) -> str:
    """The module's class name (the original one, for modules restored from an export)."""
    return getattr(module, TYPE_ATTRIBUTE, None) or type(module).__name__


def tensor_key(module: str, kind: str, part: str | None, call: int) -> str:
    """The contract's key: `M`, `M:output.0`, `M:input.x`, `M:pattern`, with `@n` for the
    n-th extra call."""
    if part is None:  # a module's output, or a value of its own (`M:pattern`)
        key = module if kind == "output" else f"{module}:{kind}"
    else:
        key = f"{module}:{kind}.{part}"
    return called(key, call)


def called(key: str, call: int) -> str:
    """`key` for a module's call `call`: as it is for the first (0), `key@n` for the n-th
    extra one."""
    return f"{key}@{call}" if call else key


def parse_key(key: str) -> tuple[str, str, str | None, int]:
    """The inverse of `tensor_key`: (module, kind, part, call)."""
    base, at, call = key.rpartition("@")
    if not (at and call.isascii() and call.isdigit()):
        base, call = key, "0"
    module, colon, rest = base.partition(":")
    if not colon:
        return module, "output", None, int(call)
    kind, _, part = rest.partition(".")
    return module, kind, part or None, int(call)


@dataclass(frozen=True)
class KeyInfo:
    """Where a captured tensor came from, and its per-sample shape (all but the first
    dimension) and dtype. `rows`: the first dimension of the tensor a live capture saw
    (None when read from a dump, or for a 0-d tensor), which tells an unbatched value."""

    key: str
    module: str
    module_type: str
    kind: str
    call: int
    part: str | None
    shape: tuple[int, ...]
    dtype: torch.dtype
    rows: int | None = None
    standard_name: str | None = None  # the value's standard name (`hooks.names`), if any

    @property
    def nbytes(self) -> int | None:
        """The bytes of `rows` rows (None when `rows` is not known)."""
        if self.rows is None:
            return None
        return self.rows * math.prod(self.shape) * self.dtype.itemsize
