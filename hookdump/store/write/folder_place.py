"""A dump in a local folder (`--out DIR`): locked with `flock` for the run, an old dump kept
whole until the new dump's first shard is on disk, each shard synced and renamed into
place, the manifest replaced atomically with room kept for it on a disk that fills."""

from __future__ import annotations

import contextlib
import os
import shutil
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

from hookdump.errors import HookdumpError, opt, printable
from hookdump.format.manifest import ShardEntry
from hookdump.format.names import DUMP_FILE, MANIFEST, RUNNING, WAITING, temporary
from hookdump.format.values import format_bytes
from hookdump.store.checksum import Checksum, file_checksum, matches, recorded
from hookdump.store.folder import (
    FolderBusy,
    check_out_dir,
    create_new,
    locked,
    make_trash,
    publish,
    remove_entry,
    write_durably,
)
from hookdump.store.location import is_url, local
from hookdump.store.media import FolderMedium
from hookdump.store.notes import running_note
from hookdump.store.write.direct_io import allocate
from hookdump.store.write.place import DumpPlace, Stray, manifest_bytes
from hookdump.store.write.shards import fsync_file
from hookdump.worker import Worker


def write_json(path: Path, data: Mapping[str, Any]) -> int:
    """Write JSON durably through a fresh temporary file, so a reader never sees half of it;
    returns the bytes written."""
    raw = manifest_bytes(data)
    write_durably(path, raw)
    return len(raw)


class _OldDump:
    """The files an old dump (`overwrite`) left in `out`: kept whole and readable until the
    first commit moves them aside (`clear`), then deleted in the background."""

    def __init__(self, out: Path, overwrite: bool, made: set[str], cleared: bool) -> None:
        self.out = out
        self.overwrite = overwrite
        self.made = made  # this writer's own files (the set grows; it is read at each listing)
        # without `overwrite`, the first commit checks the folder again all the same
        self.cleared = cleared
        self._cleanup: Worker[Path] | None = None

    def present(self) -> bool:
        """Whether the folder still holds files of an old dump, which the first commit
        moves aside."""
        if not self.overwrite or self.cleared:
            return False
        try:
            return bool(self._files())
        except FileNotFoundError:  # made with the first shard
            return False

    def bytes_to_free(self) -> int:
        """What clearing the old dump will give back."""
        if not self.overwrite or self.cleared:
            return 0
        return sum(_size(p) for p in self.out.iterdir())

    def _files(self) -> list[Path]:
        """The folder's entries that are not this writer's own shards."""
        entries = list(self.out.iterdir())
        # the shards begun meanwhile stay (the set is read after the listing: a shard is
        # named before its file is made)
        kept = set(self.made)
        return [p for p in entries if p.name not in kept]

    def clear(self, keep: str | None = None) -> None:
        if self.cleared:
            return
        if keep:
            self.made.add(keep)
        check_out_dir(self.out, self.overwrite, self.made)  # again: it may have changed
        old = sorted(self._files(), key=lambda p: p.name != MANIFEST)
        if old:
            # the manifest goes first, so a half-removed dump never reads as complete; the
            # rest is deleted in the background (unlinking gigabytes takes a while)
            trash = make_trash(self.out)
            for path in old:
                os.replace(path, trash / path.name)  # moves links themselves, never targets
            self._cleanup = Worker("hookdump-cleanup", _remove_tree)
            self._cleanup.submit(trash)
            self._cleanup.close(join=False)
        self.cleared = True

    def wait(self) -> None:
        """Until the old dump's files are gone."""
        if self._cleanup is not None:
            self._cleanup.close()


