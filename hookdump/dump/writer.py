"""Writing dumps: safetensors shards, then `manifest.json`, each file replaced atomically."""

from __future__ import annotations

import contextlib
import json
import math
import os
import re
import shutil
import struct
import threading
import uuid
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import torch

from hookdump.dump.direct_io import AppendFile, PositionalFile, allocate, pwrite_all, round_up
from hookdump.dump.folder import (
    DUMP_FILE,
    check_out_dir,
    create_new,
    make_trash,
    open_existing,
    publish,
    remove_entry,
    write_durably,
)
from hookdump.errors import HookdumpError, opt
from hookdump.format import FORMAT, MANIFEST, SAFETENSORS_DTYPES, KeyInfo, dtype_name

DEFAULT_SHARD_BYTES = 1 << 30
MANIFEST_ROOM = 64 << 10  # bytes kept for the next manifest beyond twice the last one's
__all__ = ["FORMAT", "MANIFEST", "DumpWriter"]


def write_json(path: Path, data: Mapping[str, Any]) -> int:
    """Write JSON durably through a fresh temporary file, so a reader never sees half of it;
    returns the bytes written."""
    raw = (json.dumps(data, indent=2) + "\n").encode()
    write_durably(path, raw)
    return len(raw)


class ShardFile:
    """One safetensors file, written tensor by tensor as values arrive, its header last.

    The data goes straight from each tensor's memory to the file (see `direct_io`), after
    `reserve` bytes kept for the header; the header is then padded with spaces to fill them,
    as the format allows. `close` leaves the finished file under its temporary name,
    `sealed`: the writer moves it into place.
    """

    def __init__(self, path: Path, reserve: int) -> None:
        self.path = path
        self.tmp = path.with_name(path.name + ".tmp")
        self.sealed: Path | None = None
        self.reserve = round_up(reserve)  # data starts block-aligned (and so 8-byte aligned)
        self.entries: dict[str, dict[str, Any]] = {}
        self.size = 0
        self.file = AppendFile(self.tmp, self.reserve)

    def write(
        self, key: str, tensor: torch.Tensor, release: Callable[[], None] | None = None
    ) -> None:
        """Append one tensor (contiguous, on the CPU) under `key`. With `release`, the data
        may go to the disk from the tensor's own memory; `release` is called once it is no
        longer needed (see `AppendFile.write`), whatever happens."""
        try:
            if key in self.entries:
                raise HookdumpError(f"{key!r} is in this shard already; a key is written once")
            if dtype_name(tensor.dtype) not in SAFETENSORS_DTYPES:
                raise HookdumpError(
                    f"{key!r} has dtype {tensor.dtype}, which safetensors cannot hold"
                )
        except BaseException:
            if release is not None:
                release()
            raise
        if tensor.numel():
            self.file.write(tensor.reshape(-1).view(torch.uint8).numpy().data, release)
        elif release is not None:
            release()
        nbytes = tensor.numel() * tensor.element_size()
        self.entries[key] = _entry(tensor.dtype, list(tensor.shape), self.size, nbytes)
        self.size += nbytes

    def finish(self, metadata: dict[str, str]) -> None:
        """Write the last bytes and the header (into room allocated when the file was made:
        a full disk cannot stop it), still under the temporary name `sealed`."""
        self.file.close()
        _write_header(self.tmp, self.reserve, self.entries, metadata)
        self.sealed = self.tmp

    def abort(self) -> None:
        """Drop the half-written (or finished but unpublished) file."""
        self.file.abort()
        remove_entry(self.tmp)


def _write_header(
    tmp: Path, reserve: int, entries: dict[str, Any], metadata: dict[str, str]
) -> None:
    """Write the header into the `reserve` bytes before the data."""
    header = json.dumps({"__metadata__": metadata, **entries}).encode()
    if len(header) + 8 > reserve:  # more keys than reserved for: move the data along once
        reserve = _move_data(tmp, reserve, round_up(len(header) + 8 + 4096))
    room = reserve - 8
    fd = open_existing(tmp, os.O_WRONLY)
    try:
        os.pwrite(fd, struct.pack("<Q", room) + header + b" " * (room - len(header)), 0)
    finally:
        os.close(fd)


