"""Writing shard data with O_DIRECT, past the page cache, on a thread of its own.

Written through the page cache, every byte costs the kernel a copy (seconds of CPU per
gigabyte on a small VM), on the cores the forward pass needs. With
O_DIRECT the disk reads the data straight from memory: from the caller's own buffer where
it is block-aligned (no copy at all), else from a few reused, aligned staging buffers. The
waiting is done by a disk thread while the caller goes on. Where the file system refuses
O_DIRECT (tmpfs, macOS; some refuse only the first write) the same classes write through
the page cache; `HOOKDUMP_DIRECT_IO=0` asks for that everywhere.
"""

from __future__ import annotations

import contextlib
import ctypes
import mmap
import os
import queue
import threading
from collections.abc import Callable
from pathlib import Path

from hookdump.store.checksum import Crc
from hookdump.store.folder import REFUSED, allocate, create_new, open_existing, remove_entry
from hookdump.worker import Worker

BLOCK = 4096  # O_DIRECT wants offsets, lengths and addresses aligned to the device's block
STAGE_BYTES = 8 << 20
STAGES = 3  # one being filled, two on their way to the disk
LENT = 4  # callers' own buffers queued for the disk at once (each written, then released)


def round_up(n: int, to: int = BLOCK) -> int:
    return n + (-n % to)


def direct_io_wanted() -> bool:
    return hasattr(os, "O_DIRECT") and os.environ.get("HOOKDUMP_DIRECT_IO", "1") != "0"


_Job = tuple[memoryview, int, Callable[[], None]]  # data, offset, what to do once written


def _release(job: _Job) -> None:
    job[2]()


class _DiskThread:
    """Writes buffers at their offsets on a worker thread: staging buffers (the caller takes
    an empty one, waiting while all are on their way, and hands it over once filled) and
    the caller's own block-aligned buffers (`lend`), each released once written (or, after
    a failed write, dropped).

    Buffers go out with O_DIRECT; where that is refused, through `path` opened normally."""

    def __init__(self, path: Path, direct_fd: int) -> None:
        self.path = path
        self._fd = direct_fd
        self._direct = True
        self._free: queue.SimpleQueue[memoryview] = queue.SimpleQueue()
        for _ in range(STAGES):  # page-aligned; never closed, only dropped
            self._free.put(memoryview(mmap.mmap(-1, STAGE_BYTES)))
        self._lent = threading.Semaphore(LENT)
        self._worker: Worker[_Job] = Worker("hookdump-disk", self._write_job, drop=_release)

    @property
    def direct(self) -> bool:
        return self._direct

    def take(self) -> memoryview:
        """An empty staging buffer (of STAGE_BYTES)."""
        self._worker.raise_if_failed()
        return self._free.get()

    def put(
        self, buffer: memoryview, nbytes: int, offset: int, crc: Crc | None = None, real: int = 0
    ) -> None:
        """Write `buffer[:nbytes]` at `offset` (both multiples of BLOCK), then free it; with
        `crc`, its first `real` bytes are added to it first (on this thread, in the order
        the buffers were handed over: off the caller's path)."""

        def done() -> None:
            try:
                if crc is not None:
                    crc.add(buffer[:real])
            finally:
                self._free.put(buffer)

        self._submit((buffer[:nbytes], offset, done))

    def lend(
        self, data: memoryview, offset: int, release: Callable[[], None], crc: Crc | None = None
    ) -> None:
        """Write the caller's `data` (block-aligned in memory, its length and `offset`
        multiples of BLOCK) from where it lies, then add it to `crc` and call `release`
        (from this thread, also when the write failed). Waits while LENT buffers are
        queued."""
        self._lent.acquire()

        def done() -> None:
            try:
                if crc is not None:
                    crc.add(data)
            finally:
                self._lent.release()
                release()

        self._submit((data, offset, done))

    def add(self, crc: Crc, data: bytes) -> None:
        """Add `data` (bytes of its own, written already) to `crc` in its turn among the
        buffers handed over."""
        self._submit((memoryview(b""), 0, lambda: crc.add(data)))

    def _submit(self, job: _Job) -> None:
        try:
            self._worker.submit(job)
        except BaseException:
            job[2]()
            raise

    def flush(self) -> None:
        """Wait until everything handed over is written."""
        self._worker.wait()

    def close(self) -> None:
        """Flush, stop the thread and close the file."""
        self._worker.close()
        os.close(self._fd)
        self._worker.raise_if_failed()

    def _write_job(self, job: _Job) -> None:
        data, offset, done = job
        try:
            self._write(data, offset)
        finally:
            done()

    def _write(self, data: memoryview, offset: int) -> None:
        try:
            pwrite_all(self._fd, data, offset)
        except OSError as exc:
            if exc.errno not in REFUSED or not self._direct:
                raise
            os.close(self._fd)  # accepted at open, refused at write: the page cache from now
            self._fd, self._direct = open_existing(self.path, os.O_WRONLY), False
            pwrite_all(self._fd, data, offset)


