"""Resuming an interrupted dump: what it was made with, and where it stopped.

A resumed dump must be the dump an uninterrupted run would have made, so `--resume` checks
the options that shape it (`recipe`) and the files it was made from (`sources`): the
SHA-256 of the model and weights files, and the path, size and modification time of every
input file.
"""

from __future__ import annotations

import fnmatch
import os
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypedDict

from hookdump.engine.distributed import Ranks, rank_names
from hookdump.errors import HookdumpError, opt
from hookdump.format.manifest import Manifest, ShardEntry
from hookdump.format.names import MANIFEST, RANK_MANIFESTS, FileNames, is_follower_file
from hookdump.model.weights import sha256, state_sha256
from hookdump.store.read.manifest import manifest_at
from hookdump.store.read.progress import consumed_shards
from hookdump.store.write.place import DumpPlace

if TYPE_CHECKING:
    from hookdump.engine.options import RunOptions
    from hookdump.inputs.samples import Feed
    from hookdump.model.loading import LoadedModel

RESUME = opt("resume", True)


class FileDigest(TypedDict):
    path: str
    sha256: str


StateDigest = TypedDict("StateDigest", {"class": str, "sha256": str})


class Sources(TypedDict, total=False):
    """The files a dump is made from, as the manifest records them (`sources`)."""

    model: FileDigest
    weights: FileDigest
    model_files: list[FileDigest]  # a Hugging Face folder's weights
    definition: list[FileDigest]  # what defines the model: config, tokenizer, class source
    state_dict: StateDigest  # a module handed over in Python: its weights as they are now
    input: list[list[str | int]]  # each input file's path, size and modification time (ns)


def sources(loaded: LoadedModel, feed: Feed | None) -> Sources:
    """The files a dump is made from, as the manifest records them."""
    made = loaded.sources
    found: Sources = {"definition": [_digest(p) for p in made.definition]}
    if made.model_file is not None:
        found["model"] = _digest(made.model_file)
    if made.weights_file is not None:
        found["weights"] = _digest(made.weights_file)
    if made.files:
        found["model_files"] = [_digest(p) for p in made.files]
    if made.live:
        found["state_dict"] = {"class": loaded.spec, "sha256": state_sha256(loaded.module)}
    if feed is not None:
        found["input"] = [_stat(path) for path in feed.files]
    return found


def _digest(path: Path) -> FileDigest:
    return {"path": str(path), "sha256": sha256(path)}


def _stat(path: Path) -> list[str | int]:
    info = os.stat(path)
    return [str(path), info.st_size, info.st_mtime_ns]


def check_sources(out: str, before: Any, now: Sources) -> None:
    """Refuse to resume when a file the dump was made from has changed (one line naming it).
    A dump from a hookdump that did not record its sources is taken as it is."""
    if not isinstance(before, dict):
        return
    fix = f"restore it, or start anew with {opt('overwrite', True)}"
    for name, new in (("model", now.get("model")), ("weights", now.get("weights"))):
        flag = opt(name)
        old = before.get(name)
        if old != new:
            what = (new or old or {}).get("path", "?")
            raise HookdumpError(
                f"{opt('resume', True)}: {flag} {what} is not the file the dump in {out} was made "
                "from "
                f"(SHA-256 {_short(old)}, now {_short(new)}); {fix}"
            )
    _check_definition(out, before, now, fix)
    _check_state(out, before.get("state_dict"), now.get("state_dict"))
    if before.get("model_files", []) != now.get("model_files", []):
        raise HookdumpError(
            f"{RESUME}: the weights files of {opt('model')} are not those the dump in {out} "
            f"was made from (a SHA-256 differs); {fix}"
        )
    if "input" not in before and "input" not in now:
        return
    old_files = {row[0]: row[1:] for row in before.get("input") or [] if isinstance(row, list)}
    new_files = {row[0]: row[1:] for row in now.get("input") or []}
    for path, (size, mtime) in new_files.items():
        if path not in old_files:
            change = "was added"
        elif old_files[path] != [size, mtime]:
            change = "changed (size or modification time)"
        else:
            continue
        raise HookdumpError(
            f"{opt('resume', True)}: {opt('input')} file {path} {change} since the dump in {out} "
            f"began; {fix}"
        )
    gone = [path for path in old_files if path not in new_files]
    if gone:
        raise HookdumpError(
            f"{opt('resume', True)}: {opt('input')} file {gone[0]} is no longer among the inputs "
            "of the dump in "
            f"{out}; {fix}"
        )


