"""`--generate-capture decode`: the values of the forward passes that produced the tokens,
joined into one `[B, T, ...]` value per key as a forward over the whole sequence gives it.

The first pass reads the (left-padded) prompts, each later one the token before; a value
`[B, t, ...]` of each pass is kept until the sequences are done, then the passes are
joined along the tokens. A pattern's or scores' keys (`[B, t, heads, keys]`: token rows)
are moved so that key j is the sequence's token j, as in a forward over the right-padded
sequence, the rest filled as a masked key is (weight 0; the dtype's lowest score); a
pass's keys and values (`k`, `v`) hold the cache's tokens too, of which its own is the last.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from hookdump.format.keys import KeyInfo
from hookdump.hooks.values import Receiver

# the kinds whose value in a pass holds every token the cache holds, not the pass's alone
CACHED = frozenset({"k", "v", "k_pre_rope"})


@dataclass
class DecodeSteps:
    """A receiver between the hooks and the token rows that keeps each pass's values and
    hands them on joined (`flush`)."""

    token_rows = True  # the attention tap hands [B, T, heads, ...] values (`hooks.attention`)
    receiver: Receiver
    _parts: dict[str, list[torch.Tensor]] = field(default_factory=dict)
    _info: dict[str, KeyInfo] = field(default_factory=dict)

    def keep(self, key: str, tensor: torch.Tensor, info: KeyInfo, fresh: bool) -> None:
        self._parts.setdefault(key, []).append(tensor if fresh else tensor.clone())
        self._info.setdefault(key, info)

    def flush(self, pads: torch.Tensor, prompt_width: int) -> None:
        """Hand every key's passes on joined; `pads`: each sequence's left padding, of its
        prompts' `prompt_width` (the first pass's tokens)."""
        parts, self._parts = self._parts, {}
        for key, values in parts.items():
            info = self._info[key]
            self.receiver.keep(key, _joined(values, info.kind, pads, prompt_width), info, True)
        self._info.clear()


def _joined(
    values: list[torch.Tensor], kind: str, pads: torch.Tensor, prompt_width: int
) -> torch.Tensor:
    """The passes of one key along the tokens; the first pass alone where they are not
    `[B, t, ...]` passes of the prompt then one token each (the token rows then note it)."""
    if kind in CACHED:  # a pass's keys and values reach back through the cache: its own last
        values = values[:1] + [v[:, -1:] if v.dim() >= 2 else v for v in values[1:]]
    first = values[0]
    rows = len(pads)
    alike = first.dim() >= 2 and first.shape[:2] == (rows, prompt_width)
    alike = alike and all(v.dim() == first.dim() and v.shape[:2] == (rows, 1) for v in values[1:])
    if not alike:
        return first
    width = prompt_width + len(values) - 1
    if kind in ("pattern", "scores"):  # pass i's cache ends at token prompt_width + i
        values = [
            _keys_aligned(v, kind, pads, width, prompt_width + i if i else prompt_width)
            for i, v in enumerate(values)
        ]
    try:
        return torch.cat(values, dim=1)
    except RuntimeError:  # passes of other shapes past the tokens
        return first


def _keys_aligned(
    value: torch.Tensor, kind: str, pads: torch.Tensor, width: int, end: int
) -> torch.Tensor:
    """`[B, t, heads, keys]` with each row's keys moved left past its padding and filled
    to `width` as a masked key is. The pass's keys are the last of the `end` (padded) tokens
    its cache holds: all of them, or a sliding window's last few (Gemma 2, Mistral), whose
    earlier tokens are then masked keys."""
    fill = 0.0 if kind == "pattern" else torch.finfo(value.dtype).min
    held = value.shape[-1]
    index = torch.arange(width, device=value.device)[None, :] + pads.to(value.device)[:, None]
    index = index - (end - held)  # the pass's key k is padded token end - held + k
    inside = (index >= 0) & (index < held)
    index = index.clamp(0, max(held - 1, 0))[:, None, None, :].expand(*value.shape[:3], width)
    taken = value.gather(-1, index)
    return taken.masked_fill(~inside[:, None, None, :], fill)
