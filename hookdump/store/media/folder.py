"""A folder on a local disk: entries are its files, a file is put through a fresh
temporary file and a rename, a lock is an `flock` that dies with its process."""

from __future__ import annotations

import contextlib
import fcntl
import os
import stat
from collections.abc import Callable, Iterator
from pathlib import Path

from hookdump.errors import HookdumpError
from hookdump.store.folder import publish, remove_entry, write_durably
from hookdump.store.media.base import Info, Medium, holder_note, holder_of


class FolderMedium(Medium):
    atomic_create = True
    renames = True
    poll_s = 0.2

    def __init__(self, folder: Path, durable: bool = False) -> None:
        self.folder = folder
        self.durable = durable  # whether a put survives a crash of the machine (fsync)

    @property
    def root(self) -> Path:
        return self.folder

    def read(self, name: str, most: int | None = None) -> bytes | None:
        try:
            with (self.folder / name).open("rb") as file:
                return file.read(-1 if most is None else most)
        except (FileNotFoundError, NotADirectoryError):
            return None
        except OSError as exc:
            raise HookdumpError(f"cannot read {self.folder / name}: {exc.strerror}") from None

    def info(self, name: str) -> Info | None:
        try:
            found = os.stat(self.folder / name)
        except (FileNotFoundError, NotADirectoryError):
            return None
        return Info(found.st_size, (found.st_ino, found.st_mtime_ns))

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

    def put(self, name: str, raw: bytes) -> None:
        write_durably(self.folder / name, raw, durable=self.durable)

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
        publish(local, self.folder / name)  # the caller synced it
        found = self.info(name)
        assert found is not None, "just renamed"
        return found

    def delete(self, name: str) -> None:
        path = self.folder / name
        with contextlib.suppress(FileNotFoundError):
            if stat.S_ISDIR(os.lstat(path).st_mode):
                return  # never a folder: a dump's entries that go are files
        remove_entry(path)

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
