"""Rows of a dump's shards read straight into a caller's buffer with `os.preadv`: no memory
map, no intermediate tensor, one copy from the kernel, in as large a read as the rows make.
`Dump.batches` reads this way.

A shard is checked once (its run id, and its header against the manifest, by
`Dump.open_shard`), and its tensors' byte offsets are taken from its header, each checked to
hold exactly the rows the manifest gives it inside the file. A shard whose file changed
since (another inode, size or time: another run wrote over the dump) is checked again, so
a replaced shard is an `InvalidDump`, never another run's rows.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch

from hookdump.errors import InvalidDump
from hookdump.format.manifest import ShardEntry
from hookdump.store.read.reader import ShardReader
from hookdump.store.read.shard_file import SafetensorsError, read_header


@dataclass(frozen=True)
class _Layout:
    identity: tuple[int, int, int, int]  # the file as checked: device, inode, size, mtime
    offsets: dict[str, int]  # key -> the byte in the file where its first row starts


class ShardRows:
    """Rows of `keys` of `dump`, read into buffers `allocate` makes."""

    def __init__(self, dump: ShardReader, keys: list[str]) -> None:
        self.dump, self.keys = dump, list(keys)
        self._row_bytes = {key: dump.row_bytes([key]) for key in keys}
        self._layouts: dict[str, _Layout] = {}

    def allocate(self, count: int) -> dict[str, torch.Tensor]:
        """Empty tensors of `count` rows of each key, as the manifest shapes them."""
        infos = [self.dump.info(key) for key in self.keys]  # the reader's shapes and dtypes
        return {i.key: torch.empty((count, *i.shape), dtype=i.dtype) for i in infos}

    def read_into(self, lo: int, hi: int, out: dict[str, torch.Tensor]) -> None:
        """Rows `lo:hi` (dump row numbers, inside one shard) into `out` (`hi - lo` rows of
        each key, contiguous)."""
        shard = self.dump.shard_of(lo)
        path = self.dump.shard_path(shard)
        try:
            fd = os.open(path, os.O_RDONLY)
        except OSError as exc:
            raise InvalidDump(f"cannot read shard {path}: {exc.strerror or exc}") from None
        try:
            layout = self._layout(shard, fd)
            for key in self.keys:
                size = self._row_bytes[key]
                want = (hi - lo) * size
                if want == 0:
                    continue
                target = out[key].view(torch.uint8).numpy().data.cast("B")
                got = os.preadv(fd, [target], layout.offsets[key] + (lo - shard.start) * size)
                if got != want:
                    raise InvalidDump(
                        f"shard {path} ended inside {key!r}'s rows (read {got} of {want} bytes)"
                    )
        except OSError as exc:
            raise InvalidDump(f"cannot read shard {path}: {exc.strerror or exc}") from None
        finally:
            os.close(fd)

    def will_need(self, lo: int, hi: int) -> None:
        """Ask the disk for rows `lo:hi` ahead of their read (a hint: errors wait for it)."""
        shard = self.dump.shard_of(lo)
        layout = self._layouts.get(shard.file)
        if layout is None or not hasattr(os, "posix_fadvise"):
            return
        try:
            fd = os.open(self.dump.shard_path(shard), os.O_RDONLY)
        except (OSError, InvalidDump):
            return
        try:
            for key in self.keys:
                size = self._row_bytes[key]
                start = layout.offsets[key] + (lo - shard.start) * size
                os.posix_fadvise(fd, start, (hi - lo) * size, os.POSIX_FADV_WILLNEED)
        except OSError:
            pass
        finally:
            os.close(fd)

    def _layout(self, shard: ShardEntry, fd: int) -> _Layout:
        status = os.fstat(fd)
        identity = (status.st_dev, status.st_ino, status.st_size, status.st_mtime_ns)
        known = self._layouts.get(shard.file)
        if known is not None and known.identity == identity:
            return known
        with self.dump.open(shard, self.keys):  # its run id and header, checked
            pass
        layout = _Layout(identity, self._offsets(shard, fd, status.st_size))
        self._layouts[shard.file] = layout
        return layout

    def _offsets(self, shard: ShardEntry, fd: int, size: int) -> dict[str, int]:
        where = f"shard {self.dump.path / shard.file}"
        try:
            header, data = read_header(fd, size)
        except SafetensorsError as exc:
            raise InvalidDump(f"{where}: {exc}") from None
        rows = shard.stop - shard.start
        offsets = {}
        for key in self.keys:
            entry = header.get(key) if isinstance(header, dict) else None
            span = entry.get("data_offsets") if isinstance(entry, dict) else None
            if not (
                isinstance(span, list) and len(span) == 2 and all(type(v) is int for v in span)
            ):
                raise InvalidDump(f"{where}: no byte offsets for {key!r} in its header")
            begin, end = span
            if end - begin != rows * self._row_bytes[key] or begin < 0 or data + end > size:
                raise InvalidDump(
                    f"{where}: {key!r}'s bytes {begin}:{end} are not its {rows} rows inside the "
                    "file"
                )
            offsets[key] = data + begin
        return offsets
