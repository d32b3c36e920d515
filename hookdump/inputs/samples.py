"""Reading inputs: the per-sample input shape of a model and seeded random batches.

Random sample `i` depends only on `(seed, i)`, never on the batch size, so dumps made with
different `--batch-size` (or split over processes) hold the same rows.
"""

from __future__ import annotations

import dataclasses
import inspect
import math
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from hookdump.errors import HookdumpError, opt
from hookdump.format.manifest import recipe
from hookdump.model.loading import LoadedModel

DEFAULT_IMAGE_SIZE = 224
DEFAULT_FRAMES = 16
DEFAULT_SEQUENCE = 32
MAX_SAMPLE_ELEMENTS = 1 << 31  # --input-shape: 8 GiB of float32 for one random sample


@dataclass(frozen=True)
class SampleForm:
    """What one sample looks like and how samples are passed to `forward`."""

    # image: one batched tensor; detection: a list of per-sample tensors;
    # flow: two batched tensors (image pairs); tokens: batched int64 ids below `vocab`
    layout: str
    shape: tuple[int, ...]
    vocab: int = 0

    def describe(self) -> str:
        shape = ",".join(map(str, self.shape))
        extra = {"flow": " x2 (image pairs)", "tokens": f" token ids < {self.vocab}"}
        return f"random {shape}{extra.get(self.layout, '')}"


@dataclass(frozen=True)
class InputOptions:
    """How many samples, in what batches, and (unless the run reads text) from where.

    Args:
        source: `random`, an image, a folder, a glob, a list file, `-`, or a tensor file.
        num_samples: random samples in all, or the most file or text samples (None: one
            batch of random input, every file, the whole corpus).
        batch_size: samples per forward.
        shape: the per-sample shape of random input (None: the model's own).
        image_size: crop images to this size (None: the weights' or the model's own).
        skip_bad_inputs: skip undecodable images instead of failing.
        workers: image-decoding worker processes.
    """

    source: str = field(default="random", metadata=recipe("input"))
    num_samples: int | None = field(default=None, metadata=recipe())
    batch_size: int = field(default=8, metadata=recipe())
    shape: tuple[int, ...] | None = field(default=None, metadata=recipe("input_shape"))
    image_size: int | None = field(default=None, metadata=recipe())
    skip_bad_inputs: bool = field(default=False, metadata=recipe())
    workers: int = 2


@dataclass(frozen=True)
class Ends:
    """A tokenizer's pad token (its EOS without one) and EOS token, where it has them: what
    generation pads prompts with and stops at."""

    pad: int | None = None
    eos: tuple[int, ...] = ()

    @classmethod
    def of(cls, tokenizer: Any) -> Ends:
        """A (transformers) tokenizer's."""
        eos = getattr(tokenizer, "eos_token_id", None)
        pad = getattr(tokenizer, "pad_token_id", None)
        return cls(pad if pad is not None else eos, () if eos is None else (int(eos),))


@dataclass(frozen=True)
class Feed:
    """Samples for a run: how many, and their batches, each carrying its samples' ids
    (sample indices, paths or row indices) and the inputs skipped before it.

    `source_ids` and `source_skipped` are the source's own working lists (a range, for row
    numbers): they grow as `make` reads, and only `batches`, on the same thread, reads them."""

    input_type: str  # random, images, tensors or text
    total: int | None  # samples to read (fewer if images fail to decode; None: not known)
    source_ids: Sequence[Any] = field(repr=False)
    make: Callable[[int], Iterator[Batch]] = field(repr=False)
    source_skipped: Sequence[dict[str, str]] = field(default=(), repr=False)  # undecodable
    files: list[Path] = field(default_factory=list)  # every file it reads, for the checks
    special_ids: list[int] = field(default_factory=list)  # text: the tokenizer's special ids
    first: int = 0  # a torchrun rank's first sample in the whole dump
    # samples expected in all when `total` is not known (text: from the corpus's size)
    estimate: Callable[[], int | None] = lambda: None
    tally: TextTally | None = None  # text: what was padding; prompts cut, and to what
    width: int | None = None  # text: the most tokens a sample has (a batch pads up to it)
    ends: Ends = field(default_factory=lambda: Ends())  # text: the tokenizer's pad and EOS

    def batches(self, batch_size: int) -> Iterator[Batch]:
        """The source's batches of `batch_size`, each with its ids and skipped inputs."""
        seen = 0
        for batch in self.make(batch_size):
            skipped = tuple(self.source_skipped[seen:])
            seen += len(skipped)
            ids = self.source_ids[batch.start : batch.stop]
            yield dataclasses.replace(batch, ids=ids, skipped=skipped)