def _check_definition(out: str, before: Mapping[str, Any], now: Sources, fix: str) -> None:
    """What defines the model (config, tokenizer files, class source) must be unchanged; a
    dump from before this was recorded is taken as it is."""
    if "definition" not in before:
        return
    old = {str(e.get("path")): e.get("sha256") for e in before["definition"] if isinstance(e, dict)}
    new = {e["path"]: e["sha256"] for e in now.get("definition", [])}
    for path in sorted(set(old) | set(new)):
        if old.get(path) != new.get(path):
            change = "is new" if path not in old else "is gone" if path not in new else "changed"
            raise HookdumpError(
                f"{RESUME}: {path} (part of what defines {opt('model')}) {change} since the "
                f"dump in {out} began (SHA-256 {str(old.get(path))[:12]}, now "
                f"{str(new.get(path))[:12]}); {fix}"
            )


def _check_state(out: str, old: Any, new: Any) -> None:
    """A live module's weights (`hookdump.dump`) must be those the dump began with."""
    if old != new:
        raise HookdumpError(
            f"{RESUME}: the model's weights are not those the dump in {out} was made from "
            f"(state dict SHA-256 {_short(old)}, now {_short(new)}); resume with the same "
            f"weights, or start anew with {opt('overwrite', True)}"
        )


def _short(entry: Mapping[str, Any] | None) -> str:
    if not entry:
        return "none"
    return str(entry.get("sha256", "?"))[:12]


def _gone(where: str) -> Any:
    return lambda _: HookdumpError(f"{where} is gone; start anew with {opt('overwrite', True)}")


class _Looked:
    """What `--resume` finds in a place: its entries listed once (nothing writes there
    while a resume looks), its manifests read and checked."""

    def __init__(self, place: DumpPlace) -> None:
        self.place = place
        self.label = place.label
        self.listed = place.entries() if place.exists() else []

    def has(self, name: str) -> bool:
        return name in self.listed

    def manifest(self, name: str) -> Manifest:
        place = self.place
        missing = _gone(f"{place.label}/{name}")
        return manifest_at(place.medium, missing, name)

    def rank_manifests(self) -> list[str]:
        return sorted(n for n in self.listed if fnmatch.fnmatchcase(n, RANK_MANIFESTS))


def previous_dump(
    options: RunOptions, ranks: Ranks | None, place: DumpPlace | None
) -> Manifest | None:
    """The incomplete dump that `resume` carries on (None: nothing there yet, start anew).
    Under torchrun, this rank's own part of it (empty where the rank wrote nothing)."""
    if place is None:
        raise HookdumpError(
            f"{opt('resume', True)} needs {opt('out')}: the folder of the interrupted dump"
        )
    looked = _Looked(place)
    if ranks is None:
        manifest = _one_process(looked, options.dump.grows)
    else:
        manifest = _this_rank(looked, ranks)
    if manifest is None:  # nothing there: it starts anew (a rank, beside the others' parts)
        return Manifest.empty() if ranks is not None and place.exists() else None
    _check_recipe(options, manifest, looked.label)  # whatever it holds: it must be this run's
    if not manifest.shards:  # nothing was finished (by this rank): it starts anew
        return None if ranks is None else Manifest.empty(manifest.run_id)
    listed = manifest.sample_ids
    if listed is not None and len(listed) < manifest.samples_fed:
        raise HookdumpError(
            f"{RESUME}: the manifest in {looked.label} does not list its samples' ids, so the "
            f"dump cannot be carried on; start anew with {opt('overwrite', True)}"
        )
    return manifest


