"""Where a dump lives: `DumpPlace`, the dump's rules written once over a medium
(`store.media`): one writer at a time, the destination checked, an old dump cleared (its
manifest first, only a dump's files, kept whole until the new dump's first shard is safe),
what a killed run left, each shard committed and checked, the manifest last, the run's
notes beside it, room kept on a disk that fills. The writer, the engine, resume, torchrun
ranks and Ray parts call it, and never ask which kind of medium is under it.

Shards are finished in a local folder, `work` (`store.write.area`): the dump's folder
itself where the medium renames a finished file into place, else a spool whose shards are
put whole. Where the medium has no lock of its own (an object store), a lock entry made by
a conditional put stands in (`store.write.url_lock`).
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

from hookdump.errors import HookdumpError, opt, printable
from hookdump.format.manifest import ShardEntry
from hookdump.format.names import DUMP_FILE, MANIFEST, RUNNING, URL_LOCK, WAITING, temporary
from hookdump.store.checksum import Checksum, matches, recorded
from hookdump.store.folder import FolderBusy, check_entries
from hookdump.store.location import StorageError
from hookdump.store.media import Medium, open_medium
from hookdump.store.notes import running_note
from hookdump.store.write.area import InPlace, Spool, WorkArea
from hookdump.store.write.url_lock import UrlLock

Stray = Callable[[str], bool]  # whether a name under the place is a file to remove
MANIFEST_ROOM = 64 << 10  # bytes kept for the next manifest beyond twice the last one's
_NOTES = frozenset({RUNNING, WAITING, URL_LOCK})  # a run's, never a dump's (a killed run's too)


def manifest_bytes(data: Mapping[str, Any]) -> bytes:
    """A manifest's bytes, as every medium holds them (byte for byte the same)."""
    return (json.dumps(data, indent=2) + "\n").encode()