@dataclass
class TextTally:
    """What a text feed counted so far: of the token positions fed, how many were real
    tokens; and of the documents read as prompts (`--generate`), how many had more than
    `length` tokens (a document sample's most) and were cut to it."""

    length: int | None = None
    real: int = 0
    positions: int = 0
    cut: int = 0
    seen: int = 0

    def count(self, real: int, positions: int) -> None:
        self.real += real
        self.positions += positions

    def count_prompt(self, cut: bool) -> None:
        self.seen += 1
        self.cut += int(cut)

    @property
    def fraction(self) -> float | None:
        """Real tokens per position computed (None before any)."""
        return self.real / self.positions if self.positions else None


def takes_position_ids(module: Any) -> bool:
    """Whether `module`'s forward takes `position_ids` (transformers' models do)."""
    try:
        return "position_ids" in inspect.signature(module.forward).parameters
    except (TypeError, ValueError, AttributeError):
        return False


def left_padded_positions(inputs: Mapping[str, Any], mask: torch.Tensor) -> dict[str, torch.Tensor]:
    """A left-padded batch's `position_ids`, counted from the mask as `generate` counts
    them, where the batch brings none: without them the model counts the padding as
    positions, and every activation shifts while `__position__` counts the real tokens.
    The one way both doors (a Python caller's batches, `--input` token files) get them."""
    if "position_ids" in inputs or mask.dim() != 2 or mask.shape[1] < 2:
        return {}
    starts_late = (mask[:, :-1] == 0) & (mask[:, 1:] != 0)  # a real token after padding
    if not bool(starts_late.any()):
        return {}
    return {"position_ids": (mask.long().cumsum(-1) - 1).clamp(min=0)}


def share_of(total: int, share: tuple[int, int] | None) -> tuple[int, int]:
    """The contiguous rows `first:stop` of `total` that process `rank` of `world` takes
    (`share`: (rank, world); all of them without one)."""
    if share is None:
        return 0, total
    rank, world = share
    return rank * total // world, (rank + 1) * total // world


@dataclass
class Batch:
    """Rows `start:stop` of the input, ready for `model(*args, **kwargs)`, or, given
    `forward`, for `forward(model, payload)` (a Python caller's own batch and call)."""

    args: tuple[Any, ...]
    kwargs: dict[str, Any] = field(default_factory=dict)
    start: int = 0
    stop: int = 0
    # what the dump keeps of the input itself, by reserved key (`__input_ids__`), [rows, ...]
    stored: dict[str, torch.Tensor] = field(default_factory=dict)
    forward: Callable[[Any, Any], Any] | None = None
    payload: Any = None
    ids: Sequence[Any] = ()  # its samples' ids, as the feed gives them out
    skipped: tuple[dict[str, str], ...] = ()  # inputs skipped since the batch before
    # [rows, T]: 1 where a token is the model's response (--generate, --chat), like the mask
    response: torch.Tensor | None = None

    @property
    def rows(self) -> int:
        return self.stop - self.start

    def call(self, module: Any) -> Any:
        """Run `module` on this batch."""
        if self.forward is not None:
            return self.forward(module, self.payload)
        return module(*self.args, **self.kwargs)

    def first_row(self) -> Batch:
        """The batch cut to its first sample (see `cut`)."""
        return self.cut(0, 1)

    def cut(self, lo: int, hi: int) -> Batch:
        """Rows `lo:hi` of the batch (counted from its first): every tensor whose first
        dimension is the batch's rows, and every list of that length, inside tuples, lists
        and dicts; anything else as it is."""

        def part(value: Any) -> Any:
            if isinstance(value, torch.Tensor):
                return value[lo:hi] if value.dim() and value.shape[0] == self.rows else value
            if isinstance(value, list) and len(value) == self.rows:
                return value[lo:hi]
            return _rebuilt(value, part)

        return Batch(
            tuple(part(a) for a in self.args),
            {k: part(v) for k, v in self.kwargs.items()},
            self.start + lo,
            self.start + min(hi, self.rows),
            {k: part(v) for k, v in self.stored.items()},
            self.forward,
            part(self.payload),
            self.ids[lo:hi],
            self.skipped if lo == 0 else (),
            None if self.response is None else self.response[lo:hi],
        )

    def to(self, device: torch.device) -> Batch:
        def move(value: Any) -> Any:
            if isinstance(value, torch.Tensor):
                return value.to(device, non_blocking=True)
            return _rebuilt(value, move)

        return Batch(
            tuple(move(a) for a in self.args),
            {k: move(v) for k, v in self.kwargs.items()},
            self.start,
            self.stop,
            self.stored,  # written from the CPU
            self.forward,
            move(self.payload),
            self.ids,
            self.skipped,
            self.response,  # read where the token ids are (`TokenRows`)
        )


