"""A model ready to run: loaded as `ModelOptions` say, in its mode, on its device.

`hookdump run` and `hookdump layers` both start here.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

import torch

from hookdump.errors import HookdumpError, opt
from hookdump.format.manifest import recipe
from hookdump.model.loading import LoadedModel, load_model

DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


@dataclass(frozen=True)
class ModelOptions:
    """What builds the model: the part of `RunOptions` that `hookdump layers` takes too.

    Args:
        model: a torchvision name, `package.module:attribute`, or a model file.
        weights: `none`, a torchvision weights name, or a checkpoint file.
        model_args: keyword arguments for the model's class or factory (the CLI parses
            `key=value`, see `model.loading.parse_model_args`).
        seed: seeds torch before the model is built (its random initialisation), and the
            random input.
        device: `auto`, `cpu`, `cuda` or `cuda:N`.
        train: train mode instead of eval mode.
        strict: missing or unexpected checkpoint keys are an error.
        unsafe_pickle: allow a pickled whole module as `model` (runs its code).
    """

    model: str = field(metadata=recipe())
    weights: str = field(default="none", metadata=recipe())
    model_args: dict[str, Any] = field(default_factory=dict, metadata=recipe())
    seed: int = field(default=0, metadata=recipe())
    device: str = "auto"
    train: bool = field(default=False, metadata=recipe())
    strict: bool = True
    unsafe_pickle: bool = False


def prepare(options: ModelOptions) -> LoadedModel:
    """Check the cheap options, then load the model, set its mode and move it to its device."""
    target = resolve_device(options.device)
    loaded = load_model(
        options.model,
        weights=options.weights,
        model_args=dict(options.model_args),
        seed=options.seed,
        strict=options.strict,
        unsafe_pickle=options.unsafe_pickle,
    )
    loaded.module.train(options.train)
    loaded.module.to(target)
    return dataclasses.replace(loaded, device=target)


def resolve_device(name: str) -> torch.device:
    """`auto`, `cpu`, `cuda` or `cuda:N` to a device that exists here."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = opt("device")
    try:
        found = torch.device(name)
    except RuntimeError:
        raise HookdumpError(
            f"{device} {name!r} is not a device; use auto, cpu, cuda or cuda:N"
        ) from None
    if found.type == "cuda":
        if not torch.cuda.is_available():
            raise HookdumpError(f"{device} {name}: CUDA is not available here; use {device} cpu")
        if found.index is not None and found.index >= torch.cuda.device_count():
            raise HookdumpError(
                f"{device} {name}: this machine has {torch.cuda.device_count()} CUDA device(s)"
            )
    elif found.type != "cpu":
        raise HookdumpError(f"{device} {name!r} is not supported; use auto, cpu, cuda or cuda:N")
    return found


def resolve_dtype(name: str, option: str) -> torch.dtype:
    """A dtype name (`option`: `dtype` or `save_dtype`) to a torch dtype."""
    if name not in DTYPES:
        raise HookdumpError(f"{opt(option)} {name!r} is not one of {', '.join(DTYPES)}")
    return DTYPES[name]
