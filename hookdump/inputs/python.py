"""A Python caller's own data as a `Feed`: any iterable of batches (a `DataLoader`, a list of
tensors, a generator of dicts), each called as the model takes it, with the caller's ids.

A batch's rows are the first dimension of its first tensor (found in tuples, lists and
dicts, in order). A `Tensor` batch is called as `model(t)`, a tuple or list as `model(*b)`,
a dict as `model(**b)`; `forward(model, batch)` overrides that. With `per_token`, batches are
dicts holding `input_ids` and `attention_mask` (`[B, T]`; the other keys go to the model
too), whose real tokens become rows as `--text ... --per-token` makes them.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from hookdump.errors import HookdumpError, opt
from hookdump.format.keys import ATTENTION_MASK, INPUT_IDS
from hookdump.format.rows import SampleIds
from hookdump.inputs.samples import Batch, Ends, Feed, left_padded_positions


@dataclass(frozen=True)
class Resumable:
    """Batches that start after the samples a resumed dump holds without reading those again
    (`after(done_ids)`; a fresh dump: `after([])`), that leave bad inputs out (each appended
    to `skipped` as `{"path", "error"}` before the next batch is yielded) and that say where
    they came from (`about()`: merged into the manifest's `input` whenever it is written)."""

    after: Callable[[Sequence[Any]], Iterable[Any]]
    about: Callable[[], dict[str, Any]]
    skipped: list[dict[str, str]] = field(default_factory=list)


@dataclass(frozen=True)
class PythonData:
    """What `hookdump.dump` was given to feed the model.

    Args:
        data: an iterable of batches, or one `Tensor` (one batch), or a `Resumable`.
        forward: `forward(model, batch)` runs the model on a batch (default: as above).
        ids: a callable `batch -> list of ids` (one per row), or an iterable of ids (default:
            the row numbers).
        per_token: batches are dicts of `input_ids` and `attention_mask` (see above).
        special_ids: the tokenizer's special tokens, left out of token rows
            (`skip_special_tokens`).
    """

    data: Any
    forward: Callable[[Any, Any], Any] | None = None
    ids: Callable[[Any], Iterable[Any]] | Iterable[Any] | None = None
    per_token: bool = False
    special_ids: tuple[int, ...] = ()
    position_ids: bool = False  # the model's forward takes position_ids (set by the feed)
    ends: Ends = field(default_factory=lambda: Ends())  # generation: the tokenizer's, if given

    @property
    def about(self) -> Callable[[], dict[str, Any]] | None:
        """What the manifest's `input` says of the data beyond its kind: a `Resumable`'s."""
        return self.data.about if isinstance(self.data, Resumable) else None


def python_feed(given: PythonData, num_samples: int | None, done_ids: Sequence[Any]) -> Feed:
    """`given` as a feed of at most `num_samples` samples, going on after the `done_ids`
    already dumped (resuming: the same data in the same order; ids given are checked)."""
    if isinstance(given.data, Resumable):
        return _resumable_feed(given, given.data, num_samples, done_ids)
    data = [given.data] if isinstance(given.data, torch.Tensor) else given.data
    if isinstance(data, Mapping) or not isinstance(data, Iterable):
        raise HookdumpError(
            f"data must be an iterable of batches (a DataLoader, a list) or one Tensor, not "
            f"{type(data).__name__}; wrap a single batch in a list"
        )
    feed_ids = SampleIds(done_ids)

    def batches(_: int) -> Iterator[Batch]:
        return _batches(data, given, num_samples, done_ids, feed_ids)

    return Feed(
        "python",
        num_samples,
        feed_ids,
        batches,
        special_ids=list(given.special_ids),
        estimate=lambda: num_samples if num_samples is not None else _estimate(data),
        ends=given.ends,
    )


def _resumable_feed(
    given: PythonData, data: Resumable, num_samples: int | None, done_ids: Sequence[Any]
) -> Feed:
    feed_ids = SampleIds(done_ids)

    def batches(_: int) -> Iterator[Batch]:
        after = data.after(done_ids)
        return _batches(after, given, num_samples, done_ids, feed_ids, first=len(done_ids))

    return Feed(
        "python",
        num_samples,
        feed_ids,
        batches,
        source_skipped=data.skipped,
        special_ids=list(given.special_ids),
        estimate=lambda: num_samples,
        ends=given.ends,
    )


def _batches(
    data: Iterable[Any],
    given: PythonData,
    stop: int | None,
    done_ids: Sequence[Any],
    feed_ids: SampleIds,
    first: int = 0,
) -> Iterator[Batch]:
    """The batches of `data` up to row `stop`, after the `done_ids` (their ids appended to
    `feed_ids` as they go); `first`: the row `data` starts at (a `Resumable`'s: after the
    done ones)."""
    ids = _Ids(given.ids)
    row = first
    for item in data:
        if stop is not None and row >= stop:
            return
        batch = _batch(item, given, row)
        if stop is not None and batch.stop > stop:
            batch = batch.cut(0, stop - row)
        these = ids.of(item, batch.rows, row)
        row = batch.stop
        done = min(len(done_ids) - batch.start, batch.rows)
        if done > 0:  # resuming: these rows are in the dump already
            _check_done(
                these[:done], done_ids[batch.start : batch.start + done], batch.start, ids.given
            )
            if done == batch.rows:
                continue
            batch, these = batch.cut(done, batch.rows), these[done:]
        feed_ids.extend(these)
        yield batch


def _estimate(data: Iterable[Any]) -> int | None:
    """The samples `data` holds, where that is cheap to know: a DataLoader's dataset, or a
    list of batches (their shapes)."""
    dataset = getattr(data, "dataset", None)
    if dataset is not None and hasattr(dataset, "__len__"):
        return len(dataset)
    if isinstance(data, list | tuple):
        return sum(_rows(item) for item in data)
    return None


def _batch(item: Any, given: PythonData, start: int) -> Batch:
    """One of the caller's batches as a `Batch` of rows `start:...`."""
    rows = _rows(item)
    stop = start + rows
    if given.per_token:
        if not isinstance(item, Mapping) or not {"input_ids", "attention_mask"} <= set(item):
            raise HookdumpError(
                f"{opt('per_token', True)} takes dict batches holding input_ids and "
                f"attention_mask ([batch, tokens]); batch at row {start} is "
                f"{_what(item)}"
            )
        ids, mask = item["input_ids"], item["attention_mask"]
        if ids.dim() != 2 or tuple(mask.shape) != tuple(ids.shape):
            raise HookdumpError(
                f"input_ids {list(ids.shape)} and attention_mask {list(mask.shape)} of the batch "
                f"at row {start} must both be [batch, tokens]"
            )
        stored = {INPUT_IDS: ids.cpu(), ATTENTION_MASK: mask.cpu()}
        payload = item if given.forward is not None else None
        positions = left_padded_positions(item, mask) if given.position_ids else {}
        kwargs = {**item, **positions}
        return Batch((), kwargs, start, stop, stored, given.forward, payload)
    if given.forward is not None:
        return Batch((), {}, start, stop, forward=given.forward, payload=item)
    if isinstance(item, torch.Tensor):
        return Batch((item,), {}, start, stop)
    if isinstance(item, tuple | list):
        return Batch(tuple(item), {}, start, stop)
    if isinstance(item, Mapping):
        return Batch((), dict(item), start, stop)
    raise HookdumpError(
        f"the batch at row {start} is {_what(item)}: give Tensors, tuples, lists or dicts, or "
        "forward=callable(model, batch) to call the model yourself"
    )


def _rows(item: Any) -> int:
    """The first dimension of the first tensor in `item`."""
    pending = [item]
    while pending:
        value = pending.pop(0)
        if isinstance(value, torch.Tensor):
            if value.dim() == 0:
                continue
            return int(value.shape[0])
        if isinstance(value, Mapping):
            pending[:0] = list(value.values())
        elif isinstance(value, tuple | list):
            pending[:0] = list(value)
    raise HookdumpError(
        f"a batch holds no tensor with a batch dimension ({_what(item)}); its rows are the "
        "first dimension of its first tensor"
    )


class _Ids:
    """The caller's ids: from a callable per batch, an iterable, or the row numbers."""

    def __init__(self, given: Callable[[Any], Iterable[Any]] | Iterable[Any] | None) -> None:
        self.given = given is not None
        self._call = given if callable(given) else None
        self._iter = iter(given) if given is not None and not callable(given) else None

    def of(self, item: Any, rows: int, start: int) -> Sequence[Any]:
        if self._call is not None:
            ids = [_plain(i) for i in self._call(item)]
        elif self._iter is not None:
            ids = [_plain(i) for i in itertools.islice(self._iter, rows)]
        else:
            return range(start, start + rows)
        if len(ids) < rows:
            raise HookdumpError(
                f"{opt('ids')} gave {len(ids)} ids for the batch at row {start}, which has "
                f"{rows} rows; give one id per row"
            )
        return ids[:rows]


def _plain(value: Any) -> Any:
    """An id as the manifest (JSON) can hold it."""
    if isinstance(value, torch.Tensor) and value.numel() == 1:
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)  # JSON has no NaN or Infinity: 'nan', 'inf'
    return value if isinstance(value, str | int | float) else str(value)


def _check_done(ids: Sequence[Any], done: Sequence[Any], start: int, given: bool) -> None:
    """Resuming: the batches skipped must be the samples the dump holds."""
    if given and list(ids) != done[: len(ids)]:
        first = next(i for i, (a, b) in enumerate(zip(ids, done, strict=False)) if a != b)
        raise HookdumpError(
            f"{opt('resume')}: sample {start + first} has id {ids[first]!r}, but the dump holds "
            f"{done[first]!r} there; resume with the same data in the same order, or start "
            f"anew with {opt('overwrite')}"
        )


def _what(item: Any) -> str:
    if isinstance(item, Mapping):
        return f"a {type(item).__name__} of {', '.join(map(str, list(item)[:5]))}"
    return f"a {type(item).__name__}"
