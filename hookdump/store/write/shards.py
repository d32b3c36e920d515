"""Shard files in the safetensors layout: one whose keys and rows come as they are written
(`ShardFile`, the first batch's), and one planned ahead for a known number of rows of known
keys (`PlannedShard`, filled batch by batch). Each is made as a temporary file with its room
allocated, finished on the sink thread (last bytes, then the header) and published by the
commit thread (`DumpWriter.commit_shards`)."""

from __future__ import annotations

import contextlib
import json
import math
import os
import shutil
import struct
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import torch

from hookdump.errors import HookdumpError
from hookdump.format.dtypes import SAFETENSORS_DTYPES, dtype_name
from hookdump.store.checksum import DEFAULT, Algorithm, Checksum, Crc, crc_hex, file_checksum
from hookdump.store.folder import create_new, open_existing, remove_entry
from hookdump.store.write.direct_io import AppendFile, PositionalFile, pwrite_all, round_up

ENTRY_BYTES = 256  # a header entry's bytes besides its key: dtype, a dozen dims, offsets


def header_room(keys: Iterable[str]) -> int:
    """The bytes to keep for the header of a shard of `keys`, from their real lengths: the
    header then never outgrows its room, and committing the shard needs no second copy."""
    return round_up(4096 + sum(ENTRY_BYTES + len(json.dumps(key)) for key in keys))


class _Sealed:
    """What a finished shard file (`sealed`) shares: its size and checksum, taken once: a
    CRC32C from the bytes as they were written (`crc`, once sealed), anything else by
    reading the file back."""

    sealed: Path | None
    checksum: Checksum | None
    crc: Crc | None = None  # the whole file's, where every byte was seen as written

    def take_checksum(self, algorithm: Algorithm = DEFAULT) -> Checksum:
        """The finished file's size and `algorithm`'s checksum (`store.checksum`)."""
        if self.checksum is None:
            assert self.sealed is not None, "a finished shard"
            if algorithm == "crc32c" and self.crc is not None:
                self.checksum = Checksum(self.crc.size, crc32c=crc_hex(self.crc.value))
            else:
                self.checksum = file_checksum(self.sealed, algorithm)
        return self.checksum

    def _seal(self, prefix: bytes, body: Crc | None) -> None:
        """The file is `prefix` (its header) then the bytes `body` saw: its CRC32C."""
        if body is not None:
            whole = Crc()
            whole.add(prefix)
            whole.join(body)
            self.crc = whole


class ShardFile(_Sealed):
    """One safetensors file, written tensor by tensor as values arrive, its header last.

    The data goes straight from each tensor's memory to the file (see `direct_io`), after
    `reserve` bytes kept for the header; the header is then padded with spaces to fill them,
    as the format allows. `close` leaves the finished file under its temporary name,
    `sealed`: the writer moves it into place.
    """

    def __init__(self, path: Path, reserve: int) -> None:
        self.path = path
        self.tmp = path.with_name(path.name + ".tmp")
        self.sealed: Path | None = None
        self.checksum: Checksum | None = None
        self.reserve = round_up(reserve)  # data starts block-aligned (and so 8-byte aligned)
        self.entries: dict[str, dict[str, Any]] = {}
        self.size = 0
        self.body = Crc()  # of the data, in file order: every tensor is appended
        self.file = AppendFile(self.tmp, self.reserve, self.body)

    def write(
        self, key: str, tensor: torch.Tensor, release: Callable[[], None] | None = None
    ) -> None:
        """Append one tensor (contiguous, on the CPU) under `key`. With `release`, the data
        may go to the disk from the tensor's own memory; `release` is called once it is no
        longer needed (see `AppendFile.write`), whatever happens."""
        try:
            if key in self.entries:
                raise HookdumpError(f"{key!r} is in this shard already; a key is written once")
            if dtype_name(tensor.dtype) not in SAFETENSORS_DTYPES:
                raise HookdumpError(
                    f"{key!r} has dtype {tensor.dtype}, which safetensors cannot hold"
                )
        except BaseException:
            if release is not None:
                release()
            raise
        if tensor.numel():
            self.file.write(tensor.reshape(-1).view(torch.uint8).numpy().data, release)
        elif release is not None:
            release()
        nbytes = tensor.numel() * tensor.element_size()
        self.entries[key] = _entry(tensor.dtype, list(tensor.shape), self.size, nbytes)
        self.size += nbytes

    def finish(self, metadata: dict[str, str]) -> None:
        """Write the last bytes and the header (into room allocated when the file was made:
        a full disk cannot stop it), still under the temporary name `sealed`."""
        self.file.close()
        prefix = _write_header(self.tmp, self.reserve, self.entries, metadata)
        self._seal(prefix, self.body)
        self.sealed = self.tmp

    def abort(self) -> None:
        """Drop the half-written (or finished but unpublished) file."""
        self.file.abort()
        remove_entry(self.tmp)


def _write_header(
    tmp: Path, reserve: int, entries: dict[str, Any], metadata: dict[str, str]
) -> bytes:
    """Write the header into the `reserve` bytes before the data; the bytes written (what
    comes before the data)."""
    header = json.dumps({"__metadata__": metadata, **entries}).encode()
    if len(header) + 8 > reserve:  # keys past the estimate (`header_room`): move the data once
        reserve = _move_data(tmp, reserve, round_up(len(header) + 8 + 4096))
    room = reserve - 8
    prefix = struct.pack("<Q", room) + header + b" " * (room - len(header))
    fd = open_existing(tmp, os.O_WRONLY)
    try:
        pwrite_all(fd, memoryview(prefix), 0)
    finally:
        os.close(fd)
    return prefix


