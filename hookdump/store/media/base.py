"""A medium: where a dump's bytes live, as named entries directly under one root (a
folder's files, a prefix's objects), and nothing else. It knows no dump: which names a
dump has, what a manifest is, when an old dump goes, are the rules written once above it
(`store.notes`, the writer's `DumpPlace`, the readers).

A kind is one module of byte operations and a line in the factory (`store.media.open_medium`).
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
from abc import ABC, abstractmethod
from collections.abc import Callable, Hashable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar

from hookdump.errors import HookdumpError, InvalidDump, printable
from hookdump.store.checksum import Algorithm, Checksum, stream_checksum
from hookdump.store.folder import process_alive, valid_pid
from hookdump.store.media.blob import Blob

if TYPE_CHECKING:
    from hookdump.store.location import UrlPath


@dataclass(frozen=True)
class Info:
    """An entry as the medium describes it."""

    size: int
    version: Hashable  # what tells this version of the entry from the next
    etag: str = ""  # the store's own name for this version ("": it gives none)


class Medium(ABC):
    """Named entries under one root: read whole or in part, written whole or not at all."""

    # capabilities
    atomic_create: ClassVar[bool]  # `put_if_absent` decides between two processes
    renames: ClassVar[bool]  # a finished local file becomes an entry by a rename
    poll_s: ClassVar[float]  # how often a waiting reader looks again (each look may be a request)
    reads_ahead: ClassVar[int] = 1  # blocks worth announcing ahead of a read (`Blob.will_need`)
    noun: ClassVar[str] = "prefix"  # what a message calls the root

    @property
    @abstractmethod
    def root(self) -> Path | UrlPath:
        """The folder or URL (for messages, and for a reader's open)."""

    def exists(self) -> bool:
        """Whether the root is there (a prefix needs no making: always)."""
        return True

    def lone_entry(self) -> tuple[Medium, str] | None:
        """Where the root names one entry rather than a place of them (a file given for a
        folder): the medium holding it, and its name (None: the root is a place)."""
        return None

    # reads

    @abstractmethod
    def read(self, name: str, most: int | None = None, limit: int | None = None) -> bytes | None:
        """Entry `name`'s bytes, its first `most` at most (None: not there); one of more
        than `limit` bytes is refused in one line before it is read (InvalidDump)."""

    @abstractmethod
    def info(self, name: str) -> Info | None:
        """Entry `name`'s size and version (None: not there)."""

    def version(self, name: str) -> Hashable | None:
        """What tells this version of entry `name` from the next (None: not there)."""
        found = self.info(name)
        return None if found is None else (found.version, found.size)

    @abstractmethod
    def blob(self, name: str, what: str) -> Blob:
        """Entry `name` open to be read at offsets (`what`: its part in a dump, for the
        message); InvalidDump where it is not there or not a plain entry of the root."""

    @abstractmethod
    def reading(self, name: str) -> contextlib.AbstractContextManager[Callable[[int], bytes]]:
        """Entry `name` open for the `with` block, read in order by the function given
        (`read(n)`: up to n bytes, b"" at the end)."""

    def checksum(self, name: str, algorithm: Algorithm) -> Checksum:
        """Entry `name`'s size and checksum, read back whole."""
        with self.reading(name) as read:
            return stream_checksum(read, algorithm)

    @abstractmethod
    def names(self) -> list[str]:
        """The entries' names, sorted (a folder's with a trailing '/' where the medium has
        folders)."""

    # writes

    @abstractmethod
    def put(self, name: str, raw: bytes, durable: bool = True) -> None:
        """Replace entry `name` whole: a reader sees the old bytes or the new (`durable`:
        the new survive a crash of the machine once this returns; a note need not)."""

    @abstractmethod
    def put_if_absent(self, name: str, raw: bytes) -> bool:
        """Make entry `name` only where none is: whether this call made it."""

    @abstractmethod
    def put_file(self, local: Path, name: str, crc32c: str | None) -> Info:
        """Make the finished local file `local` entry `name` (`crc32c`: its checksum, for a
        store that checks what it receives); the entry as stored. The local file is gone
        after."""

    @abstractmethod
    def delete(self, name: str) -> None:
        """Remove entry `name` (one not there is no error; never a folder)."""

    def discard(self, names: list[str]) -> Callable[[], None]:
        """Remove entries `names`, whatever they are (a folder's too), in order (a reader
        never sees a later one gone while an earlier is there; those already gone are no
        error); what waits until they are gone, where that goes on behind."""
        for name in names:
            self.delete(name)
        return lambda: None

    def abort_unfinished(self, mine: Callable[[str], bool]) -> int:
        """Abort the unfinished writes (S3's multipart uploads) of entries `mine` claims;
        how many."""
        return 0

    def reserve(self, name: str, nbytes: int | None) -> None:
        """Keep `nbytes` of room for entry `name`'s next put, where a disk may fill (None:
        no more; best effort)."""
        return  # a store that does not fill: nothing to keep

    # locks

    def root_lock(self) -> contextlib.AbstractContextManager[object] | None:
        """A lock on the whole root that goes with its process however it ends (a folder's
        `flock`), for the `with` block; None: the medium has none, and a lock entry made by
        `put_if_absent` stands in (`store.write.url_lock`)."""
        return None

    @contextlib.contextmanager
    def hold(self, name: str, who: str) -> Iterator[None]:
        """Hold entry `name` as a lock for the `with` block, made by `put_if_absent`: `who`
        (a follower) is refused in one line while another process holds it; one left by a
        process of this host that is gone is taken over. A medium whose creates are not
        atomic is refused: two processes could both take the lock."""
        self.refuse_weak_lock(who)
        me = holder_note().encode()
        made = False
        for _ in range(2):
            made = self.put_if_absent(name, me)
            if made:
                break
            pid, host = holder_of(self.read(name, 4096) or b"")
            if host != socket.gethostname() or pid is None or process_alive(pid):
                holder = f"pid {pid} on {host}" if pid else "its lock cannot be read"
                raise self.busy(who, f"{holder}; delete {self.root / name} if it is gone")
            self.delete(name)
        if not made:
            raise self.busy(who, "another process took its lock meanwhile")
        try:
            yield
        finally:
            with contextlib.suppress(HookdumpError):
                if self.read(name, 4096) == me:
                    self.delete(name)

    def refuse_weak_lock(self, who: str) -> None:
        """Refuse to lock where a create is not atomic (`who`: what would hold the lock)."""
        if not self.atomic_create:
            raise HookdumpError(
                f"cannot lock {self.root} for {who}: its store offers no atomic create, so "
                "two processes could both take the lock; use a folder, or s3://, gs:// or az://"
            )

    def busy(self, who: str, holder: str) -> HookdumpError:
        return HookdumpError(
            f"{who} of {self.root} is already running ({printable(holder)[:200]}); wait for it "
            "to end, or give this one another name"
        )


def too_large(where: object, size: int, limit: int) -> InvalidDump:
    return InvalidDump(f"{where} is {size:,} bytes, more than the {limit:,} it may be; refused")


def holder_note() -> str:
    """What a lock entry says of its holder: this process and host."""
    return json.dumps({"pid": os.getpid(), "host": socket.gethostname()})


def holder_of(raw: bytes) -> tuple[int | None, str]:
    """The pid and host a lock names (None: unreadable)."""
    try:
        data = json.loads(raw[:4096])
        pid, host = data["pid"], data["host"]
    except (ValueError, KeyError, TypeError, RecursionError):
        return None, "?"
    if not (valid_pid(pid) and isinstance(host, str)):
        return None, "?"
    return pid, host[:100]
