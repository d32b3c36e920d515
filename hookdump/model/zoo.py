"""Models from the two largest zoos after torchvision: Hugging Face transformers (`hf:PATH`,
`hf:ORG/NAME`, or a folder holding `config.json`) and timm (`timm:NAME`).

Both need an optional extra (`hookdump[hf]`, `hookdump[timm]`); without it, one line says
which to install. Nothing is downloaded when HF_HUB_OFFLINE=1 or HOOKDUMP_OFFLINE=1, and
otherwise only when the hub answers (never a hang).
"""

from __future__ import annotations

import contextlib
import importlib
import itertools
import json
from collections.abc import Iterator
from dataclasses import dataclass
from fnmatch import fnmatchcase
from pathlib import Path
from typing import Any

import torch
from PIL import Image

from hookdump.errors import HookdumpError, did_you_mean, nearest, opt
from hookdump.model.weights import can_download, offline

HF_PREFIX, TIMM_PREFIX = "hf:", "timm:"
HUB_HOST = "huggingface.co"
_HF_WEIGHTS = ("*.safetensors", "*.bin", "*.pt", "*.pth")
# the files through which transformers' Auto classes find code in the folder (`auto_map`)
_HF_CONFIGS = (
    "config.json",
    "tokenizer_config.json",
    "preprocessor_config.json",
    "processor_config.json",
    "video_preprocessor_config.json",
)
_CONFIG_BYTES = 64 << 20  # a config.json is a few KB: more is not a config
# what every from_pretrained gets: the folder's own code never runs (unset, transformers
# asks on stdin whether to run it)
_NO_CODE = {"trust_remote_code": False}


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
            f"{opt('model')} {spec}: no such folder{_near_folders(target)}, and not a Hugging "
            "Face repo id (ORG/NAME)"
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


def _near_folders(target: str) -> str:
    """A did-you-mean of the folders beside where `target` points that hold a model
    (config.json), by name, written as the user wrote the path: `hf:./my-gtp2` ->
    `hf:./my-gpt2`."""
    path, prefix = Path(target), target[: target.rfind("/") + 1]
    try:
        names = [
            p.name
            for p in itertools.islice(path.parent.iterdir(), 1000)
            if (p / "config.json").is_file()
        ]
    except OSError:
        return ""
    found = nearest(path.name, names)
    return f" (did you mean {', '.join(f'hf:{prefix}{n}' for n in found)}?)" if found else ""


@dataclass(frozen=True)
class HFModel:
    """A transformers model built from a folder, with what the rest of hookdump needs."""

    module: Any
    folder: Path
    config: Any
    class_name: str
    files: list[Path]  # its weights files
    definition: list[Path]  # config, preprocessor and tokenizer files (--resume hashes them)
    transforms: Any  # the folder's image processor, if any
    warnings: list[str]


@dataclass(frozen=True)
class TimmModel:
    """A timm model with timm's own preprocessing for it and its input size."""

    module: Any
    transforms: Any
    input_shape: tuple[int, ...]


def _load_error(
    transformers: Any, cls: Any, config: Any, spec: str, exc: Exception
) -> HookdumpError:
    """What made `from_pretrained` fail, told apart: a missing package, a config.json that
    makes no model (0 heads, say: the model is built again from the config alone, with no
    memory), the arguments given, or else the weights files."""
    reason = f"{type(exc).__name__}: {_short(exc)}"
    if isinstance(exc, ImportError):
        return HookdumpError(
            f"{opt('model')} {spec}: building it needs a package that is not installed "
            f"({reason}); install it, or change config.json"
        )
    try:
        with _quiet(transformers), torch.device("meta"):
            cls(config)
    except Exception:  # the config alone fails: not the weights
        return HookdumpError(
            f"{opt('model')} {spec}: its config.json does not make a {cls.__name__} "
            f"({reason}); check config.json"
        )
    if isinstance(exc, TypeError | ValueError):
        return HookdumpError(f"building {spec} failed: {_short(exc)}; check {opt('model_args')}")
    return HookdumpError(
        f"{opt('model')} {spec}: loading the weights failed ({reason}); check the folder's "
        "weights files"
    )


