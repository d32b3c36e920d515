"""Loading weights: state-dict checkpoints (never unpickling code) and torchvision's enums."""

from __future__ import annotations

import functools
import hashlib
import os
import pickle
import socket
import warnings
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import safetensors
import torch
from safetensors.torch import load_file
from torch import nn

from hookdump.errors import HookdumpError, Message, did_you_mean, opt

CHECKPOINT_SUFFIXES = (".safetensors", ".pt", ".pth", ".bin")
_WRAPPERS = ("state_dict", "model")  # {"state_dict": {...}, "epoch": 3} and the like
_PREFIXES = ("module.", "_orig_mod.")  # DDP and torch.compile
_SHOWN = 3


def is_checkpoint_path(value: str) -> bool:
    """True when `--weights` names a file rather than a torchvision weights name."""
    return Path(value).suffix in CHECKPOINT_SUFFIXES or os.sep in value or Path(value).is_file()


def sha256(path: Path) -> str:
    """The file's SHA-256, for the manifest (computed once per run for a file that does not
    change meanwhile)."""
    info = path.stat()
    return _sha256(str(path.resolve()), info.st_size, info.st_mtime_ns)


def state_sha256(module: nn.Module) -> str:
    """The SHA-256 of a live module's state dict: every parameter's and buffer's name,
    dtype, shape and bytes, in order (what a checkpoint of it would hold)."""
    digest = hashlib.sha256()
    with torch.no_grad():
        for name, tensor in module.state_dict(keep_vars=False).items():
            if not isinstance(tensor, torch.Tensor):
                continue
            if nn.parameter.is_lazy(tensor):  # a Lazy module's, made by its first forward
                digest.update(f"{name}|lazy|".encode())
                continue
            digest.update(f"{name}|{tensor.dtype}|{list(tensor.shape)}|".encode())
            flat = tensor.detach().cpu().contiguous().reshape(-1)
            if flat.numel():
                digest.update(flat.view(torch.uint8).numpy().data)
    return digest.hexdigest()


@functools.lru_cache(maxsize=8)
def _sha256(path: str, size: int, mtime_ns: int) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


SAVE_STATE_DICT = (
    "save a state dict (`torch.save(model.state_dict(), ...)`) or .safetensors instead"
)


def torch_load_safely(path: Path, what: str, fix: str = SAVE_STATE_DICT) -> Any:
    """`torch.load(weights_only=True)`: a pickle that would run code is refused, not run
    (`fix`: what the refusal suggests)."""
    try:
        with warnings.catch_warnings():  # torch's notes on pickle protocols: noise here
            warnings.simplefilter("ignore")
            return torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as exc:
        raise HookdumpError(
            f"{what} {path} holds pickled objects that would run code when loaded, so it was "
            f"refused and nothing in it was executed ({_unpickler_reason(str(exc))}); {fix}"
        ) from None
    except (OSError, RuntimeError, EOFError, ValueError) as exc:
        message = " ".join(str(exc).split())[:200]
        raise HookdumpError(f"{what} {path} is not a readable torch file: {message}") from None


def _unpickler_reason(text: str) -> str:
    """The part of torch's weights-only refusal that names what was refused."""
    _, marker, rest = text.partition("WeightsUnpickler error:")
    # torch's advice after "Please use" (allow-list the global) is not ours to give
    reason = rest.split("Check the documentation")[0].split("Please use")[0] if marker else text
    reason = " ".join(reason.split()).rstrip(".")
    if len(reason) > 160:  # cut at a word, and say so
        reason = reason[:160].rsplit(" ", 1)[0].rstrip(".,;:") + " …"
    return reason or "refused by torch's weights-only loader"


def load_checkpoint(path: Path) -> dict[str, torch.Tensor]:
    """A state dict from a checkpoint file, unwrapped and with DDP/compile prefixes removed."""
    if not path.is_file():
        raise HookdumpError(f"{opt('weights')} {path}: no such file")
    if path.suffix == ".safetensors":
        try:
            state: Any = load_file(path)
        except (OSError, safetensors.SafetensorError) as exc:
            raise HookdumpError(
                f"{opt('weights')} {path} is not a readable safetensors file: {exc}"
            ) from None
    else:
        state = torch_load_safely(path, opt("weights"))
    for _ in range(len(_WRAPPERS) + 1):
        if _is_state_dict(state):
            break
        inner = next((state[k] for k in _WRAPPERS if isinstance(state, dict) and k in state), None)
        if inner is None:
            break
        state = inner
    if not _is_state_dict(state):
        shown = list(state)[:5] if isinstance(state, dict) else type(state).__name__
        raise HookdumpError(
            f"{opt('weights')} {path} holds no state dict (found {shown}); expected tensors by "
            "parameter name, at the top or under 'state_dict' or 'model'"
        )
    return _strip_prefixes(state)


def _is_state_dict(value: Any) -> bool:
    return (
        isinstance(value, dict)
        and bool(value)
        and all(isinstance(k, str) and isinstance(v, torch.Tensor) for k, v in value.items())
    )


