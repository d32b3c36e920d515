"""A dump at a URL (`--out s3://bucket/prefix`): its shards finished in a local spool, each
uploaded, checked and listed (`store.write.upload`), the prefix locked by a lock object
(`store.write.url_lock`).

The spool is a new folder (in `--spool`, or the system's temporary folder) that holds at
most SPOOL_SHARDS shard files at a time, and is removed when the run ends. Nothing in it
is needed to resume: what a run has uploaded and listed is the dump."""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
import uuid
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

from hookdump.errors import HookdumpError, opt
from hookdump.format.manifest import ShardEntry
from hookdump.format.names import DUMP_FILE, RUNNING, URL_LOCK, WAITING
from hookdump.format.values import format_bytes
from hookdump.store.checksum import Checksum
from hookdump.store.folder import describe_os_error, locked, process_alive, remove_entry
from hookdump.store.location import Remote, UrlPath, is_url
from hookdump.store.write.place import DumpPlace, Stray
from hookdump.store.write.upload import SPOOL_SHARDS, Upload
from hookdump.store.write.url_lock import UrlLock


class UrlPlace(DumpPlace):
    """A prefix at a URL; `work` is this run's spool."""

    groups_commits = False  # a shard goes up as soon as it is finished
    in_flight = SPOOL_SHARDS - 1  # besides the one being written
    poll_s = 0.5  # each look a listing

    def __init__(
        self, url: str, storage_options: Mapping[str, Any], spool: Path | None = None
    ) -> None:
        super().__init__()
        self.upload = Upload(Remote(url, storage_options), uuid.uuid4().hex)
        self.spool_parent = spool

    @classmethod
    def claims(cls, where: str | Path) -> bool:
        return is_url(os.fspath(where))

    @classmethod
    def open(
        cls, where: str | Path, storage_options: Mapping[str, Any], spool: Path | None
    ) -> UrlPlace:
        return cls(os.fspath(where), storage_options, spool)

    @property
    def label(self) -> str:
        return str(self.upload.url)

    @property
    def root(self) -> UrlPath:
        return self.upload.url

    @property
    def remote(self) -> Remote:
        return self.upload.remote

    @property
    def run_id(self) -> str | None:
        """The run id its lock names: a new dump's shards carry it."""
        return self.upload.run_id

    @contextlib.contextmanager
    def held(self, main: bool, take_over: bool, resumable: bool = True) -> Iterator[Path]:
        spool = _new_spool(self.spool_parent)
        lock = UrlLock(self.upload) if main else None
        try:
            with locked(spool):
                if lock is not None:
                    self.upload.medium.make_root()
                    lock.take(take_over, resumable)
                self.work = spool
                yield spool
        finally:
            with contextlib.suppress(HookdumpError):  # the run's own error comes first
                self.drop_notes()
            if lock is not None:
                lock.release()
            shutil.rmtree(spool, ignore_errors=True)

    def put_note(self, name: str, raw: bytes) -> None:
        self.upload.keep(name)  # not an old dump's, to remove at the first commit
        self.upload.put_bytes(name, raw)

    def drop_note(self, name: str) -> None:
        self.upload.remove([name])

    def check(self, overwrite: bool, keep_old: bool = False) -> None:
        # a killed run's notes of itself are no dump
        self.upload.check_prefix(overwrite or keep_old, ignore=(URL_LOCK, RUNNING, WAITING))
        if keep_old:  # resuming: what is there is this dump's
            self.upload.forget_old()

    def claim(self, name: str) -> None:
        pass  # the spool is this run's alone

    def old_present(self) -> bool:
        return False  # an old dump's objects go before the first upload, not after a sync

    def clear_old(self, keep: str | None = None) -> None:
        self.upload.clear_old()

    def forget_old(self) -> None:
        self.upload.forget_old()

    def wait_old(self) -> None:
        pass  # removed in line (`clear_old`)

    def keep_room(self, name: str, nbytes: int) -> None:
        pass  # a manifest is one PUT from memory: nothing on the local disk

    def drop_room(self, name: str) -> None:
        pass

    def estimate_notice(self, nbytes: int) -> str | None:
        return f"uploading about {format_bytes(nbytes)} to {self.label}, a few shards at a time"

    def check_room(self, needed: int, written: int, shard_bytes: int) -> None:
        assert self.work is not None, "held"
        free = shutil.disk_usage(self.work).free + written
        needed = min(needed, SPOOL_SHARDS * shard_bytes)  # the spool holds a few at a time
        if needed > free:
            raise HookdumpError(
                f"the spool needs about {format_bytes(needed)} but only {format_bytes(free)} is "
                f"free under {self.work.parent}; make room, lower {opt('shard_size')}, or give "
                f"{opt('spool')} a folder on another disk"
            )

    def commit_shard(self, sealed: Path, name: str, checksum: Checksum) -> dict[str, Any]:
        self.upload.clear_old()
        return self.upload.put_shard(sealed, name, checksum)

    def put_manifest(self, name: str, data: Mapping[str, Any], complete: bool) -> None:
        self.upload.clear_old()
        self.upload.put_json(name, data)

    def put_file(self, name: str, raw: bytes) -> None:
        self.upload.put_bytes(name, raw)

    def remove(self, names: Iterable[str]) -> None:
        names = list(names)
        self.upload.remove(names)
        if self.work is not None:  # a shard not yet uploaded
            for name in names:
                remove_entry(self.work / name)

    def remove_strays(self, stray: Stray) -> None:
        def mine(name: str) -> bool:
            return stray(name) and bool(DUMP_FILE.match(name))

        self.upload.abort_unfinished(mine)
        self.upload.remove(name for name in self.upload.entries() if mine(name))

    def exists(self) -> bool:
        return True  # a prefix needs no making

    def entries(self) -> list[str]:
        return self.upload.entries()

    def matches(self, entry: ShardEntry) -> bool:
        return self.upload.matches(entry)


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
