"""`Dump.batches` and `Dump.dataset`: every row once per pass, keys aligned, a seeded order
drawn from the whole dump, a buffer of blocks read at a time, row numbers, resuming at a
batch, and DataLoader workers times ranks reading every row once."""

from __future__ import annotations

import itertools
import os
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

import hookdump
from hookdump.format.manifest import ShardEntry
from hookdump.store.read.dump import Dump
from hookdump.store.read.reader import ShardReader

X, Y = "linear_1:input.0", "linear_1"


def _two_linear(out: Path | str, rows: int, capture: tuple[str, ...] = ("output",)) -> Dump:
    """A dump of TwoLinear's first layer for `rows` random rows, in shards of one batch of
    4 each (made through hookdump.dump: the engine's Python door)."""
    from tiny_models import TwoLinear

    torch.manual_seed(0)
    data = list(torch.rand(rows, 2).split(4))
    model = TwoLinear()
    return hookdump.dump(model, data, out, layers="linear_1", capture=capture, shard_size=1)


@pytest.fixture(scope="module")
def dump(place: Callable[[str], Path | str]) -> Dump:
    """37 random rows in 10 shards (nine of 4 rows, one of 1): TwoLinear's first layer,
    whose weights are all 1, so each output row is the sum of its input row plus 1 (in a
    folder, and once more at a URL: `place`)."""
    loaded = _two_linear(place("d"), 37, ("input", "output"))
    assert len(loaded.manifest.shards) == 10
    return loaded


def _shard_of(dump: Dump) -> dict[tuple[float, ...], int]:
    """Each input row (unique: random) -> the index of the shard holding it."""
    found = {}
    for index, shard in enumerate(dump.manifest.shards):
        tensors = dump.reader.read_shard(shard, [X])
        for row in tensors[X]:
            found[tuple(row.tolist())] = index
    return found


@pytest.mark.parametrize("shuffle", [False, True])
@pytest.mark.parametrize("batch_size", [1, 5, 16, 64])
def test_every_row_once_with_keys_aligned(dump: Dump, shuffle: bool, batch_size: int) -> None:
    batches = list(dump.batches([X, Y], batch_size, shuffle=shuffle, seed=3))
    sizes = [len(b[X]) for b in batches]
    assert all(size == batch_size for size in sizes[:-1]) and 0 < sizes[-1] <= batch_size
    xs = torch.cat([b[X] for b in batches])
    ys = torch.cat([b[Y] for b in batches])
    torch.testing.assert_close(ys, (xs.sum(1, keepdim=True) + 1).expand(-1, 2))  # aligned
    assert sorted(map(tuple, xs.tolist())) == sorted(map(tuple, dump[X].tolist()))
    if not shuffle:
        assert torch.equal(xs, dump[X])  # in row order


