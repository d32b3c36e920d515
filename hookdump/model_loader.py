"""Loading models: torchvision names and `package.module:attribute` specs."""

from __future__ import annotations

import importlib
import inspect
import os
import sys
from dataclasses import dataclass
from fnmatch import fnmatchcase
from functools import cache
from pathlib import Path
from typing import Any

import torch
from torch import nn

from hookdump.errors import HookdumpError, did_you_mean

# torchvision sub-packages whose models take something other than a batch of images
_FAMILY_MODULES = ("detection", "segmentation", "video", "optical_flow", "quantization")


@dataclass
class LoadedModel:
    """A model ready to hook, with what the rest of hookdump needs to know about it."""

    module: nn.Module
    spec: str
    weights: str
    family: str  # classification, detection, segmentation, video, optical_flow, custom
    torchvision_name: str | None = None

    @property
    def class_path(self) -> str:
        cls = type(self.module)
        return f"{cls.__module__}.{cls.__qualname__}"


@cache
def torchvision_models() -> dict[str, str]:
    """Every torchvision model name, mapped to its family."""
    import torchvision.models as tvm

    families = {name: "classification" for name in tvm.list_models()}
    for family in _FAMILY_MODULES:
        for name in tvm.list_models(module=getattr(tvm, family)):
            families[name] = "classification" if family == "quantization" else family
    return dict(sorted(families.items()))


def list_models(pattern: str | None = None) -> dict[str, str]:
    """The torchvision models whose names match the glob `pattern` (all without one)."""
    models = torchvision_models()
    if pattern is None:
        return models
    found = {n: f for n, f in models.items() if fnmatchcase(n, pattern)}
    if not found:
        raise HookdumpError(
            f"no model name matches {pattern!r}{did_you_mean(pattern, models)}; "
            "`hookdump models` lists them all"
        )
    return found


def parse_model_args(items: list[str]) -> dict[str, Any]:
    """`key=value` strings to keyword arguments (values as int, float, bool, None or str)."""
    kwargs: dict[str, Any] = {}
    for item in items:
        key, sep, raw = item.partition("=")
        if not sep or not key.isidentifier():
            raise HookdumpError(
                f"--model-arg {item!r} is not key=value; write e.g. --model-arg num_classes=10"
            )
        kwargs[key] = _parse_value(raw)
    return kwargs


def _parse_value(raw: str) -> Any:
    lowered = raw.lower()
    if lowered in ("true", "false"):
        return lowered == "true"
    if lowered == "none":
        return None
    for parse in (int, float):
        try:
            return parse(raw)
        except ValueError:
            pass
    return raw


def load_model(
    spec: str,
    weights: str = "none",
    model_args: dict[str, Any] | None = None,
    seed: int = 0,
) -> LoadedModel:
    """Build the model that `spec` names, seeded by `seed` before construction."""
    kwargs = model_args or {}
    if weights != "none":
        raise HookdumpError(
            f"--weights {weights!r}: only 'none' (the model as constructed) is supported yet"
        )
    if Path(spec).suffix in (".pt2", ".pt", ".pth", ".bin", ".safetensors") or (
        os.sep in spec and Path(spec).exists()
    ):
        raise HookdumpError(
            f"MODEL {spec!r}: loading models from files is not supported yet; "
            "give a torchvision name or package.module:attribute"
        )
    torch.manual_seed(seed)
    if ":" in spec:
        module = _build(_import_attribute(spec), spec, kwargs)
        return LoadedModel(module, spec, weights, "custom")

    models = torchvision_models()
    if spec not in models:
        raise HookdumpError(
            f"unknown model {spec!r}{did_you_mean(spec, models)}; `hookdump models` lists "
            "the torchvision names, and package.module:attribute loads your own"
        )
    import torchvision.models as tvm

    if "weights_backbone" in inspect.signature(tvm.get_model_builder(spec)).parameters:
        # detection and segmentation builders download an ImageNet backbone by default
        kwargs = {"weights_backbone": None, **kwargs}
    module = _build(lambda **kw: tvm.get_model(spec, weights=None, **kw), spec, kwargs)
    return LoadedModel(module, spec, weights, models[spec], torchvision_name=spec)


def _import_attribute(spec: str) -> Any:
    module_name, _, attr_path = spec.partition(":")
    if not module_name or not attr_path:
        raise HookdumpError(f"MODEL {spec!r} is not package.module:attribute")
    cwd = os.getcwd()
    if cwd not in sys.path:
        sys.path.insert(0, cwd)
    try:
        obj: Any = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name and module_name.startswith(exc.name):
            raise HookdumpError(
                f"cannot import {module_name!r} for MODEL {spec!r}: no module named "
                f"{exc.name!r}; run from the folder that holds it or add that folder to "
                "PYTHONPATH"
            ) from None
        raise HookdumpError(f"importing {module_name!r} failed: {exc}") from None
    except Exception as exc:
        raise HookdumpError(
            f"importing {module_name!r} raised {type(exc).__name__}: {exc}"
        ) from None
    for part in attr_path.split("."):
        if not hasattr(obj, part):
            names = [n for n in dir(obj) if not n.startswith("_")]
            raise HookdumpError(
                f"{module_name!r} has no attribute {attr_path!r}{did_you_mean(part, names)}"
            )
        obj = getattr(obj, part)
    return obj


def _build(factory: Any, spec: str, kwargs: dict[str, Any]) -> nn.Module:
    if isinstance(factory, nn.Module):
        if kwargs:
            raise HookdumpError(f"{spec!r} is a module instance; it takes no --model-arg")
        return factory
    if not callable(factory):
        raise HookdumpError(f"{spec!r} is a {type(factory).__name__}, not a class or factory")
    try:
        module = factory(**kwargs)
    except TypeError as exc:
        raise HookdumpError(f"building {spec!r} failed: {exc}; check --model-arg") from None
    except Exception as exc:
        raise HookdumpError(f"building {spec!r} raised {type(exc).__name__}: {exc}") from None
    if not isinstance(module, nn.Module):
        raise HookdumpError(f"{spec!r} returned a {type(module).__name__}, not a torch.nn.Module")
    return module
