"""A dump's lifecycle: shards (`dump.shards`) listed in `manifest.json` as they are
committed, the manifest written last; where they go (a folder, a URL) is the `DumpPlace`'s."""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from hookdump.errors import HookdumpError, opt
from hookdump.format.dtypes import dtype_name
from hookdump.format.keys import KeyInfo
from hookdump.format.manifest import FORMAT, Manifest, ShardEntry, recipe
from hookdump.format.names import MANIFEST, STATS_FILE, FileNames, part_files, temporary
from hookdump.format.rows import Rows, SampleIds, ids_for_manifest
from hookdump.store.checksum import DEFAULT, Algorithm, checksum_of
from hookdump.store.write.place import DumpPlace
from hookdump.store.write.shards import PlannedShard, ShardFile, header_room

DEFAULT_SHARD_BYTES = 1 << 30
__all__ = ["FORMAT", "MANIFEST", "DumpWriter"]


@dataclass(frozen=True)
class DumpOptions:
    """Where the dump goes and how it is written.

    Args:
        out: where the dump goes, as the user named it: a folder (a `Path`) or a URL (a
            `str`, `store.location.destination_of`); None: nothing is written, statistics
            only. Never rewritten: the shards are finished in the place's own `work`.
        storage_options: fsspec's options for a URL (never recorded or printed).
        spool: where a URL's shards are finished (a new folder in it; None: the system's
            temporary folder).
        overwrite: replace a dump already in `out`.
        resume: finish an interrupted dump in `out`.
        grows: with `resume`, a complete dump is carried on too (its source grew since: an
            import of files an engine is still writing).
        shard_bytes: about how many bytes go into one shard file.
        save_dtype: the dtype written for floating tensors (None: as captured).
        part: this run writes one part of a dump that another process locked, checked and
            finishes (a Ray task's): its files are named for the part.
        max_disk: the most bytes of shards kept under `out` at once: the run waits for a
            follower to consume them (`hookdump.follow`; None: no limit).
        checksum: what the manifest records of each shard: its CRC32C, taken as it is
            written, or its SHA-256 (a content address), read back.
    """

    out: Path | str | None = None
    storage_options: Mapping[str, str] = field(default_factory=dict, repr=False)
    spool: Path | None = None
    overwrite: bool = False
    resume: bool = False
    shard_bytes: int = DEFAULT_SHARD_BYTES
    save_dtype: torch.dtype | None = field(default=None, metadata=recipe())
    part: Part | None = None
    max_disk: int | None = None
    checksum: Algorithm = DEFAULT
    grows: bool = False

    @property
    def folder(self) -> Path | None:
        """The local folder the dump is (None: a URL, or no `out`)."""
        return self.out if isinstance(self.out, Path) else None


@dataclass(frozen=True)
class Part:
    """One part of a dump that another process finishes (`DumpOptions.part`): its name
    (hex digits, made from its samples' ids) and the dump's run id."""

    name: str
    run_id: str

    @property
    def names(self) -> FileNames:
        return part_files(self.name)


