"""What `hookdump run` takes (`RunOptions`: a group of options per stage, filled in by the
CLI, `hookdump.dump` or a script) and what it gives back (`RunResult`)."""

from __future__ import annotations

import dataclasses
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from hookdump.errors import HookdumpError, opt
from hookdump.format.dtypes import dtype_name
from hookdump.format.manifest import recipe
from hookdump.format.values import format_bytes
from hookdump.hooks.options import CaptureOptions
from hookdump.hooks.tokens import TokenOptions, positions_text
from hookdump.inputs.generation import Generation
from hookdump.inputs.samples import InputOptions
from hookdump.inputs.text import TextOptions
from hookdump.model.prepare import ModelOptions
from hookdump.store.stats import KeySummary
from hookdump.store.write.writer import DumpOptions

REPR_KEYS = 12  # the keys a RunResult's repr lists


@dataclass(frozen=True)
class RunOptions:
    """Everything `hookdump run` takes, grouped by the stage that uses it; the CLI parses its
    strings into these types, `hookdump.dump` fills them in from its arguments, a script may
    too. Each option is one field, in one group; those marked `recipe` shape the dump's
    contents, and `--resume` compares exactly those (`recipe()`).

    Args:
        model: what builds the model (`model.prepare.ModelOptions`).
        capture: which modules, and what of them (`hooks.options.CaptureOptions`).
        input: how many samples, in what batches, from where (`inputs.samples.InputOptions`).
        text: text instead of `input.source` (`inputs.text.TextOptions`; None: no text).
        tokens: a row per token (`hooks.tokens.TokenOptions`; None: a row per sample).
        generate: the text's documents are prompts, and the rows are prompt + response
            (`inputs.generation.Generation`; token rows; None: the text is read as it is).
        dump: where the dump goes (`store.write.writer.DumpOptions`).
        dtype: the forward's precision (autocast for float16 and bfloat16).
        command: the command line, recorded in the manifest.
        config: the config file the options came from (never read from inside `out`).

    Example:
        >>> from hookdump.engine.runner import run
        >>> options = RunOptions(ModelOptions("resnet18"), CaptureOptions(layers=("layer1.*",)),
        ...                      dump=DumpOptions(out=Path("acts")))
        >>> run(options).num_samples
        8
    """

    model: ModelOptions
    capture: CaptureOptions = field(default_factory=CaptureOptions)
    input: InputOptions = field(default_factory=InputOptions)
    text: TextOptions | None = None
    tokens: TokenOptions | None = None
    generate: Generation | None = None
    dump: DumpOptions = field(default_factory=DumpOptions)
    dtype: torch.dtype = field(default=torch.float32, metadata=recipe())
    command: tuple[str, ...] = field(default_factory=lambda: tuple(sys.argv))
    config: Path | None = None

    def recipe(self) -> dict[str, Any]:
        """The options that shape the dump's contents, by name, as JSON values: `resume`
        needs the same. Text and token rows count by their presence too."""
        found: dict[str, Any] = {
            "text": None,
            "per_token": self.tokens is not None,
            "generate": None,
        }
        groups = (
            self,
            self.model,
            self.capture,
            self.input,
            self.text,
            self.tokens,
            self.generate,
            self.dump,
        )
        for group in groups:
            if group is None:
                continue
            for f in dataclasses.fields(group):
                name = f.metadata.get("recipe")
                if name:
                    found[f.name if name is True else name] = _plain(getattr(group, f.name))
        if self.text is not None:  # the samples are the text's: no --input was read
            found["input"] = None
        return found


def _plain(value: Any) -> Any:
    """An option's value as the manifest's JSON holds it (and as the CLI spells it)."""
    if isinstance(value, torch.dtype):
        return dtype_name(value)
    if isinstance(value, slice):
        return positions_text(value)
    if isinstance(value, tuple | list):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, Path):
        return str(value)
    return value


@dataclass
class RunResult:
    """What a run captured and where it went."""

    model: str
    out: Path | str | None  # a folder, or a URL
    num_samples: int  # rows: samples, or tokens with per_token
    keys: list[KeySummary]
    skipped: list[dict[str, str]]
    manifest: dict[str, Any] | None = None
    skipped_inputs: list[dict[str, str]] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    timings: dict[str, float] = field(default_factory=dict)  # seconds: load, loop, finish
    num_sequences: int | None = None  # the samples fed, when rows are tokens
    estimated_bytes: int | None = None  # the disk-space estimate made after the first batch
    real_tokens: float | None = None  # text: the fraction of positions computed that were real

    @property
    def wall_time(self) -> float:
        """Seconds the run took: loading, the loop and finishing."""
        return sum(self.timings.values())

    @property
    def total_bytes(self) -> int:
        return sum(k.nbytes for k in self.keys)

    def __repr__(self) -> str:
        """The summary in short: the run, then a line per key (the first REPR_KEYS)."""
        rows = (
            f"{self.num_samples} tokens"
            if self.num_sequences is not None
            else (f"{self.num_samples} samples")
        )
        where = f" -> {str(self.out)!r}" if self.out is not None else ""
        head = (
            f"RunResult({self.model!r}{where}: {rows}, {len(self.keys)} keys, "
            f"{format_bytes(self.total_bytes)}, {self.wall_time:.1f} s)"
        )
        shown = self.keys[:REPR_KEYS]
        width = max((len(k.info.key) for k in shown), default=0)
        lines = [
            f"  {k.info.key:<{width}}  {list(k.shape)!s:<16} {k.dtype:<8} "
            f"mean {k.stats.mean:<10.4g} std {k.stats.std:<10.4g} "
            f"nan {k.stats.nan} inf {k.stats.inf}"
            for k in shown
        ]
        if len(self.keys) > REPR_KEYS:
            lines.append(f"  ... {len(self.keys) - REPR_KEYS} more keys")
        return "\n".join([head, *lines])

    def nonfinite(self) -> list[KeySummary]:
        """The keys holding NaN or Inf, in forward order (the first is where it started)."""
        return [k for k in self.keys if k.stats.nan or k.stats.inf]

    def as_dict(self) -> dict[str, Any]:
        bad = self.nonfinite()
        return {
            "model": self.model,
            "out": str(self.out) if self.out else None,
            "num_samples": self.num_samples,
            "num_sequences": self.num_sequences,
            "estimated_bytes": self.estimated_bytes,
            "wall_time_s": round(self.wall_time, 3),
            "total_bytes": self.total_bytes,
            "tensors": [k.as_dict() for k in self.keys],
            "skipped": self.skipped,
            "skipped_inputs": self.skipped_inputs,
            "first_nonfinite": bad[0].info.key if bad else None,
        }


_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]?i?b?)?\s*$", re.IGNORECASE)
_UNITS = {"": 1, "k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12}


def parse_size(text: str) -> int:
    """'2GB' -> 2e9 bytes, '512MiB' -> 512 * 2**20, '1000' -> 1000."""
    match = _SIZE.match(text)
    if not match:
        raise HookdumpError(f"{opt('shard_size')} {text!r} is not a size; write e.g. 2GB or 512MiB")
    number, unit = float(match.group(1)), (match.group(2) or "").lower()
    prefix = unit[:1] if unit[:1] in "kmgt" else ""
    scale = 1024 ** "kmgt".index(prefix) * 1024 if "i" in unit and prefix else _UNITS[prefix]
    size = int(number * scale)
    if size < 1:
        raise HookdumpError(f"{opt('shard_size')} {text!r} must be at least one byte")
    return size
