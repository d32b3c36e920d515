"""Loading models: torchvision names, `package.module:attribute` specs and model files."""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import itertools
import os
import sys
from dataclasses import dataclass, field
from fnmatch import fnmatchcase
from functools import cache
from pathlib import Path
from typing import Any

import torch
from torch import nn

from hookdump.errors import HookdumpError, did_you_mean, opt
from hookdump.format.keys import TYPE_ATTRIBUTE
from hookdump.model.weights import (
    apply_state_dict,
    ensure_cached,
    is_checkpoint_path,
    load_checkpoint,
    sha256,
    torch_load_safely,
    torchvision_weights,
)
from hookdump.model.zoo import (
    TIMM_PREFIX,
    hf_input,
    hf_positions,
    is_zoo_spec,
    list_timm,
    load_hf,
    load_timm,
)

# torchvision sub-packages whose models take something other than a batch of images
_FAMILY_MODULES = ("detection", "segmentation", "video", "optical_flow", "quantization")


@dataclass(frozen=True)
class ModelSources:
    """The files a model was made from, which `--resume` compares by SHA-256."""

    weights_file: Path | None = None
    model_file: Path | None = None  # MODEL, when it is a file
    files: list[Path] = field(default_factory=list)  # a Hugging Face folder's weights files
    # what defines the model beside its weights: an hf: folder's config and tokenizer files,
    # the source files of a module:attribute model
    definition: list[Path] = field(default_factory=list)
    live: bool = False  # a module handed over in Python: its weights are its state dict


def live_model(module: nn.Module) -> LoadedModel:
    """A module handed over in Python (`hookdump.dump`), used as it is: on its own device
    (its first parameter's or buffer's), in its own mode."""
    if not isinstance(module, nn.Module):
        raise HookdumpError(
            f"model must be a torch.nn.Module or a MODEL string, not {type(module).__name__}"
        )
    tensors = itertools.chain(module.parameters(), module.buffers())
    device = next((t.device for t in tensors), torch.device("cpu"))
    spec = class_path(module)
    sources = ModelSources(definition=_sources_of(module, spec), live=True)
    return LoadedModel(module, spec, "live", "custom", device=device, sources=sources)


@dataclass(frozen=True)
class LoadedModel:
    """A model ready to hook, with what the rest of hookdump needs to know about it; a new
    one (`dataclasses.replace`) for each step that adds to it, never changed once made."""

    module: nn.Module
    spec: str
    weights: str
    family: str  # classification, detection, segmentation, video, optical_flow, custom
    transforms: Any = None  # the torchvision weights' preprocessing, when they have one
    input_shape: tuple[int, ...] | None = None  # per sample, when the model file records it
    warnings: list[str] = field(default_factory=list)
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))
    vocab: int = 0  # token ids of random input are below this (family "tokens")
    positions: int | None = None  # the most tokens a sample may have (a text model's config)
    about: dict[str, Any] = field(default_factory=dict)  # more for the manifest's model entry
    sources: ModelSources = ModelSources()

    def manifest_entry(self) -> dict[str, Any]:
        """The manifest's `model` entry."""
        entry: dict[str, Any] = {
            "spec": self.spec,
            "weights": self.weights,
            "class": self.class_path,
        }
        weights_file, files = self.sources.weights_file, self.sources.files
        if weights_file is not None:
            entry["weights_file"] = str(weights_file)
            entry["weights_sha256"] = sha256(weights_file)
        if files:
            entry["files_sha256"] = {str(p): sha256(p) for p in files}
        return {**entry, **self.about}

    @property
    def class_path(self) -> str:
        return class_path(self.module)


def class_path(module: nn.Module) -> str:
    """`package.module.Class` of a module."""
    cls = type(module)
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


