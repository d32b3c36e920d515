"""What `hookdump run` takes (`RunOptions`, filled in by the CLI or a script) and what it gives
back (`RunResult`).

Each option is written once, here: the fields that shape a dump's contents are marked
`recipe`, and `--resume` compares exactly those (`RunOptions.recipe`).
"""

from __future__ import annotations

import dataclasses
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hookdump.errors import HookdumpError, opt
from hookdump.format import format_bytes
from hookdump.model.prepare import ModelOptions
from hookdump.store.stats import KeySummary
from hookdump.store.writer import DEFAULT_SHARD_BYTES

RECIPE = {"recipe": True}
REPR_KEYS = (
    12  # the keys a RunResult's repr lists  # field metadata: the option shapes the dump's contents
)


@dataclass
class RunOptions:
    """Everything `hookdump run` takes; the CLI fills it in, a script may too.

    Args:
        model: a torchvision name, `package.module:attribute`, or a model file.
        layers, exclude, types: which modules to hook (globs over qualified names, and class
            names); no `layers` means every leaf module.
        capture: any of `output`, `input`, `grad`, comma-separated.
        reduce: `none`, `mean`, `max` or `flatten` over each captured tensor's spatial or
            token dims.
        grad_target: the objective of `capture="grad"`: `sum`, or an index into dim 1.
        weights: `none`, a torchvision weights name, or a checkpoint file.
        strict: missing or unexpected checkpoint keys are an error.
        unsafe_pickle: allow a pickled whole module as `model` (runs its code).
        model_args: `key=value` keyword arguments for the model's class or factory.
        input: `random`, an image, a folder, a glob, a list file, `-`, or a tensor file.
        text: text instead of `input`: a `.txt` or `.jsonl` file, a folder of `.txt` files,
            or `-` (see `inputs.text`); tokenized with the model folder's tokenizer.
        text_field: the document's field in `.jsonl` objects.
        tokenizer: a folder holding a tokenizer (default: the `hf:` model's).
        context_size: pack the documents into windows of this many tokens (None: a
            document per sample, padded to `max_length`).
        bos: packed windows start with the BOS token.
        max_length: tokens of a document sample (None: 128, or the model's positions).
        max_tokens: the most whole samples whose tokens add up to no more than this.
        per_token: one row per real token of every `[B, T, ...]` tensor (text only), with
            `__token_ids__`, `__sample__` and `__position__` beside (see `run.tokens`).
        positions: `START:STOP`, the positions kept of each sample's real tokens.
        skip_special_tokens: drop the tokenizer's special tokens' rows.
        input_shape: the per-sample shape of random input, e.g. `3,224,224`.
        image_size: crop images to this size (default: the weights' or the model's own).
        skip_bad_inputs: skip undecodable images (listed in the manifest) instead of failing.
        workers: image-decoding worker processes.
        batch_size: samples per forward.
        num_samples: random samples in all, or the most file samples (default: one batch of
            random input, every file).
        seed: seeds the model's construction and the random input.
        device: `auto`, `cpu`, `cuda` or `cuda:N`.
        dtype: the forward's precision: `float32`, `float16` or `bfloat16`.
        save_dtype: the dtype written to disk (default: as captured).
        out: the dump folder; None writes nothing (statistics only).
        overwrite: replace a dump already in `out`.
        resume: finish an interrupted dump in `out`.
        train: run the model in train mode.
        early_stop: end each forward once every selected module has made all its calls.
        shard_bytes: about how many bytes go into one shard file.
        command: the command line, recorded in the manifest.
        config: the config file the options came from (never read from inside `out`).

    Example:
        >>> from hookdump.run.runner import run
        >>> result = run(RunOptions(model="resnet18", layers=["layer1.*"], out=Path("acts")))
        >>> result.num_samples
        8
    """

    model: str = field(metadata=RECIPE)
    layers: list[str] = field(default_factory=list, metadata=RECIPE)
    exclude: list[str] = field(default_factory=list, metadata=RECIPE)
    types: list[str] = field(default_factory=list, metadata=RECIPE)
    capture: str = field(default="output", metadata=RECIPE)
    reduce: str = field(default="none", metadata=RECIPE)
    grad_target: str = field(default="sum", metadata=RECIPE)
    weights: str = field(default="none", metadata=RECIPE)
    strict: bool = True
    unsafe_pickle: bool = False
    model_args: list[str] = field(default_factory=list, metadata=RECIPE)
    input: str = field(default="random", metadata=RECIPE)
    text: str | None = field(default=None, metadata=RECIPE)
    text_field: str = field(default="text", metadata=RECIPE)
    tokenizer: str | None = field(default=None, metadata=RECIPE)
    context_size: int | None = field(default=None, metadata=RECIPE)
    bos: bool = field(default=True, metadata=RECIPE)
    max_length: int | None = field(default=None, metadata=RECIPE)
    max_tokens: int | None = field(default=None, metadata=RECIPE)
    per_token: bool = field(default=False, metadata=RECIPE)
    positions: str | None = field(default=None, metadata=RECIPE)
    skip_special_tokens: bool = field(default=False, metadata=RECIPE)
    input_shape: str | None = field(default=None, metadata=RECIPE)
    image_size: int | None = field(default=None, metadata=RECIPE)
    skip_bad_inputs: bool = field(default=False, metadata=RECIPE)
    workers: int = 2
    batch_size: int = field(default=8, metadata=RECIPE)
    num_samples: int | None = field(default=None, metadata=RECIPE)
    seed: int = field(default=0, metadata=RECIPE)
    device: str = "auto"
    dtype: str = field(default="float32", metadata=RECIPE)
    save_dtype: str | None = field(default=None, metadata=RECIPE)
    out: Path | None = None
    overwrite: bool = False
    resume: bool = False
    train: bool = field(default=False, metadata=RECIPE)
    early_stop: bool = True
    shard_bytes: int = DEFAULT_SHARD_BYTES
    command: list[str] = field(default_factory=lambda: list(sys.argv))
    config: Path | None = None

    def recipe(self) -> dict[str, Any]:
        """The options that shape the dump's contents, by name: `resume` needs the same."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.metadata}

    def model_options(self, device: str | None = None) -> ModelOptions:
        """The options that build the model (`device`: a torchrun rank's own)."""
        return ModelOptions(
            model=self.model,
            weights=self.weights,
            model_args=list(self.model_args),
            seed=self.seed,
            device=device or self.device,
            train=self.train,
            strict=self.strict,
            unsafe_pickle=self.unsafe_pickle,
        )


@dataclass
class RunResult:
    """What a run captured and where it went."""

    model: str
    out: Path | None
    num_samples: int  # rows: samples, or tokens with per_token
    keys: list[KeySummary]
    skipped: list[dict[str, str]]
    wall_time: float
    manifest: dict[str, Any] | None = None
    skipped_inputs: list[dict[str, str]] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    timings: dict[str, float] = field(default_factory=dict)  # seconds: load, loop, finish
    num_sequences: int | None = None  # the samples fed, when rows are tokens
    estimated_bytes: int | None = None  # the disk-space estimate made after the first batch

    @property
    def total_bytes(self) -> int:
        return sum(k.nbytes for k in self.keys)

    def __repr__(self) -> str:
        """The summary in short: the run, then a line per key (the first REPR_KEYS)."""
        rows = f"{self.num_samples} tokens" if self.num_sequences is not None else (
            f"{self.num_samples} samples"
        )  # fmt: skip
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
