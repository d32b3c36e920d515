"""Reading a dump's rows back in batches, for training a probe or a sparse autoencoder.

Every row comes exactly once per pass, and the rows of different keys stay aligned (row i
of every key is the same sample or token). Without shuffling, rows come in order. With it,
the order is drawn from the whole dump, fixed by the seed alone:

- every shard is cut into blocks of contiguous rows, about `block_bytes` (8 MiB) of the
  requested keys each: large enough to read at the disk's sequential speed, small enough
  that a shard holds many;
- the blocks of all shards are put in one seeded random order;
- a buffer of half the budget `buffer_bytes` (256 MiB, so 128 MiB) is filled with the next
  blocks in that order (at least 16 of them: a small budget takes smaller blocks), read
  straight into it (`store.read.rows`); its rows, and the few carried over from the buffer
  before, are put in a seeded random order and given out in batches; the rows short of a
  whole batch are carried into the next buffer, so batches are full until the very last
  (left out with `drop_last`).

A thread fills the next buffer while this one is given out (and asks the disk for each
next block while it reads one; at a URL, for the next `REMOTE_AHEAD` blocks), so reading
overlaps the consumer. Memory holds the two buffers (the budget), the batch being given
out, and 24 bytes of bookkeeping per buffered row, never a shard, whatever its size or its
header's claims (at a URL, up to `REMOTE_AHEAD` blocks in flight besides). So a batch draws from the
blocks of one buffer, anywhere in the dump.

The batches before `start` are passed over without reading their rows: only the
permutations are drawn, so a pass resumes where it stopped, in the same order.
`split=(i, n)` keeps every n-th block of the order from the i-th: n readers (DataLoader
workers times ranks) together read every row once.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Protocol

import torch

from hookdump.errors import HookdumpError, did_you_mean, opt
from hookdump.format.values import is_integer
from hookdump.store.read.reader import ShardReader
from hookdump.store.read.rows import ShardRows
from hookdump.worker import prefetch

BLOCK_BYTES = 8 << 20  # contiguous bytes of the requested keys read at a time
BUFFER_BYTES = 256 << 20  # the rows a shuffle mixes at once: its memory budget
MIXED = 16  # the fewest blocks a buffer holds: a small buffer takes smaller blocks
MAX_BLOCKS = 1 << 20  # the most blocks of a pass (16 MiB of row ranges): 8 TiB of 8 MiB
ROW_OVERHEAD = 24  # bytes of the buffer's bookkeeping per row
ROW = "__row__"  # with_index: each row's number in the dump
MAX_SEED = 1 << 62  # a pass's seed, with room for Dump.dataset's epochs: torch takes 64 bits

RowRange = tuple[int, int]


class RowSource(Protocol):
    """Where a pass reads rows: buffers of rows, and rows `lo:hi` read into one's views."""

    def allocate(self, count: int) -> dict[str, torch.Tensor]: ...

    def read_into(self, lo: int, hi: int, out: dict[str, torch.Tensor]) -> None: ...

    def will_need(self, lo: int, hi: int) -> None: ...

    @property
    def ahead(self) -> int:
        """How many blocks to announce (`will_need`) ahead of the one read."""
        ...


@dataclass(frozen=True)
class PassOptions:
    """How a pass gives out rows (see the module's docstring)."""

    batch_size: int
    shuffle: bool = False
    seed: int = 0
    with_index: bool = False
    drop_last: bool = False
    start: int = 0  # batches of the pass passed over
    buffer_bytes: int = BUFFER_BYTES
    block_bytes: int = BLOCK_BYTES
    split: tuple[int, int] = (0, 1)  # (reader, readers): this reader's share of the blocks


