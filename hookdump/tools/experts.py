"""A mixture-of-experts block's chosen experts (`M:topk_ids`) as read from a dump: how many
experts the block has, from the manifest (its router logits' width), and the ids checked
against it before anything is counted or drawn with them. A dump is untrusted input: an id
of 10^12 would size a count of 8 TB, one equal to the number of experts would be counted as
an expert that does not exist, a negative one dropped."""

from __future__ import annotations

from typing import Any

import torch

from hookdump.errors import InvalidDump, printable

MOST_EXPERTS = 1 << 16  # where the dump does not say how many (no router logits kept)


def experts_of(dump: Any, ids_key: str) -> int | None:
    """The block's experts, as its `M:router_logits` key's width says (None: not kept)."""
    logits = ids_key.replace(":topk_ids", ":router_logits", 1)
    if logits not in dump:
        return None
    shape = dump.info(logits).shape
    return int(shape[-1]) if len(shape) else None


def checked_ids(ids: torch.Tensor, experts: int | None, key: str, where: str) -> torch.Tensor:
    """`ids` as int64, each in `[0, experts)` (else one line naming the key and `where`)."""
    ids = ids.long()
    if not ids.numel():
        return ids
    most = experts if experts is not None else MOST_EXPERTS
    low, high = int(ids.min()), int(ids.max())
    if low < 0 or high >= most:
        bad = low if low < 0 else high
        of = f"the block's {experts} experts" if experts is not None else f"{most} at most"
        raise InvalidDump(
            f"{printable(key)} in {where} holds expert id {bad}, outside 0 to {most - 1} ({of}): "
            "the dump is damaged"
        )
    return ids
