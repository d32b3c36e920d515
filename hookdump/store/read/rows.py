"""Rows of a dump's shards read straight into a caller's buffer, or to their places in a
pass's batches (`scatter`): with `preadv` from a local file (no memory map, no intermediate
tensor, one copy from the kernel, in as large a read as the rows make), or with ranged
requests from an object at a URL, asked for `REMOTE_AHEAD` blocks ahead, and copied to
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
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from dataclasses import dataclass

import numpy as np
import torch

from hookdump.errors import InvalidDump
from hookdump.format.manifest import ShardEntry
from hookdump.store.media.blob import Blob, LocalBlob, scattered_reads
from hookdump.store.read.reader import ShardReader
from hookdump.store.read.scatter import Places
from hookdump.store.read.shard_file import SafetensorsFile

# blocks asked for ahead of their read from a URL: each a request per key in flight, so
# the memory beyond a pass's buffers is at most this many blocks (of BLOCK_BYTES)
REMOTE_AHEAD = 8
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
        # at a URL: the blocks asked for ahead (each a request per key in flight), and each
        # shard's object, looked up (and checked) once per pass
        self.ahead = 1 if dump.remote is None else REMOTE_AHEAD
        self._pending: dict[tuple[int, int], list[Future[bytes]]] = {}
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

    def read_into(self, lo: int, hi: int, out: dict[str, torch.Tensor]) -> None:
        """Rows `lo:hi` of a local shard (dump row numbers, inside one shard) into `out`
        (`hi - lo` rows of each key, contiguous): where `preadv` cannot scatter them."""
        self._read_local(lo, hi, lambda key, blob, at: blob.readinto(_bytes_of(out[key]), at))

    def scatter(self, lo: int, hi: int, places: Places, positions: torch.Tensor) -> None:
        """Rows `lo:hi` (inside one shard) straight to `positions` of `places` (one each):
        locally with one `preadv` per key, into the batches themselves; at a URL from each
        response's bytes."""
        where = positions.numpy()
        if self.dump.remote is not None:
            for key, data in self._remote_rows(lo, hi):
                if data:
                    raw = np.frombuffer(data, dtype=np.uint8).reshape(hi - lo, -1)
                    places.put_bytes(key, raw, where)
            return
        if not scattered_reads():
            rows = self.allocate(hi - lo)
            self.read_into(lo, hi, rows)
            for key, values in rows.items():
                places.put(key, values, positions)
            return

        def read(key: str, blob: Blob, at: int) -> int:
            assert isinstance(blob, LocalBlob)
            return blob.read_vectors(places.vectors(key, self._row_bytes[key], where), at)

        self._read_local(lo, hi, read)

    def _read_local(self, lo: int, hi: int, read: Callable[[str, Blob, int], int]) -> None:
        """Rows `lo:hi` of a local shard, key by key: `read(key, blob, offset)` reads a
        key's rows from `offset` on and says how many bytes it read."""
        shard = self.dump.shard_of(lo)
        blob = self._blob(shard)
        try:
            layout = self._layout(shard, blob)
            for key in self.keys:
                span = self._span(layout, shard, key, lo, hi)
                if not span:
                    continue
                got = read(key, blob, span.start)
                if got != len(span):
                    raise self._short(shard, key, got, len(span))
        except OSError as exc:
            where = self.dump.path / shard.file
            raise InvalidDump(f"cannot read shard {where}: {exc.strerror or exc}") from None

    def will_need(self, lo: int, hi: int) -> None:
        """Ask for rows `lo:hi` ahead of their read (a hint: errors wait for the read)."""
        shard = self.dump.shard_of(lo)
        if self.dump.remote is not None:
            if (lo, hi) not in self._pending:
                self._pending[(lo, hi)] = self._fetch(shard, lo, hi)
            return
        layout = self._layouts.get(shard.file)
        if layout is None:
            return
        try:
            blob = self._blob(shard)
        except (OSError, InvalidDump):
            return
        for key in self.keys:
            span = self._span(layout, shard, key, lo, hi)
            blob.will_need(span.start, len(span))

    def _fetch(self, shard: ShardEntry, lo: int, hi: int) -> list[Future[bytes]]:
        """Requests for rows `lo:hi` of each key, sent now (the object looked up and its
        header checked the first time the pass meets the shard)."""
        remote = self.dump.remote
        assert remote is not None
        layout = self._layout(shard, self._blob(shard))
        spans = [self._span(layout, shard, key, lo, hi) for key in self.keys]
        return [remote.fetch(shard.file, span.start, span.stop) for span in spans]

    def _remote_rows(self, lo: int, hi: int) -> Iterator[tuple[str, bytes]]:
        """Each key's bytes of rows `lo:hi` from the URL (asked for ahead, or now), as the
        responses hold them, checked to be whole."""
        remote = self.dump.remote
        assert remote is not None
        shard = self.dump.shard_of(lo)
        futures = self._pending.pop((lo, hi), None) or self._fetch(shard, lo, hi)
        for key, future in zip(self.keys, futures, strict=True):
            data = remote.take(shard.file, future)
            want = (hi - lo) * self._row_bytes[key]
            if len(data) != want:
                raise self._short(shard, key, len(data), want)
            yield key, data

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