def load_hf(spec: str, model_args: dict[str, Any], strict: bool) -> HFModel:
    """Build a transformers model through `from_pretrained` with the class its config names
    first in `architectures` (AutoModel when it names none), so a checkpoint loads as it was
    saved. Returns the module and what the rest of hookdump needs to know about it."""
    transformers = require("transformers", "hf", spec)
    folder = hf_folder(spec)
    refuse_folder_code(folder, f"{opt('model')} {spec}")
    config = _hf_config(transformers, folder, spec)
    cls = _hf_class(transformers, config, spec)
    if "trust_remote_code" in model_args:
        raise HookdumpError(
            f"{opt('model_args')} trust_remote_code: hookdump never runs a model folder's own "
            "code; load the model in Python and give it as package.module:attribute"
        )
    try:
        with _quiet(transformers):
            module, info = cls.from_pretrained(
                folder, output_loading_info=True, **_NO_CODE, **model_args
            )
    except Exception as exc:  # a pickled .bin, a weights file of the wrong size, a config...
        raise _load_error(transformers, cls, config, spec, exc) from exc
    if getattr(module.config, "use_cache", None) and "use_cache" not in model_args:
        # a dump runs each forward once: a key-value cache is never read, yet it costs time
        # and its updates would show up as the attention modules' own ops (`op.cat`)
        module.config.use_cache = False
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
    return HFModel(
        module=module,
        folder=folder,
        config=config,
        class_name=cls.__name__,
        files=sorted(p for pattern in _HF_WEIGHTS for p in folder.glob(pattern)),
        definition=[folder / n for n in _HF_CONFIGS if (folder / n).is_file()]
        + [p for p in _tokenizer_files(folder) if p.name not in _HF_CONFIGS],
        transforms=_hf_image_processor(transformers, folder),
        warnings=[f"{opt('model')} {spec}: {p}" for p in problems],
    )


def refuse_folder_code(folder: Path, label: str) -> None:
    """Refuse a folder whose config files point transformers at code in the folder or on the
    hub (`auto_map`): hookdump never runs it, and never asks. `label` names the folder in
    the message (`MODEL hf:x`)."""
    for name in _HF_CONFIGS:
        data = read_config(folder / name, label)
        auto_map = data.get("auto_map") if isinstance(data, dict) else None
        if auto_map:
            code = sorted({str(v).split(".")[0] for v in _strings(auto_map)})
            raise HookdumpError(
                f"{label}: {name} names code to run ({', '.join(code[:3])}; "
                "auto_map), and hookdump never runs a model folder's own code; load the model "
                "in Python and give it as package.module:attribute"
            )


def read_config(path: Path, label: str) -> Any:
    """A folder's JSON config file, parsed (None where there is none)."""
    if not path.is_file():
        return None
    try:
        with path.open("rb") as file:
            raw = file.read(_CONFIG_BYTES + 1)
        if len(raw) > _CONFIG_BYTES:
            raise ValueError(f"over {_CONFIG_BYTES >> 20} MiB")
        return json.loads(raw)
    except (OSError, ValueError, RecursionError) as exc:
        raise HookdumpError(
            f"{label}: {path.name} is not a readable JSON file "
            f"({_short(exc)}); give a folder saved with save_pretrained"
        ) from None


def _strings(value: Any) -> Iterator[str]:
    """The strings in an `auto_map` value (a string, a list, or a mapping of them)."""
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for item in value.values():
            yield from _strings(item)
    elif isinstance(value, list):
        for item in value:
            yield from _strings(item)


def _hf_config(transformers: Any, folder: Path, spec: str) -> Any:
    """The folder's config, as transformers reads it; every way it can fail is one line."""
    data = read_config(folder / "config.json", f"{opt('model')} {spec}")
    if not isinstance(data, dict):
        raise HookdumpError(
            f"{opt('model')} {spec}: config.json holds {type(data).__name__}, not an object; "
            "give a folder saved with save_pretrained"
        )
    try:
        with _quiet(transformers):
            return transformers.AutoConfig.from_pretrained(folder, **_NO_CODE)
    except Exception as exc:  # an unknown model_type, a value of the wrong type...
        raise HookdumpError(
            f"{opt('model')} {spec}: transformers cannot read its config.json "
            f"({type(exc).__name__}: {_short(exc)})"
        ) from exc


