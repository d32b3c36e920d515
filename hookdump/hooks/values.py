"""What a capture's hooks hand over: structured values flattened to dotted parts, the
non-tensor leaves noted instead (`Skipped`), the capture kinds asked for, and where the
copies go (`Receiver`; `Tensors`, a dict, by default)."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import torch

from hookdump.choices import CAPTURE_KINDS, CaptureKind
from hookdump.errors import HookdumpError, opt
from hookdump.format.keys import KeyInfo


@dataclass(frozen=True)
class Skipped:
    """A non-tensor leaf met where a tensor could have been (e.g. `None`, an int)."""

    key: str
    type: str


def flatten(value: Any, prefix: str | None = None) -> Iterator[tuple[str | None, Any]]:
    """The leaves of a structured value, each with its dotted path (None for a bare tensor)."""
    parts = None if isinstance(value, torch.Tensor) else _parts(value)
    if parts is None:
        yield prefix, value
        return
    for name, part in parts:
        yield from flatten(part, str(name) if prefix is None else f"{prefix}.{name}")


def _parts(value: Any) -> Iterator[tuple[object, Any]] | None:
    """The named parts of a structured value (None for a leaf)."""
    if isinstance(value, Mapping):  # dict, OrderedDict, HF-style ModelOutput
        return iter(value.items())
    if isinstance(value, tuple) and hasattr(value, "_fields"):  # named tuple
        return ((name, getattr(value, name)) for name in value._fields)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return ((f.name, getattr(value, f.name)) for f in dataclasses.fields(value))
    if isinstance(value, list | tuple):
        return enumerate(value)
    return None


def parse_capture(capture: str | Sequence[str]) -> tuple[CaptureKind, ...]:
    """Validate `--capture` (a comma-separated string or a list) into a tuple of kinds."""
    items = capture.split(",") if isinstance(capture, str) else list(capture)
    named = dict.fromkeys(item.strip() for item in items if item.strip())
    kinds = tuple(_kind(name) for name in named)
    if not kinds:
        raise HookdumpError(f"{opt('capture')} is empty; use any of {','.join(CAPTURE_KINDS)}")
    return kinds


def _kind(name: str) -> CaptureKind:
    for kind in CAPTURE_KINDS:
        if name == kind:
            return kind
    raise HookdumpError(
        f"{opt('capture')} {name!r} is not a capture kind; use any of {','.join(CAPTURE_KINDS)}"
    )


class Receiver(Protocol):
    """Where captured values go: `Capture.tensors` by default, the runner's writer thread in a
    run (`dump.sink.BatchSink`)."""

    def keep(self, key: str, tensor: torch.Tensor, info: KeyInfo, fresh: bool) -> None:
        """One captured value. Unless `fresh` (a new tensor nothing else holds), it may still
        be changed by a later in-place op: copy it before returning."""


class Tensors:
    """The default receiver: copies kept in a dict, in the order the hooks fired."""

    def __init__(self) -> None:
        self.tensors: dict[str, torch.Tensor] = {}

    def keep(self, key: str, tensor: torch.Tensor, info: KeyInfo, fresh: bool) -> None:
        self.tensors[key] = tensor if fresh else tensor.clone()

    def clear(self) -> None:
        self.tensors = {}
