"""Where a dump lives, behind one interface: a `DumpPlace` is a folder (`FolderPlace`) or a
prefix at a URL (`UrlPlace`), and owns everything that differs between them: the lock, the
check of the destination, clearing an old dump (only its own files), what a killed run left
and `--resume` may keep, committing a shard (rename, or upload, then check) and writing the
manifest last. The writer, the engine, resume, torchrun ranks and Ray parts call it and
never ask which kind it is.

A new kind (a Hub dataset repo, say) is one module with a `DumpPlace` subclass, named in
`KINDS`: `open_place` asks each kind in turn whether a destination is its own.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import os
import socket
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any, ClassVar

from hookdump.format.manifest import ShardEntry
from hookdump.format.names import RUNNING
from hookdump.store.checksum import Checksum
from hookdump.store.location import Remote, UrlPath

Stray = Callable[[str], bool]  # whether a name under the place is a file to remove
# the kinds of place, as `module:class`, asked in order (the last, a folder, takes any path)
KINDS = (
    "hookdump.store.write.url_place:UrlPlace",
    "hookdump.store.write.folder_place:FolderPlace",
)


def manifest_bytes(data: Mapping[str, Any]) -> bytes:
    """A manifest's bytes, as every kind of place writes them (the same file in a folder
    and at a URL, byte for byte)."""
    return (json.dumps(data, indent=2) + "\n").encode()


class DumpPlace(ABC):
    """A dump's place. `work` is the local folder its shards are finished in (the folder
    itself, or a spool beside the upload), set once the place is `held`."""

    # whether finished shards wait to be committed together (`store.write.commit`), and how
    # many may wait at most (None: no bound)
    groups_commits: ClassVar[bool]
    in_flight: ClassVar[int | None]
    poll_s: ClassVar[float] = 0.2  # how often a run waiting for room looks (`--max-disk`)

    def __init__(self) -> None:
        self.work: Path | None = None
        self._notes: set[str] = set()  # what this run wrote beside the dump (`mark_running`)

    @classmethod
    @abstractmethod
    def claims(cls, where: str | Path) -> bool:
        """Whether `where` (as `--out` gave it) is a place of this kind."""

    @classmethod
    @abstractmethod
    def open(
        cls, where: str | Path, storage_options: Mapping[str, Any], spool: Path | None
    ) -> DumpPlace:
        """The place at `where` (one this kind `claims`)."""

    @property
    @abstractmethod
    def label(self) -> str:
        """The folder or URL, for messages."""

    @property
    @abstractmethod
    def root(self) -> Path | UrlPath:
        """Where readers find the dump (with `remote`)."""

    @property
    def run_id(self) -> str | None:
        """The run id the place already gave this run (its lock's), if any."""
        return None

    @property
    def remote(self) -> Remote | None:
        """The client readers reach the dump with (None: a local folder)."""
        return None

    @abstractmethod
    @contextlib.contextmanager
    def held(self, main: bool, take_over: bool, resumable: bool = True) -> Iterator[Path]:
        """Hold the place for the `with` block (`main`: the process that writes its
        manifest; `take_over`: `--resume` or `--overwrite`, which may take a dead run's lock;
        `resumable`: whether a refusal may offer `--resume`) and give the local folder
        shards are finished in (`work`)."""

    # the destination and an old dump

    @abstractmethod
    def check(self, overwrite: bool, keep_old: bool = False) -> None:
        """Refuse a place that cannot take a dump: entries that are not a dump's, or a dump
        without `overwrite`. With `overwrite`, note the old dump's files, removed by
        `clear_old` (`keep_old`: resuming, none are old)."""

    @abstractmethod
    def claim(self, name: str) -> None:
        """Name a file this writer makes in `work`: never taken for the old dump's."""

    @abstractmethod
    def old_present(self) -> bool:
        """Whether an old dump (`check` with `overwrite`) is still there."""

    @abstractmethod
    def clear_old(self, keep: str | None = None) -> None:
        """Remove the old dump's files, once (`keep`: a file of this run to leave)."""

    @abstractmethod
    def forget_old(self) -> None:
        """Leave the old dump to another process (torchrun's rank 0, a Ray job's driver)."""

    @abstractmethod
    def wait_old(self) -> None:
        """Until the old dump's files are gone."""

    @abstractmethod
    def estimate_notice(self, nbytes: int) -> str | None:
        """What a run says once the first batch has estimated the dump's `nbytes` (None:
        nothing; a folder's estimate is checked against its disk instead)."""

    @abstractmethod
    def check_room(self, needed: int, written: int, shard_bytes: int) -> None:
        """Refuse a dump of about `needed` bytes (`written` already in its first shard)
        that the local disk cannot hold."""

    # writing

    @abstractmethod
    def commit_shard(self, sealed: Path, name: str, checksum: Checksum) -> dict[str, Any]:
        """Make the finished shard file `sealed` (of `checksum`) the dump's `name`, checked;
        what its manifest entry records of it (size, checksum, ...)."""

    @abstractmethod
    def put_manifest(self, name: str, data: Mapping[str, Any], complete: bool) -> None:
        """Write a manifest (after every file it lists), atomically."""

    @abstractmethod
    def put_file(self, name: str, raw: bytes) -> None:
        """Write a small file of the dump (its statistics), atomically."""

    @abstractmethod
    def keep_room(self, name: str, nbytes: int) -> None:
        """Keep room for the next `name` (a manifest), where a disk may fill."""

    @abstractmethod
    def drop_room(self, name: str) -> None:
        """No more `name` to keep room for."""

    @abstractmethod
    def remove(self, names: Iterable[str]) -> None:
        """Remove the dump's files `names` (those already gone are no error)."""

    @abstractmethod
    def remove_strays(self, stray: Stray) -> None:
        """Remove what a killed run left whose name `stray` claims (dump files only)."""

    # reading back (resume)

    @abstractmethod
    def exists(self) -> bool:
        """Whether the place is there at all."""

    @abstractmethod
    def entries(self) -> list[str]:
        """The names directly in the place."""

    @abstractmethod
    def matches(self, entry: ShardEntry) -> bool:
        """Whether the listed shard's file is there with the size and checksum its entry
        records (what is not recorded is not compared)."""

    def mark_running(self, run_id: str | None, overwrite: bool) -> None:
        """Say, beside the dump, which run writes it (pid, host, since when) and whether it
        replaces the dump there (what a follower checks first: `hookdump.follow`; and
        `inspect`); gone when the place is let go (`drop_notes`)."""
        note = {
            "run_id": run_id,
            "overwrite": overwrite,
            "pid": os.getpid(),
            "host": socket.gethostname(),
            "started": time.time(),
        }
        self.put_note(RUNNING, json.dumps(note).encode())
        self._notes.add(RUNNING)

    def mark_waiting(self, name: str, waiting: bool) -> None:
        """Say, in file `name` (a writer's own: `FileNames.waiting`), whether the run waits
        for a follower to consume shards (`--max-disk`), so that a follower holding the
        rows of a shard back gives them out."""
        if waiting == (name in self._notes):
            return
        if waiting:
            self.put_note(name, b'{"waiting": true}')
            self._notes.add(name)
        else:
            self.drop_note(name)
            self._notes.discard(name)

    def drop_notes(self) -> None:
        """Remove what this run wrote beside the dump (the place is let go)."""
        notes, self._notes = sorted(self._notes), set()
        for name in notes:
            self.drop_note(name)

    @abstractmethod
    def put_note(self, name: str, raw: bytes) -> None:
        """Write a small file of this run's beside the dump (not an old dump's), replaced
        whole; a crash of the machine may lose it."""

    @abstractmethod
    def drop_note(self, name: str) -> None:
        """Remove a small file `put_note` wrote (one not there is no error)."""

    def gone(self, names: list[str]) -> list[str]:
        """Of the listed shards `names`, those a follower consumed (deleted: see
        `hookdump.follow`)."""
        present = set(self.entries())
        return [name for name in names if name not in present]


def open_place(
    where: str | Path, storage_options: Mapping[str, Any], spool: Path | None
) -> DumpPlace:
    """The place `--out` names (`storage_options`: a URL's client's; `spool`: where a
    URL's shards are finished): of the first kind in KINDS that claims it."""
    for spec in KINDS:
        module, _, name = spec.partition(":")
        kind: type[DumpPlace] = getattr(importlib.import_module(module), name)
        if kind.claims(where):
            return kind.open(where, storage_options, spool)
    raise ValueError(f"no kind of place takes {str(where)[:200]!r}")