class FolderPlace(DumpPlace):
    """A dump folder: `work` is the folder itself."""

    groups_commits = True  # a commit is a few syncs, each slowing the writes that overlap it
    in_flight = None

    def __init__(self, out: Path) -> None:
        super().__init__()
        self.out = out
        self.work = out
        self._made: set[str] = set()  # the files this writer makes (`claim`)
        self._old = _OldDump(out, False, self._made, cleared=False)
        self.medium = FolderMedium(out)  # its entries, and the run's notes in it

    @classmethod
    def claims(cls, where: str | Path) -> bool:
        return not is_url(os.fspath(where))

    @classmethod
    def open(
        cls, where: str | Path, storage_options: Mapping[str, Any], spool: Path | None
    ) -> FolderPlace:
        return cls(Path(local(where)))

    @property
    def label(self) -> str:
        return str(self.out)

    @property
    def root(self) -> Path:
        return self.out

    @contextlib.contextmanager
    def held(self, main: bool, take_over: bool, resumable: bool = True) -> Iterator[Path]:
        with self._locked(main):
            try:
                yield self.out
            finally:
                if main:
                    self.drop_notes()
                    remove_entry(self.out / RUNNING)  # a killed run's, too

    @contextlib.contextmanager
    def _locked(self, main: bool) -> Iterator[None]:
        """The folder's lock (whichever way the folder was named: a path or a file:// URL);
        a refusal names the run that holds it, as its note says."""
        with contextlib.ExitStack() as stack:
            try:
                stack.enter_context(locked(self.out if main else None))
            except FolderBusy as exc:
                note = running_note(self.medium)
                if note is None:
                    raise
                raise FolderBusy(
                    f"{opt('out')} {self.out} is being written by run "
                    f"{printable(str(note.get('run_id')))[:32]} on {note['host']} (pid "
                    f"{note['pid']}); wait for it to finish, or choose another folder"
                ) from exc
            yield

    def put_note(self, name: str, raw: bytes) -> None:
        self.claim(name)
        self.medium.put(name, raw)

    def drop_note(self, name: str) -> None:
        self.medium.delete(name)

    def check(self, overwrite: bool, keep_old: bool = False) -> None:
        # a killed run's note of itself is no dump
        check_out_dir(self.out, overwrite or keep_old, self._made | {RUNNING, WAITING})
        self._old = _OldDump(self.out, overwrite, self._made, cleared=keep_old)

    def claim(self, name: str) -> None:
        self._made.add(name)

    def old_present(self) -> bool:
        return self._old.present()

    def clear_old(self, keep: str | None = None) -> None:
        self._old.clear(keep)

    def forget_old(self) -> None:
        self._old.cleared = True

    def wait_old(self) -> None:
        self._old.wait()

    def estimate_notice(self, nbytes: int) -> str | None:
        return None

    def check_room(self, needed: int, written: int, shard_bytes: int) -> None:
        free = shutil.disk_usage(self.out).free + written + self._old.bytes_to_free()
        if needed > free:
            raise HookdumpError(
                f"the dump needs about {format_bytes(needed)} but only {format_bytes(free)} is "
                f"free under {opt('out')} {self.out}; make room, lower {opt('num_samples')}, "
                "or choose another folder"
            )

    def commit_shard(self, sealed: Path, name: str, checksum: Checksum) -> dict[str, Any]:
        fsync_file(sealed)
        self._old.clear(keep=sealed.name)
        publish(sealed, self.out / name)
        return checksum.entry()

    def put_manifest(self, name: str, data: Mapping[str, Any], complete: bool) -> None:
        written = write_json(self.out / name, data)  # in the room's place
        if not complete:
            self.keep_room(name, 2 * written)

    def put_file(self, name: str, raw: bytes) -> None:
        self.claim(name)
        write_durably(self.out / name, raw)

    def keep_room(self, name: str, nbytes: int) -> None:
        """Keep the next `name`'s temporary file allocated, MANIFEST_ROOM + `nbytes` big: on
        a disk that fills, the manifest listing the finished shards is written where it was
        (removed just before), never refused for want of space. Best effort: a disk already
        full gets none."""
        room = self.out / temporary(name)
        self.claim(room.name)
        try:
            fd = create_new(room)
            try:
                allocate(fd, 0, MANIFEST_ROOM + nbytes)
            finally:
                os.close(fd)
        except OSError:
            remove_entry(room)

    def drop_room(self, name: str) -> None:
        remove_entry(self.out / temporary(name))

    def remove(self, names: Iterable[str]) -> None:
        for name in names:
            remove_entry(self.out / name)

    def remove_strays(self, stray: Stray) -> None:
        if not self.out.is_dir():
            return
        for path in self.out.iterdir():
            if stray(path.name) and DUMP_FILE.match(path.name):
                remove_entry(path)

    def exists(self) -> bool:
        return self.out.is_dir()

    def entries(self) -> list[str]:
        return self.medium.names()

    def matches(self, entry: ShardEntry) -> bool:
        path = self.out / entry.file
        try:
            if not path.is_file() or path.is_symlink():
                return False
            if entry.bytes is not None and path.stat().st_size != entry.bytes:
                return False
            algorithm = recorded(entry)
            return algorithm is None or matches(entry, file_checksum(path, algorithm))
        except OSError:
            return False


MANIFEST_ROOM = 64 << 10  # bytes kept for the next manifest beyond twice the last one's


def _remove_tree(path: Path) -> None:
    shutil.rmtree(path, ignore_errors=True)


def _size(path: Path) -> int:
    """Bytes held by a file of an old dump (a folder of them: their sum), links not followed."""
    try:
        if path.is_symlink() or not path.is_dir():
            return path.lstat().st_size
        return sum(p.lstat().st_size for p in path.rglob("*") if not p.is_dir())
    except OSError:
        return 0