def _hf_class(transformers: Any, config: Any, spec: str) -> Any:
    """The model class `architectures` names first (AutoModel when it names none)."""
    names = getattr(config, "architectures", None) or []
    if not isinstance(names, list | tuple) or not all(isinstance(n, str) for n in names):
        raise HookdumpError(
            f"{opt('model')} {spec}: config.json's architectures is {names!r:.60}, not a list "
            "of class names"
        )
    if not names:
        return transformers.AutoModel
    cls = getattr(transformers, names[0], None) if names[0].isidentifier() else None
    if not (isinstance(cls, type) and hasattr(cls, "from_pretrained")):
        raise HookdumpError(
            f"{opt('model')} {spec}: config.json names the class {names[0]!r:.80}, which "
            f"transformers {transformers.__version__} does not have"
        )
    return cls


def _short(exc: BaseException, limit: int = 200) -> str:
    """An exception's message on one line, cut at a word."""
    text = " ".join(str(exc).split())
    if len(text) <= limit:
        return text
    return text[:limit].rsplit(" ", 1)[0] + " ..."


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
    positions = hf_positions(config) or 128
    return "tokens", (min(128, positions),), int(getattr(text, "vocab_size", 0) or 0)


def hf_positions(config: Any) -> int | None:
    """The most tokens a text model's config allows in a sample (None: it does not say)."""
    text = getattr(config, "text_config", None) or config
    positions = getattr(text, "max_position_embeddings", None) or getattr(text, "n_positions", None)
    return int(positions) if isinstance(positions, int) and positions > 0 else None


def _hf_image_processor(transformers: Any, folder: Path) -> Any:
    """The folder's image processor as a PIL image -> [C, H, W] tensor transform (None
    without one)."""
    if not (folder / "preprocessor_config.json").is_file():
        return None
    try:
        with _quiet(transformers):
            processor = transformers.AutoImageProcessor.from_pretrained(folder, **_NO_CODE)
    except Exception as exc:
        raise HookdumpError(
            f"{opt('model')} {folder}: its preprocessor_config.json cannot be read "
            f"({type(exc).__name__}: {_short(exc)})"
        ) from exc

    def transform(image: Image.Image) -> torch.Tensor:
        return processor(images=image, return_tensors="pt")["pixel_values"][0]

    return transform


def _tokenizer_files(folder: Path) -> list[Path]:
    """The files of `folder` that a tokenizer is read from, sorted."""
    names = ("vocab.txt", "vocab.json", "merges.txt", "spiece.model")
    return sorted(
        p for p in folder.glob("*") if p.is_file() and ("token" in p.name or p.name in names)
    )


def has_tokenizer(folder: Path) -> bool:
    """Whether `folder` holds tokenizer files."""
    return folder.is_dir() and bool(_tokenizer_files(folder))


def load_tokenizer(folder: str | Path, spec: str, given: bool = True) -> tuple[Any, list[Path]]:
    """The tokenizer saved in `folder` (`AutoTokenizer`), with the files it was read from;
    `given`: the folder was named by `--tokenizer` (else it is the model's own, and errors
    name MODEL)."""
    transformers = require("transformers", "hf", spec)
    path = Path(folder)
    files = _tokenizer_files(path)
    label = f"{opt('tokenizer')} {folder}" if given else f"{opt('model')} {spec}"
    fix = (
        "give a folder saved with save_pretrained"
        if given
        else (f"give one with {opt('tokenizer')} PATH")
    )
    if not path.is_dir() or not files:
        raise HookdumpError(f"{label}: no tokenizer files there; {fix}")
    refuse_folder_code(path, label)
    try:
        with _quiet(transformers):
            return transformers.AutoTokenizer.from_pretrained(path, **_NO_CODE), files
    except Exception as exc:  # a wrong tokenizer.json raises whatever its parser raises
        raise HookdumpError(
            f"{label}: cannot load its tokenizer ({type(exc).__name__}: {_short(exc)}); {fix}"
        ) from exc


# --- timm ---------------------------------------------------------------------------------


def load_timm(spec: str, model_args: dict[str, Any], pretrained: bool) -> TimmModel:
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
    return TimmModel(
        module=module,
        transforms=timm.data.create_transform(**config, is_training=False),
        input_shape=tuple(int(d) for d in config["input_size"]),
    )


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