def list_models(pattern: str | None = None, source: str = "torchvision") -> dict[str, str]:
    """The model names of `source` (`torchvision` or `timm`) that match the glob `pattern`
    (all without one), each with its family."""
    if source not in ("torchvision", "timm"):
        raise HookdumpError(f"{opt('source')} {source!r} is not one of torchvision, timm")
    models = (
        torchvision_models()
        if source == "torchvision"
        else dict.fromkeys((f"timm:{name}" for name in list_timm(None)), "timm")
    )
    if source == "timm" and pattern is not None and not pattern.startswith("timm:"):
        pattern = f"timm:{pattern}"
    if pattern is None:
        return models
    found = {n: f for n, f in models.items() if fnmatchcase(n, pattern)}
    if not found:
        raise HookdumpError(
            f"no model name matches {pattern!r}{did_you_mean(pattern, models)}; "
            f"`hookdump models{' --source timm' if source == 'timm' else ''}` lists them all"
        )
    return found


def parse_model_args(items: list[str]) -> dict[str, Any]:
    """`key=value` strings to keyword arguments (values as int, float, bool, None or str)."""
    kwargs: dict[str, Any] = {}
    for item in items:
        key, sep, raw = item.partition("=")
        if not sep or not key.isidentifier():
            raise HookdumpError(
                f"{opt('model_args')} {item!r} is not key=value; write e.g. {opt('model_args')} "
                "num_classes=10"
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
    *,
    weights: str = "none",
    model_args: dict[str, Any] | None = None,
    seed: int = 0,
    strict: bool = True,
    unsafe_pickle: bool = False,
) -> LoadedModel:
    """Build the model that `spec` names (seeded by `seed`), then load `weights` into it."""
    kwargs = model_args or {}
    torch.manual_seed(seed)
    if is_zoo_spec(spec):
        loaded = _load_zoo(spec, weights, kwargs, strict)
        if weights in ("none", "pretrained"):
            return loaded
    elif is_model_file(spec):
        if kwargs:
            raise HookdumpError(f"{opt('model')} {spec} is a file; it takes no {opt('model_args')}")
        module, shape, batch = _load_model_file(Path(spec), unsafe_pickle)
        loaded = LoadedModel(
            module,
            spec,
            weights,
            "custom",
            input_shape=shape,
            sources=ModelSources(model_file=Path(spec)),
            about={"export_batch": batch} if batch is not None else {},
        )
    elif ":" in spec:
        module = _build(_import_attribute(spec), spec, kwargs)
        definition = _sources_of(module, spec)
        loaded = LoadedModel(
            module, spec, weights, "custom", sources=ModelSources(definition=definition)
        )
    else:
        loaded = _load_torchvision(spec, weights, kwargs)
        if loaded.sources.weights_file is not None:
            return loaded
    if weights == "none":
        return loaded
    if not is_checkpoint_path(weights):
        raise HookdumpError(
            f"{opt('weights')} {weights!r} is not a file; torchvision weights names work with "
            "torchvision models only, so give a checkpoint (.safetensors, .pt, .pth, .bin)"
        )
    return _with_checkpoint(loaded, Path(weights), strict)


def _load_zoo(spec: str, weights: str, kwargs: dict[str, Any], strict: bool) -> LoadedModel:
    """A Hugging Face or timm model (see `model.zoo`)."""
    if spec.startswith(TIMM_PREFIX):
        built = load_timm(spec, kwargs, pretrained=weights == "pretrained")
        return LoadedModel(
            built.module,
            spec,
            weights,
            "image",
            transforms=built.transforms,
            input_shape=built.input_shape,
        )
    if weights == "pretrained":
        raise HookdumpError(
            f"{opt('weights')} pretrained is for timm models; a Hugging Face folder loads its "
            "own weights"
        )
    hf = load_hf(spec, kwargs, strict)
    layout, shape, vocab = hf_input(hf.config)
    return LoadedModel(
        hf.module,
        spec,
        weights,
        layout,
        transforms=hf.transforms,
        input_shape=shape,
        vocab=vocab,
        positions=hf_positions(hf.config),
        warnings=hf.warnings,
        sources=ModelSources(files=hf.files, definition=hf.definition),
        about={
            "folder": str(hf.folder),
            "config_class": type(hf.config).__name__,
            "architecture": hf.class_name,
        },
    )


_WARNS_OF_ITS_INIT = ("googlenet", "inception_v3")


