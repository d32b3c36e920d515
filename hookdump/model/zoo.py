"""Models from the two largest zoos after torchvision: Hugging Face transformers (`hf:PATH`,
`hf:ORG/NAME`, or a folder holding `config.json`) and timm (`timm:NAME`).

Both need an optional extra (`hookdump[hf]`, `hookdump[timm]`); without it, one line says
which to install. Nothing is downloaded when HF_HUB_OFFLINE=1 or HOOKDUMP_OFFLINE=1, and
otherwise only when the hub answers (never a hang).
"""

from __future__ import annotations

import contextlib
import importlib
from collections.abc import Iterator
from fnmatch import fnmatchcase
from pathlib import Path
from typing import Any

import torch
from PIL import Image

from hookdump.errors import HookdumpError, did_you_mean, opt
from hookdump.model.weights import can_download, offline

HF_PREFIX, TIMM_PREFIX = "hf:", "timm:"
HUB_HOST = "huggingface.co"
_HF_WEIGHTS = ("*.safetensors", "*.bin", "*.pt", "*.pth")


def is_zoo_spec(spec: str) -> bool:
    """True when MODEL names a Hugging Face or timm model (these prefixes win over
    `package.module:attribute`), or a folder holding a `config.json`."""
    return spec.startswith((HF_PREFIX, TIMM_PREFIX)) or (Path(spec) / "config.json").is_file()


def require(module: str, extra: str, spec: str) -> Any:
    """Import an optional dependency, or say which extra installs it."""
    try:
        return importlib.import_module(module)
    except ImportError:
        raise HookdumpError(
            f"{opt('model')} {spec} needs {module}, which is not installed; install it with "
            f"pip install 'hookdump[{extra}]'"
        ) from None


# --- Hugging Face -------------------------------------------------------------------------


def hf_folder(spec: str) -> Path:
    """The local folder of `hf:PATH` (a path that exists wins) or `hf:ORG/NAME` (the Hugging
    Face cache, downloaded into it only where allowed)."""
    target = spec.removeprefix(HF_PREFIX)
    if Path(target).is_dir():
        if not (Path(target) / "config.json").is_file():
            raise HookdumpError(
                f"{opt('model')} {spec}: {target} holds no config.json; give a folder saved "
                "with save_pretrained, or hf:ORG/NAME"
            )
        return Path(target)
    if target.count("/") != 1 or target.startswith((".", "/")):
        raise HookdumpError(
            f"{opt('model')} {spec}: no such folder, and not a Hugging Face repo id (ORG/NAME)"
        )
    hub = require("huggingface_hub", "hf", spec)
    try:
        return Path(hub.snapshot_download(target, local_files_only=not can_download(HUB_HOST)))
    except Exception as exc:
        where = hub.constants.HF_HUB_CACHE
        why = "downloads are off" if offline() else f"{HUB_HOST} cannot be reached"
        raise HookdumpError(
            f"{opt('model')} {spec} is not in the Hugging Face cache (looked in {where}) and "
            f"{why}; download it once, or give the folder (hf:PATH)"
        ) from exc


def load_hf(spec: str, model_args: dict[str, Any], strict: bool) -> dict[str, Any]:
    """Build a transformers model through `from_pretrained` with the class its config names
    first in `architectures` (AutoModel when it names none), so a checkpoint loads as it was
    saved. Returns the module and what the rest of hookdump needs to know about it."""
    transformers = require("transformers", "hf", spec)
    folder = hf_folder(spec)
    with _quiet(transformers):
        config = transformers.AutoConfig.from_pretrained(folder)
    names = getattr(config, "architectures", None) or []
    cls = getattr(transformers, names[0], None) if names else transformers.AutoModel
    if cls is None:
        raise HookdumpError(
            f"{opt('model')} {spec}: config.json names the class {names[0]!r}, which "
            f"transformers {transformers.__version__} does not have"
        )
    try:
        with _quiet(transformers):
            module, info = cls.from_pretrained(folder, output_loading_info=True, **model_args)
    except (TypeError, ValueError) as exc:
        raise HookdumpError(
            f"building {spec} failed: {' '.join(str(exc).split())[:200]}; check {opt('model_args')}"
        ) from exc
    problems = [
        f"{len(keys)} {kind.replace('_', ' ')} ({', '.join(list(keys)[:3])})"
        for kind, keys in info.items()
        if kind in ("missing_keys", "unexpected_keys") and keys
    ]
    if problems and strict:
        raise HookdumpError(
            f"{opt('model')} {spec} does not load as saved: {'; '.join(problems)}; fix the "
            f"checkpoint or pass {opt('strict', False)}"
        )
    return {
        "module": module,
        "folder": folder,
        "config_class": type(config).__name__,
        "class_name": cls.__name__,
        "files": sorted(p for pattern in _HF_WEIGHTS for p in folder.glob(pattern)),
        "transforms": _hf_image_processor(transformers, folder),
        "config": config,
        "warnings": [f"{opt('model')} {spec}: {p}" for p in problems],
    }


