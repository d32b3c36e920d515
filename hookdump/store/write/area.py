"""The local folder a dump's shards are finished in (`DumpPlace.work`): the dump's own
folder, where a finished shard is renamed into place (`InPlace`), or a spool beside the
run, from which each is put whole and deleted (`Spool`: in `--spool`, or the system's
temporary folder; it holds at most SPOOL_SHARDS shard files at a time and is removed when
the run ends; nothing in it is needed to resume)."""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import ClassVar

from hookdump.errors import HookdumpError, opt
from hookdump.format.values import format_bytes
from hookdump.store.folder import describe_os_error, locked, process_alive, remove_entry
from hookdump.store.write.shards import fsync_file

# shard files in a spool at most: one being written, two waiting, one going up
SPOOL_SHARDS = 4


class WorkArea(ABC):
    folder: Path | None  # None: not made yet (`held`)
    groups_commits: ClassVar[bool]  # whether finished shards wait to be committed together
    in_flight: ClassVar[int | None]  # how many may wait at most (None: no bound)

    @abstractmethod
    def held(self) -> contextlib.AbstractContextManager[Path]:
        """The folder, for the run."""

    def seal(self, path: Path) -> None:
        """A finished shard file, before the place commits it."""
        return  # nothing to do before a put

    @abstractmethod
    def notice(self, label: str, nbytes: int) -> str | None:
        """What a run says once it has estimated the dump's `nbytes`."""

    @abstractmethod
    def check_room(
        self, needed: int, written: int, shard_bytes: int, old_bytes: Callable[[], int]
    ) -> None:
        """Refuse a dump of about `needed` bytes that the local disk cannot hold (`written`:
        already in its first shard; `old_bytes()`: what clearing an old dump gives back)."""

    def forget(self, names: Iterable[str]) -> None:
        """Shards of these names that will not be committed."""
        return  # the dump's own files: the place removes them


class InPlace(WorkArea):
    """The dump's folder itself: a commit is a few syncs, each slowing the writes that
    overlap it, so finished shards are committed together."""

    groups_commits = True
    in_flight = None

    def __init__(self, folder: Path) -> None:
        self.folder: Path = folder

    @contextlib.contextmanager
    def held(self) -> Iterator[Path]:
        yield self.folder

    def seal(self, path: Path) -> None:
        fsync_file(path)

    def notice(self, label: str, nbytes: int) -> str | None:
        return None  # checked against the disk instead

    def check_room(
        self, needed: int, written: int, shard_bytes: int, old_bytes: Callable[[], int]
    ) -> None:
        free = shutil.disk_usage(self.folder).free + written + old_bytes()
        if needed > free:
            raise HookdumpError(
                f"the dump needs about {format_bytes(needed)} but only {format_bytes(free)} is "
                f"free under {opt('out')} {self.folder}; make room, lower "
                f"{opt('num_samples')}, or choose another folder"
            )


class Spool(WorkArea):
    """A new folder of this run's: each shard goes up as soon as it is finished."""

    groups_commits = False
    in_flight = SPOOL_SHARDS - 1  # besides the one being written

    def __init__(self, parent: Path | None) -> None:
        self.parent = parent
        self.folder: Path | None = None

    @contextlib.contextmanager
    def held(self) -> Iterator[Path]:
        spool = _new_spool(self.parent)
        try:
            with locked(spool):
                self.folder = spool
                yield spool
        finally:
            shutil.rmtree(spool, ignore_errors=True)

    def notice(self, label: str, nbytes: int) -> str | None:
        return f"uploading about {format_bytes(nbytes)} to {label}, a few shards at a time"

    def check_room(
        self, needed: int, written: int, shard_bytes: int, old_bytes: Callable[[], int]
    ) -> None:
        assert self.folder is not None, "held"
        free = shutil.disk_usage(self.folder).free + written
        needed = min(needed, SPOOL_SHARDS * shard_bytes)  # the spool holds a few at a time
        if needed > free:
            raise HookdumpError(
                f"the spool needs about {format_bytes(needed)} but only {format_bytes(free)} is "
                f"free under {self.folder.parent}; make room, lower {opt('shard_size')}, or "
                f"give {opt('spool')} a folder on another disk"
            )

    def forget(self, names: Iterable[str]) -> None:
        if self.folder is not None:
            for name in names:
                remove_entry(self.folder / name)


def _new_spool(parent: Path | None) -> Path:
    """A new spool folder, named for this process; those of killed runs beside it (their
    process gone) are removed first."""
    where = parent if parent is not None else Path(tempfile.gettempdir())
    try:
        where.mkdir(parents=True, exist_ok=True)
        for old in where.glob("hookdump-spool-*-*"):
            pid = old.name.split("-")[2]
            if (
                pid.isdigit()
                and not process_alive(int(pid))
                and old.is_dir()
                and not old.is_symlink()
            ):
                shutil.rmtree(old, ignore_errors=True)
        spool = tempfile.mkdtemp(prefix=f"hookdump-spool-{os.getpid()}-", dir=where)
        return Path(spool).resolve()
    except OSError as exc:
        raise HookdumpError(f"{opt('spool')} {where}: {describe_os_error(exc)}") from None
