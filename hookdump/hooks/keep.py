"""Where every hooked module's values go: each key noted once (the module, kind, call and
part it came from, checked against the key's earlier value), reduced, and handed to the
receiver. The hooked modules (`hooks.hooked`) share one `Keeper`."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import torch

from hookdump.choices import ATTENTION_KINDS, Reduction
from hookdump.errors import HookdumpError, opt
from hookdump.format.keys import RESERVED_KEYS, KeyInfo, tensor_key
from hookdump.hooks.calls import Calls
from hookdump.hooks.names import Side, name_of
from hookdump.hooks.reduce import reduce_attention, reduce_tensor
from hookdump.hooks.values import Receiver, Skipped, Tensors, flatten


@dataclass(frozen=True)
class Origin:
    """A hooked module as its keys name it: its name, its class, and whether its 3-d
    outputs are [batch, channels, length] (`hooks.reduce.channels_first`)."""

    name: str
    module_type: str
    channels_first: bool


class Keeper:
    """What the hooks keep: `info` (key -> where it came from), `skipped` (non-tensor values
    met), and the values themselves, given to `receiver` reduced by `reduce` (over the
    current batch's real tokens where `token_mask` is set). `standard`: the standard name
    of each (module, side) that has one."""

    def __init__(
        self,
        receiver: Receiver,
        reduce: Reduction,
        standard: dict[tuple[str, Side], str],
        calls: Calls,
    ) -> None:
        self.receiver = receiver
        self.reduce = reduce
        self.standard = standard
        self.calls = calls
        # the current batch's attention mask ([B, T]): token reductions skip the padding
        self.token_mask: torch.Tensor | None = None
        self.info: dict[str, KeyInfo] = {}
        self.skipped: dict[str, Skipped] = {}

    @property
    def tensors(self) -> dict[str, torch.Tensor]:
        """key -> captured copy, in the order kept (empty with a receiver of its own)."""
        return self.receiver.tensors if isinstance(self.receiver, Tensors) else {}

    def next_batch(self, token_mask: torch.Tensor | None) -> None:
        self.token_mask = token_mask

    def clear(self) -> None:
        if isinstance(self.receiver, Tensors):
            self.receiver.clear()

    def skip(self, key: str, value: object) -> None:
        self.skipped.setdefault(key, Skipped(key, type(value).__name__))

    def record(
        self,
        origin: Origin,
        kind: str,
        prefix: str | None,
        value: Any,
        call: int,
        kept: torch.Tensor | None = None,
    ) -> None:
        """Keep each tensor of `value` (`kept`: one kept under another key already; a
        tensor in its memory is left out)."""
        for part, leaf in flatten(value, prefix):
            key = tensor_key(origin.name, kind, part, call)
            if not isinstance(leaf, torch.Tensor):
                self.skip(key, leaf)
                continue
            if kept is not None and _same_memory(leaf, kept):
                continue
            self.keep(origin, key, kind, call, part, leaf)

    def keep(
        self,
        origin: Origin,
        key: str,
        kind: str,
        call: int,
        part: str | None,
        tensor: torch.Tensor,
        standard: str | None = None,
    ) -> None:
        """Note where `key` came from (once) and keep a copy of its value; `standard`: the
        standard name it is kept under (else the one its value has, if any)."""
        known = self.info.get(key)
        if known is None:
            shape, rows = tuple(tensor.shape[1:]), tensor.shape[0] if tensor.dim() else None
            name, module_type, dtype = origin.name, origin.module_type, tensor.dtype
            made = KeyInfo(key, name, module_type, kind, call, part, shape, dtype, rows, standard)
            self.info[key] = self._note(made)
        elif (known.module, known.kind, known.call, known.part) != (origin.name, kind, call, part):
            made = KeyInfo(key, origin.name, origin.module_type, kind, call, part, (), tensor.dtype)
            raise HookdumpError(
                f"two tensors would be saved under the key {key!r}: {_said(known)} and "
                f"{_said(made)} (a module's name holds '@' or ':', which keys use); "
                f"{opt('exclude')} one of them"
            )
        if not self.calls.storing:
            return
        value = tensor.detach()
        try:
            if kind in ATTENTION_KINDS:
                reduced = reduce_attention(value, self.reduce, kind, self.token_mask)
            else:
                reduced = reduce_tensor(value, self.reduce, origin.channels_first, self.token_mask)
        except HookdumpError as exc:  # which key could not be reduced
            raise HookdumpError(f"{key!r}: {exc.args[0]}") from None
        # a mean or max is a new tensor already; the rest (views included) must be copied
        # before an in-place op can change it
        fresh = reduced.untyped_storage().data_ptr() != value.untyped_storage().data_ptr()
        self.receiver.keep(key, reduced, self.info[key], fresh)

    def _note(self, made: KeyInfo) -> KeyInfo:
        """A new key's record (with the standard name its value has, if it has one and
        none was given), refused where it is one the dump keeps for itself."""
        if made.key in RESERVED_KEYS:
            raise HookdumpError(
                f"the module {made.module!r} would be saved under {made.key!r}, a key the "
                f"dump keeps for its input and token rows; {opt('exclude')} it"
            )
        if made.standard_name is None and made.call == 0:
            standard = name_of(self.standard, made.module, made.kind, made.part)
            return dataclasses.replace(made, standard_name=standard)
        return made


def _same_memory(a: torch.Tensor, b: torch.Tensor) -> bool:
    return bool(a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr())


def _said(info: KeyInfo) -> str:
    """Where a key's tensor comes from, in words."""
    what = info.kind if info.part is None else f"{info.kind} {info.part}"
    call = f", call {info.call + 1}" if info.call else ""
    return f"the {what} of module {info.module!r} ({info.module_type}{call})"
