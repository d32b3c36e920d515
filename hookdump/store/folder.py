"""The `--out` folder: one run at a time, nothing outside it touched, nothing lost.

- The folder is resolved once (it may be a symlink) and locked with `flock` on its own file
  descriptor for the whole run, so a second run on it is refused and no lock file is left
  behind to be mistaken for part of a dump.
- Every file hookdump writes is created fresh (`O_CREAT | O_EXCL | O_NOFOLLOW`): an entry
  already there under that name (a leftover temporary file, or a planted symlink) is
  removed, never opened, so nothing is ever written through a link.
- A file becomes visible under its final name only once its bytes are on disk: written,
  fsynced, renamed, and the folder entry fsynced.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import shutil
import stat
import tempfile
from collections.abc import Iterable, Iterator
from pathlib import Path

from hookdump.errors import HookdumpError, InvalidDump, opt
from hookdump.format.names import DUMP_FILE, TRASH_PREFIX

_FILE_MODE = 0o666  # less the umask, as for any file a program creates
# how file systems say no to O_DIRECT or fallocate (EINVAL on Linux; FUSE and others may say
# unsupported)
REFUSED = {errno.EINVAL, errno.EOPNOTSUPP, getattr(errno, "ENOTSUP", errno.EOPNOTSUPP)}


def check_entries(where: str, present: list[str], overwrite: bool, place: str = "folder") -> None:
    """Refuse an `--out` (`where`: a folder, or a `prefix` at a URL) that holds `present`
    entries: those of a dump are replaced with `overwrite`, others never."""
    if not present:
        return
    files = "files" if place == "folder" else "objects"
    foreign = [name for name in present if not DUMP_FILE.match(name)]
    if foreign:  # said first: --overwrite would not help
        raise HookdumpError(
            f"{opt('out')} {where} holds {files} that are not part of a hookdump dump "
            f"({', '.join(foreign[:3])}{', ...' if len(foreign) > 3 else ''}); "
            f"{opt('overwrite', True)} only replaces dumps, so choose another {place}"
        )
    if not overwrite:
        raise HookdumpError(
            f"{opt('out')} {where} holds a dump already; pass {opt('overwrite', True)} to "
            f"replace it, or choose another {place}"
        )


class FolderBusy(HookdumpError):
    """Another run holds the folder's lock."""


class FolderLock:
    """An exclusive lock on the `--out` folder, held from before anything in it is looked at
    until the run ends; the folder is made here if it does not exist yet."""

    def __init__(self, out: Path) -> None:
        self.created: list[Path] = []  # the folders this run made, innermost last
        self._fd = -1
        missing = [p for p in (out, *out.parents) if not os.path.lexists(p)]
        try:
            for folder in reversed(missing):
                folder.mkdir()
                self.created.append(folder)
        except FileExistsError:
            pass  # made meanwhile, by another run: the lock decides
        except OSError as exc:
            raise HookdumpError(f"{opt('out')} {out}: {describe_os_error(exc)}") from None
        if not out.is_dir():
            raise HookdumpError(f"{opt('out')} {out} is a file; give a folder (new or empty)")
        self.path = out.resolve()
        self._fd = os.open(self.path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(self._fd)
            self._fd = -1
            raise FolderBusy(
                f"{opt('out')} {out} is being written by another hookdump run; wait for it to "
                "finish, or choose another folder"
            ) from None

    def release(self, failed: bool) -> None:
        """Unlock; after a failed run, remove the folders this run made, where still empty."""
        if self._fd < 0:
            return
        if failed:
            for folder in reversed(self.created):
                with contextlib.suppress(OSError):
                    folder.rmdir()  # only if empty
        os.close(self._fd)
        self._fd = -1


@contextlib.contextmanager
def locked(out: Path | None) -> Iterator[FolderLock | None]:
    """Hold the lock on `out` (nothing when there is no `--out`) for the `with` block."""
    if out is None:
        yield None
        return
    lock = FolderLock(out)
    failed = True
    try:
        yield lock
        failed = False
    finally:
        lock.release(failed)


def describe_os_error(exc: OSError) -> str:
    """What an OSError means for a dump folder, and what to do about it."""
    code = exc.errno
    reason = exc.strerror or str(exc)
    if code in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG):
        return f"{reason}; make room (or raise the file-size limit)"
    if code == errno.EROFS:
        return f"{reason}; choose a folder on a writable disk"
    if code in (errno.ENOTDIR, errno.EEXIST):
        return f"{reason}: part of the path is a file, not a folder; choose another folder"
    if code in (errno.EACCES, errno.EPERM):
        return f"{reason}; choose a folder you can write to"
    return reason