def _move_data(tmp: Path, reserve: int, grown_reserve: int) -> int:
    """Copy the data of `tmp` to start at `grown_reserve` instead of `reserve` (slow: the
    whole shard is read back and written again); returns `grown_reserve`."""
    grown = tmp.with_name(tmp.name + "-grow")  # not .tmp2: a PlannedShard's
    try:
        with (
            os.fdopen(open_existing(tmp, os.O_RDONLY), "rb") as src,
            os.fdopen(create_new(grown), "wb") as dst,
        ):
            src.seek(reserve)
            dst.seek(grown_reserve)
            shutil.copyfileobj(src, dst, 1 << 24)
        os.replace(grown, tmp)
    finally:
        remove_entry(grown)
    return grown_reserve


def fsync_file(path: Path) -> None:
    fd = open_existing(path, os.O_WRONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class PlannedShard(_Sealed):
    """A shard of `rows` rows whose layout is fixed up front: each batch's rows are written
    straight to their place in the file, so gathering batches into a shard holds nothing
    in memory. A shard that ends short (the last one) is compacted key by key."""

    def __init__(self, path: Path, layout: list[tuple[str, torch.dtype, list[int]]], rows: int):
        self.path = path
        self.tmp = path.with_name(path.name + ".tmp2")
        self.sealed: Path | None = None  # the finished file, once closed (as ShardFile)
        self.checksum: Checksum | None = None
        self.rows = rows
        self.filled = 0
        self.layout: dict[str, tuple[torch.dtype, list[int], int, int]] = {}
        offset = 0
        for key, dtype, shape in layout:
            row_bytes = math.prod(shape) * _element_size(dtype)
            self.layout[key] = (dtype, shape, offset, row_bytes)
            offset += row_bytes * rows
        self.reserve = header_room(key for key, _, _ in layout)
        self.file = PositionalFile(self.tmp, self.reserve + offset)
        # each key's rows, as written from row 0 on (None: written out of order), and the
        # rows written so far
        self.keys_crc: dict[str, Crc | None] = {key: Crc() for key in self.layout}
        self._next = dict.fromkeys(self.layout, 0)

    def write_rows(self, key: str, row: int, tensor: torch.Tensor) -> None:
        """Rows `row:row + len(tensor)` of `key` (contiguous, on the CPU)."""
        _, _, offset, row_bytes = self.layout[key]
        if row + tensor.shape[0] > self.rows:  # would run into the next key's rows
            raise ValueError(f"{key!r}: rows {row}:{row + tensor.shape[0]} past {self.rows}")
        if tensor.numel():
            data = tensor.reshape(-1).view(torch.uint8).numpy().data
            if self._next[key] != row:
                self.keys_crc[key] = None  # out of order: read back once finished
            self._next[key] = row + tensor.shape[0]
            crc = self.keys_crc[key]
            self.file.pwrite(data, self.reserve + offset + row * row_bytes, crc)
        self.filled = max(self.filled, row + tensor.shape[0])

    def finish(self, metadata: dict[str, str]) -> None:
        """Write the header (a shard that ends short is first compacted in place: its
        keys' rows moved down to follow each other), under the temporary name `sealed`.
        The file was allocated whole when made, so this needs no new space."""
        self.file.flush()
        entries, size = {}, 0
        for key, (dtype, shape, offset, row_bytes) in self.layout.items():
            nbytes = row_bytes * self.filled
            if size != offset:  # rows of later keys only ever move down, in order
                _move_down(self.file.fileno(), self.reserve + offset, self.reserve + size, nbytes)
            entries[key] = _entry(dtype, [self.filled, *shape], size, nbytes)
            size += nbytes
        os.ftruncate(self.file.fileno(), self.reserve + size)  # the rows planned, not filled
        self.file.close()
        prefix = _write_header(self.tmp, self.reserve, entries, metadata)
        self._seal(prefix, self._body())
        self.sealed = self.tmp

    def _body(self) -> Crc | None:
        """The CRC32C of the data as compacted: each key's filled rows, in layout order
        (None: a key's rows were not all seen in order)."""
        body = Crc()
        for key, (_, _, _, row_bytes) in self.layout.items():
            crc = self.keys_crc[key]
            if crc is None or crc.size != row_bytes * self.filled:
                return None
            body.join(crc)
        return body

    def abort(self) -> None:
        """Drop the file."""
        with contextlib.suppress(OSError):  # already failing: the error was raised before
            self.file.close()
        remove_entry(self.tmp)


def _move_down(fd: int, source: int, target: int, nbytes: int, chunk: int = 16 << 20) -> None:
    """Copy `nbytes` at `source` to `target` (lower) in the same file, front first, so no
    byte is overwritten before it is read."""
    for done in range(0, nbytes, chunk):
        data = os.pread(fd, min(chunk, nbytes - done), source + done)
        if len(data) != min(chunk, nbytes - done):
            raise OSError(f"the shard ends before byte {source + done + len(data)}")
        pwrite_all(fd, memoryview(data), target + done)


def _element_size(dtype: torch.dtype) -> int:
    return torch.empty((), dtype=dtype).element_size()


def _entry(dtype: torch.dtype, shape: list[int], start: int, nbytes: int) -> dict[str, Any]:
    st_dtype = SAFETENSORS_DTYPES[dtype_name(dtype)]
    return {"dtype": st_dtype, "shape": shape, "data_offsets": [start, start + nbytes]}