def _rebuilt(value: Any, each: Callable[[Any], Any]) -> Any:
    """`value` with `each` applied to the items of its tuples, lists and dicts (a named
    tuple or dict subclass keeps its type where it can be rebuilt so)."""
    if isinstance(value, tuple):
        items = [each(v) for v in value]
        return type(value)(*items) if hasattr(value, "_fields") else tuple(items)
    if isinstance(value, list):
        return [each(v) for v in value]
    if isinstance(value, dict):
        rebuilt = {k: each(v) for k, v in value.items()}
        try:
            return type(value)(rebuilt)
        except TypeError:  # a mapping type that takes other arguments
            return rebuilt
    return value


def parse_shape(text: str) -> tuple[int, ...]:
    """`3,224,224` (or `3x224x224`) to a tuple of positive ints."""
    parts = [p.strip() for p in text.replace("x", ",").split(",")]
    try:
        shape = tuple(int(p) for p in parts)
    except ValueError:
        shape = ()
    if not shape or any(d <= 0 for d in shape):
        raise HookdumpError(
            f"{opt('input_shape')} {text!r} is not a per-sample shape; write positive integers "
            "separated by commas, e.g. 3,224,224"
        )
    if math.prod(shape) > MAX_SAMPLE_ELEMENTS:
        raise HookdumpError(
            f"{opt('input_shape')} {text!r} makes {math.prod(shape):,} values per sample, more "
            f"than hookdump makes at random ({MAX_SAMPLE_ELEMENTS:,}); give a smaller shape"
        )
    return shape


def sample_form(loaded: LoadedModel, shape: tuple[int, ...] | None = None) -> SampleForm:
    """The random-input form for a model: its own default shape, or `shape` if given."""
    family = loaded.family
    if family == "tokens":  # a Hugging Face text model: random token ids
        return SampleForm("tokens", shape or loaded.input_shape or (32,), vocab=loaded.vocab)
    if family == "image" and loaded.input_shape is not None:  # Hugging Face vision, timm
        return SampleForm("image", shape or loaded.input_shape)
    if family == "custom":
        return _custom_form(loaded.module, shape or loaded.input_shape, loaded.spec)
    layout = {"detection": "detection", "optical_flow": "flow"}.get(family, "image")
    if shape is not None:
        return SampleForm(layout, shape)
    crop, resize, frames = _weights_sizes(loaded.spec)  # a torchvision name, for these families
    if family == "video":
        return SampleForm(layout, (3, frames, crop, crop))
    if family == "segmentation":
        return SampleForm(layout, (3, resize, resize))
    if family == "classification":
        size = getattr(loaded.module, "image_size", None)  # ViT built without weights: 224
        return SampleForm(layout, (3, size if isinstance(size, int) else crop, crop))
    return SampleForm(layout, (3, DEFAULT_IMAGE_SIZE, DEFAULT_IMAGE_SIZE))