def _is_timm_name(name: str) -> bool:
    """Whether timm, where it is installed, has a model of this name (asked only once the
    name is not torchvision's: importing timm takes a while)."""
    try:
        import timm
    except ImportError:
        return False
    return bool(timm.list_models(name))


def _load_torchvision(spec: str, weights: str, kwargs: dict[str, Any]) -> LoadedModel:
    models = torchvision_models()
    if spec not in models:
        if _is_timm_name(spec):
            raise HookdumpError(
                f"unknown torchvision model {spec!r}; timm has one of that name: give timm:{spec}"
            )
        raise HookdumpError(
            f"unknown model {spec!r}{did_you_mean(spec, models)}; `hookdump models` lists "
            "the torchvision names, timm:NAME loads a timm model, and package.module:attribute "
            "your own"
        )
    import torchvision.models as tvm

    enum, cached = None, None
    if weights != "none" and not is_checkpoint_path(weights):
        enum = torchvision_weights(spec, weights)
        cached = ensure_cached(enum)  # torchvision then reads this file: no download, no hang
    elif "weights_backbone" in inspect.signature(tvm.get_model_builder(spec)).parameters:
        # detection and segmentation builders download an ImageNet backbone by default
        kwargs = {"weights_backbone": None, **kwargs}
    if enum is None and spec.endswith(_WARNS_OF_ITS_INIT):
        # torchvision warns that their default init will change and, for now, uses this one:
        # the same weights, said outright, without the FutureWarning on stderr
        kwargs = {"init_weights": True, **kwargs}
    module = _build(lambda **kw: tvm.get_model(spec, weights=enum, **kw), spec, kwargs)
    return LoadedModel(
        module,
        spec,
        weights,
        models[spec],
        transforms=enum.transforms() if enum is not None else None,
        sources=ModelSources(weights_file=cached if enum is not None else None),
    )


def _with_checkpoint(loaded: LoadedModel, path: Path, strict: bool) -> LoadedModel:
    state = load_checkpoint(path)
    # torchvision's and timm's builders take num_classes: a head of another size is that
    builder = loaded.spec.startswith(TIMM_PREFIX) or ":" not in loaded.spec
    warnings = apply_state_dict(loaded.module, state, str(path), strict, builder)
    return dataclasses.replace(
        loaded,
        warnings=[*loaded.warnings, *warnings],
        sources=dataclasses.replace(loaded.sources, weights_file=path),
    )


def is_model_file(spec: str) -> bool:
    """True when MODEL names a file (an export archive or a pickled module)."""
    path = Path(spec)
    return path.suffix in (".pt2", ".pt", ".pth", ".bin") or (":" not in spec and path.is_file())


def _load_model_file(
    path: Path, unsafe_pickle: bool
) -> tuple[nn.Module, tuple[int, ...] | None, int | None]:
    """A `torch.export` archive, unflattened (with its example input's per-sample shape and
    its fixed batch size, if any); or a pickled module, only with --unsafe-pickle."""
    if not path.is_file():
        raise HookdumpError(f"{opt('model')} {path}: no such file")
    if path.suffix == ".pt2":
        try:
            program = torch.export.load(path)
            module = torch.export.unflatten(program)
        except Exception as exc:
            message = " ".join(str(exc).split())[:200]
            raise HookdumpError(
                f"{opt('model')} {path} is not a loadable torch.export archive: {message}"
            ) from exc
        _restore_type_names(module, program)
        args = program.example_inputs[0] if program.example_inputs else ()
        first = args[0] if args and torch.is_tensor(args[0]) else None
        return module, tuple(first.shape[1:]) if first is not None else None, _fixed_batch(program)
    if not unsafe_pickle:
        content = torch_load_safely(
            path,
            opt("model"),
            f"if it is a whole model you trust, pass {opt('unsafe_pickle', True)} (unpickling "
            f"runs its code); else save its state dict and give it as {opt('weights')}",
        )
        raise HookdumpError(
            f"{opt('model')} {path} holds a {type(content).__name__}, not a model: give the model "
            "as "
            f"{opt('model')} (a torchvision name or package.module:Class) and this file as "
            f"{opt('weights')}"
        )
    _importable_from_cwd()  # the pickle names the class by module, as MODEL specs do
    try:
        module = torch.load(path, map_location="cpu", weights_only=False)
    except Exception as exc:
        raise HookdumpError(f"{opt('model')} {path} could not be unpickled: {exc}") from exc
    if not isinstance(module, nn.Module):
        raise HookdumpError(
            f"{opt('model')} {path} holds a {type(module).__name__}, not a torch.nn.Module"
        )
    return module, None, None