@contextlib.contextmanager
def _quiet(transformers: Any) -> Iterator[None]:
    """No progress bars or notes from transformers on stderr while a model loads."""
    logging = transformers.utils.logging
    bars, level = logging.is_progress_bar_enabled(), logging.get_verbosity()
    logging.disable_progress_bar()
    logging.set_verbosity_error()
    try:
        yield
    finally:
        logging.set_verbosity(level)
        if bars:
            logging.enable_progress_bar()


def hf_input(config: Any) -> tuple[str, tuple[int, ...], int]:
    """(layout, per-sample shape, vocabulary) of random input for a transformers config:
    images from `image_size` and `num_channels`, else token ids (at most 128, within the
    model's positions)."""
    vision = getattr(config, "vision_config", None) or config
    size = getattr(vision, "image_size", None)
    if size is not None:
        side = size if isinstance(size, int) else int(size[0])
        return "image", (int(getattr(vision, "num_channels", 3)), side, side), 0
    text = getattr(config, "text_config", None) or config
    positions = getattr(text, "max_position_embeddings", None) or getattr(text, "n_positions", 128)
    return "tokens", (min(128, int(positions)),), int(getattr(text, "vocab_size", 0) or 0)


def _hf_image_processor(transformers: Any, folder: Path) -> Any:
    """The folder's image processor as a PIL image -> [C, H, W] tensor transform (None
    without one)."""
    if not (folder / "preprocessor_config.json").is_file():
        return None
    processor = transformers.AutoImageProcessor.from_pretrained(folder)

    def transform(image: Image.Image) -> torch.Tensor:
        return processor(images=image, return_tensors="pt")["pixel_values"][0]

    return transform


def _tokenizer_file(name: str) -> bool:
    return "token" in name or name in ("vocab.txt", "vocab.json", "merges.txt", "spiece.model")


def load_tokenizer(folder: str | Path, spec: str) -> tuple[Any, list[Path]]:
    """The tokenizer saved in `folder` (`AutoTokenizer`), with the files it was read from."""
    transformers = require("transformers", "hf", spec)
    path = Path(folder)
    files = sorted(p for p in path.glob("*") if p.is_file() and _tokenizer_file(p.name))
    if not path.is_dir() or not files:
        raise HookdumpError(
            f"{opt('tokenizer')} {folder}: no tokenizer files there; give a folder saved with "
            "save_pretrained"
        )
    try:
        with _quiet(transformers):
            return transformers.AutoTokenizer.from_pretrained(path), files
    except (OSError, ValueError) as exc:
        raise HookdumpError(
            f"{opt('tokenizer')} {folder}: cannot load a tokenizer ({str(exc)[:200]})"
        ) from exc


# --- timm ---------------------------------------------------------------------------------


def load_timm(spec: str, model_args: dict[str, Any], pretrained: bool) -> dict[str, Any]:
    """`timm.create_model(NAME, pretrained=..., **model_args)`, with timm's own preprocessing
    for it (`resolve_model_data_config`, which takes the model's input size into account)."""
    timm = require("timm", "timm", spec)
    name = spec.removeprefix(TIMM_PREFIX)
    if name not in timm.list_models():
        raise HookdumpError(
            f"{opt('model')} {spec}: timm has no model {name!r}"
            f"{did_you_mean(name, timm.list_models())}; `hookdump models --source timm` "
            "lists them (timm:NAME)"
        )
    try:
        with _cache_only(pretrained and not can_download(HUB_HOST)):
            module = timm.create_model(name, pretrained=pretrained, **model_args)
    except TypeError as exc:
        raise HookdumpError(f"building {spec} failed: {exc}; check {opt('model_args')}") from exc
    except Exception as exc:
        if not pretrained:
            raise
        raise HookdumpError(
            f"{opt('weights')} pretrained: timm's weights for {name} are not in the local "
            f"cache and cannot be downloaded here ({type(exc).__name__}); download them once"
        ) from exc
    config = timm.data.resolve_model_data_config(module)
    return {
        "module": module,
        "transforms": timm.data.create_transform(**config, is_training=False),
        "input_shape": tuple(int(d) for d in config["input_size"]),
    }


@contextlib.contextmanager
def _cache_only(active: bool) -> Iterator[None]:
    """While `active`, weights come from the local caches only: huggingface_hub is told it
    is offline, and torch.hub refuses to download (timm fetches through either)."""
    if not active:
        yield
        return
    import huggingface_hub.constants as hub

    def refuse(url: str, *args: Any, **kwargs: Any) -> None:
        raise OSError(f"not downloading {url}: offline")

    offline_before, download = hub.HF_HUB_OFFLINE, torch.hub.download_url_to_file
    hub.HF_HUB_OFFLINE, torch.hub.download_url_to_file = True, refuse
    try:
        yield
    finally:
        hub.HF_HUB_OFFLINE, torch.hub.download_url_to_file = offline_before, download


def list_timm(pattern: str | None) -> list[str]:
    """timm's model names matching the glob `pattern` (all without one)."""
    timm = require("timm", "timm", "timm:NAME")
    names = timm.list_models()
    return [n for n in names if pattern is None or fnmatchcase(n, pattern)]