def iter_batches(
    dump: ShardReader, keys: list[str], options: PassOptions
) -> Iterator[dict[str, torch.Tensor]]:
    """Batches of `keys` as dicts of aligned tensors (see the module's docstring)."""
    check(dump, keys, options)
    # a row costs its bytes and its number and place in the buffer's order (int64 each,
    # with a copy while they are joined): the budget bounds rows of zero bytes too
    row_bytes = dump.row_bytes(keys) + ROW_OVERHEAD
    # a buffer holds at least MIXED blocks (unless a row is larger than a block), and a pass
    # at most MAX_BLOCKS (however many rows the shards claim)
    block_rows = max(
        1,
        min(options.block_bytes, options.buffer_bytes // MIXED) // row_bytes,
        -(-dump.num_samples // MAX_BLOCKS),
    )
    blocks = torch.cat(
        [_cut(shard.start, shard.stop, block_rows) for shard in dump.shards]
        or [torch.empty(0, 2, dtype=torch.int64)]
    )
    # two buffers: one given out while the next is read
    group = max(1, options.buffer_bytes // 2 // (block_rows * row_bytes))

    return pass_batches(blocks, ShardRows(dump, keys), options, group)


def _cut(start: int, stop: int, rows: int) -> torch.Tensor:
    """[blocks, 2]: `start:stop` cut into row ranges of `rows` (the last may be shorter)."""
    lows = torch.arange(start, stop, rows, dtype=torch.int64)
    return torch.stack([lows, (lows + rows).clamp(max=stop)], dim=1)


@dataclass
class _Buffer:
    """Rows of a pass read into memory, and how they are given out."""

    rows: torch.Tensor  # their row numbers, in the buffer's order
    mixed: torch.Tensor | None  # the order they are given out in (None: as they are)
    full: int  # whole batches in it
    skip: int  # of those, passed over (resuming)
    values: dict[str, torch.Tensor]
    carried_in: int  # leading rows the buffer before leaves over, filled by the consumer
    base: dict[str, torch.Tensor]  # the whole buffer `values` are the first rows of
    last: bool = False  # the rows short of a batch at the end of the pass


class _ReadAhead:
    """The reading thread's controls: the two buffers (handed back to be filled again, so
    their memory is reused, not faulted in anew), and a stop for a pass left early (its
    consumer gone, or the interpreter ending) that the thread checks between reads."""

    def __init__(self) -> None:
        self._free: list[dict[str, torch.Tensor] | None] = [None, None]  # None: not made yet
        self._changed = threading.Condition()
        self.stopped = False

    def give_back(self, buffer: dict[str, torch.Tensor]) -> None:
        with self._changed:
            self._free.append(buffer)
            self._changed.notify_all()

    def stop(self) -> None:
        with self._changed:
            self.stopped = True
            self._changed.notify_all()

    def take(self, source: RowSource, capacity: int) -> dict[str, torch.Tensor] | None:
        """A buffer of `capacity` rows once one is free (reused when it holds as many);
        None once the pass is stopped."""
        with self._changed:
            while not self._free and not self.stopped:
                self._changed.wait()
            if self.stopped:
                return None
            free = self._free.pop(0)
        if free is not None and len(next(iter(free.values()))) >= capacity:
            return free
        return source.allocate(capacity)


def pass_batches(
    blocks: torch.Tensor, source: RowSource, options: PassOptions, group: int
) -> Iterator[dict[str, torch.Tensor]]:
    """The algorithm of the module's docstring over row ranges `blocks` ([n, 2], in row
    order), read from `source` a buffer of `group` blocks at a time, on a thread that fills
    the next buffer while this one is given out (two buffers at most)."""
    control = _ReadAhead()
    buffers = _buffers(blocks, source, options, group, control)
    leftover: dict[str, torch.Tensor] = {}
    try:  # the next buffer filled on a thread while this one is given out
        for buffer in prefetch(buffers, 1, "hookdump-read", on_leave=control.stop):
            values, size = buffer.values, options.batch_size
            for key, value in values.items() if buffer.carried_in else ():
                value[: buffer.carried_in] = leftover[key]
            if buffer.last:
                yield _batch(values, buffer.rows, None, 0, len(buffer.rows), options.with_index)
            for batch in range(buffer.skip, buffer.full):
                lo, hi = batch * size, (batch + 1) * size
                yield _batch(values, buffer.rows, buffer.mixed, lo, hi, options.with_index)
            done = buffer.full * size
            leftover = _batch(values, buffer.rows, buffer.mixed, done, len(buffer.rows), False)
            control.give_back(buffer.base)
            del buffer, values
    finally:
        control.stop()  # a pass left early: the thread stops at its next read


def _buffers(
    blocks: torch.Tensor,
    source: RowSource,
    options: PassOptions,
    group: int,
    control: _ReadAhead,
) -> Iterator[_Buffer]:
    """The pass's buffers, filled in turn (each once a slot is free); buffers wholly before
    `options.start` are drawn (their permutations) but not read."""
    generator = torch.Generator().manual_seed(options.seed)
    order = blocks
    if options.shuffle:
        order = blocks[torch.randperm(len(blocks), generator=generator)]
    reader, readers = options.split
    order = order[reader::readers]
    size = options.batch_size
    lengths = order[:, 1] - order[:, 0]
    longest, total = (int(lengths.max()), int(lengths.sum())) if len(order) else (0, 0)
    capacity = min(group * longest + size - 1, total)  # the most rows a buffer holds
    carry = torch.empty(0, dtype=torch.int64)  # row numbers carried into the next buffer
    passed = False  # the buffer before was passed over: the carried rows are read here
    given = 0  # batches given out (or passed over) before this buffer
    for first in range(0, len(order), group):
        chosen = [(lo, hi) for lo, hi in order[first : first + group].tolist()]
        rows = torch.cat([carry, *(torch.arange(lo, hi) for lo, hi in chosen)])
        mixed = torch.randperm(len(rows), generator=generator) if options.shuffle else None
        full = len(rows) // size
        if given < options.start and given + full <= options.start:
            carry, passed = _taken(rows, mixed, full * size, len(rows)), True
            given += full
            continue
        filled = _filled(source, len(rows), carry, passed, chosen, control, capacity)
        if filled is None:
            return
        yield _Buffer(
            rows,
            mixed,
            full,
            max(0, options.start - given),
            filled[0],
            0 if passed else len(carry),
            filled[1],
        )
        given += full
        carry, passed = _taken(rows, mixed, full * size, len(rows)), False
    if len(carry) and not options.drop_last and given >= options.start:
        filled = _filled(source, len(carry), carry, passed, [], control, 0)
        if filled is not None:
            yield _Buffer(
                carry, None, 0, 0, filled[0], 0 if passed else len(carry), filled[1], last=True
            )


def _filled(
    source: RowSource,
    count: int,
    carry: torch.Tensor,
    read_carry: bool,
    blocks: list[RowRange],
    control: _ReadAhead,
    capacity: int,
) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]] | None:
    """The first `count` rows of a free buffer (of `capacity` rows), and the buffer: room
    for the carried rows (read one by one when their buffer was passed over: fewer than a
    batch), then `blocks` read straight in, the disk asked for each next block while one is
    read. None: the pass was stopped."""
    base = control.take(source, max(count, capacity))
    if base is None:
        return None
    values = {key: value[:count] for key, value in base.items()}
    if read_carry:
        for index, row in enumerate(carry.tolist()):
            source.read_into(row, row + 1, {k: v[index : index + 1] for k, v in values.items()})
    at = len(carry)
    for index, (lo, hi) in enumerate(blocks):
        if control.stopped:
            return None
        for block in blocks[index + 1 : index + 1 + source.ahead]:
            source.will_need(*block)
        if hi > lo:
            source.read_into(lo, hi, {k: v[at : at + hi - lo] for k, v in values.items()})
        at += hi - lo
    return values, base


def _taken(rows: torch.Tensor, mixed: torch.Tensor | None, lo: int, hi: int) -> torch.Tensor:
    return rows[lo:hi] if mixed is None else rows[mixed[lo:hi]]


def _batch(
    values: dict[str, torch.Tensor],
    rows: torch.Tensor,
    mixed: torch.Tensor | None,
    lo: int,
    hi: int,
    with_index: bool,
) -> dict[str, torch.Tensor]:
    """Rows `lo:hi` of the buffer's order: a copy (a gather, or a slice made contiguous)."""
    if mixed is None:
        batch = {key: value[lo:hi].clone() for key, value in values.items()}
    else:
        at = mixed[lo:hi]
        batch = {key: value[at] for key, value in values.items()}
    if with_index:
        batch[ROW] = _taken(rows, mixed, lo, hi)
    return batch


def check(dump: ShardReader, keys: list[str], options: PassOptions) -> None:
    """The arguments of a pass, before anything is read."""
    if isinstance(keys, str) or not keys:
        raise HookdumpError(
            f"{opt('keys')} must be a non-empty list of keys, e.g. {dump.keys()[:1]}"
        )
    for key in keys:
        if key not in dump:
            raise HookdumpError(
                f"{opt('keys')}: {key!r} is not in {dump.path}{did_you_mean(key, dump.keys())}"
            )
    if dump.ragged:
        raise HookdumpError(
            f"{dump.path}: its tensors have different numbers of rows, so the rows of its keys "
            "are not the same samples; read each key with dump[key]"
        )
    numbers: dict[str, Any] = {
        "batch_size": (options.batch_size, 1),
        "start": (options.start, 0),
        "buffer_bytes": (options.buffer_bytes, 1),
        "block_bytes": (options.block_bytes, 1),
    }
    for name, (value, least) in numbers.items():
        if not is_integer(value) or value < least:
            raise HookdumpError(f"{opt(name)} {value!r} must be an integer of at least {least}")
    if not is_integer(options.seed) or not 0 <= options.seed < MAX_SEED:
        raise HookdumpError(
            f"{opt('seed')} {options.seed!r} must be an integer, at least 0 and below 2**62"
        )
    if options.with_index and ROW in keys:
        raise HookdumpError(
            f"{opt('with_index', True)} names each row's number {ROW!r}, which is a key of "
            f"{dump.path}: read that key without {opt('with_index', True)}"
        )