def _fixed_batch(program: Any) -> int | None:
    """The batch size an export archive was traced for, when its first input's batch
    dimension is static (not a `Dim`): every batch must have it."""
    names = list(program.graph_signature.user_inputs)[:1]
    for node in program.graph.nodes:
        value = node.meta.get("val")
        if node.op == "placeholder" and node.name in names and torch.is_tensor(value):
            size = value.shape[0] if value.dim() else None
            return size if type(size) is int else None
    return None


def _restore_type_names(module: nn.Module, program: Any) -> None:
    """Unflattened modules are all InterpreterModule: note each one's original class name."""
    names: dict[str, str] = {}
    for node in program.graph.nodes:
        for path, type_name in (node.meta.get("nn_module_stack") or {}).values():
            type_str = type_name if isinstance(type_name, str) else type_name.__qualname__
            names.setdefault(path.split("@")[0], type_str.rpartition(".")[2])
    for name, sub in module.named_modules():
        if name in names:
            setattr(sub, TYPE_ATTRIBUTE, names[name])


def _sources_of(module: nn.Module, spec: str) -> list[Path]:
    """The source files of the module `spec` imports and of the model's class."""
    found = []
    for obj in (sys.modules.get(spec.partition(":")[0]), type(module)):
        try:
            path = inspect.getsourcefile(obj) if obj is not None else None
        except TypeError:  # built in
            path = None
        if path and Path(path).is_file() and Path(path) not in found:
            found.append(Path(path))
    return found


def _import_attribute(spec: str) -> Any:
    module_name, _, attr_path = spec.partition(":")
    if not module_name or not attr_path:
        raise HookdumpError(f"{opt('model')} {spec!r} is not package.module:attribute")
    _importable_from_cwd()
    try:
        obj: Any = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name and module_name.startswith(exc.name):
            raise HookdumpError(
                f"cannot import {module_name!r} for {opt('model')} {spec!r}: no module named "
                f"{exc.name!r}; run from the folder that holds it or add that folder to "
                "PYTHONPATH"
            ) from None
        raise HookdumpError(f"importing {module_name!r} failed: {exc}") from exc
    except Exception as exc:
        raise HookdumpError(
            f"importing {module_name!r} raised {type(exc).__name__}: {exc}"
        ) from exc
    for part in attr_path.split("."):
        if not hasattr(obj, part):
            names = [n for n in dir(obj) if not n.startswith("_")]
            raise HookdumpError(
                f"{module_name!r} has no attribute {attr_path!r}{did_you_mean(part, names)}"
            )
        obj = getattr(obj, part)
    return obj


def _importable_from_cwd() -> None:
    cwd = os.getcwd()
    if cwd not in sys.path:
        sys.path.insert(0, cwd)


def _build(factory: Any, spec: str, kwargs: dict[str, Any]) -> nn.Module:
    if isinstance(factory, nn.Module):
        if kwargs:
            raise HookdumpError(f"{spec!r} is a module instance; it takes no {opt('model_args')}")
        return factory
    if not callable(factory):
        raise HookdumpError(f"{spec!r} is a {type(factory).__name__}, not a class or factory")
    try:
        module = factory(**kwargs)
    except TypeError as exc:
        raise HookdumpError(f"building {spec!r} failed: {exc}; check {opt('model_args')}") from exc
    except Exception as exc:
        raise HookdumpError(f"building {spec!r} raised {type(exc).__name__}: {exc}") from exc
    if not isinstance(module, nn.Module):
        raise HookdumpError(f"{spec!r} returned a {type(module).__name__}, not a torch.nn.Module")
    return module
