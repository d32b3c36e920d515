"""A run whose dump goes to a URL: the local spool its shards are finished in, the lock on
the prefix, and what `--resume` keeps of what a killed run uploaded.

The spool is a new folder (in `--spool`, or the system's temporary folder) that holds at
most SPOOL_SHARDS shard files at a time, and is removed when the run ends. Nothing in it
is needed to resume: what a run has uploaded and listed is the dump."""

from __future__ import annotations

import contextlib
import dataclasses
import os
import shutil
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from hookdump.engine.options import RunOptions
from hookdump.errors import HookdumpError, opt
from hookdump.store.folder import DUMP_FILE, describe_os_error
from hookdump.store.location import Remote
from hookdump.store.write.upload import Upload
from hookdump.store.write.url_lock import UrlLock, process_alive
from hookdump.store.write.writer import FileNames


@contextlib.contextmanager
def at_url(options: RunOptions, main: bool) -> Iterator[tuple[RunOptions, Upload | None]]:
    """For a dump at a URL: the options with `out` set to a new spool, and the prefix to
    upload to, locked by this run (`main`: the one process, or torchrun's rank 0) until
    the block ends. Other options pass through."""
    dump = options.dump
    if dump.url is None:
        yield options, None
        return
    upload = Upload(Remote(dump.url, dump.storage_options), uuid.uuid4().hex)
    spool = _new_spool(dump.spool)
    lock = UrlLock(upload) if main else None
    try:
        if lock is not None:
            upload.make_prefix()
            lock.take(take_over=dump.resume or dump.overwrite)
        yield dataclasses.replace(options, dump=dataclasses.replace(dump, out=spool)), upload
    finally:
        if lock is not None:
            lock.release()
        shutil.rmtree(spool, ignore_errors=True)


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


def keep_uploaded(
    upload: Upload, previous: dict[str, Any], names: FileNames
) -> dict[str, Any] | None:
    """What `--resume` keeps of a killed run's dump at a URL: the listed shards up to the
    first whose object is missing or differs in size or SHA-256 (the rest are redone), the
    manifest cut to match (None: nothing kept, start anew). Objects of this run's names
    that are not kept, and its unfinished multipart uploads, are removed."""
    shards = previous["shards"]
    kept = 0
    for entry in shards:
        if not upload.matches(entry["file"], entry):
            break
        kept += 1
    listed = {entry["file"] for entry in shards[:kept]}

    def stray(name: str) -> bool:  # a shard object of this run's names that is not kept
        ours = name.startswith(names.shard_prefix) and bool(DUMP_FILE.match(name))
        return ours and name not in listed

    upload.abort_unfinished(lambda name: stray(name) or name == names.manifest)
    upload.remove(name for name in upload.entries() if stray(name))
    if kept == len(shards):
        return previous
    if kept == 0:
        return None
    return _cut(previous, kept)


def _cut(manifest: dict[str, Any], kept: int) -> dict[str, Any]:
    """`manifest` as if only its first `kept` shards had been listed."""
    last = manifest["shards"][kept - 1]
    fed = int(last.get("sequences", last["stop"]))
    cut = {**manifest, "shards": manifest["shards"][:kept], "num_samples": last["stop"]}
    if "num_sequences" in manifest:
        cut["num_sequences"] = fed
    if manifest.get("sample_ids") is not None:
        cut["sample_ids"] = manifest["sample_ids"][:fed]
    skipped = manifest.get("skipped_inputs", [])
    cut["skipped_inputs"] = skipped[: last.get("inputs_skipped", len(skipped))]
    return cut