def _check_recipe(options: RunOptions, manifest: Manifest, out: str) -> None:
    before = manifest.recipe
    for name, value in options.recipe().items():
        if name not in before and value is False:  # an option newer than the dump, off
            continue
        if before.get(name) != value:
            raise HookdumpError(
                f"{RESUME}: {opt(name)} was {before.get(name)!r:.80} for the dump in {out}, now "
                f"{value!r:.80}; resume with the same options, or start anew with "
                f"{opt('overwrite', True)}"
            )


def _one_process(place: _Looked, grows: bool) -> Manifest | None:
    """The manifest a one-process run left (None: none, the run starts anew); `grows`: a
    complete one is carried on too."""
    out = place.label
    if place.has(MANIFEST):
        manifest = place.manifest(MANIFEST)
        if manifest.complete:
            if not grows and _intact(place.place, manifest):
                raise HookdumpError(f"{RESUME}: {out} is already complete; nothing to do")
            # damaged since: carried on from its first shard that differs, as a killed run's
            return manifest.reopened()
        return manifest
    by_ranks = place.rank_manifests()
    if by_ranks:
        world = place.manifest(by_ranks[0]).get("processes", "several")
        raise HookdumpError(
            f"{RESUME}: the dump in {out} was started under torchrun; resume it with "
            f"torchrun --nproc-per-node {world}"
        )
    return None


def _intact(place: DumpPlace, manifest: Manifest) -> bool:
    """Whether every listed shard not consumed is there as its entry records it (size and
    checksum, read back)."""
    consumed = _consumed(place, manifest)
    shards = list(manifest.shards)
    stats = manifest.get("feature_stats")
    if isinstance(stats, dict):
        shards.append(ShardEntry.of_json({**stats, "start": 0, "stop": 0}))
    return all(entry.file in consumed or place.matches(entry) for entry in shards)


def _this_rank(place: _Looked, ranks: Ranks) -> Manifest | None:
    """The manifest this torchrun rank left (None where it wrote none)."""
    out = place.label
    if place.has(MANIFEST):
        raise HookdumpError(
            f"{RESUME}: the dump in {out} was started by one process; resume it without torchrun"
        )
    if not place.place.exists():
        return None
    mine = rank_names(ranks).manifest
    if not place.has(mine):
        return None
    manifest = place.manifest(mine)
    if manifest.get("processes") != ranks.world:
        raise HookdumpError(
            f"{RESUME}: the dump in {out} was started by {manifest.get('processes')} torchrun "
            f"processes, now {ranks.world}; resume it with --nproc-per-node "
            f"{manifest.get('processes')}"
        )
    return manifest


def keep_verified(place: DumpPlace, previous: Manifest, names: FileNames) -> Manifest | None:
    """What `--resume` keeps of a killed run's dump: the listed shards up to the first that
    is missing or differs in size or SHA-256 from its manifest entry (the rest are redone),
    the manifest cut to match (None: nothing kept, start anew). The files of this run's
    names that are not kept (a torchrun rank: its own; one process: any dump file) are
    removed, with the unfinished uploads of a URL's."""
    shards = previous.shards
    consumed = _consumed(place, previous)
    kept = 0
    for entry in shards:
        if entry.file not in consumed and not place.matches(entry):
            break
        kept += 1
    listed = {names.manifest} | {entry.file for entry in shards[:kept]}
    mine = names.shard_prefix if names.own_manifest else ""
    place.remove_strays(
        lambda name: name.startswith(mine) and name not in listed and not is_follower_file(name)
    )
    if kept == len(shards):
        return previous
    if kept == 0:
        return None
    return previous.cut(kept)


def _consumed(place: DumpPlace, previous: Manifest) -> set[str]:
    """The listed shards followers consumed (deleted once given out: `hookdump.follow`):
    kept by `--resume` as they are, gone."""
    return set(previous.get("consumed", [])) | set(consumed_shards(place.medium))