class DumpPlace:
    """A dump's place on `medium`. `work` is the local folder its shards are finished in,
    set once the place is `held`."""

    def __init__(self, medium: Medium, spool: Path | None = None) -> None:
        self.medium = medium
        self.area: WorkArea = InPlace(Path(medium.root)) if medium.renames else Spool(spool)
        self.run_id: str | None = None  # the run id its lock entry gave this run, if any
        self._made: set[str] = set()  # what this writer makes: never taken for an old dump's
        self._notes: set[str] = set()  # what this run wrote beside the dump (`mark_running`)
        self._overwrite = False
        self._cleared = False  # the old dump is gone, or is another process's to remove
        self._waiter: Callable[[], None] = lambda: None  # until the old dump's files are gone

    @property
    def work(self) -> Path | None:
        """The local folder shards are finished in (None: a spool not made yet)."""
        return self.area.folder

    @property
    def label(self) -> str:
        """The folder or URL, for messages."""
        return str(self.medium.root)

    @property
    def groups_commits(self) -> bool:
        """Whether finished shards wait to be committed together (`store.write.commit`)."""
        return self.area.groups_commits

    @property
    def in_flight(self) -> int | None:
        """How many finished shards may wait to be committed (None: no bound)."""
        return self.area.in_flight

    @property
    def poll_s(self) -> float:
        """How often a run waiting for room looks (`--max-disk`)."""
        return self.medium.poll_s

    @contextlib.contextmanager
    def held(self, main: bool, take_over: bool, resumable: bool = True) -> Iterator[Path]:
        """Hold the place for the `with` block (`main`: the process that writes its
        manifest, which takes the lock; `take_over`: `--resume` or `--overwrite`, which may
        take a dead run's lock; `resumable`: whether a refusal may offer `--resume`) and
        give the local folder shards are finished in (`work`)."""
        with self.area.held() as work, self._locked(main, take_over, resumable):
            try:
                yield work
            finally:
                with contextlib.suppress(HookdumpError):  # the run's own error comes first
                    self.drop_notes()
                    if main:
                        self.medium.delete(RUNNING)  # a killed run's, too

    @contextlib.contextmanager
    def _locked(self, main: bool, take_over: bool, resumable: bool) -> Iterator[None]:
        """The medium's lock on its root (a folder's `flock`: a refusal names the run that
        holds it, as its note says), or a lock entry where it has none."""
        root_lock = self.medium.root_lock() if main else contextlib.nullcontext()
        if root_lock is None:
            lock = UrlLock(self.medium)
            lock.take(take_over, resumable)
            self.run_id = lock.holder.run_id  # a new dump's shards carry it
            self._made.add(URL_LOCK)
            try:
                yield
            finally:
                lock.release()
            return
        with contextlib.ExitStack() as stack:
            try:
                stack.enter_context(root_lock)
            except FolderBusy as exc:
                busy = self._busy()
                if busy is None:
                    raise
                raise busy from exc
            yield

    def _busy(self) -> HookdumpError | None:
        note = running_note(self.medium)
        if note is None:
            return None
        return FolderBusy(
            f"{opt('out')} {self.label} is being written by run "
            f"{printable(str(note.get('run_id')))[:32]} on {note['host']} (pid "
            f"{note['pid']}); wait for it to finish, or choose another {self.medium.noun}"
        )

    # the destination and an old dump

    def check(self, overwrite: bool, keep_old: bool = False) -> None:
        """Refuse a place that cannot take a dump: entries that are not a dump's, or a dump
        without `overwrite`. With `overwrite`, the old dump's files are removed by
        `clear_old` (`keep_old`: resuming, none are old)."""
        self._checked_others(overwrite or keep_old)
        self._overwrite, self._cleared = overwrite, keep_old

    def _checked_others(self, overwrite: bool) -> list[str]:
        """The entries this writer did not make, once those that are no run's note are
        found to be a dump's (replaced with `overwrite`, else none may be there)."""
        present = self._others()
        dump = [name for name in present if name not in _NOTES]
        check_entries(self.label, dump, overwrite, self.medium.noun)
        return present

    def _others(self) -> list[str]:
        """The entries this writer did not make (the set is read after the listing: a file
        is named before it is made)."""
        listed = self.medium.names()
        made = set(self._made)
        return [name for name in listed if name not in made]

    def claim(self, name: str) -> None:
        """Name a file this writer makes in `work`: never taken for the old dump's."""
        self._made.add(name)

    def old_present(self) -> bool:
        """Whether an old dump (`check` with `overwrite`) is still there."""
        return self._overwrite and not self._cleared and bool(self._others())

    def clear_old(self, keep: str | None = None) -> None:
        """Remove the old dump's files, once, its manifest first, so that a half-removed
        dump never reads as complete (`keep`: a file of this run to leave); the place is
        checked again first: it may have changed since `check`. A killed run's unfinished
        uploads are aborted."""
        if self._cleared:
            return
        if keep:
            self._made.add(keep)
        present = self._checked_others(self._overwrite)
        with self._writing():
            self.medium.abort_unfinished(lambda name: bool(DUMP_FILE.match(name)))
            self._waiter = self.medium.discard(sorted(present, key=lambda n: n != MANIFEST))
        self._cleared = True

    def forget_old(self) -> None:
        """Leave the old dump to another process (torchrun's rank 0, a Ray job's driver)."""
        self._cleared = True

    def wait_old(self) -> None:
        """Until the old dump's files are gone."""
        self._waiter()

    def estimate_notice(self, nbytes: int) -> str | None:
        """What a run says once the first batch has estimated the dump's `nbytes` (None:
        nothing; a folder's estimate is checked against its disk instead)."""
        return self.area.notice(self.label, nbytes)

    def check_room(self, needed: int, written: int, shard_bytes: int) -> None:
        """Refuse a dump of about `needed` bytes (`written` already in its first shard)
        that the local disk cannot hold."""
        self.area.check_room(needed, written, shard_bytes, self._old_bytes)

    def _old_bytes(self) -> int:
        """What clearing the old dump will give back."""
        if not self._overwrite or self._cleared:
            return 0
        found = (self.medium.info(name) for name in self._others())
        return sum(info.size for info in found if info is not None)

    # writing

    def commit_shard(self, sealed: Path, name: str, checksum: Checksum) -> dict[str, Any]:
        """Make the finished shard file `sealed` (of `checksum`) the dump's `name`, checked;
        what its manifest entry records of it (size, checksum, the store's ETag)."""
        self.area.seal(sealed)  # on the disk before the old dump goes
        self.clear_old(keep=sealed.name)
        with self._writing():
            stored = self.medium.put_file(sealed, name, checksum.crc32c)
        if stored.size != checksum.bytes:
            raise HookdumpError(
                f"{self.medium.root / name} holds {stored.size} bytes after it was written, "
                f"not {checksum.bytes}; run the same command with {opt('resume', True)} to "
                "write it again"
            )
        entry = checksum.entry()
        if stored.etag:  # what this version of the object is: `--resume` compares it
            entry["etag"] = stored.etag
        return entry

    def put_manifest(self, name: str, data: Mapping[str, Any], complete: bool) -> None:
        """Write a manifest (after every file it lists), whole or not at all; while the
        dump is not complete, room is kept for the next one."""
        self.clear_old()
        raw = manifest_bytes(data)
        with self._writing():
            self.medium.put(name, raw)  # in the room's place
        if not complete:
            self.keep_room(name, 2 * len(raw))

    def put_file(self, name: str, raw: bytes) -> None:
        """Write a small file of the dump (its statistics), whole or not at all."""
        self.claim(name)
        with self._writing():
            self.medium.put(name, raw)

    def keep_room(self, name: str, nbytes: int) -> None:
        """Keep MANIFEST_ROOM + `nbytes` of room for the next `name` (a manifest), where a
        disk may fill: the manifest listing the finished shards is then never refused for
        want of space."""
        self.claim(temporary(name))
        self.medium.reserve(temporary(name), MANIFEST_ROOM + nbytes)

    def drop_room(self, name: str) -> None:
        """No more `name` to keep room for."""
        self.medium.reserve(temporary(name), None)

    def remove(self, names: Iterable[str]) -> None:
        """Remove the dump's files `names` (those already gone are no error), and any not
        yet put from `work`."""
        names = list(names)
        with self._writing():
            for name in names:
                self.medium.delete(name)
        self.area.forget(names)

    def remove_strays(self, stray: Stray) -> None:
        """Remove what a killed run left whose name `stray` claims (dump files only)."""

        def mine(name: str) -> bool:
            return stray(name) and bool(DUMP_FILE.match(name))

        with self._writing():
            self.medium.abort_unfinished(mine)
            # whatever they are (a listed shard a folder took the place of, too), gone on return
            self.medium.discard([name for name in self.medium.names() if mine(name)])()

    @contextlib.contextmanager
    def _writing(self) -> Iterator[None]:
        """A storage failure within the block says, beside what failed, how to go on."""
        try:
            yield
        except StorageError as exc:
            raise HookdumpError(
                f"{exc.args[0]}; the shards written so far are kept: run the same command "
                f"with {opt('resume', True)} to finish the dump"
            ) from None

    # reading back (resume)

    def exists(self) -> bool:
        """Whether the place is there at all."""
        return self.medium.exists()

    def entries(self) -> list[str]:
        """The names directly in the place."""
        return self.medium.names()

    def matches(self, entry: ShardEntry) -> bool:
        """Whether the listed shard's file is there with the size and checksum its entry
        records: the object written then (its ETag recorded, where the store gives one) is
        taken as checked; another is read back whole. What is not recorded is not
        compared."""
        size, algorithm = entry.bytes, recorded(entry)
        try:
            with self._writing():
                found = self.medium.info(entry.file)
                if found is None or (size is not None and found.size != size):
                    return False
                if algorithm is None or (entry.etag and entry.etag == found.etag):
                    return True
                return matches(entry, self.medium.checksum(entry.file, algorithm))
        except OSError:  # gone meanwhile, or unreadable: not this shard
            return False

    # the run's notes beside the dump

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

    def put_note(self, name: str, raw: bytes) -> None:
        """Write a small file of this run's beside the dump (not an old dump's), replaced
        whole; a crash of the machine may lose it."""
        self.claim(name)
        with self._writing():
            self.medium.put(name, raw, durable=False)

    def drop_note(self, name: str) -> None:
        """Remove a small file `put_note` wrote (one not there is no error)."""
        self.medium.delete(name)

    def gone(self, names: list[str]) -> list[str]:
        """Of the listed shards `names`, those a follower consumed (deleted: see
        `hookdump.follow`)."""
        present = set(self.entries())
        return [name for name in names if name not in present]


def open_place(
    where: str | Path, storage_options: Mapping[str, Any], spool: Path | None
) -> DumpPlace:
    """The place `--out` names (`storage_options`: a URL's client's; `spool`: where shards
    are finished when the medium cannot rename them into place)."""
    return DumpPlace(open_medium(where, storage_options, strict=False), spool)
