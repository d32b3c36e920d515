"""The size and SHA-256 a manifest records of each shard (in a folder and at a URL alike),
and their check: `sha256sum` of a shard gives the same digest."""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

CHUNK = 8 << 20  # bytes read at a time


@dataclass(frozen=True)
class Checksum:
    """A file's size and SHA-256 (hex), as a manifest's shard entry holds them."""

    bytes: int
    sha256: str

    def entry(self) -> dict[str, Any]:
        return {"bytes": self.bytes, "sha256": self.sha256}


def file_checksum(path: Path, progress: Callable[[int], None] | None = None) -> Checksum:
    """A local file's size and SHA-256, read a CHUNK at a time into one buffer; the pages
    read are dropped from the page cache behind the read, so hashing a shard that was
    written past the cache (O_DIRECT) does not fill it. `progress(n)`: n more bytes read."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        return checksum_of(_chunks(fd), progress)
    finally:
        os.close(fd)


def stream_checksum(
    read: Callable[[int], bytes], progress: Callable[[int], None] | None = None
) -> Checksum:
    """The size and SHA-256 of what `read(n)` gives until it gives nothing (an object
    opened for reading, say)."""
    return checksum_of(iter(lambda: read(CHUNK), b""), progress)


def checksum_of(
    chunks: Iterable[bytes | memoryview], progress: Callable[[int], None] | None = None
) -> Checksum:
    """The size and SHA-256 of `chunks`, one after the other."""
    digest = hashlib.sha256()
    size = 0
    for chunk in chunks:
        digest.update(chunk)  # hashlib lets the GIL go for large updates
        size += len(chunk)
        if progress is not None:
            progress(len(chunk))
    return Checksum(size, digest.hexdigest())


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