def _aligned(data: memoryview) -> bool:
    """Whether `data` (flat bytes) starts at a block boundary in memory (read-only
    buffers, whose address ctypes cannot take, count as not)."""
    if data.readonly or not len(data):
        return False
    return ctypes.addressof(ctypes.c_char.from_buffer(data)) % BLOCK == 0


def _open_direct(path: Path) -> _DiskThread | None:
    """A disk thread writing `path` (which this run created) with O_DIRECT, or None where
    refused."""
    if not direct_io_wanted():
        return None
    try:
        return _DiskThread(path, open_existing(path, os.O_WRONLY | os.O_DIRECT))
    except OSError as exc:
        if exc.errno not in REFUSED:
            raise
        return None


class AppendFile:
    """A new file whose bytes from `start` (a multiple of BLOCK) on are appended in order;
    the bytes before `start` are allocated (see `allocate`) for the caller to fill in later
    (a header). Whatever was at `path` before is removed, never written through; a file
    that cannot be made is not left behind."""

    def __init__(self, path: Path, start: int, crc: Crc | None = None) -> None:
        if start % BLOCK:
            raise ValueError(f"start {start} is not a multiple of {BLOCK}")
        self.path = path
        self.crc = crc  # the appended bytes', in order (complete once closed)
        self.end = start  # the file offset the next byte goes to
        self._fd = create_new(path)
        try:
            allocate(self._fd, 0, start)
            self._disk = _open_direct(path)
        except BaseException:
            os.close(self._fd)
            remove_entry(path)
            raise
        self._stage: memoryview | None = None
        self._fill = 0  # bytes in the stage, not yet handed to the disk thread

    @property
    def direct(self) -> bool:
        return self._disk is not None and self._disk.direct

    def write(self, data: memoryview, release: Callable[[], None] | None = None) -> None:
        """Append `data` (a flat, contiguous buffer).

        With `release`, `data`'s whole blocks may be written from its own memory, with no
        copy, when it is block-aligned there and the file is at a block boundary; `release`
        is then called (on the disk thread) once they are written, and otherwise at once:
        exactly once, whatever happens. Until then the caller leaves the memory as it is.
        """
        data = data.cast("B")
        whole = len(data) - len(data) % BLOCK
        if (
            release is None
            or self._disk is None
            or self._fill % BLOCK
            or whole < BLOCK
            or not _aligned(data)
        ):
            try:
                self._append(data)
            finally:
                if release is not None:
                    release()
            return
        try:
            if self._fill:
                self._hand_over()  # whole blocks: nothing padded
            offset, self.end = self.end, self.end + whole
            self._append(data[whole:])  # the tail is copied before the memory goes back
        except BaseException:
            release()
            raise
        # (the tail's stage is handed over later: the CRC takes the lent blocks first)
        self._disk.lend(data[:whole], offset, release, self.crc)

    def _append(self, data: memoryview) -> None:
        if self._disk is None:
            if self.crc is not None:
                self.crc.add(data)
            pwrite_all(self._fd, data, self.end)
            self.end += len(data)
            return
        while len(data):
            if self._stage is None:
                self._stage = self._disk.take()
            n = min(len(data), STAGE_BYTES - self._fill)
            self._stage[self._fill : self._fill + n] = data[:n]
            self._fill += n
            data = data[n:]
            if self._fill == STAGE_BYTES:
                self._hand_over()

    def close(self) -> int:
        """Write what is staged and close; returns the file's size."""
        try:
            if self._disk is not None:
                if self._fill:
                    self._hand_over()  # the last block goes out padded...
                disk, self._disk = self._disk, None
                disk.close()
            os.ftruncate(self._fd, self.end)  # ...and is cut back here
        finally:
            self.abort()
        return self.end

    def abort(self) -> None:
        """Close, leaving the file as far as it was written."""
        if self._disk is not None:
            disk, self._disk = self._disk, None
            with contextlib.suppress(OSError):
                disk.close()
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
        self._stage = None

    def _hand_over(self) -> None:
        assert self._disk is not None and self._stage is not None
        self._disk.put(self._stage, round_up(self._fill), self.end, self.crc, self._fill)
        self.end += self._fill
        self._stage, self._fill = None, 0