def create_new(path: Path, flags: int = os.O_WRONLY) -> int:
    """A new file at `path`, open with `flags`; whatever was there under that name (a
    leftover temporary file, a symlink) is removed first, never opened or followed."""
    flags |= os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        return os.open(path, flags, _FILE_MODE)
    except FileExistsError:
        remove_entry(path)
        return os.open(path, flags, _FILE_MODE)


def open_existing(path: Path, flags: int) -> int:
    """Open a file this run created, never through a symlink put in its place."""
    return os.open(path, flags | os.O_NOFOLLOW | os.O_CLOEXEC)


def remove_entry(path: Path) -> None:
    """Remove what is at `path`: a link itself (not its target), a file, or a folder."""
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return
    if stat.S_ISDIR(mode):
        shutil.rmtree(path, ignore_errors=True)
    else:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)


def make_trash(folder: Path) -> Path:
    """A fresh, uniquely named folder inside `folder` to move an old dump into."""
    return Path(tempfile.mkdtemp(prefix=f"{TRASH_PREFIX}{os.getpid()}-", dir=folder))


def sync_folder(folder: Path) -> None:
    """Make the folder's entries (a rename, a new file) durable."""
    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def publish(tmp: Path, path: Path) -> None:
    """Rename the finished (and fsynced) `tmp` to `path` and make the rename durable."""
    os.replace(tmp, path)  # renames the entry itself: a symlink at `path` is replaced, not followed
    sync_folder(path.parent)


def write_durably(path: Path, data: bytes, durable: bool = True) -> None:
    """Write `data` to `path` through a fresh temporary file: a reader sees the old file or
    the new one, never half of it, and a crash after this returns keeps the new one (not
    `durable`: a killed process's, not the machine's: no fsync)."""
    tmp = path.with_name(path.name + ".tmp")
    fd = create_new(tmp)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        if durable:
            os.fsync(fd)
    except BaseException:
        os.close(fd)
        remove_entry(tmp)
        raise
    os.close(fd)
    if durable:
        publish(tmp, path)
    else:
        os.replace(tmp, path)


def inside(real: str, root: str) -> bool:
    """Whether the resolved path `real` lies below the resolved folder `root`."""
    return real.startswith(root.rstrip(os.sep) + os.sep)


def refuse_reads_inside(out: Path | None, what: str, paths: Iterable[Path]) -> None:
    """Refuse a run that would read one of `paths` (`what`: the option naming them) from
    inside `out`, where `--overwrite` or a new shard could delete or replace it."""
    if out is None:
        return
    root = os.path.realpath(out)
    parents: dict[str, str] = {}
    for path in paths:
        parent = str(path.parent)
        if parent not in parents:
            parents[parent] = os.path.realpath(parent)
        real = (
            os.path.realpath(path)
            if os.path.islink(path)
            else os.path.join(parents[parent], path.name)
        )
        if real == root or inside(real, root):
            raise HookdumpError(
                f"{what} {path} lies inside {opt('out')} {out}, which this run writes (and "
                f"{opt('overwrite', True)} clears); move it out, or choose another {opt('out')}"
            )


def valid_pid(pid: object) -> bool:
    """Whether `pid` (read from a note a run or a follower left) can name a process: an int
    (not a bool), positive (0 and -1 are process groups), within C's pid_t."""
    return type(pid) is int and 0 < pid < 1 << 31


def process_alive(pid: int) -> bool:
    """Whether process `pid` of this host exists (another user's counts)."""
    if not valid_pid(pid):
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def allocate(fd: int, offset: int, length: int) -> None:
    """Give bytes `offset:offset + length` of a new file (extended to cover them) disk blocks
    now, so that writing them later needs no new space: a full disk then fails here, when
    the file is made, never when a finished shard's header is written."""
    if length <= 0:
        return
    try:
        os.posix_fallocate(fd, offset, length)
        return
    except AttributeError:  # no posix_fallocate (macOS)
        pass
    except OSError as exc:
        if exc.errno not in REFUSED:
            raise
    zeros = bytes(min(length, 1 << 20))  # the file has nothing there yet: zeros cost nothing
    end = offset + length
    while offset < end:
        offset += os.pwrite(fd, zeros[: end - offset], offset)


def resolved_inside(path: Path, folder: Path, what: str) -> str:
    """`path` resolved, if it stays inside `folder` (symlinks followed); else InvalidDump
    (naming only the entry, never where it points)."""
    real = os.path.realpath(path)
    if not inside(real, os.path.realpath(folder)):
        raise InvalidDump(
            f"{what} {path.name!r} of {folder} resolves outside the dump folder; refused"
        )
    return real
