"""Gradients of the scalar objective `--grad-target`, computed without touching `.grad`."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from hookdump.errors import HookdumpError, opt
from hookdump.hooks.values import flatten


def parse_grad_target(text: str) -> str | int:
    """`sum` or an integer index into dim 1 of the output."""
    if text == "sum":
        return "sum"
    try:
        return int(text)
    except ValueError:
        raise HookdumpError(
            f"{opt('grad_target')} {text!r} is neither 'sum' nor an integer index (e.g. a class: "
            "207)"
        ) from None


def objective(output: Any, target: str | int) -> torch.Tensor:
    """The sum of the output's first floating tensor, or of its `[:, target]` slice."""
    first = next(
        (leaf for _, leaf in flatten(output) if torch.is_tensor(leaf) and leaf.is_floating_point()),
        None,
    )
    if first is None or not first.requires_grad:
        raise HookdumpError(
            f"{opt('capture')} grad needs a model output that depends on its parameters or input; "
            "this model's first tensor output does not"
        )
    if isinstance(target, str):  # "sum"
        return first.sum()
    if first.dim() < 2 or not -first.shape[1] <= target < first.shape[1]:
        raise HookdumpError(
            f"{opt('grad_target')} {target} is out of range for the output's shape "
            f"{list(first.shape)} "
            f"(it indexes dim 1)"
        )
    return first[:, target].sum()


def backward(model: nn.Module, output: Any, target: str | int, inputs: list[torch.Tensor]) -> None:
    """Run the backward pass so tensor hooks fire, leaving every parameter's `.grad` as it was."""
    wrt: list[torch.Tensor] = [p for p in model.parameters() if p.requires_grad]
    wrt += [t for t in inputs if t.requires_grad]
    if not wrt:
        raise HookdumpError(
            f"{opt('capture')} grad: the model has no parameter or input to differentiate"
        )
    torch.autograd.grad(objective(output, target), wrt, allow_unused=True)


def inputs_requiring_grad(args: tuple[Any, ...], kwargs: dict[str, Any]) -> list[torch.Tensor]:
    """Mark the batch's floating tensors as requiring grad (for `__root__:grad_input.*`)."""
    tensors = [leaf for _, leaf in flatten((args, kwargs)) if torch.is_tensor(leaf)]
    floats = [t for t in tensors if t.is_floating_point()]
    for t in floats:
        t.requires_grad_(True)
    return floats
