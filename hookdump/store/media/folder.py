"""A folder on a local disk: entries are its files, a file is put through a fresh
temporary file and a rename, a lock is an `flock` that dies with its process."""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import stat
from collections.abc import Callable, Hashable, Iterator
from pathlib import Path

from hookdump.errors import HookdumpError, InvalidDump
from hookdump.store.checksum import Algorithm, Checksum, file_checksum
from hookdump.store.folder import (
    allocate,
    create_new,
    locked,
    make_trash,
    publish,
    remove_entry,
    resolved_inside,
    write_durably,
)
from hookdump.store.media.base import Info, Medium, holder_note, holder_of, too_large
from hookdump.store.media.blob import Blob, LocalBlob
from hookdump.worker import Worker


class FolderMedium(Medium):
    atomic_create = True
    renames = True
    poll_s = 0.2
    noun = "folder"

    def __init__(self, folder: Path) -> None:
        self.folder = folder

    @property
    def root(self) -> Path:
        return self.folder

    def read(self, name: str, most: int | None = None, limit: int | None = None) -> bytes | None:
        """A regular file's bytes (through a link that stays inside the folder); anything
        else, a FIFO planted beside a dump that would block the open or the read forever,
        is refused in one line."""
        path = self.folder / name
        try:
            fd = os.open(
                resolved_inside(path, self.folder, "entry"),
                os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC,
            )
        except (FileNotFoundError, NotADirectoryError):
            return None
        except OSError as exc:
            raise HookdumpError(f"cannot read {path}: {exc.strerror}") from None
        found = os.fstat(fd)
        if not stat.S_ISREG(found.st_mode):  # before fdopen, which refuses a folder on its own
            os.close(fd)
            raise InvalidDump(f"{path} is not a regular file; refused")
        with os.fdopen(fd, "rb") as file:
            if limit is not None and found.st_size > limit:
                raise too_large(path, found.st_size, limit)
            want = found.st_size + 1 if most is None else min(most, found.st_size + 1)
            try:
                return file.read(want)  # never a buffer larger than the file
            except OSError as exc:
                raise HookdumpError(f"cannot read {path}: {exc.strerror}") from None

    def exists(self) -> bool:
        return self.folder.is_dir()

    def lone_entry(self) -> tuple[Medium, str] | None:
        """A file (wherever a link to it points: the one the user named)."""
        if not self.folder.exists() or self.folder.is_dir():
            return None
        real = self.folder.resolve()
        return FolderMedium(real.parent), real.name

    def info(self, name: str) -> Info | None:
        """A regular file's (a link, a folder: None)."""
        try:
            found = os.lstat(self.folder / name)
        except (FileNotFoundError, NotADirectoryError):
            return None
        if not stat.S_ISREG(found.st_mode):
            return None
        return Info(found.st_size, (found.st_ino, found.st_mtime_ns))

    def version(self, name: str) -> Hashable | None:
        """Its target's, where the entry is a link (as a reader follows one inside the
        folder)."""
        try:
            found = os.stat(self.folder / name)
        except (FileNotFoundError, NotADirectoryError):
            return None
        return (found.st_ino, found.st_mtime_ns), found.st_size

    def checksum(self, name: str, algorithm: Algorithm) -> Checksum:
        return file_checksum(self.folder / name, algorithm)  # the cache dropped behind

    def blob(self, name: str, what: str) -> Blob:
        """A regular file inside the folder (a link is followed only where it stays inside)."""
        path = self.folder / name
        real = resolved_inside(path, self.folder, what)
        try:
            mode = os.stat(real).st_mode
        except OSError as exc:
            raise InvalidDump(f"cannot read {what} {path}: {exc.strerror or exc}") from None
        if not stat.S_ISREG(mode):
            raise InvalidDump(f"{what} {path} is not a regular file; refused")
        return LocalBlob(real)

    @contextlib.contextmanager
    def reading(self, name: str) -> Iterator[Callable[[int], bytes]]:
        fd = os.open(self.folder / name, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        try:
            yield lambda size: os.read(fd, size)
        finally:
            os.close(fd)

    def names(self) -> list[str]:
        with contextlib.suppress(FileNotFoundError, NotADirectoryError):
            return sorted(os.listdir(self.folder))
        return []

    def put(self, name: str, raw: bytes, durable: bool = True) -> None:
        write_durably(self.folder / name, raw, durable=durable)

    def put_if_absent(self, name: str, raw: bytes) -> bool:
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
        try:
            fd = os.open(self.folder / name, flags, 0o644)
        except FileExistsError:
            return False
        try:
            os.write(fd, raw)
        finally:
            os.close(fd)
        return True

    def put_file(self, local: Path, name: str, crc32c: str | None) -> Info:
        """Renamed into place, durably (the caller synced the file)."""
        publish(local, self.folder / name)
        found = self.info(name)
        assert found is not None, "just renamed"
        return found

    def delete(self, name: str) -> None:
        path = self.folder / name
        with contextlib.suppress(FileNotFoundError):
            if stat.S_ISDIR(os.lstat(path).st_mode):
                return  # never a folder: a dump's entries that go are files
        remove_entry(path)

    def discard(self, names: list[str]) -> Callable[[], None]:
        """Moved aside at once into a new trash folder inside the root (the order kept: a
        rename each), then deleted behind (unlinking gigabytes takes a while)."""
        if not names:
            return lambda: None
        trash = make_trash(self.folder)
        for name in names:
            with contextlib.suppress(FileNotFoundError):
                os.replace(self.folder / name, trash / name)  # moves links, never their targets
        cleanup: Worker[Path] = Worker("hookdump-cleanup", _remove_tree)
        cleanup.submit(trash)
        cleanup.close(join=False)
        return cleanup.close

    def reserve(self, name: str, nbytes: int | None) -> None:
        """An allocated file under `name`, which the next put (through a temporary file of
        that name: `write_durably`) replaces: on a disk that fills, the put finds its room."""
        room = self.folder / name
        if nbytes is None:
            remove_entry(room)
            return
        try:
            fd = create_new(room)
            try:
                allocate(fd, 0, nbytes)
            finally:
                os.close(fd)
        except OSError:
            remove_entry(room)

    def root_lock(self) -> contextlib.AbstractContextManager[object]:
        """The folder's `flock` (the folder made if missing; those made removed again if the
        block fails while they are empty)."""
        return locked(self.folder)

    @contextlib.contextmanager
    def hold(self, name: str, who: str) -> Iterator[None]:
        """An `flock` on the entry, gone with its process however it ends; the file stays."""
        try:
            fd = os.open(
                self.folder / name, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644
            )
        except OSError as exc:
            raise HookdumpError(f"cannot open {self.folder / name}: {exc.strerror}") from None
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                pid, host = holder_of(os.pread(fd, 4096, 0))
                holder = f"pid {pid} on {host}" if pid else "another process"
                raise self.busy(who, holder) from None
            os.ftruncate(fd, 0)
            os.pwrite(fd, holder_note().encode(), 0)
            yield
        finally:
            os.close(fd)


def _remove_tree(path: Path) -> None:
    shutil.rmtree(path, ignore_errors=True)
