"""Reading a dump's rows back in batches, for training a probe or a sparse autoencoder.

Every row comes exactly once per pass, and the rows of different keys stay aligned (row i
of every key is the same sample or token). Without shuffling, rows come in order. With it,
the order is fixed by the seed:

- the shards are cut into blocks of rows of at most `BLOCK_BYTES` (32 MiB) of the
  requested keys (a shard smaller than that is one block);
- the blocks are taken in a seeded random order, `window` at a time (4 by default);
- the rows of the blocks in the window (and the few left over from the window before) are
  put in a seeded random order and cut into batches; the last partial batch of a window
  waits for the next one, so batches are full until the very last.

So a batch mixes rows from up to `window` blocks, never from blocks far apart in the
shuffled order, and memory holds `window` blocks (128 MiB by default; twice that while
they are shuffled), never the whole dump, whatever the shards' headers claim. A wider
window mixes more and holds more. Without shuffling, one block is held at a time.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import torch

from hookdump.errors import HookdumpError, did_you_mean, opt

if TYPE_CHECKING:
    from hookdump.dump.reader import Dump

WINDOW = 4
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
    generator = torch.Generator().manual_seed(seed)
    blocks = [
        (shard, lo, hi) for shard in dump.shards for lo, hi in dump.slices(shard, keys, BLOCK_BYTES)
    ]
    if shuffle:
        blocks = [blocks[i] for i in torch.randperm(len(blocks), generator=generator).tolist()]
    step = window if shuffle else 1
    carry: dict[str, torch.Tensor] | None = None
    for first in range(0, len(blocks), step):
        pool = [_read(dump, block, keys) for block in blocks[first : first + step]]
        if carry is not None:
            pool.insert(0, carry)
        rows = _concat(pool, keys)
        del pool  # the blocks, now in `rows`
        if shuffle:
            order = torch.randperm(_rows(rows), generator=generator)
            rows = {key: value[order] for key, value in rows.items()}
        full = _rows(rows) - _rows(rows) % batch_size
        for start in range(0, full, batch_size):
            yield {key: value[start : start + batch_size] for key, value in rows.items()}
        carry = {key: value[full:] for key, value in rows.items()} if full < _rows(rows) else None
    if carry is not None:
        yield carry


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


def _read(
    dump: Dump, block: tuple[dict[str, Any], int, int], keys: list[str]
) -> dict[str, torch.Tensor]:
    shard, lo, hi = block
    with dump.open_shard(shard, keys) as opened:
        return {key: dump.read_rows(opened, shard, key, lo, hi) for key in keys}


def _concat(parts: list[dict[str, torch.Tensor]], keys: list[str]) -> dict[str, torch.Tensor]:
    if len(parts) == 1:
        return parts[0]
    return {key: torch.cat([part[key] for part in parts]) for key in keys}


def _rows(tensors: dict[str, torch.Tensor]) -> int:
    return next(iter(tensors.values())).shape[0]