def _strip_prefixes(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    changed = True
    while changed:
        changed = False
        for prefix in _PREFIXES:
            if all(k.startswith(prefix) for k in state):
                state = {k[len(prefix) :]: v for k, v in state.items()}
                changed = True
    return state


def apply_state_dict(
    model: nn.Module,
    state: dict[str, torch.Tensor],
    source: str,
    strict: bool,
    takes_num_classes: bool = False,
) -> list[str]:
    """Load `state` into `model`; an error (strict) or warnings (not) for what does not fit.
    `takes_num_classes`: the model's builder takes `num_classes` (torchvision's, timm's), so
    a classifier head of another size is named as the fix."""
    own = model.state_dict()
    mismatched = [
        f"{k} (checkpoint {list(v.shape)}, model {list(own[k].shape)})"
        for k, v in state.items()
        if k in own and v.shape != own[k].shape
    ]
    fitting = {k: v for k, v in state.items() if k in own and v.shape == own[k].shape}
    missing = [k for k in own if k not in state]
    unexpected = [k for k in state if k not in own]
    problems = [
        _listing(len(items), label, items)
        for items, label in (
            (missing, "missing"),
            (unexpected, "unexpected"),
            (mismatched, "with another shape"),
        )
        if items
    ]
    if problems and strict:
        classes = _head_classes(own, state) if takes_num_classes and not missing else None
        fix = (
            f"build the model for them with {opt('model_args')} num_classes={classes}, or "
            if classes is not None
            else "fix the checkpoint or "
        )
        raise HookdumpError(
            f"{opt('weights')} {source} does not fit the model: {'; '.join(problems)}; {fix}"
            f"pass {opt('strict', False)} to load the keys that fit"
        )
    model.load_state_dict(fitting, strict=False)
    return [
        Message(f"{opt('weights')} {source}: {p}; loaded the {len(fitting)} keys that fit")
        for p in problems
    ]


def _head_classes(own: dict[str, torch.Tensor], state: dict[str, torch.Tensor]) -> int | None:
    """The checkpoint's number of classes, when the only keys of another shape are the
    model's last layer's and differ in their first dimension alone (a head for N classes)."""
    other = [k for k, v in state.items() if k in own and v.shape != own[k].shape]
    last = next((k.rpartition(".")[0] for k in reversed(own) if k.endswith(".weight")), None)
    if not other or last is None or any(k.rpartition(".")[0] != last for k in other):
        return None
    if any(state[k].shape[1:] != own[k].shape[1:] for k in other):
        return None
    return int(state[other[0]].shape[0])


def _listing(count: int, label: str, items: list[str]) -> str:
    shown = ", ".join(items[:_SHOWN]) + (", ..." if count > _SHOWN else "")
    return f"{count} key{'s' if count != 1 else ''} {label} ({shown})"


def torchvision_weights(model_name: str, name: str) -> Any:
    """The weights enum member `name` (`DEFAULT`, `IMAGENET1K_V2`) of a torchvision model."""
    import torchvision.models as tvm

    try:
        enum = tvm.get_model_weights(model_name)
    except (ValueError, KeyError):
        raise HookdumpError(
            f"{opt('weights')} {name}: {model_name} has no torchvision weights"
        ) from None
    choices = ["DEFAULT", *(w.name for w in enum)]
    short = name.rpartition(".")[2]  # also accept ResNet50_Weights.IMAGENET1K_V2
    if short not in choices:
        raise HookdumpError(
            f"{opt('weights')} {name!r} is not a weights name of {model_name}"
            f"{did_you_mean(short, choices)}; choose one of {', '.join(choices)}, or give a "
            "checkpoint file"
        )
    return enum.DEFAULT if short == "DEFAULT" else enum[short]


def cached_weights_file(weights: Any) -> Path:
    """Where torch's hub cache keeps these weights (`$TORCH_HOME/hub/checkpoints/...`)."""
    return Path(torch.hub.get_dir()) / "checkpoints" / Path(urlparse(weights.url).path).name


def ensure_cached(weights: Any) -> Path:
    """The cached weights file, downloaded first if the network allows; never a hang."""
    path = cached_weights_file(weights)
    if path.is_file():
        return path
    host = urlparse(weights.url).hostname or ""
    if not can_download(host):
        raise HookdumpError(
            f"{opt('weights')} {weights}: not in torch's cache and {host} cannot be reached; put "
            f"{weights.url} at {path} (or set TORCH_HOME to a cache that has it)"
        )
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.hub.download_url_to_file(weights.url, str(path), progress=True)
    return path


def offline() -> bool:
    """Whether downloads are off: HOOKDUMP_OFFLINE set, or HF_HUB_OFFLINE=1."""
    hub = os.environ.get("HF_HUB_OFFLINE", "")
    return bool(os.environ.get("HOOKDUMP_OFFLINE")) or hub not in ("", "0")


def can_download(host: str, timeout: float = 3.0) -> bool:
    """Whether a download from `host` may be tried: downloads are on and the host answers
    within `timeout` (so a closed network is never a hang)."""
    if offline():
        return False
    try:
        socket.create_connection((host, 443), timeout=timeout).close()
    except OSError:
        return False
    return True
