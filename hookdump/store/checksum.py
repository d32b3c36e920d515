"""The size and checksum a manifest records of each shard (in a folder and at a URL alike),
and their check.

A shard's checksum is its CRC32C by default (the Castagnoli CRC-32 of the whole file, 8
lower-case hexadecimal digits, as `gsutil hash -c` and S3's `x-amz-checksum-crc32c` give it;
`--checksum sha256` records the SHA-256 instead, as `sha256sum` gives it). A CRC32C is taken
from memory as the shard's bytes are written (`Crc`), never by reading the file back: the
header, written last at the front, is folded in with `combine`. A check verifies whichever
checksum an entry records."""

from __future__ import annotations

import base64
import functools
import hashlib
import os
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import crc32c as _crc32c

from hookdump.choices import ChecksumKind as Algorithm

CHUNK = 8 << 20  # bytes read at a time
DEFAULT: Algorithm = "crc32c"


def crc32c(data: bytes | bytearray | memoryview, value: int = 0) -> int:
    """The CRC32C of `data`, going on from `value` (the CRC of what came before); the GIL
    is let go for large buffers, and the buffer is read in place."""
    return int(_crc32c.crc32c(data, value))


def combine(first: int, second: int, second_len: int) -> int:
    """The CRC32C of A + B from crc(A), crc(B) and len(B) (zlib's `crc32_combine`, for the
    Castagnoli polynomial): A's CRC carried past len(B) zero bytes, then B's added."""
    if second_len <= 0:
        return first
    return _times(_shift(second_len), first) ^ second


@functools.lru_cache(maxsize=1024)
def _shift(length: int) -> tuple[int, ...]:
    """The GF(2) matrix that carries a CRC past `length` zero bytes (a shard's keys often
    share their lengths: made once each)."""
    bit = [0x82F63B78] + [1 << n for n in range(31)]  # one zero bit: the reflected polynomial
    step = bit
    for _ in range(3):  # a zero byte
        step = _square(step)
    total = [1 << n for n in range(32)]  # no shift
    while length:
        if length & 1:
            total = [_times(step, column) for column in total]
        length >>= 1
        if length:
            step = _square(step)
    return tuple(total)


def _times(matrix: Sequence[int], vector: int) -> int:
    total, row = 0, 0
    while vector:
        if vector & 1:
            total ^= matrix[row]
        vector >>= 1
        row += 1
    return total


def _square(matrix: Sequence[int]) -> list[int]:
    return [_times(matrix, matrix[n]) for n in range(32)]


def crc_hex(value: int) -> str:
    return f"{value & 0xFFFFFFFF:08x}"


def crc_base64(hex_digits: str) -> str:
    """A CRC32C as S3 takes it in `x-amz-checksum-crc32c`: its 4 bytes, big-endian, base64."""
    return base64.b64encode(int(hex_digits, 16).to_bytes(4, "big")).decode()


@dataclass(frozen=True)
class Checksum:
    """A file's size and checksum (hex: `crc32c` or `sha256`), as a manifest's shard entry
    holds them."""

    bytes: int
    sha256: str | None = None
    crc32c: str | None = None

    def entry(self) -> dict[str, Any]:
        found = {"sha256": self.sha256, "crc32c": self.crc32c}
        return {"bytes": self.bytes, **{k: v for k, v in found.items() if v is not None}}


def _field(entry: Any, name: str) -> Any:
    """Field `name` of a shard entry: a `ShardEntry`, or its JSON."""
    return entry.get(name) if isinstance(entry, Mapping) else getattr(entry, name, None)


def recorded(entry: Any) -> Algorithm | None:
    """The checksum a shard entry records (None: neither, a dump from before them: its size
    alone is checked)."""
    if _field(entry, "crc32c") is not None:
        return "crc32c"
    return "sha256" if _field(entry, "sha256") is not None else None


def matches(entry: Any, found: Checksum) -> bool:
    """Whether `found` (of the algorithm `entry` records) is what `entry` records."""
    algorithm = recorded(entry)
    if algorithm is None:
        return True
    got = getattr(found, algorithm)
    return got is not None and str(_field(entry, algorithm)).lower() == got


def file_checksum(
    path: Path, algorithm: Algorithm = DEFAULT, progress: Callable[[int], None] | None = None
) -> Checksum:
    """A local file's size and `algorithm`'s checksum, read a CHUNK at a time into one
    buffer; the pages read are dropped from the page cache behind the read, so checking a
    shard that was written past the cache (O_DIRECT) does not fill it. `progress(n)`: n more
    bytes read."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        return checksum_of(_chunks(fd), algorithm, progress)
    finally:
        os.close(fd)


def stream_checksum(
    read: Callable[[int], bytes],
    algorithm: Algorithm = DEFAULT,
    progress: Callable[[int], None] | None = None,
) -> Checksum:
    """The size and checksum of what `read(n)` gives until it gives nothing (an object
    opened for reading, say)."""
    return checksum_of(iter(lambda: read(CHUNK), b""), algorithm, progress)


def checksum_of(
    chunks: Iterable[bytes | memoryview],
    algorithm: Algorithm = DEFAULT,
    progress: Callable[[int], None] | None = None,
) -> Checksum:
    """The size and checksum of `chunks`, one after the other."""
    digest = hashlib.sha256() if algorithm == "sha256" else None
    crc = 0
    size = 0
    for chunk in chunks:
        if digest is not None:
            digest.update(chunk)  # hashlib lets the GIL go for large updates
        else:
            crc = crc32c(chunk, crc)
        size += len(chunk)
        if progress is not None:
            progress(len(chunk))
    if digest is not None:
        return Checksum(size, sha256=digest.hexdigest())
    return Checksum(size, crc32c=crc_hex(crc))


class Crc:
    """The CRC32C of a file's bytes taken as they are written: pieces in the order they lie
    in the file (`add`), a piece's CRC taken apart and joined in (`join`)."""

    def __init__(self) -> None:
        self.value = 0
        self.size = 0

    def add(self, data: bytes | bytearray | memoryview) -> None:
        self.value = crc32c(data, self.value)
        self.size += len(data)

    def join(self, other: Crc) -> None:
        self.value = combine(self.value, other.value, other.size)
        self.size += other.size


def _chunks(fd: int) -> Iterator[memoryview]:
    buffer = bytearray(CHUNK)
    view = memoryview(buffer)
    offset = 0
    while True:
        got = os.preadv(fd, [buffer], offset)
        if not got:
            return
        yield view[:got]
        if hasattr(os, "posix_fadvise"):
            os.posix_fadvise(fd, offset, got, os.POSIX_FADV_DONTNEED)
        offset += got
