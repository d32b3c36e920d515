"""The small files a run and its followers (`hookdump.follow`) share beside a dump's
manifest (`running.json`, `waiting*.json`, each follower's `follow-NAME.json`), and the
shards a follower deletes: one interface for a folder and for a prefix at a URL."""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import socket
import stat
from abc import ABC, abstractmethod
from collections.abc import Hashable, Iterator, Mapping
from pathlib import Path
from typing import Any

from hookdump.errors import HookdumpError, printable
from hookdump.format.names import RUNNING
from hookdump.store.folder import process_alive, remove_entry, valid_pid, write_durably
from hookdump.store.location import Remote, UrlPath, is_url, local, version_of


class Beside(ABC):
    """Where a dump lives, as its followers read and write beside it."""

    poll_s: float  # how often a follower looks for a new shard, or a run for room

    @property
    @abstractmethod
    def root(self) -> Path | UrlPath:
        """The dump's folder or URL (for messages, and a reader's)."""

    @property
    def remote(self) -> Remote | None:
        """A URL's client (None: a folder)."""
        return None

    @abstractmethod
    def version(self, name: str) -> Hashable | None:
        """What tells this version of entry `name` from the next (None: not there)."""

    @abstractmethod
    def read(self, name: str) -> bytes | None:
        """Entry `name`'s bytes (None: not there)."""

    @abstractmethod
    def write(self, name: str, raw: bytes) -> None:
        """Replace entry `name` whole: a reader sees the old bytes or the new."""

    @abstractmethod
    def remove(self, name: str) -> None:
        """Remove entry `name` (one not there is no error)."""

    @abstractmethod
    def names(self) -> list[str]:
        """The entries' names."""

    @abstractmethod
    def hold(self, name: str, who: str) -> contextlib.AbstractContextManager[None]:
        """Hold entry `name` as a lock for the `with` block: `who` (a follower) is refused in
        one line while another process holds it."""

    def _busy(self, who: str, holder: str) -> HookdumpError:
        return HookdumpError(
            f"{who} of {self.root} is already running ({printable(holder)[:200]}); wait for it "
            "to end, or give this one another name"
        )


class FolderBeside(Beside):
    poll_s = 0.2

    def __init__(self, folder: Path) -> None:
        self.folder = folder

    @property
    def root(self) -> Path:
        return self.folder

    def version(self, name: str) -> Hashable | None:
        try:
            found = os.stat(self.folder / name)
        except (FileNotFoundError, NotADirectoryError):
            return None
        return found.st_ino, found.st_mtime_ns, found.st_size

    def read(self, name: str) -> bytes | None:
        try:
            return (self.folder / name).read_bytes()
        except (FileNotFoundError, NotADirectoryError):
            return None
        except OSError as exc:
            raise HookdumpError(f"cannot read {self.folder / name}: {exc.strerror}") from None

    def write(self, name: str, raw: bytes) -> None:
        write_durably(self.folder / name, raw, durable=False)

    def remove(self, name: str) -> None:
        path = self.folder / name
        with contextlib.suppress(FileNotFoundError):
            if stat.S_ISDIR(os.lstat(path).st_mode):
                return  # never a folder: a dump's entries that go are files
        remove_entry(path)

    def names(self) -> list[str]:
        with contextlib.suppress(FileNotFoundError, NotADirectoryError):
            return sorted(os.listdir(self.folder))
        return []

    @contextlib.contextmanager
    def hold(self, name: str, who: str) -> Iterator[None]:
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
                pid, host = _holder_of(os.pread(fd, 4096, 0))
                holder = f"pid {pid} on {host}" if pid else "another process"
                raise self._busy(who, holder) from None
            os.ftruncate(fd, 0)
            os.pwrite(fd, _holder().encode(), 0)
            yield
        finally:
            os.close(fd)  # the lock goes with it; the file stays, unlocked