def _weights_sizes(name: str) -> tuple[int, int, int]:
    """Crop size, resize size and frame count from the model's default weights' transforms."""
    crop = resize = DEFAULT_IMAGE_SIZE
    frames = DEFAULT_FRAMES
    try:
        import torchvision.models as tvm

        weights = tvm.get_model_weights(name).DEFAULT
        transforms = weights.transforms()
    except Exception:  # a model without weights enums: keep the defaults
        return crop, resize, frames
    crop_size = getattr(transforms, "crop_size", None)
    resize_size = getattr(transforms, "resize_size", None)
    if crop_size:
        crop = int(crop_size[0])
    if resize_size:
        resize = int(resize_size[0])
    frames = max(frames, int(weights.meta.get("min_temporal_size", 0)))
    return crop, resize if resize_size else crop, frames


def _custom_form(model: nn.Module, shape: tuple[int, ...] | None, label: str) -> SampleForm:
    """Guess the input of a user's model from its first Embedding, Linear or Conv layer."""
    first = next((m for m in model.modules() if isinstance(m, _GUESSABLE)), None)
    if isinstance(first, nn.Embedding):
        return SampleForm("tokens", shape or (DEFAULT_SEQUENCE,), vocab=first.num_embeddings)
    if shape is not None:
        return SampleForm("image", shape)
    if isinstance(first, nn.Linear):
        return SampleForm("image", (first.in_features,))
    if isinstance(first, nn.Conv1d):
        return SampleForm("image", (first.in_channels, DEFAULT_IMAGE_SIZE))
    if isinstance(first, nn.Conv2d):
        return SampleForm("image", (first.in_channels, DEFAULT_IMAGE_SIZE, DEFAULT_IMAGE_SIZE))
    if isinstance(first, nn.Conv3d):
        return SampleForm("image", (first.in_channels, DEFAULT_FRAMES, 112, 112))
    raise HookdumpError(
        f"cannot tell the input shape of {label!r} (it has no Linear, Conv or Embedding "
        f"layer to go by); pass {opt('input_shape')}, e.g. {opt('input_shape')} 3,224,224"
    )


_GUESSABLE = (nn.Embedding, nn.Linear, nn.Conv1d, nn.Conv2d, nn.Conv3d)


def random_batches(
    form: SampleForm,
    num_samples: int,
    batch_size: int,
    seed: int,
    first: int = 0,
    offset: int = 0,
) -> Iterator[Batch]:
    """Seeded random input from row `first` on, `batch_size` samples at a time, on the CPU.

    Row i holds sample `offset + i` (a torchrun rank's slice starts at its offset). A batch
    larger than the memory available is a MemoryError before any of it is made: made a
    sample at a time, it would be killed by the kernel instead, without a word."""
    per_sample = math.prod(form.shape) * (8 if form.layout == "tokens" else 4)
    per_sample *= 2 if form.layout == "flow" else 1
    needed = 2 * per_sample * min(batch_size, max(0, num_samples - first))  # and stacked
    available = _memory_available()
    if available is not None and needed > available:
        raise MemoryError(f"a batch of random input needs {needed:,} bytes, {available:,} free")
    for start in range(first, num_samples, batch_size):
        stop = min(start + batch_size, num_samples)
        samples = [_random_sample(form, seed, offset + i) for i in range(start, stop)]
        if form.layout == "detection":
            args: tuple[Any, ...] = ([s[0] for s in samples],)
        else:
            args = tuple(torch.stack(parts) for parts in zip(*samples, strict=True))
        yield Batch(args, {}, start, stop)


def _memory_available() -> int | None:
    """The memory the kernel says is available (Linux), in bytes."""
    try:
        with open("/proc/meminfo") as info:
            for line in info:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def _random_sample(form: SampleForm, seed: int, index: int) -> tuple[torch.Tensor, ...]:
    # 2**31-1 is prime: mixes (seed, index) into one 64-bit seed without collisions in practice
    generator = torch.Generator().manual_seed((seed * 2_147_483_647 + index) % 2**63)
    if form.layout == "tokens":
        return (torch.randint(0, form.vocab, form.shape, generator=generator),)
    count = 2 if form.layout == "flow" else 1
    return tuple(torch.randn(form.shape, generator=generator) for _ in range(count))
