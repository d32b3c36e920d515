"""`--reduce`: what a captured tensor is reduced to before it is kept (a per-sample vector
of a feature map or of token rows), the real tokens alone where a mask says which."""

from __future__ import annotations

import torch
from torch import nn

from hookdump.errors import HookdumpError, opt

# 1-d layers whose [batch, channels, length] outputs reduce over length, not dim 1
_CHANNELS_FIRST_1D = (
    nn.Conv1d,
    nn.ConvTranspose1d,
    nn.BatchNorm1d,
    nn.InstanceNorm1d,
    nn.MaxPool1d,
    nn.AvgPool1d,
    nn.AdaptiveAvgPool1d,
    nn.AdaptiveMaxPool1d,
)


def reduce_tensor(
    tensor: torch.Tensor,
    how: str,
    channels_first: bool = False,
    mask: torch.Tensor | None = None,
) -> torch.Tensor:
    """`reduce`: `mean`/`max` take [B, C, *spatial] over the spatial dims, [B, T, D] over
    tokens (over the length for 1-d layers' [B, C, L]), to [B, C] or [B, D]; `first` and
    `last` take one token of [B, T, D] (position 0, as a [CLS] token, or the last);
    `flatten` makes [B, -1]; tensors of rank 2 or less, and `none`, are left as they are
    (and are not copies). `mask` ([B, T], 1 for real tokens): [B, T, D] tensors reduce over
    the real tokens only, and `last` is the last real token."""
    if how == "none" or tensor.dim() <= 2:
        return tensor
    if how == "flatten":
        return tensor.reshape(tensor.shape[0], -1)
    tokens = tensor.dim() == 3 and not channels_first
    if mask is not None and tokens and tuple(tensor.shape[:2]) == tuple(mask.shape):
        return _reduce_real_tokens(tensor, how, mask.to(tensor.device).bool())
    if how in ("first", "last"):  # a token: [CLS] at position 0, or the last one
        if tensor.dim() != 3 or channels_first:
            raise HookdumpError(
                f"{opt('reduce')} {how} takes a token of [batch, tokens, features] tensors; "
                f"this one is {list(tensor.shape)}; {opt('exclude')} it, or reduce by mean"
            )
        return tensor[:, 0 if how == "first" else -1].clone()
    dims = (1,) if tensor.dim() == 3 and not channels_first else tuple(range(2, tensor.dim()))
    if how == "mean":
        return (tensor if tensor.is_floating_point() else tensor.float()).mean(dim=dims)
    return tensor.amax(dim=dims)


def reduce_attention(
    tensor: torch.Tensor, how: str, kind: str, mask: torch.Tensor | None = None
) -> torch.Tensor:
    """`reduce` of an attention kind, over its query tokens (the real ones, with `mask`):
    `q`, `k`, `v`, `z` [B, T, heads, head_dim] become [B, heads, head_dim]; `pattern` and
    `scores` [B, heads, T, T] become [B, heads, T] (per key: the mean, the max, the first or
    the last real query's row). The shape rule of feature maps would reduce these over the
    wrong axes (a pattern's mean is always 1/T)."""
    if how in ("none", "flatten") or tensor.dim() != 4:
        return reduce_tensor(tensor, how, mask=mask)
    batch = tensor.shape[0]
    rows = tensor.transpose(1, 2) if kind in ("pattern", "scores") else tensor  # [B, Tq, ...]
    shape = rows.shape[2:]
    reduced = reduce_tensor(rows.reshape(batch, rows.shape[1], -1), how, mask=mask)
    return reduced.reshape(batch, *shape)


def _reduce_real_tokens(tensor: torch.Tensor, how: str, real: torch.Tensor) -> torch.Tensor:
    """[B, T, D] over the real tokens of each sample (`real`: [B, T] booleans)."""
    if how == "first":
        return tensor[:, 0].clone()
    if how == "last":
        last = (real.sum(1) - 1).clamp(min=0)
        return tensor[torch.arange(tensor.shape[0], device=tensor.device), last].clone()
    keep = real[..., None]
    if how == "max":
        return tensor.masked_fill(~keep, float("-inf")).amax(dim=1)
    values = tensor if tensor.is_floating_point() else tensor.float()
    return (values * keep).sum(1) / keep.sum(1).clamp(min=1)


def channels_first(module: nn.Module) -> bool:
    """Whether `module`'s 3-d outputs are [batch, channels, length] (reduced over length)."""
    return isinstance(module, _CHANNELS_FIRST_1D)
