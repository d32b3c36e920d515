"""Rows of a dump's shards read to their places in a pass's batches (`scatter`), from the
blob its medium opens: with `preadv` from a local file (no memory map, no intermediate
tensor, one copy from the kernel, in as large a read as the rows make), or with ranged
requests from an object at a URL, sent `Medium.reads_ahead` blocks ahead, and copied to
their places. `Dump.batches` reads this way.

A shard is checked once (its run id, and its header against the manifest, by
`ShardReader.open`, on the very file or object read), and its tensors' byte offsets are
taken from that header, each checked to hold exactly the rows the manifest gives it. A pass
opens each shard once and keeps it open (up to `OPEN_SHARDS` at a time; opening a file for
every block cost a path check, an open and a stat each): the rows read are the checked
file's, never another run's, even if the dump is written over meanwhile. A shard opened
again is checked again where it changed (another inode, size or time, or at a URL another
size or ETag).
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass

import numpy as np
import torch

from hookdump.errors import InvalidDump
from hookdump.format.manifest import ShardEntry
from hookdump.store.media.blob import Blob
from hookdump.store.read.reader import ShardReader
from hookdump.store.read.scatter import Places
from hookdump.store.read.shard_file import SafetensorsFile

OPEN_SHARDS = 64  # shards a pass keeps open, the least recently read closed first


@dataclass(frozen=True)
class _Layout:
    identity: tuple[object, ...]  # the file as checked: device, inode, size, mtime (or ETag)
    offsets: dict[str, int]  # key -> the byte in the file where its first row starts


# each dump's shard layouts, per keys read, by file: as long as the dump is alive
_LAYOUTS: weakref.WeakKeyDictionary[ShardReader, dict[tuple[str, ...], dict[str, _Layout]]] = (
    weakref.WeakKeyDictionary()
)


class ShardRows:
    """Rows of `keys` of `dump`, read into buffers `allocate` makes."""

    def __init__(self, dump: ShardReader, keys: list[str]) -> None:
        self.dump, self.keys = dump, list(keys)
        self._row_bytes = {key: dump.row_bytes([key]) for key in keys}
        # kept for the dump's later passes: a shard's header is read again only where the
        # shard changed (at a URL, a request fewer per shard and pass)
        self._layouts = _LAYOUTS.setdefault(dump, {}).setdefault(tuple(self.keys), {})
        self.ahead = dump.medium.reads_ahead  # blocks announced ahead of the one read
        self._opened: dict[str, Blob] = {}  # by file, the most recently read last

    def close(self) -> None:
        """Close the shards the pass keeps open (it may read on: they open again)."""
        while self._opened:
            self._opened.popitem()[1].close()

    def _blob(self, shard: ShardEntry) -> Blob:
        """The shard's file or object, opened (and its size checked) the first time the
        pass meets it, and kept open."""
        blob = self._opened.pop(shard.file, None)
        if blob is None:
            blob = self.dump.blob(shard)
            if len(self._opened) >= OPEN_SHARDS:
                self._opened.pop(next(iter(self._opened))).close()
        self._opened[shard.file] = blob
        return blob

    def allocate(self, count: int) -> dict[str, torch.Tensor]:
        """Empty tensors of `count` rows of each key, as the manifest shapes them."""
        infos = [self.dump.info(key) for key in self.keys]  # the reader's shapes and dtypes
        return {i.key: torch.empty((count, *i.shape), dtype=i.dtype) for i in infos}

    def scatter(self, lo: int, hi: int, places: Places, positions: torch.Tensor) -> None:
        """Rows `lo:hi` (inside one shard) straight to `positions` of `places` (one each):
        from a local file with one `preadv` per key into the batches themselves; from
        another blob (an object at a URL, bytes in memory) copied from the bytes it gives."""
        at = positions.numpy()
        shard = self.dump.shard_of(lo)
        blob = self._blob(shard)
        try:
            layout = self._layout(shard, blob)
            spans = {key: self._span(layout, shard, key, lo, hi) for key in self.keys}
            if not blob.vectored:  # every key's bytes asked for at once (an object: requests)
                for span in spans.values():
                    if span:
                        blob.will_need(span.start, len(span))
            for key, span in spans.items():
                if not span:
                    continue
                if blob.vectored:
                    vectors = places.vectors(key, self._row_bytes[key], at)
                    got = blob.read_vectors(vectors, span.start)
                else:
                    data = blob.pread(len(span), span.start)
                    got = len(data)
                    if got == len(span):
                        raw = np.frombuffer(data, dtype=np.uint8).reshape(hi - lo, -1)
                        places.put_bytes(key, raw, at)
                if got != len(span):
                    raise self._short(shard, key, got, len(span))
        except OSError as exc:
            where = self.dump.path / shard.file
            raise InvalidDump(f"cannot read shard {where}: {exc.strerror or exc}") from None

    def will_need(self, lo: int, hi: int) -> None:
        """Announce rows `lo:hi` ahead of their read (a local file: a hint to the disk; an
        object: its requests sent now). Errors wait for the read."""
        shard = self.dump.shard_of(lo)
        try:
            blob = self._blob(shard)
            layout = self._layout(shard, blob)
        except (OSError, InvalidDump):
            return
        for key in self.keys:
            span = self._span(layout, shard, key, lo, hi)
            if span:
                blob.will_need(span.start, len(span))

    def _layout(self, shard: ShardEntry, blob: Blob) -> _Layout:
        known = self._layouts.get(shard.file)
        if known is not None and known.identity == blob.identity:
            return known
        with self.dump.open(shard, self.keys, blob) as opened:  # its run id and header
            layout = _Layout(blob.identity, self._offsets(shard, opened))
        self._layouts[shard.file] = layout
        return layout

    def _offsets(self, shard: ShardEntry, opened: SafetensorsFile) -> dict[str, int]:
        """Where each key's rows start in the shard, once they are exactly its rows."""
        where = f"shard {self.dump.path / shard.file}"
        offsets = {}
        for key in self.keys:
            span = opened.span(key)
            if span is None:
                raise InvalidDump(f"{where}: no byte offsets for {key!r} in its header")
            begin, end = span
            if end - begin != shard.rows * self._row_bytes[key]:
                raise InvalidDump(
                    f"{where}: {key!r}'s bytes {begin}:{end} are not its {shard.rows} rows "
                    "inside the file"
                )
            offsets[key] = begin
        return offsets

    def _span(self, layout: _Layout, shard: ShardEntry, key: str, lo: int, hi: int) -> range:
        """The bytes of rows `lo:hi` of `key` in the shard."""
        size = self._row_bytes[key]
        start = layout.offsets[key] + (lo - shard.start) * size
        return range(start, start + (hi - lo) * size)

    def _short(self, shard: ShardEntry, key: str, got: int, want: int) -> InvalidDump:
        return InvalidDump(
            f"shard {self.dump.path / shard.file} ended inside {key!r}'s rows (read {got} of "
            f"{want} bytes)"
        )


def _bytes_of(rows: torch.Tensor) -> memoryview:
    """The bytes of contiguous `rows`, to read into."""
    return rows.view(torch.uint8).numpy().data.cast("B")