def _move_data(tmp: Path, reserve: int, grown_reserve: int) -> int:
    """Copy the data of `tmp` to start at `grown_reserve` instead of `reserve` (slow: the
    whole shard is read back and written again); returns `grown_reserve`."""
    grown = tmp.with_name(tmp.name + "-grow")  # not .tmp2: a PlannedShard's
    try:
        with (
            os.fdopen(open_existing(tmp, os.O_RDONLY), "rb") as src,
            os.fdopen(create_new(grown), "wb") as dst,
        ):
            src.seek(reserve)
            dst.seek(grown_reserve)
            shutil.copyfileobj(src, dst, 1 << 24)
        os.replace(grown, tmp)
    finally:
        remove_entry(grown)
    return grown_reserve


def _fsync(path: Path) -> None:
    fd = open_existing(path, os.O_WRONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class PlannedShard:
    """A shard of `rows` rows whose layout is fixed up front: each batch's rows are written
    straight to their place in the file, so gathering batches into a shard holds nothing
    in memory. A shard that ends short (the last one) is compacted key by key."""

    def __init__(self, path: Path, layout: list[tuple[str, torch.dtype, list[int]]], rows: int):
        self.path = path
        self.tmp = path.with_name(path.name + ".tmp2")
        self.sealed: Path | None = None  # the finished file, once closed (as ShardFile)
        self.rows = rows
        self.filled = 0
        self.layout: dict[str, tuple[torch.dtype, list[int], int, int]] = {}
        offset = 0
        for key, dtype, shape in layout:
            row_bytes = math.prod(shape) * _element_size(dtype)
            self.layout[key] = (dtype, shape, offset, row_bytes)
            offset += row_bytes * rows
        self.reserve = round_up(4096 + 256 * len(layout))
        self.file = PositionalFile(self.tmp, self.reserve + offset)

    def write_rows(self, key: str, row: int, tensor: torch.Tensor) -> None:
        """Rows `row:row + len(tensor)` of `key` (contiguous, on the CPU)."""
        _, _, offset, row_bytes = self.layout[key]
        if row + tensor.shape[0] > self.rows:  # would run into the next key's rows
            raise ValueError(f"{key!r}: rows {row}:{row + tensor.shape[0]} past {self.rows}")
        if tensor.numel():
            data = tensor.reshape(-1).view(torch.uint8).numpy().data
            self.file.pwrite(data, self.reserve + offset + row * row_bytes)
        self.filled = max(self.filled, row + tensor.shape[0])

    def finish(self, metadata: dict[str, str]) -> None:
        """Write the header (a shard that ends short is first compacted in place: its
        keys' rows moved down to follow each other), under the temporary name `sealed`.
        The file was allocated whole when made, so this needs no new space."""
        self.file.flush()
        entries, size = {}, 0
        for key, (dtype, shape, offset, row_bytes) in self.layout.items():
            nbytes = row_bytes * self.filled
            if size != offset:  # rows of later keys only ever move down, in order
                _move_down(self.file.fileno(), self.reserve + offset, self.reserve + size, nbytes)
            entries[key] = _entry(dtype, [self.filled, *shape], size, nbytes)
            size += nbytes
        os.ftruncate(self.file.fileno(), self.reserve + size)  # the rows planned, not filled
        self.file.close()
        _write_header(self.tmp, self.reserve, entries, metadata)
        self.sealed = self.tmp

    def abort(self) -> None:
        """Drop the file."""
        with contextlib.suppress(OSError):  # already failing: the error was raised before
            self.file.close()
        remove_entry(self.tmp)


def _move_down(fd: int, source: int, target: int, nbytes: int, chunk: int = 16 << 20) -> None:
    """Copy `nbytes` at `source` to `target` (lower) in the same file, front first, so no
    byte is overwritten before it is read."""
    for done in range(0, nbytes, chunk):
        data = os.pread(fd, min(chunk, nbytes - done), source + done)
        if len(data) != min(chunk, nbytes - done):
            raise OSError(f"the shard ends before byte {source + done + len(data)}")
        pwrite_all(fd, memoryview(data), target + done)


def _element_size(dtype: torch.dtype) -> int:
    return torch.empty((), dtype=dtype).element_size()


def _entry(dtype: torch.dtype, shape: list[int], start: int, nbytes: int) -> dict[str, Any]:
    st_dtype = SAFETENSORS_DTYPES[dtype_name(dtype)]
    return {"dtype": st_dtype, "shape": shape, "data_offsets": [start, start + nbytes]}


class DumpWriter:
    """The dump folder: shards, each listed in the manifest once complete, the manifest last.

    The caller holds the folder's lock (`dump_folder.locked`). An old dump (with
    `overwrite`) stays whole and readable until the new dump's first shard is complete on
    disk; only then is it moved aside and deleted in the background, so a run that fails
    before that leaves `out` as it was.
    """

    def __init__(
        self,
        out: Path,
        *,
        overwrite: bool = False,
        shard_bytes: int = DEFAULT_SHARD_BYTES,
        shard_prefix: str = "shard-",
        manifest_name: str = MANIFEST,
        fields: Callable[[], dict[str, Any]] = dict,
    ) -> None:
        check_out_dir(out, overwrite)
        self.out = out
        self.shard_prefix = shard_prefix  # "shard-r01-" for a torchrun rank
        self.manifest_name = manifest_name  # a torchrun rank's own, until rank 0 merges them
        self.overwrite = overwrite
        self.shard_bytes = shard_bytes
        self.tensors: dict[str, dict[str, Any]] = {}
        self.shards: list[dict[str, Any]] = []
        self._named = 0  # shard files named so far (listed ones may lag behind: `Committer`)
        self._made: set[str] = set()  # temporary files of this writer's shards, in `out`
        self._keys_fixed = False  # the first shard is complete: its keys are the dump's
        # the rest of the manifest (model, command, sample ids...), built anew for each write
        self.fields = fields
        self._prepared = False
        self._cleanup: threading.Thread | None = None
        # in the manifest and every shard: a reader can tell a shard of another run
        self.run_id: str | None = uuid.uuid4().hex

    def open_shard(self, keys_expected: int) -> ShardFile:
        """A new shard file; `keys_expected` sizes the room kept for its header.

        Its temporary file sits beside an old dump until the shard commits, so a run that
        fails in its first batch leaves the old dump as it was.
        """
        reserve = 4096 + 256 * max(keys_expected, len(self.tensors))
        name = self._next_name()
        self._made.add(name + ".tmp")  # before it exists: see `_prepare`
        return ShardFile(self.out / name, reserve)

    def plan_shard(self, rows: int) -> PlannedShard:
        """A shard of `rows` rows laid out from the keys seen so far (see PlannedShard)."""
        name = self._next_name()
        self._made.add(name + ".tmp2")
        layout = [
            (key, getattr(torch, meta["dtype"]), meta["shape"])
            for key, meta in self.tensors.items()
        ]
        return PlannedShard(self.out / name, layout, rows)

    def _next_name(self) -> str:
        if not self._named:
            self._keep_room(MANIFEST_ROOM)
        self._named = max(self._named, len(self.shards)) + 1
        return f"{self.shard_prefix}{self._named - 1:05d}.safetensors"

    def fix_keys(self) -> None:
        """The first shard is complete (if not yet committed): later batches must bring
        the same keys (see `describe`)."""
        self._keys_fixed = True

    @property
    def keys_fixed(self) -> bool:
        return self._keys_fixed or bool(self.shards)

    def commit_shards(
        self, shards: list[tuple[ShardFile | PlannedShard, int, int, int | None]]
    ) -> None:
        """Commit finished shards, each given as (shard, start, stop, sequences): its rows
        `start:stop` (token rows: the samples they come from end at `sequences`).

        Each shard's file is finished and synced; then (first shard) an old dump is moved
        aside; then the shard is moved into place. The manifest (still incomplete) is
        rewritten once, listing those moved in. After an error, the shards not listed are
        dropped and the error raised."""
        listed = len(self.shards)
        try:
            for done, (shard, start, stop, sequences) in enumerate(shards):
                try:
                    self._move_in(shard, start, stop, sequences)
                except BaseException:
                    for later, *_ in shards[done + 1 :]:
                        later.abort()
                    raise
        finally:
            if len(self.shards) > listed:
                self._list(listed)

    def _list(self, listed: int) -> None:
        """Write the manifest listing the shards moved in after the first `listed`; if that
        fails, take them out again: the folder holds what its manifest lists."""
        try:
            self.write_manifest(complete=False)
        except BaseException:
            for entry in self.shards[listed:]:
                remove_entry(self.out / entry["file"])
            del self.shards[listed:]
            raise

    def _move_in(
        self, shard: ShardFile | PlannedShard, start: int, stop: int, sequences: int | None
    ) -> None:
        if start != (self.shards[-1]["stop"] if self.shards else 0):
            shard.abort()
            raise ValueError(f"shards out of order: a shard starting at row {start}")
        try:
            assert shard.sealed is not None  # finished (`finish_shard`)
            _fsync(shard.sealed)
            self._prepare(keep=shard.sealed.name)
            publish(shard.sealed, shard.path)
        except BaseException:
            shard.abort()
            raise
        entry: dict[str, Any] = {"file": shard.path.name, "start": start, "stop": stop}
        if sequences is not None:  # token rows: the samples whose tokens the shards hold
            entry["sequences"] = sequences
        self.shards.append(entry)

    def finish_shard(self, shard: ShardFile | PlannedShard, start: int, stop: int) -> None:
        """Write the rest of a complete shard of rows `start:stop`, header included, so that
        committing it needs no new space; drops it if that fails."""
        meta = {"format": FORMAT, "start": str(start), "stop": str(stop)}
        if self.run_id is not None:
            meta["run_id"] = self.run_id
        try:
            shard.finish(meta)
        except BaseException:
            shard.abort()
            raise

    def check_room(self, needed: int, written: int) -> None:
        """Refuse a dump of about `needed` bytes (`written` of them already in the first
        shard's temporary file) that the disk under `out` cannot hold."""
        free = shutil.disk_usage(self.out).free + written
        if self.overwrite and not self._prepared:  # the old dump's bytes will be free
            free += sum(_size(p) for p in self.out.iterdir())
        if needed > free:
            raise HookdumpError(
                f"the dump needs about {_gb(needed)} but only {_gb(free)} is free under "
                f"{opt('out')} {self.out}; make room, lower {opt('num_samples')}, or choose "
                "another folder"
            )

    def describe(self, key: str, info: KeyInfo, tensor: torch.Tensor, start: int) -> None:
        """Note a key's manifest entry (first batch), or check it did not change (later)."""
        shape = list(tensor.shape[1:])
        if not self.keys_fixed and key not in self.tensors:
            self.tensors[key] = {
                "module": info.module,
                "module_type": info.module_type,
                "kind": info.kind,
                "call": info.call,
                "part": info.part,
                "shape": shape,
                "dtype": dtype_name(tensor.dtype),
            }
        elif key in self.tensors and shape != self.tensors[key]["shape"]:
            raise HookdumpError(
                f"{key!r} changed its per-sample shape from {self.tensors[key]['shape']} to "
                f"{shape} at sample {start}; {opt('exclude')} that module"
            )

    def prepare(self) -> None:
        """Clear the folder now (a torchrun rank 0, before any rank writes)."""
        self._prepare()

    def prepared_elsewhere(self) -> None:
        """Another process cleared the folder: leave it alone."""
        self._prepared = True

    def replaces_old_dump(self) -> bool:
        """Whether the folder still holds files of an old dump (`overwrite`), which the
        first commit moves aside."""
        if not self.overwrite or self._prepared:
            return False
        try:
            return bool(self._old_files())
        except FileNotFoundError:  # made with the first shard
            return False

    def _old_files(self) -> list[Path]:
        """The folder's entries that are not this writer's own shards."""
        entries = list(self.out.iterdir())
        # the shards begun meanwhile stay (the set is read after the listing: a shard is
        # named before its file is made)
        kept = set(self._made)
        return [p for p in entries if p.name not in kept]

    def _prepare(self, keep: str | None = None) -> None:
        if self._prepared:
            return
        if keep:
            self._made.add(keep)
        check_out_dir(self.out, self.overwrite, self._made)  # again: it may have changed
        old = sorted(self._old_files(), key=lambda p: p.name != MANIFEST)
        if old:
            # the manifest goes first, so a half-removed dump never reads as complete; the
            # rest is deleted in the background (unlinking gigabytes takes a while)
            trash = make_trash(self.out)
            for path in old:
                os.replace(path, trash / path.name)  # moves links themselves, never targets
            self._cleanup = threading.Thread(target=shutil.rmtree, args=(trash, True))
            self._cleanup.start()
        self._prepared = True

    def manifest(self, complete: bool, extra: dict[str, Any] | None = None) -> dict[str, Any]:
        """The manifest for what has been written so far (`extra`: fields to add or replace)."""
        num_samples = self.shards[-1]["stop"] if self.shards else 0
        fields = {**self.fields(), **(extra or {})}
        samples = num_samples
        if self.shards and "sequences" in self.shards[-1]:  # rows are tokens
            samples = fields["num_sequences"] = self.shards[-1]["sequences"]
        if "sample_ids" in fields:  # ids of the samples written, not of those still to come
            fields["sample_ids"] = list(fields["sample_ids"][:samples])
        return {
            "format": FORMAT,
            **({"run_id": self.run_id} if self.run_id is not None else {}),
            "complete": complete,
            "num_samples": num_samples,
            **fields,
            "tensors": self.tensors,
            "shards": self.shards,
        }

    def write_manifest(self, complete: bool, extra: dict[str, Any] | None = None) -> dict[str, Any]:
        """Write `manifest.json` (after every shard it lists is on disk) and return it.

        Incomplete manifests (`complete: false`) list the shards finished so far.
        """
        self._prepare()
        manifest = self.manifest(complete, extra)
        written = write_json(self.out / self.manifest_name, manifest)  # in the room's place
        if not complete:
            self._keep_room(MANIFEST_ROOM + 2 * written)
        return manifest

    def _keep_room(self, nbytes: int) -> None:
        """Keep the manifest's next temporary file allocated, `nbytes` big: on a disk that
        fills, the manifest listing the finished shards is written where it was (removed
        just before), never refused for want of space. Best effort: a disk already full
        gets none."""
        room = self.out / (self.manifest_name + ".tmp")
        self._made.add(room.name)
        try:
            fd = create_new(room)
            try:
                allocate(fd, 0, nbytes)
            finally:
                os.close(fd)
        except OSError:
            remove_entry(room)

    def drop_room(self) -> None:
        """The run is over: no more manifests to write room for."""
        if self._named:
            remove_entry(self.out / (self.manifest_name + ".tmp"))

    def take_over(self, shards: list[dict[str, Any]], tensors: dict[str, dict[str, Any]]) -> None:
        """Become the writer of the whole dump (torchrun's rank 0, once every rank is done):
        list every rank's shards and write the one `manifest.json`."""
        self.shards, self.tensors, self.manifest_name = shards, tensors, MANIFEST

    @classmethod
    def resume(
        cls,
        out: Path,
        manifest: dict[str, Any],
        *,
        shard_bytes: int = DEFAULT_SHARD_BYTES,
        shard_prefix: str = "shard-",
        manifest_name: str = MANIFEST,
        fields: Callable[[], dict[str, Any]] = dict,
    ) -> DumpWriter:
        """Carry on an incomplete dump: keep its listed shards, drop half-written files.
        A torchrun rank (its own shard prefix and manifest) touches only its own files."""
        writer = cls(
            out,
            overwrite=True,
            shard_bytes=shard_bytes,
            shard_prefix=shard_prefix,
            manifest_name=manifest_name,
            fields=fields,
        )
        writer.tensors, writer.shards = dict(manifest["tensors"]), list(manifest["shards"])
        writer.run_id = manifest.get("run_id")  # one dump, one id: its shards carry it
        writer._prepared = True
        listed = {writer.manifest_name} | {s["file"] for s in writer.shards}
        # one process: every stray dump file; a torchrun rank: its own
        mine = shard_prefix if manifest_name != MANIFEST else ""
        for path in out.iterdir():
            if (
                path.name.startswith(mine)
                and path.name not in listed
                and DUMP_FILE.match(path.name)
            ):
                remove_entry(path)
        return writer

    def finish(self, extra: dict[str, Any] | None = None) -> dict[str, Any]:
        """Write the complete manifest, once the old dump's files are gone."""
        if self._cleanup is not None:
            self._cleanup.join()
        return self.write_manifest(complete=True, extra=extra)


def _size(path: Path) -> int:
    """Bytes held by a file of an old dump (a folder of them: their sum), links not followed."""
    try:
        if path.is_symlink() or not path.is_dir():
            return path.lstat().st_size
        return sum(p.lstat().st_size for p in path.rglob("*") if not p.is_dir())
    except OSError:
        return 0


def _gb(n: int) -> str:
    return f"{n / 1e9:.3g} GB"


_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]?i?b?)?\s*$", re.IGNORECASE)
_UNITS = {"": 1, "k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12}


def parse_size(text: str) -> int:
    """'2GB' -> 2e9 bytes, '512MiB' -> 512 * 2**20, '1000' -> 1000."""
    match = _SIZE.match(text)
    if not match:
        raise HookdumpError(f"{opt('shard_size')} {text!r} is not a size; write e.g. 2GB or 512MiB")
    number, unit = float(match.group(1)), (match.group(2) or "").lower()
    prefix = unit[:1] if unit[:1] in "kmgt" else ""
    scale = 1024 ** "kmgt".index(prefix) * 1024 if "i" in unit and prefix else _UNITS[prefix]
    size = int(number * scale)
    if size < 1:
        raise HookdumpError(f"{opt('shard_size')} {text!r} must be at least one byte")
    return size
