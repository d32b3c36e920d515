"""A file or an object read at offsets (`Blob`), as the readers read a shard: a local file
with `pread` (`LocalBlob`, and `preadv` straight into the places rows go), an object at a
URL with ranged requests (`store.media.url.RemoteBlob`), or bytes in memory (`BytesBlob`).
A medium opens them (`Medium.blob`)."""

from __future__ import annotations

import contextlib
import ctypes
import errno
import os
from collections.abc import Callable
from typing import Protocol

import numpy as np

IOV_MAX = 1024  # I/O vectors per preadv call (POSIX's least IOV_MAX; Linux's)


def _libc_preadv() -> Callable[..., int] | None:
    """The C library's preadv, where there is one and `struct iovec` is two 64-bit words."""
    if ctypes.sizeof(ctypes.c_void_p) != 8 or ctypes.sizeof(ctypes.c_size_t) != 8:
        return None
    try:
        preadv = ctypes.CDLL(None, use_errno=True).preadv
    except (AttributeError, OSError):
        return None
    preadv.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_int, ctypes.c_int64]
    preadv.restype = ctypes.c_ssize_t
    return preadv


_PREADV = _libc_preadv()


def preadv_into(fd: int, vectors: np.ndarray, offset: int) -> int:
    """Read the file's bytes from `offset` on into `vectors` ([n, 2] uint64: address,
    length), IOV_MAX at a time; the bytes read (fewer only where the file ends)."""
    assert _PREADV is not None and vectors.dtype == np.uint64 and vectors.shape[1:] == (2,)
    done = 0
    for first in range(0, len(vectors), IOV_MAX):
        part = np.ascontiguousarray(vectors[first : first + IOV_MAX])
        want = int(part[:, 1].sum())
        while True:
            got = _PREADV(fd, part.ctypes.data, len(part), offset + done)
            if got >= 0 or ctypes.get_errno() != errno.EINTR:
                break
        if got < 0:
            code = ctypes.get_errno()
            raise OSError(code, os.strerror(code))
        done += got
        if got != want:
            return done
    return done


class Blob(Protocol):
    """Bytes read at offsets: a file, or an object at a URL. `identity` changes when the
    bytes are replaced (another run's shard under the same name); `vectored`: it reads
    straight into I/O vectors (`read_vectors`), where the others give bytes to copy."""

    size: int
    identity: tuple[object, ...]
    vectored: bool

    def pread(self, nbytes: int, offset: int) -> bytes: ...

    def readinto(self, view: memoryview, offset: int) -> int: ...

    def holds_data(self, offset: int, nbytes: int) -> bool: ...

    def will_need(self, offset: int, nbytes: int) -> None: ...

    def read_vectors(self, vectors: np.ndarray, offset: int) -> int: ...

    def close(self) -> None: ...


class LocalBlob:
    """A local file, open for `pread` (the caller checked what the path is)."""

    vectored = _PREADV is not None

    def __init__(self, path: str) -> None:
        self._fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        status = os.fstat(self._fd)
        self.size = status.st_size
        identity = (status.st_dev, status.st_ino, status.st_size, status.st_mtime_ns)
        self.identity: tuple[object, ...] = identity

    def pread(self, nbytes: int, offset: int) -> bytes:
        return os.pread(self._fd, nbytes, offset)

    def readinto(self, view: memoryview, offset: int) -> int:
        return os.preadv(self._fd, [view], offset)

    def read_vectors(self, vectors: np.ndarray, offset: int) -> int:
        """Bytes from `offset` on into I/O vectors (`preadv_into`)."""
        return preadv_into(self._fd, vectors, offset)

    def holds_data(self, offset: int, nbytes: int) -> bool:
        """Whether bytes `offset:offset + nbytes` have any block on disk; False for a hole
        of a sparse file, which reads as zeros (`SEEK_DATA`; True where the system cannot
        tell)."""
        try:
            found = os.lseek(self._fd, offset, os.SEEK_DATA)
        except AttributeError:  # no SEEK_DATA here
            return True
        except OSError as exc:  # ENXIO: no data from `offset` to the end of the file
            return exc.errno != errno.ENXIO
        return found < offset + nbytes

    def will_need(self, offset: int, nbytes: int) -> None:
        """Ask the disk for these bytes ahead of their read (a hint)."""
        if hasattr(os, "posix_fadvise"):
            with contextlib.suppress(OSError):
                os.posix_fadvise(self._fd, offset, nbytes, os.POSIX_FADV_WILLNEED)

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


class BytesBlob:
    """Bytes in memory, read as a file is."""

    vectored = False

    def __init__(self, data: bytes, identity: tuple[object, ...]) -> None:
        self._data = data
        self.size = len(data)
        self.identity = identity

    def pread(self, nbytes: int, offset: int) -> bytes:
        return self._data[offset : offset + nbytes]

    def readinto(self, view: memoryview, offset: int) -> int:
        data = self.pread(len(view), offset)
        view[: len(data)] = data
        return len(data)

    def holds_data(self, offset: int, nbytes: int) -> bool:
        return True

    def will_need(self, offset: int, nbytes: int) -> None:
        return

    def read_vectors(self, vectors: np.ndarray, offset: int) -> int:
        raise NotImplementedError("not vectored: read its bytes")

    def close(self) -> None:
        return
