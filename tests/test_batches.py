"""`Dump.batches`: every row once per pass, keys aligned, a seeded order that mixes shards,
and only a window of shards read at a time."""

from __future__ import annotations

import itertools
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from clitools import invoke

import hookdump
from hookdump.store.reader import Dump

X, Y = "linear_1:input.0", "linear_1"


@pytest.fixture(scope="module")
def dump(tmp_path_factory: pytest.TempPathFactory) -> Dump:
    """37 random rows in 10 shards (nine of 4 rows, one of 1): TwoLinear's first layer,
    whose weights are all 1, so each output row is the sum of its input row plus 1."""
    out = tmp_path_factory.mktemp("batches") / "d"
    old = Path.cwd()
    import os

    os.chdir(Path(__file__).parent)
    try:
        result = invoke("run", "tiny_models:TwoLinear", "-l", "linear_1", "--capture",
                        "input,output", "-n", "37", "-b", "4", "--shard-size", "1", "-q",
                        "-o", str(out))  # fmt: skip
    finally:
        os.chdir(old)
    assert result.exit_code == 0, result.stderr
    loaded = hookdump.load(out)
    assert len(loaded.shards) == 10
    return loaded


def _shard_of(dump: Dump) -> dict[tuple[float, ...], int]:
    """Each input row (unique: random) -> the index of the shard holding it."""
    found = {}
    for index, tensors in enumerate(dump.iter_shards([X])):
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


def test_only_a_window_of_shards_is_read_at_a_time(
    dump: Dump, monkeypatch: pytest.MonkeyPatch
) -> None:
    opened: list[str] = []
    real = Dump.open_shard

    def spy(self: Dump, shard: dict, keys: list[str]):  # type: ignore[no-untyped-def]
        opened.append(shard["file"])
        return real(self, shard, keys)

    monkeypatch.setattr(Dump, "open_shard", spy)
    batches = dump.batches([X, Y], 4, shuffle=True, seed=0, window=3)
    next(batches)
    assert len(opened) == 3  # the first window, no more
    rest = list(batches)
    assert len(opened) == 10 and len(set(opened)) == 10 and rest


def test_bad_arguments_are_one_error(dump: Dump) -> None:
    with pytest.raises(hookdump.HookdumpError, match="'linear_9' is not in"):
        next(dump.batches(["linear_9"], 4))
    with pytest.raises(hookdump.HookdumpError, match="batch_size 0 must be at least 1"):
        next(dump.batches([X], 0))
    with pytest.raises(hookdump.HookdumpError, match="keys must be a non-empty list"):
        next(dump.batches(X, 4))  # type: ignore[arg-type]


# The algorithm alone (`mixed_batches`), over blocks of rows held in memory: no dump, no file.
ROWS = torch.arange(103)  # row i of "id" is i, of "twice" 2i: alignment is checkable


def _blocks(sizes: list[int]) -> list[tuple[int, int]]:
    bounds = torch.tensor([0, *sizes]).cumsum(0).tolist()
    return list(itertools.pairwise(bounds))


def _reader(log: list[tuple[int, int]]) -> Callable[[tuple[int, int]], dict[str, torch.Tensor]]:
    def read(block: tuple[int, int]) -> dict[str, torch.Tensor]:
        log.append(block)
        lo, hi = block
        return {"id": ROWS[lo:hi].clone(), "twice": 2 * ROWS[lo:hi]}

    return read


@pytest.mark.parametrize("sizes", [[103], [10] * 10 + [3], [1] * 103, [50, 0, 53]])
@pytest.mark.parametrize("shuffle", [False, True])
@pytest.mark.parametrize("batch_size", [1, 7, 32, 200])
def test_mixed_batches_give_every_row_once_aligned_and_full_until_the_last(
    sizes: list[int], shuffle: bool, batch_size: int
) -> None:
    from hookdump.store.batches import mixed_batches

    log: list[tuple[int, int]] = []
    batches = list(mixed_batches(_blocks(sizes), _reader(log), batch_size, shuffle=shuffle,
                                 seed=3, window=2))  # fmt: skip
    seen = torch.cat([b["id"] for b in batches])
    assert sorted(seen.tolist()) == ROWS.tolist()
    assert all(torch.equal(b["twice"], 2 * b["id"]) for b in batches)
    assert all(len(b["id"]) == batch_size for b in batches[:-1])
    assert (seen.tolist() == ROWS.tolist()) is not shuffle or len(ROWS) <= 1
    assert sorted(log) == _blocks(sizes)  # each block read once


def test_mixed_batches_read_a_window_at_a_time_in_a_seeded_order() -> None:
    from hookdump.store.batches import mixed_batches

    log: list[tuple[int, int]] = []
    batches = mixed_batches(_blocks([10] * 10 + [3]), _reader(log), 8, shuffle=True, seed=5,
                            window=3)  # fmt: skip
    first = next(batches)
    assert len(log) == 3  # one window read, the rest not yet
    assert {int(i) // 10 for i in first["id"]} <= {lo // 10 for lo, _ in log}
    rest = [first, *batches]
    again = list(mixed_batches(_blocks([10] * 10 + [3]), _reader([]), 8, shuffle=True, seed=5,
                               window=3))  # fmt: skip
    assert all(torch.equal(a["id"], b["id"]) for a, b in zip(rest, again, strict=True))
    other = list(mixed_batches(_blocks([10] * 10 + [3]), _reader([]), 8, shuffle=True, seed=6,
                               window=3))  # fmt: skip
    assert not all(torch.equal(a["id"], b["id"]) for a, b in zip(rest, other, strict=True))


def test_a_window_of_blocks_mixes_shards_when_shards_hold_many_blocks() -> None:
    """Two shards of ten blocks each: every window of two shuffled blocks holds one block of
    each shard, so a batch mixes rows of two shards as the contract says."""
    from hookdump.store.batches import mixed_batches

    log: list[tuple[int, int]] = []
    blocks = _blocks([5] * 20)
    batches = list(mixed_batches(blocks, _reader(log), 10, shuffle=True, seed=1, window=2,
                                 source=lambda block: block[0] // 50))  # fmt: skip
    assert sorted(torch.cat([b["id"] for b in batches]).tolist()) == ROWS[:100].tolist()
    assert all({lo // 50 for lo, _ in log[i : i + 2]} == {0, 1} for i in range(0, 20, 2))
    assert all(len({int(i) // 50 for i in b["id"]}) == 2 for b in batches)
