"""Reading a dump's rows back in batches, for training a probe or a sparse autoencoder.

Every row comes exactly once per pass, and the rows of different keys stay aligned (row i
of every key is the same sample or token). Without shuffling, rows come in order. With it,
the order is drawn from the whole dump, fixed by the seed alone:

- every shard is cut into blocks of contiguous rows, about `block_bytes` (8 MiB) of the
  requested keys each: large enough to read at the disk's sequential speed, small enough
  that a shard holds many;
- the blocks of all shards are put in one seeded random order;
- a buffer of half the budget `buffer_bytes` (256 MiB, so 128 MiB) less a batch takes the
  next blocks in that order (at least 16 of them: a small budget takes smaller blocks); its
  rows, and the few carried over from the buffer before, are put in a seeded random order,
  and each row is read straight to its place in its batch (`store.read.scatter`: one copy,
  the kernel's, into batch memory used again once the caller lets a batch go, and kept
  for the `Dump`'s next pass); the rows short of a whole batch are carried into the next
  buffer, so batches are full until the very last (left out with `drop_last`).

A thread reads the next buffer's batches while this one's are given out (and asks the disk
for each next block while it reads one; at a URL, for the next `REMOTE_AHEAD` blocks), so
reading overlaps the consumer, which only hands batches over. Memory holds two buffers'
batches, each buffer's rows and those carried into it within half the budget (batches
past half the budget: a quarter of it and the batches), the batches the caller keeps, and
40 bytes of bookkeeping per buffered row, never a shard, whatever its size or its
header's claims (at a URL, up to `REMOTE_AHEAD` blocks in flight besides). So a batch
draws from the blocks of one buffer, anywhere in the dump. In order nothing is mixed: a
buffer takes a block or a batch, whichever is larger, and the rows carried stay in the
batch they were read into, which the next buffer fills.

The batches before `start` are passed over without reading their rows: only the
permutations are drawn, so a pass resumes where it stopped, in the same order.
`split=(i, n)` keeps every n-th block of the order from the i-th: n readers (DataLoader
workers times ranks) together read every row once.
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Protocol

import torch

from hookdump.errors import HookdumpError, did_you_mean, opt
from hookdump.format.values import is_integer
from hookdump.store.read.reader import ShardReader
from hookdump.store.read.rows import ShardRows
from hookdump.store.read.scatter import BatchMemory, Places, Slabs
from hookdump.worker import prefetch

BLOCK_BYTES = 8 << 20  # contiguous bytes of the requested keys read at a time
BUFFER_BYTES = 256 << 20  # the rows a shuffle mixes at once: its memory budget
MIXED = 16  # the fewest blocks a buffer holds: a small buffer takes smaller blocks
MAX_BLOCKS = 1 << 20  # the most blocks of a pass (16 MiB of row ranges): 8 TiB of 8 MiB
ROW_OVERHEAD = 40  # bytes of the buffer's bookkeeping per row (see iter_batches)
ROW = "__row__"  # with_index: each row's number in the dump
MAX_SEED = 1 << 62  # a pass's seed, with room for Dump.dataset's epochs: torch takes 64 bits

RowRange = tuple[int, int]


class RowSource(Protocol):
    """Where a pass reads rows: their form (`allocate(0)`), and rows `lo:hi` read straight
    to their places in the batches."""

    def allocate(self, count: int) -> dict[str, torch.Tensor]: ...

    def scatter(self, lo: int, hi: int, places: Places, positions: torch.Tensor) -> None: ...

    def will_need(self, lo: int, hi: int) -> None: ...

    def close(self) -> None:
        """The pass has ended: let go of what it kept open."""
        ...

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
    bounds = sorted({0, dump.num_samples, *(shard.start for shard in dump.shards)})
    blocks, group = plan_blocks(bounds, dump.row_bytes(keys), options)
    return pass_batches(blocks, ShardRows(dump, keys), options, group, dump.batch_memory)


def plan_blocks(
    bounds: list[int], row_bytes: int, options: PassOptions
) -> tuple[torch.Tensor, int]:
    """A pass's blocks ([n, 2] row ranges, none across any of `bounds`: the rows where
    shards start, 0 and the row count among them), for rows of `row_bytes`; and how many
    blocks a buffer takes."""
    # a row costs its bytes, its number, its place in the buffer's order and the inverse
    # (int64 each, with copies while they are made): the budget bounds rows of zero bytes
    row_bytes += ROW_OVERHEAD
    room = _room(options, row_bytes)
    # a shuffled buffer holds at least MIXED blocks (unless a row is larger than a block),
    # and a pass at most MAX_BLOCKS (however many rows the shards claim)
    most = room // MIXED if options.shuffle else room
    block_rows = max(1, min(options.block_bytes, most) // row_bytes, -(-bounds[-1] // MAX_BLOCKS))
    blocks = torch.cat(
        [_cut(lo, hi, block_rows) for lo, hi in itertools.pairwise(bounds)]
        or [torch.empty(0, 2, dtype=torch.int64)]
    )
    return blocks, max(1, room // (block_rows * row_bytes))


def _room(options: PassOptions, row_bytes: int) -> int:
    """The bytes of rows a buffer takes. Two buffers are in memory (one given out while the
    next is read), each in whole batches with the rows carried into it (fewer than a
    batch): a buffer's rows leave a batch of room in its half of the budget. In order,
    nothing is mixed: a buffer takes about a batch (the carried rows stay where they are)."""
    batch = options.batch_size * row_bytes
    half = options.buffer_bytes // 2
    room = max(half - batch, half // 4)  # batches past half the budget: a quarter of it
    return room if options.shuffle else min(room, max(batch, options.block_bytes))


def _cut(start: int, stop: int, rows: int) -> torch.Tensor:
    """[blocks, 2]: `start:stop` cut into row ranges of `rows` (the last may be shorter)."""
    lows = torch.arange(start, stop, rows, dtype=torch.int64)
    return torch.stack([lows, (lows + rows).clamp(max=stop)], dim=1)


@dataclass
class _Buffer:
    """Rows of a pass read into their batches, and how they are given out."""

    rows: torch.Tensor  # their row numbers, in the buffer's order
    mixed: torch.Tensor | None  # the order they are given out in (None: as they are)
    skip: int  # whole batches passed over (resuming)
    batches: list[dict[str, torch.Tensor] | None]  # whole batches, in the order given out
    last: dict[str, torch.Tensor] | None = None  # the pass's last rows, short of a batch


class _ReadAhead:
    """The reading thread's controls: two buffers' worth of batches at most (one given out,
    one read), and a stop for a pass left early (its consumer gone, or the interpreter
    ending) that the thread checks between reads."""

    def __init__(self) -> None:
        self._free = 2
        self._changed = threading.Condition()
        self.stopped = False

    def give_back(self) -> None:
        with self._changed:
            self._free += 1
            self._changed.notify_all()

    def stop(self) -> None:
        with self._changed:
            self.stopped = True
            self._changed.notify_all()

    def take(self) -> bool:
        """Wait for room for a buffer; False once the pass is stopped."""
        with self._changed:
            while not self._free and not self.stopped:
                self._changed.wait()
            if self.stopped:
                return False
            self._free -= 1
            return True


def pass_batches(
    blocks: torch.Tensor,
    source: RowSource,
    options: PassOptions,
    group: int,
    memory: BatchMemory | None = None,
) -> Iterator[dict[str, torch.Tensor]]:
    """The algorithm of the module's docstring over row ranges `blocks` ([n, 2], in row
    order), read from `source` a buffer of `group` blocks at a time, on a thread that reads
    the next buffer's rows into their batches while this one's are given out."""
    control = _ReadAhead()
    buffers = _closing(_buffers(blocks, source, options, (group, memory), control), source)
    size = options.batch_size
    try:  # the next buffer filled on a thread while this one is given out
        for buffer in prefetch(buffers, 1, "hookdump-read", on_leave=control.stop):
            if buffer.last is not None:
                yield _indexed(buffer.last, buffer.rows, options.with_index)
            for index in range(buffer.skip, len(buffer.batches)):
                batch, buffer.batches[index] = buffer.batches[index], None
                assert batch is not None
                if options.with_index:
                    batch[ROW] = _taken(buffer.rows, buffer.mixed, index * size, (index + 1) * size)
                yield batch
                del batch  # its memory is the caller's alone, used again once it is let go
            control.give_back()
            del buffer
    finally:
        control.stop()  # a pass left early: the thread stops at its next read


def _closing(buffers: Iterator[_Buffer], source: RowSource) -> Iterator[_Buffer]:
    """`buffers`, then the source closed, however the pass ends (on the reading thread)."""
    try:
        yield from buffers
    finally:
        source.close()


def _buffers(
    blocks: torch.Tensor,
    source: RowSource,
    options: PassOptions,
    taking: tuple[int, BatchMemory | None],
    control: _ReadAhead,
) -> Iterator[_Buffer]:
    """The pass's buffers, filled in turn (each once there is room), `group` blocks each,
    on `memory`'s batches; buffers wholly before `options.start` are drawn (their
    permutations) but not read."""
    group, memory = taking
    generator = torch.Generator().manual_seed(options.seed)
    order = blocks
    if options.shuffle:
        order = blocks[torch.randperm(len(blocks), generator=generator)]
    reader, readers = options.split
    order = order[reader::readers]
    size = options.batch_size
    lengths = order[:, 1] - order[:, 0]
    longest = int(lengths.max()) if len(order) else 0
    # the batches of two buffers (the rows carried in one of them) and the caller's
    keep = 2 * ((group * longest) // size + 2) + 2
    slabs = (memory or BatchMemory()).slabs(source.allocate(0), keep)
    carry = torch.empty(0, dtype=torch.int64)  # row numbers carried into the next buffer
    # their values, in a batch's memory (None: not read, passed over)
    carried: dict[str, torch.Tensor] | None = {}
    given = 0  # batches given out (or passed over) before this buffer
    for first in range(0, len(order), group):
        chosen = [(lo, hi) for lo, hi in order[first : first + group].tolist()]
        rows = torch.cat([carry, *(torch.arange(lo, hi) for lo, hi in chosen)])
        mixed = torch.randperm(len(rows), generator=generator) if options.shuffle else None
        full = len(rows) // size
        if given < options.start and given + full <= options.start:
            carry, carried = _taken(rows, mixed, full * size, len(rows)), None
            given += full
            continue
        if not control.take():
            return
        upcoming = [(lo, hi) for lo, hi in order[first + group :][: source.ahead].tolist()]
        # the rows of the pass from this buffer on: no batch is larger than they are
        rest = len(carry) + int(lengths[first:].sum())
        fill = Fill(slabs, rows, mixed, size, len(carry), rest)
        filled = _filled(source, fill, carried, chosen, control, upcoming)
        if filled is None:
            return
        yield _Buffer(rows, mixed, max(0, options.start - given), filled[0])
        given += full
        carry, carried = _taken(rows, mixed, full * size, len(rows)), filled[1]
    if len(carry) and not options.drop_last and given >= options.start and control.take():
        if carried is None:  # passed over: fewer than a batch, read one by one
            fill = Fill(slabs, carry, None, size, len(carry), len(carry))
            filled = _filled(source, fill, None, [], control)
            if filled is None:
                return
            carried = filled[1]
        last = {key: values[: len(carry)] for key, values in carried.items()}
        yield _Buffer(carry, None, 0, [], last=last)


@dataclass(frozen=True)
class Fill:
    """A buffer to read: its rows (the carried ones first) and the order they go out in."""

    slabs: Slabs
    rows: torch.Tensor
    mixed: torch.Tensor | None
    size: int  # rows per batch
    carried: int  # of `rows`, the leading ones carried from the buffer before
    rest: int  # rows of the pass from this buffer's first on (the carried ones too)


def _filled(
    source: RowSource,
    fill: Fill,
    carried: dict[str, torch.Tensor] | None,
    blocks: list[RowRange],
    control: _ReadAhead,
    upcoming: list[RowRange] | None = None,
) -> tuple[list[dict[str, torch.Tensor] | None], dict[str, torch.Tensor]] | None:
    """The buffer's whole batches, and the rows left over (fewer than a batch, in the
    order given out): the carried rows copied to their places (`carried`; None: read from
    the disk one by one, their buffer having been passed over), then the buffer's blocks
    read straight to theirs, the disk asked for each next block while one is read, and for
    the next buffer's first few (`upcoming`: requests stay in flight across the turn of a
    buffer). None: the pass was stopped."""
    count, size = len(fill.rows), fill.size
    full = count // size
    # in order, the carried rows are the first batch's first rows, where they lie already
    kept = carried if fill.mixed is None and carried else None
    # every batch whole-sized (the rows left over too: later buffers fill it, and its
    # memory serves any later batch), unless the pass has fewer rows left
    sizes = [min(size, fill.rest - index * size) for index in range(-(-count // size))]
    batches = [kept or fill.slabs.take(sizes[0])] if sizes else []
    batches += [fill.slabs.take(rows) for rows in sizes[1:]]
    places = Places(_cut_to(batches, count, size), size)
    where = torch.arange(count)  # each row's place in the order given out
    if fill.mixed is not None:
        where = torch.empty_like(where).index_put_((fill.mixed,), where)
    if carried is None:
        for index, row in enumerate(fill.rows[: fill.carried].tolist()):
            source.scatter(row, row + 1, places, where[index : index + 1])
    elif kept is None:
        for key, values in carried.items():
            places.put(key, values[: fill.carried], where[: fill.carried])
    at = fill.carried
    asked = [*blocks, *(upcoming or [])]
    for index, (lo, hi) in enumerate(blocks):
        if control.stopped:
            return None
        for block in asked[index + 1 : index + 1 + source.ahead]:
            source.will_need(*block)
        if hi > lo:
            source.scatter(lo, hi, places, where[at : at + hi - lo])
        at += hi - lo
    whole: list[dict[str, torch.Tensor] | None] = list(batches[:full])
    return whole, batches[full] if count > full * size else {}


def _cut_to(
    batches: list[dict[str, torch.Tensor]], count: int, size: int
) -> list[dict[str, torch.Tensor]]:
    """The batches as `Places` takes them: the last cut to the `count` rows' share."""
    if not batches:
        return batches
    left = count - (len(batches) - 1) * size
    return [*batches[:-1], {key: values[:left] for key, values in batches[-1].items()}]


def _taken(rows: torch.Tensor, mixed: torch.Tensor | None, lo: int, hi: int) -> torch.Tensor:
    return rows[lo:hi] if mixed is None else rows[mixed[lo:hi]]


def _indexed(
    values: dict[str, torch.Tensor], rows: torch.Tensor, with_index: bool
) -> dict[str, torch.Tensor]:
    """The pass's last rows, with their row numbers where asked."""
    batch = dict(values)
    if with_index:
        batch[ROW] = rows.clone()
    return batch


def as_keys(keys: list[str] | str) -> list[str]:
    """The keys of a pass: one key may be given as a string."""
    return [keys] if isinstance(keys, str) else keys


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
    check_numbers(options)
    if options.with_index and ROW in keys:
        raise HookdumpError(
            f"{opt('with_index', True)} names each row's number {ROW!r}, which is a key of "
            f"{dump.path}: read that key without {opt('with_index', True)}"
        )


def check_numbers(options: PassOptions) -> None:
    """A pass's numbers (sizes, the seed), which need no dump to be checked."""
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
