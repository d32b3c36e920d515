"""Reading a dump's rows back in batches, for training a probe or a sparse autoencoder.

Every row comes exactly once per pass, and the rows of different keys stay aligned (row i
of every key is the same sample or token). Without shuffling, rows come in order. With it,
the order is fixed by the seed:

- the shards are cut into blocks of rows of at most `BLOCK_BYTES` (32 MiB) of the
  requested keys (a shard smaller than that is one block);
- the blocks are taken in a seeded random order, from each shard in turn (so that a
  window mixes as many shards as it can), `window` at a time (4 by default);
- the rows of the blocks in the window (and the few left over from the window before) are
  put in a seeded random order and cut into batches; the last partial batch of a window
  waits for the next one, so batches are full until the very last.

So a batch mixes rows from up to `window` blocks, never from blocks far apart in the
shuffled order, and memory holds `window` blocks (128 MiB by default; twice that while
they are shuffled), never the whole dump, whatever the shards' headers claim. A wider
window mixes more and holds more. Without shuffling, one block is held at a time.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

import torch

from hookdump.errors import HookdumpError, did_you_mean, opt

if TYPE_CHECKING:
    from hookdump.store.reader import Dump

WINDOW = 4
Block = TypeVar("Block")
BLOCK_BYTES = 32 << 20  # a window of 4 is 128 MiB, and twice that while it is shuffled


def iter_batches(
    dump: Dump,
    keys: list[str],
    batch_size: int,
    *,
    shuffle: bool = False,
    seed: int = 0,
    window: int = WINDOW,
) -> Iterator[dict[str, torch.Tensor]]:
    """Batches of `batch_size` rows (the last may be smaller) of `keys`, as dicts."""
    _check(dump, keys, batch_size, window)
    blocks = [
        (shard, lo, hi) for shard in dump.shards for lo, hi in dump.slices(shard, keys, BLOCK_BYTES)
    ]

    def read(block: tuple[dict[str, Any], int, int]) -> dict[str, torch.Tensor]:
        shard, lo, hi = block
        with dump.open_shard(shard, keys) as opened:
            return {key: dump.read_rows(opened, shard, key, lo, hi) for key in keys}

    return mixed_batches(blocks, read, batch_size, shuffle=shuffle, seed=seed, window=window,
                         source=lambda block: block[0]["file"])  # fmt: skip


def mixed_batches(
    blocks: Sequence[Block],
    read: Callable[[Block], dict[str, torch.Tensor]],
    batch_size: int,
    *,
    shuffle: bool = False,
    seed: int = 0,
    window: int = WINDOW,
    source: Callable[[Block], object] | None = None,
) -> Iterator[dict[str, torch.Tensor]]:
    """The algorithm of the module's docstring over any `blocks`, each read (as aligned
    tensors of the same rows) by `read` only when its window comes: in order, or shuffled
    `window` blocks at a time. `source` (a block's shard): shuffled blocks are taken from
    the sources in turn, so that a window mixes as many shards as it can."""
    generator = torch.Generator().manual_seed(seed)
    order = list(blocks)
    if shuffle:
        order = [order[i] for i in torch.randperm(len(order), generator=generator).tolist()]
        if source is not None:
            order = _in_turn(order, source)
    step = window if shuffle else 1
    carry: dict[str, torch.Tensor] | None = None
    for first in range(0, len(order), step):
        pool = [read(block) for block in order[first : first + step]]
        if carry is not None:
            pool.insert(0, carry)
        rows = _concat(pool)
        del pool  # the blocks, now in `rows`
        if shuffle:
            permutation = torch.randperm(_rows(rows), generator=generator)
            rows = {key: value[permutation] for key, value in rows.items()}
        full = _rows(rows) - _rows(rows) % batch_size
        for start in range(0, full, batch_size):
            yield {key: value[start : start + batch_size] for key, value in rows.items()}
        carry = {key: value[full:] for key, value in rows.items()} if full < _rows(rows) else None
    if carry is not None:
        yield carry


def _in_turn(blocks: list[Block], source: Callable[[Block], object]) -> list[Block]:
    """`blocks` taken from their sources in turn (each source's in their order here, the
    sources in the order they first appear): one block per source stays as it was."""
    by_source: dict[object, list[Block]] = {}
    for block in blocks:
        by_source.setdefault(source(block), []).append(block)
    queues = list(by_source.values())
    turned: list[Block] = []
    for depth in range(max((len(q) for q in queues), default=0)):
        turned += [q[depth] for q in queues if depth < len(q)]
    return turned


def _check(dump: Dump, keys: list[str], batch_size: int, window: int) -> None:
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
    if batch_size < 1:
        raise HookdumpError(f"{opt('batch_size')} {batch_size} must be at least 1")
    if window < 1:
        raise HookdumpError(f"{opt('window')} {window} must be at least 1")


def _concat(parts: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    if len(parts) == 1:
        return parts[0]
    return {key: torch.cat([part[key] for part in parts]) for key in parts[0]}


def _rows(tensors: dict[str, torch.Tensor]) -> int:
    return next(iter(tensors.values())).shape[0]
