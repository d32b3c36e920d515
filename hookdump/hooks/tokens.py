"""Token rows (`--per-token`): every captured `[B, T, ...]` tensor becomes one row per real
token, so dim 0 counts tokens, for probes and sparse autoencoders.

Padding is dropped by the attention mask (never by the token's id: GPT-2 pads with its EOS);
`positions` (a Python slice over each sample's real tokens) and `skip_special` select
further. Beside the captured keys go `__token_ids__`, `__sample__` (the sample's index in the
whole dump) and `__position__` (the token's position in its sample), one row per token.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

import torch

from hookdump.errors import HookdumpError, opt
from hookdump.format.keys import POSITION, RESPONSE, SAMPLE, TOKEN_IDS, KeyInfo
from hookdump.format.manifest import recipe
from hookdump.hooks.values import Receiver
from hookdump.inputs.samples import Batch


@dataclass(frozen=True)
class TokenOptions:
    """Token rows (`--per-token`): a row per real token of every `[B, T, ...]` tensor.

    Args:
        positions: the positions kept of each sample's real tokens (see `parse_positions`).
        skip_special_tokens: drop the rows of the tokenizer's special tokens.
    """

    positions: slice = field(default_factory=lambda: slice(None), metadata=recipe())
    skip_special_tokens: bool = field(default=False, metadata=recipe())


def positions_text(positions: slice) -> str:
    """A slice of positions as `--positions` spells it (`1:`, `-8:`, `:`)."""
    start = "" if positions.start is None else positions.start
    stop = "" if positions.stop is None else positions.stop
    return f"{start}:{stop}"


def parse_positions(text: str | None) -> slice:
    """`START:STOP` (either may be empty or negative) as a slice; None: every position."""
    if text is None:
        return slice(None)
    start, colon, stop = text.partition(":")
    try:
        if not colon:
            raise ValueError
        return slice(int(start) if start.strip() else None, int(stop) if stop.strip() else None)
    except ValueError:
        raise HookdumpError(
            f"{opt('positions')} {text!r} is not START:STOP; write e.g. 1: (drop the BOS "
            "position) or -8: (the last 8 tokens)"
        ) from None


@dataclass
class TokenRows:
    """A receiver between the hooks and the writer thread: keeps the selected tokens' rows
    of `[B, T, ...]` values and notes the parts that are not."""

    token_rows: ClassVar[bool] = True  # values shaped [B, T, ...] (see `hooks.attention`)
    receiver: Receiver
    positions: slice = field(default_factory=lambda: slice(None))
    special_ids: list[int] = field(default_factory=list)
    first_sample: int = 0  # a torchrun rank's first sample in the whole dump
    # text: the most tokens a sample has; token rows of attention patterns and scores are
    # padded to it (`_of_one_width`), whatever width dynamic padding gave their batch
    key_width: int | None = None
    skipped: dict[str, dict[str, str]] = field(default_factory=dict)
    _select: torch.Tensor | None = None  # [B, T] booleans of the current batch
    _every: bool = False  # every position of the current batch is a row
    _kept_modules: set[str] = field(default_factory=set)
    _seen_modules: set[str] = field(default_factory=set)

    def rows(self, batch: Batch) -> tuple[int, dict[str, torch.Tensor]]:
        """Select the current batch's tokens: how many rows, and the token keys' values."""
        ids = batch.kwargs["input_ids"]
        mask = batch.kwargs["attention_mask"].bool()
        order = mask.long().cumsum(1) - 1  # a real token's position among its sample's
        select = mask & self._in_positions(order, mask)
        if self.special_ids:
            select &= ~torch.isin(ids, torch.tensor(self.special_ids, device=ids.device))
        self._select, self._every = select, bool(select.all())
        samples = select.nonzero(as_tuple=True)[0]
        keys = {
            TOKEN_IDS: ids[select].cpu(),
            SAMPLE: (samples + batch.start + self.first_sample).cpu(),
            POSITION: order[select].cpu(),
        }
        if batch.response is not None:
            keys[RESPONSE] = batch.response.to(ids.device)[select].to(torch.uint8).cpu()
        return int(select.sum()), keys

    def _in_positions(self, order: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """[B, T]: True where a real token's position (`order`) lies in `positions` of its
        sample's real tokens (padded on either side)."""
        inside = torch.zeros_like(mask)
        for row, real in enumerate(mask.sum(1).tolist()):
            kept = range(real)[self.positions]  # a step of 1: `START:STOP` has none
            inside[row] = (order[row] >= kept.start) & (order[row] < kept.stop)
        return inside

    def keep(self, key: str, tensor: torch.Tensor, info: KeyInfo, fresh: bool) -> None:
        select = self._select
        assert select is not None
        self._seen_modules.add(info.module)
        if tensor.dim() < 2 or tuple(tensor.shape[:2]) != tuple(select.shape):
            self.skipped.setdefault(
                key,
                {
                    "key": key,
                    "reason": f"not [batch, tokens, ...] (shape {list(tensor.shape)})",
                },
            )
            return
        self._kept_modules.add(info.module)
        width = self.key_width if info.kind in ("pattern", "scores") else None
        if self._every and width is None:  # the rows are the value itself, [B * T, ...]
            self.receiver.keep(key, tensor.flatten(0, 1), info, fresh)
            return
        rows = tensor[select.to(tensor.device)]
        if width is not None:
            rows = _of_one_width(rows, info.kind, width)
        self.receiver.keep(key, rows, info, fresh=True)

    def check_modules(self) -> None:
        """After the first forward: every selected module gave at least one token part."""
        without = sorted(self._seen_modules - self._kept_modules)
        if without:
            raise HookdumpError(
                f"{opt('per_token', True)}: {without[0]!r} captured nothing shaped [batch, "
                f"tokens, ...] (it gave {self._shapes(without[0])}); {opt('exclude')} it"
            )

    def _shapes(self, module: str) -> str:
        reasons = [s["reason"] for s in self.skipped.values() if s["key"].startswith(module)]
        if not reasons:
            return "other values"
        return reasons[0].removeprefix("not [batch, tokens, ...] ").strip("()")


def _of_one_width(rows: torch.Tensor, kind: str, width: int) -> torch.Tensor:
    """Token rows `[n, heads, T]` of a pattern or scores padded along the keys to `width`,
    as a masked key is: weight 0 in a pattern, the dtype's lowest value in scores (what the
    mask adds). Batches padded to their longest sample then make rows of one shape."""
    short = width - rows.shape[-1]
    if short <= 0:
        return rows
    fill = 0.0 if kind == "pattern" else torch.finfo(rows.dtype).min
    return torch.nn.functional.pad(rows, (0, short), value=fill)