def test_shards_closed_to_keep_few_open_read_the_same(
    dump: Dump, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A pass keeps few shards open (`OPEN_SHARDS`): one closed and met again is opened and
    read again, giving the same rows in the same order."""
    from hookdump.store.read import rows

    whole = list(dump.batches([X, Y], 3, shuffle=True, seed=4, with_index=True))
    monkeypatch.setattr(rows, "OPEN_SHARDS", 2)
    again = list(dump.batches([X, Y], 3, shuffle=True, seed=4, with_index=True))
    assert len(whole) == len(again)
    for one, two in zip(whole, again, strict=True):
        assert all(torch.equal(one[k], two[k]) for k in (X, Y, "__row__"))


def test_the_order_is_fixed_by_the_seed_and_mixes_shards(dump: Dump) -> None:
    def order(seed: int) -> torch.Tensor:
        return torch.cat([b[X] for b in dump.batches([X], 8, shuffle=True, seed=seed)])

    assert torch.equal(order(0), order(0))
    assert not torch.equal(order(0), order(1))
    assert not torch.equal(order(0), dump[X])
    shard_of = _shard_of(dump)
    for batch in dump.batches([X], 8, shuffle=True, seed=0):
        shards = {shard_of[tuple(row.tolist())] for row in batch[X]}
        assert len(shards) >= 2, shards  # every batch mixes rows of at least two shards


def test_only_a_buffer_of_blocks_is_read_at_a_time(
    dump: Dump, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A budget of 16 rows' bytes, batches of 4: two buffers of 4 one-row blocks (half the
    budget, less a batch's room for the rows carried in), from shards all over the dump;
    every row is read once in the pass, and each shard's header checked once."""
    from hookdump.store.read import rows as rows_module
    from hookdump.store.read.batches import ROW_OVERHEAD
    from hookdump.store.read.rows import ShardRows

    sums = dump[X].sum(1).tolist()  # each row's, read before the spies
    read: list[tuple[int, int]] = []
    opened: list[str] = []
    real_read, real_open = ShardRows.scatter, ShardReader.open

    def spy_read(self: ShardRows, lo: int, hi: int, *places: Any) -> None:
        read.append((lo, hi))
        real_read(self, lo, hi, *places)

    def spy_open(self: ShardReader, shard: ShardEntry, keys: list[str], *more: Any):  # type: ignore[no-untyped-def]
        opened.append(shard.file)
        return real_open(self, shard, keys, *more)

    monkeypatch.setattr(ShardRows, "scatter", spy_read)
    monkeypatch.setattr(ShardReader, "open", spy_open)
    rows_module._LAYOUTS.pop(dump.reader, None)  # as if no pass had read this dump before
    batches = dump.batches(
        [X, Y],
        4,
        shuffle=True,
        seed=0,
        buffer_bytes=16 * (dump.reader.row_bytes([X, Y]) + ROW_OVERHEAD),
    )
    first = next(batches)
    # two buffers of 4 one-row blocks at most: the one given out, and the next read ahead
    assert 4 <= len(read) <= 8
    assert len({lo // 4 for lo, _ in read[:4]}) >= 2  # of 10 shards: from the whole dump
    assert set(first[X].sum(1).tolist()) <= {sums[lo] for lo, _ in read[:4]}
    rest = list(batches)
    assert sorted(read) == [(i, i + 1) for i in range(37)] and rest
    assert sorted(opened) == sorted(s.file for s in dump.manifest.shards)
    opened.clear()  # a later pass of the dump checks no header again (the shards unchanged)
    assert len(list(dump.batches([X, Y], 4, shuffle=True, seed=1))) == 10 and opened == []


def test_bad_arguments_are_one_error(dump: Dump) -> None:
    with pytest.raises(hookdump.HookdumpError, match="'linear_9' is not in"):
        next(dump.batches(["linear_9"], 4))
    with pytest.raises(hookdump.HookdumpError, match="start -1 must be an integer of at least 0"):
        next(dump.batches([X], 4, start=-1))
    with pytest.raises(hookdump.HookdumpError, match="batch_size 0 must be an integer of at"):
        next(dump.batches([X], 0))
    with pytest.raises(hookdump.HookdumpError, match="keys must be a non-empty list"):
        next(dump.batches([], 4))
    # one key may be given as a string (issue 57): the same pass as its list
    one, listed = dump.batches(X, 4, with_index=True), dump.batches([X], 4, with_index=True)
    for a, b in zip(one, listed, strict=True):
        assert a.keys() == b.keys() and torch.equal(a[X], b[X])


# The algorithm alone (`pass_batches`), over row ranges held in memory: no dump, no file.
ROWS = torch.arange(103)  # row i of "id" is i, of "twice" 2i: alignment is checkable


def _blocks(sizes: list[int]) -> list[tuple[int, int]]:
    bounds = torch.tensor([0, *sizes]).cumsum(0).tolist()
    return list(itertools.pairwise(bounds))


class _Rows:
    """ROWS in memory as a pass's source, logging the ranges read."""

    def __init__(self, log: list[tuple[int, int]]) -> None:
        self.log = log
        self.done = threading.Event()  # closed

    def allocate(self, count: int) -> dict[str, torch.Tensor]:
        return {"id": torch.full((count,), -1), "twice": torch.full((count,), -1)}

    ahead = 1

    def will_need(self, lo: int, hi: int) -> None:
        pass

    closed = 0

    def close(self) -> None:
        self.closed += 1
        self.done.set()

    def scatter(self, lo: int, hi: int, places: Any, positions: torch.Tensor) -> None:
        self.log.append((lo, hi))
        places.put("id", ROWS[lo:hi], positions)
        places.put("twice", 2 * ROWS[lo:hi], positions)


def _pass(sizes: list[int], group: int = 2, log: list | None = None, **options: Any) -> list:
    from hookdump.store.read.batches import PassOptions, pass_batches

    chosen = PassOptions(**{"batch_size": 8, "seed": 3, **options})
    blocks = torch.tensor(_blocks(sizes), dtype=torch.int64).reshape(-1, 2)
    source = _Rows([] if log is None else log)
    batches = list(pass_batches(blocks, source, chosen, group))
    assert source.closed == 1  # what the pass kept open is let go, once
    return batches


def test_a_pass_left_early_closes_its_source() -> None:
    from hookdump.store.read.batches import PassOptions, pass_batches

    blocks = torch.tensor(_blocks([10] * 10), dtype=torch.int64)
    source = _Rows([])
    rows = pass_batches(blocks, source, PassOptions(batch_size=4, shuffle=True), 2)
    next(rows)
    rows.close()  # the reading thread closes it as it stops
    assert source.done.wait(600) and source.closed == 1


@pytest.mark.parametrize("sizes", [[103], [10] * 10 + [3], [1] * 103, [50, 0, 53]])
@pytest.mark.parametrize("shuffle", [False, True])
@pytest.mark.parametrize("batch_size", [1, 7, 32, 200])
def test_a_pass_gives_every_row_once_aligned_and_full_until_the_last(
    sizes: list[int], shuffle: bool, batch_size: int
) -> None:
    log: list[tuple[int, int]] = []
    batches = _pass(sizes, log=log, batch_size=batch_size, shuffle=shuffle, with_index=True)
    seen = torch.cat([b["id"] for b in batches])
    assert sorted(seen.tolist()) == ROWS.tolist()
    assert all(torch.equal(b["twice"], 2 * b["id"]) for b in batches)
    assert all(torch.equal(b["__row__"], b["id"]) for b in batches)  # row numbers
    assert all(len(b["id"]) == batch_size for b in batches[:-1])
    assert (seen.tolist() == ROWS.tolist()) is not shuffle or len(ROWS) <= 1
    assert sorted(log) == sorted(b for b in _blocks(sizes) if b[0] < b[1])  # each once
    dropped = _pass(sizes, batch_size=batch_size, shuffle=shuffle, drop_last=True)
    assert len(dropped) == len(ROWS) // batch_size
    assert all(torch.equal(a["id"], b["id"]) for a, b in zip(dropped, batches, strict=False))


def test_the_order_is_drawn_from_every_block_and_fixed_by_the_seed() -> None:
    """Twenty blocks of five rows (think: shards) and a buffer of four blocks: the first
    buffer's blocks come from all over, not the first four; the order is the seed's."""
    log: list[tuple[int, int]] = []
    batches = _pass([5] * 20, group=4, log=log, shuffle=True, seed=5, batch_size=10)
    assert sorted(torch.cat([b["id"] for b in batches]).tolist()) == ROWS[:100].tolist()
    assert log[:4] != _blocks([5] * 4) and max(lo for lo, _ in log[:4]) >= 40
    again = _pass([5] * 20, group=4, shuffle=True, seed=5, batch_size=10)
    assert all(torch.equal(a["id"], b["id"]) for a, b in zip(batches, again, strict=True))
    other = _pass([5] * 20, group=4, shuffle=True, seed=6, batch_size=10)
    assert not all(torch.equal(a["id"], b["id"]) for a, b in zip(batches, other, strict=True))


@pytest.mark.parametrize("start", [0, 1, 4, 5, 12, 13, 14])
def test_start_resumes_the_same_order_reading_only_what_is_left(start: int) -> None:
    """103 rows, batches of 8 (12 full and one of 7): starting at batch `start` gives the
    rest of the same pass; buffers wholly before it are not read."""
    whole = _pass([10] * 10 + [3], group=3, shuffle=True, seed=2)
    log: list[tuple[int, int]] = []
    rest = _pass([10] * 10 + [3], group=3, log=log, shuffle=True, seed=2, start=start)
    assert len(rest) == max(0, len(whole) - start)
    assert all(torch.equal(a["id"], b["id"]) for a, b in zip(whole[start:], rest, strict=True))
    if start >= 4:  # the first buffer (30 rows: 3 batches) was passed over unread
        assert len([b for b in log if b[1] - b[0] > 1]) < 11


def test_readers_split_the_blocks_and_together_read_every_row_once() -> None:
    parts = [_pass([10] * 10 + [3], shuffle=True, split=(i, 3)) for i in range(3)]
    ids = [torch.cat([b["id"] for b in part]).tolist() for part in parts]
    assert sorted(itertools.chain(*ids)) == ROWS.tolist()
    assert all(part for part in ids)


# The reader on a dump of 16 shards, and the IterableDataset.


@pytest.fixture(scope="module")
def sixteen(place: Callable[[str], Path | str]) -> Dump:
    """64 rows of TwoLinear in 16 shards of 4 (in a folder, and at a URL)."""
    loaded = _two_linear(place("sixteen"), 64)
    assert len(loaded.manifest.shards) == 16
    return loaded


def test_the_first_shuffled_batch_draws_from_most_shards(sixteen: Dump) -> None:
    first = next(sixteen.batches([Y], 16, shuffle=True, seed=0, with_index=True))
    shards = {int(row) // 4 for row in first["__row__"]}
    assert len(shards) >= 9, shards  # 16 rows from 16 shards of 4 rows: about 10 expected
    torch.testing.assert_close(first[Y], sixteen[Y][first["__row__"]])  # rows and numbers


def test_with_index_and_start_through_a_dump(sixteen: Dump) -> None:
    whole = list(sixteen.batches([Y], 5, shuffle=True, seed=4, with_index=True))
    rows = torch.cat([b["__row__"] for b in whole])
    assert sorted(rows.tolist()) == list(range(64))
    torch.testing.assert_close(torch.cat([b[Y] for b in whole]), sixteen[Y][rows])
    rest = list(sixteen.batches([Y], 5, shuffle=True, seed=4, with_index=True, start=7))
    assert all(torch.equal(a["__row__"], b["__row__"]) for a, b in zip(whole[7:], rest,
                                                                     strict=True))  # fmt: skip


@pytest.mark.parametrize("scattered", [True, False], ids=["preadv", "copied"])
@pytest.mark.parametrize("shuffle", [False, True])
def test_batches_held_keep_their_rows_while_the_pass_goes_on(
    dump: Dump, monkeypatch: pytest.MonkeyPatch, scattered: bool, shuffle: bool
) -> None:
    """Rows are read straight into the batches, whose memory is used again once let go:
    the batches held here (whole, by a view, by a NumPy array of them) keep their own rows
    to the end of a pass of buffers of 8 rows, while the rest are let go; each equals the
    dump's own rows (`dump[key][rows]`). Once without `preadv` (rows read, then copied)."""
    from hookdump.store.media.blob import LocalBlob
    from hookdump.store.read.batches import ROW_OVERHEAD

    if not scattered:
        monkeypatch.setattr(LocalBlob, "vectored", False)
    budget = 16 * (dump.reader.row_bytes([X, Y]) + ROW_OVERHEAD)
    batches = dump.batches([X, Y], 3, shuffle=shuffle, seed=1, with_index=True,
                              buffer_bytes=budget)  # fmt: skip
    held: list[tuple[torch.Tensor, Any, Any]] = []  # row numbers, X as held, Y as held
    for index, batch in enumerate(batches):
        rows = batch["__row__"]
        if index % 3 == 0:
            held.append((rows, batch[X], batch[Y]))
        elif index % 3 == 1:
            held.append((rows, batch[X][1:], batch[Y].numpy()))
        del batch  # the others are let go: their memory goes to later batches
    assert len(held) == 9  # of 13 batches (37 rows)
    seen = torch.cat([rows for rows, _, _ in held])
    assert len(set(seen.tolist())) == len(seen)
    for rows, x, y in held:
        torch.testing.assert_close(x, dump[X][rows][-len(x) :], rtol=0, atol=0)
        torch.testing.assert_close(torch.as_tensor(y), dump[Y][rows], rtol=0, atol=0)


def test_batch_memory_is_used_again_once_nothing_refers_to_it() -> None:
    from hookdump.store.read.scatter import Places, Slabs

    slabs = Slabs({"a": torch.empty(0, 3), "none": torch.empty(0, 0)}, keep=2)
    first = slabs.take(4)
    address = first["a"].data_ptr()
    view = first["a"][1:]
    del first
    assert slabs.take(4)["a"].data_ptr() != address  # a view of it is held
    del view
    again = slabs.take(2)  # fewer rows fit the same memory
    assert again["a"].data_ptr() == address and again["a"].shape == (2, 3)
    array = again["a"].numpy()
    del again
    assert slabs.take(4)["a"].data_ptr() != address  # a NumPy array of it is held
    del array
    assert slabs.take(4)["a"].data_ptr() == address
    # rows land where the order puts them, and nowhere outside the batches
    batches = [slabs.take(2), slabs.take(1)]
    places = Places(batches, 2)
    places.put("a", torch.arange(9.0).view(3, 3), torch.tensor([2, 0, 1]))
    assert batches[1]["a"].tolist() == [[0.0, 1.0, 2.0]]
    assert batches[0]["a"].tolist() == [[3.0, 4.0, 5.0], [6.0, 7.0, 8.0]]
    with pytest.raises(IndexError, match="outside the 3 places"):
        places.vectors("a", 12, torch.tensor([0, 3]).numpy())


@pytest.mark.filterwarnings("ignore:This DataLoader will create 4 worker processes")
def test_workers_and_ranks_together_read_every_row_once(sixteen: Dump) -> None:
    """4 DataLoader workers x 2 simulated ranks: disjoint, and every row once."""
    seen: list[int] = []
    for rank in range(2):
        dataset = sixteen.dataset(
            [Y],
            3,
            shuffle=True,
            seed=1,
            with_index=True,
            rank=rank,
            world_size=2,
            buffer_bytes=16 * (sixteen.reader.row_bytes([Y]) + 24),
        )
        loader = torch.utils.data.DataLoader(dataset, batch_size=None, num_workers=4)
        batches = list(loader)
        for batch in batches:
            torch.testing.assert_close(batch[Y], sixteen[Y][batch["__row__"]])
        seen += torch.cat([b["__row__"] for b in batches]).tolist()
    assert sorted(seen) == list(range(64))


def test_a_rank_resumes_at_its_own_step(sixteen: Dump) -> None:
    """`start` counts the batches the rank's DataLoader gave out (from its workers in turn)."""

    def rows(start: int) -> list[list[int]]:
        dataset = sixteen.dataset(
            [Y],
            3,
            shuffle=True,
            seed=1,
            with_index=True,
            rank=1,
            world_size=2,
            start=start,
            buffer_bytes=16 * (sixteen.reader.row_bytes([Y]) + 24),
        )
        loader = torch.utils.data.DataLoader(dataset, batch_size=None, num_workers=2)
        return [b["__row__"].tolist() for b in loader]

    whole = rows(0)
    assert rows(3) == whole[3:]


def test_a_pass_left_open_at_exit_ends_the_process_cleanly(dump: Dump) -> None:
    """The reading thread is stopped before the interpreter tears down: torch aborts a
    process whose thread is inside it then ("terminate called without an active
    exception")."""
    import subprocess
    import sys

    script = (
        "import sys, hookdump\n"
        "rows = hookdump.load(sys.argv[1]).batches([sys.argv[2]], 1, shuffle=True,\n"
        "                                         buffer_bytes=1 << 12)\n"
        "next(rows)\n"
        "print('one batch')\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script, str(dump.path), X],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert (done.returncode, done.stdout, done.stderr) == (0, "one batch\n", "")


def test_a_dataset_pickles_for_workers_started_by_spawn(dump: Dump) -> None:
    """A DataLoader whose workers are spawned (macOS's default) pickles the dataset; the
    copy gives the same batches."""
    import pickle

    dataset = dump.dataset([X, Y], 5, shuffle=True, seed=2, with_index=True)
    copy = pickle.loads(pickle.dumps(dataset))
    for mine, theirs in zip(dataset, copy, strict=True):
        assert all(torch.equal(mine[k], theirs[k]) for k in (X, Y, "__row__"))


def test_a_shard_changed_between_two_passes_is_checked_again(tmp_path: Path) -> None:
    """The layouts a pass keeps for the dump's later passes hold only while a shard is the
    file checked: another run's shard put in its place is refused by the next pass."""
    one, other = _two_linear(tmp_path / "one", 12), _two_linear(tmp_path / "other", 12)
    assert len(list(one.batches([Y], 5))) == 3
    name = one.manifest.shards[1].file
    os.replace(tmp_path / "other" / name, tmp_path / "one" / name)
    with pytest.raises(hookdump.InvalidDump, match=name):
        list(one.batches([Y], 5))
    assert other.manifest.run_id != one.manifest.run_id
