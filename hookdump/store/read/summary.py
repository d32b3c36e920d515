"""Every key's size and statistics read back from a dump's shards (`inspect`, and a resumed
run's table), in bounded slices; the holes of a sparse shard are counted, not read."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Sequence

import torch

from hookdump.format.dtypes import ITEMSIZE
from hookdump.format.manifest import ShardEntry
from hookdump.store.read.reader import SLICE_BYTES, ShardReader, key_info
from hookdump.store.read.shard_file import SafetensorsFile
from hookdump.store.stats import KeySummary


def summarize(
    dump: ShardReader, shards: Sequence[ShardEntry] | None = None
) -> dict[str, KeySummary]:
    """Every key's size and statistics, read from `shards` (default: all) shard by shard, a
    slice of rows at a time (a row larger than a slice is read a part of its first
    dimension at a time): memory stays bounded whatever the shards' headers claim."""
    summaries = {
        key: KeySummary(key_info(key, meta), tuple(meta["shape"]), meta["dtype"])
        for key, meta in dump.manifest.tensors.items()
    }
    keys = [
        key for key in dump.manifest.tensors if dump.row_bytes([key])
    ]  # zero-width: nothing to read
    for key in summaries.keys() - set(keys):
        summaries[key].lose_features()  # never read: its rows are not counted here
    for shard in dump.shards if shards is None else shards:
        with dump.open(shard, keys) as opened:
            for key in dump.manifest.tensors:
                rows = min(shard.stop, dump.rows_of(key)) - shard.start  # a ragged file
                summaries[key].count_bytes(dump.row_bytes([key]) * rows)
            for key in keys:
                own = dataclasses.replace(shard, stop=min(shard.stop, dump.rows_of(key)))
                if not _whole_rows(dump, key):
                    summaries[key].lose_features()  # read in parts of a row: not as rows
                for part in _parts(dump, opened, own, key):
                    if isinstance(part, int):
                        summaries[key].add_zeros(part)  # a hole: zeros never read
                    else:
                        summaries[key].add_values(part)
    return summaries


def _whole_rows(dump: ShardReader, key: str) -> bool:
    """Whether `key` is read whole rows at a time (a row larger than a slice, of more than
    one part along its first dimension, is read a part at a time)."""
    shape = dump.manifest.tensors[key]["shape"]
    return dump.row_bytes([key]) <= SLICE_BYTES or not shape or shape[0] < 2


def _parts(
    dump: ShardReader, opened: SafetensorsFile, shard: ShardEntry, key: str
) -> Iterator[torch.Tensor | int]:
    """`key`'s values in a shard, in pieces of about `SLICE_BYTES` at most; a piece that is
    a hole of a sparse file is the count of its zeros, never read, so the time follows the
    bytes on disk rather than the rows a header claims."""
    per_row, shape = dump.row_bytes([key]), dump.manifest.tensors[key]["shape"]
    per_element = ITEMSIZE.get(dump.manifest.tensors[key]["dtype"], 8)
    if _whole_rows(dump, key):
        for lo, hi in dump.slices(shard, [key]):
            first = (lo - shard.start) * per_row
            if not opened.holds_data(key, first, (hi - lo) * per_row):
                yield (hi - lo) * per_row // per_element
                continue
            yield dump.read_rows(opened, shard, key, lo, hi)
        return
    step = max(1, SLICE_BYTES * shape[0] // per_row)  # of the row's first dimension
    part = per_row // shape[0]
    for row in range(shard.start, shard.stop):
        for lo in range(0, shape[0], step):
            first = (row - shard.start) * per_row + lo * part
            size = (min(lo + step, shape[0]) - lo) * part
            if not opened.holds_data(key, first, size):
                yield size // per_element
                continue
            yield dump.read_rows(opened, shard, key, row, row + 1, inner=slice(lo, lo + step))
