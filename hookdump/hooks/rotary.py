"""Rotary position embeddings undone: `--capture q_pre_rope,k_pre_rope` give an attention
module's queries and keys as its projections made them, before the rotation (what
TransformerLens calls `hook_q` and `hook_k`; `q` and `k` are after it, its `hook_rot_q`).

The attention function sees the rotated ones. The module's `position_embeddings` (cos,
sin), taken by a pre-hook, rotate them back: the rotate-half rotation of Llama, Mistral,
Qwen and Gemma (the first `cos.shape[-1]` dims of a partial rotary). The result is checked
with the model's own `apply_rotary_pos_emb`, which must give the rotated ones again: a
model whose rotation is of another kind is refused in one line, never undone wrongly. A
module with no rotary embedding (GPT-2, BERT) gives its queries and keys as they are.
"""

from __future__ import annotations

import sys
from typing import Any

import torch
from torch import nn

from hookdump.errors import HookdumpError, opt


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def unrotated(
    name: str, module: nn.Module, query: torch.Tensor, key: torch.Tensor, embeddings: Any
) -> tuple[torch.Tensor, torch.Tensor]:
    """`query` and `key` (`[B, heads, T, D]`, rotated) before the rotation (see the
    module's docstring); `embeddings`: the module's `position_embeddings`, or None."""
    if embeddings is None:
        return query, key
    cos, sin = embeddings
    width = cos.shape[-1]
    over_heads = cos.unsqueeze(1), sin.unsqueeze(1)

    def back(x: torch.Tensor) -> torch.Tensor:
        turned, rest = x[..., :width], x[..., width:]
        c, s = over_heads
        return torch.cat([turned * c - _rotate_half(turned) * s, rest], dim=-1)

    q, k = back(query), back(key)
    apply = getattr(sys.modules[type(module).__module__], "apply_rotary_pos_emb", None)
    again = apply(q, k, cos, sin) if callable(apply) else None
    scale = max(float(query.detach().abs().max()), float(key.detach().abs().max()), 1.0)
    if again is None or not all(
        torch.allclose(a, b, rtol=1e-4, atol=1e-4 * scale)
        for a, b in zip(again, (query, key), strict=True)
    ):
        raise HookdumpError(
            f"{opt('capture')} q_pre_rope,k_pre_rope: {name}'s rotary embedding is not the "
            "rotate-half kind hookdump can undo; capture q and k (after it), or the "
            "module's q_proj and k_proj outputs"
        )
    return q, k