class UrlBeside(Beside):
    poll_s = 0.5  # each look a request

    def __init__(self, remote: Remote) -> None:
        self._remote = remote

    @property
    def root(self) -> UrlPath:
        return self._remote.url

    @property
    def remote(self) -> Remote:
        return self._remote

    def version(self, name: str) -> Hashable | None:
        remote = self._remote
        try:
            with remote.failing(f"read {remote.url / name}", passing=(FileNotFoundError,)):
                info = remote.fs.info(remote.object(name))
        except FileNotFoundError:
            return None
        return version_of(info), info.get("size")

    def read(self, name: str) -> bytes | None:
        remote = self._remote
        try:
            with remote.failing(f"read {remote.url / name}", passing=(FileNotFoundError,)):
                return bytes(remote.fs.cat_file(remote.object(name)))
        except FileNotFoundError:
            return None

    def write(self, name: str, raw: bytes) -> None:
        remote = self._remote
        self._do(
            f"write {remote.url / name}", lambda: remote.fs.pipe_file(remote.object(name), raw)
        )

    def remove(self, name: str) -> None:
        remote = self._remote

        def gone() -> None:
            with contextlib.suppress(FileNotFoundError):
                remote.fs.rm_file(remote.object(name))

        self._do(f"remove {remote.url / name}", gone)

    def names(self) -> list[str]:
        return sorted(name.rstrip("/") for name in self._remote.entries())

    @contextlib.contextmanager
    def hold(self, name: str, who: str) -> Iterator[None]:
        """A lock object made by a conditional put (as a run's `UrlLock`); one left by a
        process of this host that is gone is taken over."""
        remote, me = self._remote, _holder().encode()
        path = remote.object(name)

        def create() -> bool:
            try:
                remote.fs.pipe_file(path, me, mode="create")
            except FileExistsError:
                return False
            return True

        made = False
        for _ in range(2):
            with remote.failing(f"write {remote.url / name}"):
                made = create()
            if made:
                break
            raw = self.read(name) or b""
            pid, host = _holder_of(raw)
            if host != socket.gethostname() or pid is None or process_alive(pid):
                holder = f"pid {pid} on {host}" if pid else "its lock cannot be read"
                raise self._busy(who, f"{holder}; delete {remote.url / name} if it is gone")
            self.remove(name)
        if not made:
            raise self._busy(who, "another process took its lock meanwhile")
        try:
            yield
        finally:
            with contextlib.suppress(HookdumpError):
                if self.read(name) == me:
                    self.remove(name)

    def _do(self, what: str, action: Any) -> None:
        with self._remote.failing(what):
            action()


def beside(
    where: str | os.PathLike[str], storage_options: Mapping[str, Any] | None = None
) -> Beside:
    """The place of the dump in folder or URL `where`."""
    text = local(where)
    if is_url(text):
        return UrlBeside(Remote(text, storage_options))
    if storage_options:
        raise HookdumpError(
            f"storage_options are for a dump at a URL; {text} is a folder: leave them out"
        )
    return FolderBeside(Path(text))


def beside_of(root: Path | UrlPath, remote: Remote | None) -> Beside:
    """The place of a dump already opened (a reader's root and client)."""
    return UrlBeside(remote) if remote is not None else FolderBeside(Path(root))


def _holder() -> str:
    return json.dumps({"pid": os.getpid(), "host": socket.gethostname()})


def _holder_of(raw: bytes) -> tuple[int | None, str]:
    """The pid and host a lock names (None: unreadable)."""
    try:
        data = json.loads(raw[:4096])
        pid, host = data["pid"], data["host"]
    except (ValueError, KeyError, TypeError, RecursionError):
        return None, "?"
    if not (valid_pid(pid) and isinstance(host, str)):
        return None, "?"
    return pid, host[:100]


def running_note(where: Beside) -> dict[str, Any] | None:
    """What the run writing the dump says of itself (`running.json`: its run id, pid, host,
    start, whether it overwrites), if anything readable: a note that is not what a run
    writes (a pid that is no process's, a host that is not a short line, a huge or deep
    file) is a damaged one, and None."""
    raw = where.read(RUNNING) or b"null"
    if len(raw) > _NOTE_BYTES:
        return None
    try:
        note = json.loads(raw)
    except (ValueError, RecursionError):
        return None
    if not isinstance(note, dict):
        return None
    pid, host = note.get("pid"), note.get("host")
    if not valid_pid(pid):
        return None
    if not (isinstance(host, str) and 0 < len(host) <= 255 and host.isprintable()):
        return None
    return note


def note_alive(note: Mapping[str, Any]) -> bool:
    """Whether the run that wrote `note` (one `running_note` read) is still going (another
    host's: assumed)."""
    pid = note.get("pid")
    if note.get("host") != socket.gethostname() or not isinstance(pid, int):
        return True
    return process_alive(pid)


_NOTE_BYTES = 64 << 10  # a run's note is a few hundred bytes
