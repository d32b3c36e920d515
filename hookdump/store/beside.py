"""The small files a run and its followers (`hookdump.follow`) share beside a dump's
manifest (`running.json`, `waiting*.json`, each follower's `follow-NAME.json`), and the
shards a follower deletes: one interface for a folder and for a prefix at a URL."""

from __future__ import annotations

import contextlib
import json
import os
import socket
from abc import ABC, abstractmethod
from collections.abc import Hashable, Mapping
from pathlib import Path
from typing import Any

from hookdump.errors import HookdumpError
from hookdump.format.manifest import RUNNING
from hookdump.store.folder import process_alive, remove_entry, write_durably
from hookdump.store.location import Remote, UrlPath, is_url


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
        remove_entry(self.folder / name)

    def names(self) -> list[str]:
        with contextlib.suppress(FileNotFoundError, NotADirectoryError):
            return sorted(os.listdir(self.folder))
        return []


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
            info = remote.fs.info(remote.object(name))
        except FileNotFoundError:
            return None
        except Exception as exc:  # the clients' errors have no common base
            raise HookdumpError(f"cannot read {remote.url / name}: {remote.reason(exc)}") from None
        stamp = (
            info.get("ETag") or info.get("etag") or info.get("LastModified") or info.get("mtime")
        )
        return str(stamp), info.get("size")

    def read(self, name: str) -> bytes | None:
        remote = self._remote
        try:
            return bytes(remote.fs.cat_file(remote.object(name)))
        except FileNotFoundError:
            return None
        except Exception as exc:
            raise HookdumpError(f"cannot read {remote.url / name}: {remote.reason(exc)}") from None

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
        remote = self._remote
        root = remote.root + "/"
        try:
            found = remote.fs.ls(remote.root, detail=False, refresh=True)
        except FileNotFoundError:
            return []
        except Exception as exc:
            raise HookdumpError(f"cannot list {remote.url}: {remote.reason(exc)}") from None
        return sorted(str(p)[len(root) :] for p in found if str(p).startswith(root))

    def _do(self, what: str, action: Any) -> None:
        try:
            action()
        except Exception as exc:
            raise HookdumpError(f"cannot {what}: {self._remote.reason(exc)}") from None


def beside(
    where: str | os.PathLike[str], storage_options: Mapping[str, Any] | None = None
) -> Beside:
    """The place of the dump in folder or URL `where`."""
    text = os.fspath(where)
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


def running_note(where: Beside) -> dict[str, Any] | None:
    """What the run writing the dump says of itself (`running.json`: its run id, pid, host,
    start, whether it overwrites), if anything readable."""
    try:
        note = json.loads(where.read(RUNNING) or b"null")
    except ValueError:
        return None
    return note if isinstance(note, dict) else None


def note_alive(note: Mapping[str, Any]) -> bool:
    """Whether the run that wrote `note` is still going (another host's: assumed)."""
    pid = note.get("pid")
    if note.get("host") != socket.gethostname() or not isinstance(pid, int):
        return True
    return process_alive(pid)