class DumpWriter:
    """The dump folder: shards, each listed in the manifest once complete, the manifest last.

    The caller holds the place (`DumpPlace.held`) and has checked it (`DumpPlace.check`).
    An old dump (with `overwrite`) stays whole and readable until the new dump's first
    shard is complete; only then is it removed, so a run that fails before that leaves the
    place as it was. `fields`: the rest of the manifest (the model, the command...); the
    sample ids and skipped inputs come with each shard's rows.
    """

    def __init__(
        self,
        place: DumpPlace,
        *,
        shard_bytes: int = DEFAULT_SHARD_BYTES,
        names: FileNames = FileNames(),
        fields: dict[str, Any] | None = None,
        checksum: Algorithm = DEFAULT,
    ) -> None:
        assert place.work is not None, "the place is held"
        self.place = place
        self.names = names
        self.shard_bytes = shard_bytes
        self.fields = dict(fields or {})
        self.tensors: dict[str, dict[str, Any]] = {}
        self.checksum = checksum  # each shard's, as the manifest records it
        self.shards: list[ShardEntry] = []
        # the ids of the samples listed, and the inputs skipped before them (see `Rows`)
        self.fed: tuple[SampleIds, list[dict[str, str]]] = (SampleIds(), [])
        self.generated: list[list[Any]] = []  # --generate: per sample listed (see `Rows`)
        self._named = 0  # shard files named so far (listed ones may lag behind: `Committer`)
        self._keys_fixed = False  # the first shard is complete: its keys are the dump's
        # in the manifest and every shard: a reader can tell a shard of another run
        self.run_id: str | None = place.run_id or uuid.uuid4().hex

    @property
    def out(self) -> Path:
        """Where shards are finished (a dump at a URL: its spool)."""
        assert self.place.work is not None, "the place is held"
        return self.place.work

    def open_shard(self, keys_expected: list[str]) -> ShardFile:
        """A new shard file; `keys_expected` (names) size the room kept for its header.

        Its temporary file sits beside an old dump until the shard commits, so a run that
        fails in its first batch leaves the old dump as it was.
        """
        reserve = header_room(dict.fromkeys([*self.tensors, *keys_expected]))
        name = self._next_name()
        self.place.claim(temporary(name))  # before it exists: never taken for an old dump's
        return ShardFile(self.out / name, reserve)

    def plan_shard(self, rows: int) -> PlannedShard:
        """A shard of `rows` rows laid out from the keys seen so far (see PlannedShard)."""
        name = self._next_name()
        self.place.claim(name + ".tmp2")
        layout = [
            (key, getattr(torch, meta["dtype"]), meta["shape"])
            for key, meta in self.tensors.items()
        ]
        return PlannedShard(self.out / name, layout, rows)

    def _next_name(self) -> str:
        if not self._named:
            self.place.keep_room(self.names.manifest, 0)
        self._named = max(self._named, len(self.shards)) + 1
        return self.names.shard(self._named - 1)

    def share_run_id(self, run_id: str | None) -> None:
        """Take the run id every torchrun rank agreed on: one dump, one id in its shards."""
        self.run_id = run_id

    def fix_keys(self) -> None:
        """The first shard is complete (if not yet committed): later batches must bring
        the same keys (see `note_key`)."""
        self._keys_fixed = True

    @property
    def keys_fixed(self) -> bool:
        return self._keys_fixed or bool(self.shards)

    def commit_shards(self, shards: list[tuple[ShardFile | PlannedShard, Rows]]) -> None:
        """Commit finished shards, each given with the rows it holds.

        Each shard's file is finished and synced; then (first shard) an old dump is moved
        aside; then the shard is moved into place. The manifest (still incomplete) is
        rewritten once, listing those moved in. After an error, the shards not listed are
        dropped and the error raised."""
        listed, skipped = len(self.shards), len(self.fed[1])
        try:
            for done, (shard, rows) in enumerate(shards):
                try:
                    self._move_in(shard, rows)
                except BaseException:
                    for later, *_ in shards[done + 1 :]:
                        later.abort()
                    raise
        finally:
            if len(self.shards) > listed:
                self._list(listed, skipped)

    def _list(self, listed: int, skipped: int) -> None:
        """Write the manifest listing the shards moved in after the first `listed` (and the
        inputs skipped after the first `skipped`); if that fails, take them out again: the
        folder holds what its manifest lists."""
        try:
            self.write_manifest(complete=False)
        except BaseException:
            self.place.remove([entry.file for entry in self.shards[listed:]])
            del self.shards[listed:]
            ids, inputs = self.fed
            ids.truncate(self._samples_listed())
            del self.generated[self._samples_listed() :]
            del inputs[skipped:]
            raise

    def _move_in(self, shard: ShardFile | PlannedShard, rows: Rows) -> None:
        if rows.start != (self.shards[-1].stop if self.shards else 0):
            shard.abort()
            raise ValueError(f"shards out of order: a shard starting at row {rows.start}")
        ids, skipped = self.fed
        before = len(ids)
        try:
            ids.extend(rows.ids)  # first: ids that the manifest could not hold refuse it
            self.generated.extend(list(g) for g in rows.generated)
            assert shard.sealed is not None  # finished (`finish_shard`)
            checksum = shard.take_checksum(self.checksum)
            stored = self.place.commit_shard(shard.sealed, shard.path.name, checksum)
        except BaseException:
            ids.truncate(before)
            del self.generated[before:]
            shard.abort()
            raise
        entry = rows.shard_entry(shard.path.name)
        # and what `--resume` needs to drop this shard and those after it
        done = len(skipped) + len(rows.skipped)
        self.shards.append(dataclasses.replace(entry, **stored, inputs_skipped=done))
        skipped.extend(rows.skipped)

    def _samples_listed(self) -> int:
        """The samples whose rows the listed shards hold."""
        return self.shards[-1].samples_fed if self.shards else 0

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
        shard's temporary file) that the local disk cannot hold."""
        self.place.check_room(needed, written, self.shard_bytes)

    def note_key(self, key: str, info: KeyInfo, tensor: torch.Tensor, start: int) -> None:
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
            if info.standard_name is not None:
                self.tensors[key]["standard_name"] = info.standard_name
        elif key in self.tensors and shape != self.tensors[key]["shape"]:
            raise HookdumpError(
                f"{key!r} changed its per-sample shape from {self.tensors[key]['shape']} to "
                f"{shape} at sample {start}; {opt('exclude')} that module"
            )
        elif key in self.tensors and dtype_name(tensor.dtype) != self.tensors[key]["dtype"]:
            # the sink casts where it can (`sink.as_dtype`): bytes of one dtype never go
            # where a shard's rows of another are laid out
            raise HookdumpError(
                f"{key!r} changed its dtype from {self.tensors[key]['dtype']} to "
                f"{dtype_name(tensor.dtype)} at sample {start}"
            )

    def clear_old_dump(self, here: bool) -> None:
        """Under torchrun, before any rank writes: rank 0 (`here`) moves an old dump aside
        now, the other ranks leave the folder alone."""
        if here:
            self.place.clear_old()
        else:
            self.place.forget_old()

    def replaces_old_dump(self) -> bool:
        """Whether the folder still holds files of an old dump (`overwrite`), which the
        first commit moves aside."""
        return self.place.old_present()

    def manifest(self, complete: bool, extra: dict[str, Any] | None = None) -> dict[str, Any]:
        """The manifest for what has been written so far (`extra`: fields to add or replace)."""
        ids, skipped = self.fed
        fields: dict[str, Any] = {**self.fields, "sample_ids": ids, "skipped_inputs": skipped}
        fields.update(extra or {})
        fields["sample_ids"] = ids_for_manifest(fields["sample_ids"])
        if fields["sample_ids"] is None:  # row numbers: no list, which every reader reads so
            del fields["sample_ids"]
        if self.generated and "generated" not in fields:
            fields["generated"] = self.generated
        gone = self.place.gone([shard.file for shard in self.shards])
        if gone:  # deleted by a follower (hookdump.follow consume=True): their rows are gone
            fields["consumed"] = gone
        if self.shards and self.shards[-1].sequences is not None:  # rows are tokens
            fields["num_sequences"] = self.shards[-1].sequences
        return {
            "format": FORMAT,
            **({"run_id": self.run_id} if self.run_id is not None else {}),
            "complete": complete,
            "num_samples": self.shards[-1].stop if self.shards else 0,
            **fields,
            "tensors": self.tensors,
            "shards": [shard.to_json() for shard in self.shards],
        }

    def write_manifest(
        self, complete: bool, extra: dict[str, Any] | None = None, stats: bytes | None = None
    ) -> dict[str, Any]:
        """Write `manifest.json` (after every shard it lists is on disk, and `stats`, the
        per-feature statistics' file, if given) and return it.

        Incomplete manifests (`complete: false`) list the shards finished so far.
        """
        self.place.clear_old()
        if stats is not None:
            extra = {**(extra or {}), "feature_stats": self._write_stats(stats)}
        manifest = self.manifest(complete, extra)
        self.place.put_manifest(self.names.manifest, manifest, complete)
        return manifest

    def _write_stats(self, raw: bytes) -> dict[str, Any]:
        """Write the per-feature statistics' file; its manifest entry."""
        self.place.put_file(STATS_FILE, raw)
        return {"file": STATS_FILE, **checksum_of([raw], "sha256").entry()}

    def present_bytes(self) -> int:
        """The bytes of the listed shards still under `out` (not consumed by a follower)."""
        gone = set(self.place.gone([shard.file for shard in self.shards]))
        return sum(shard.bytes or 0 for shard in self.shards if shard.file not in gone)

    def drop_room(self) -> None:
        """The run is over: no more manifests to write room for."""
        if self._named:
            self.place.drop_room(self.names.manifest)

    def take_over(
        self,
        shards: list[ShardEntry],
        tensors: dict[str, dict[str, Any]],
        fields: dict[str, Any] | None = None,
    ) -> None:
        """Become the writer of the whole dump (torchrun's rank 0 once every rank is done, or
        the process that joins a dump's parts): list every part's shards and write the one
        `manifest.json` (`fields`: the manifest's other fields, if this writer had none)."""
        self.shards, self.tensors, self.names = shards, tensors, FileNames()
        if fields is not None:
            self.fields = dict(fields)

    @classmethod
    def resume(
        cls,
        place: DumpPlace,
        manifest: Manifest,
        *,
        shard_bytes: int = DEFAULT_SHARD_BYTES,
        names: FileNames = FileNames(),
        fields: dict[str, Any] | None = None,
        checksum: Algorithm = DEFAULT,
    ) -> DumpWriter:
        """Carry on an incomplete (validated) dump, keeping its listed shards (the engine
        has removed what else a killed run left: `engine.resume.keep_verified`)."""
        writer = cls(place, shard_bytes=shard_bytes, names=names, fields=fields, checksum=checksum)
        fed = manifest.samples_fed
        writer.tensors = {key: dict(meta) for key, meta in manifest.tensors.items()}
        writer.shards = list(manifest.shards)
        listed_ids = manifest.sample_ids
        writer.fed = (
            SampleIds(range(fed) if listed_ids is None else listed_ids[:fed]),
            list(manifest.get("skipped_inputs", [])),
        )
        writer.generated = list(manifest.get("generated", []))[:fed]
        writer.run_id = manifest.run_id  # one dump, one id: its shards carry it
        return writer

    def finish(
        self, extra: dict[str, Any] | None = None, stats: bytes | None = None
    ) -> dict[str, Any]:
        """Write the complete manifest (and `stats`, see `write_manifest`), once the old
        dump's files are gone."""
        self.place.wait_old()
        return self.write_manifest(complete=True, extra=extra, stats=stats)