class PositionalFile:
    """A new file of `size` bytes, allocated whole (see `allocate`), written at any offsets:
    the whole blocks of each write go past the page cache (as in AppendFile), the partial
    blocks at its ends through it. No block is written both ways, since writes do not
    overlap. Created as AppendFile is."""

    def __init__(self, path: Path, size: int) -> None:
        self.path = path
        self._fd = create_new(path, os.O_RDWR)  # also reads back
        try:
            allocate(self._fd, 0, size)
            self._disk = _open_direct(path)
        except BaseException:
            os.close(self._fd)
            remove_entry(path)
            raise

    def fileno(self) -> int:
        """The file, for reading back (after `flush`)."""
        return self._fd

    def pwrite(self, data: memoryview, offset: int, crc: Crc | None = None) -> None:
        """Write `data` (a flat, contiguous buffer) at `offset`; with `crc`, add `data` to
        it (on the disk thread, after the bytes handed over before: a region written in
        order gets its CRC in order; complete once flushed)."""
        data = data.cast("B")
        start, stop = round_up(offset), offset + len(data) - (offset + len(data)) % BLOCK
        disk = self._disk
        if disk is None or stop <= start:
            pwrite_all(self._fd, data, offset)
            if crc is not None:
                if disk is None:
                    crc.add(data)
                else:  # in its turn: less than two blocks
                    disk.add(crc, bytes(data))
            return
        pwrite_all(self._fd, data[: start - offset], offset)
        if crc is not None and start > offset:
            disk.add(crc, bytes(data[: start - offset]))  # less than a block
        for position in range(start, stop, STAGE_BYTES):
            n = min(STAGE_BYTES, stop - position)
            stage = disk.take()
            stage[:n] = data[position - offset : position - offset + n]
            disk.put(stage, n, position, crc, n)
        pwrite_all(self._fd, data[stop - offset :], stop)
        if crc is not None and len(data) > stop - offset:
            disk.add(crc, bytes(data[stop - offset :]))  # less than a block

    def flush(self) -> None:
        """Wait until every write is on the file."""
        if self._disk is not None:
            self._disk.flush()

    def close(self) -> None:
        """Finish the writes and close."""
        try:
            if self._disk is not None:
                disk, self._disk = self._disk, None
                disk.close()
        finally:
            if self._fd >= 0:
                os.close(self._fd)
                self._fd = -1


def pwrite_all(fd: int, data: memoryview, offset: int) -> None:
    while len(data):
        written = os.pwrite(fd, data, offset)
        data, offset = data[written:], offset + written
