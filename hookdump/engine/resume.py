"""Resuming an interrupted dump: what it was made with, and where it stopped.

A resumed dump must be the dump an uninterrupted run would have made, so `--resume` checks
the options that shape it (`recipe`) and the files it was made from (`sources`): the
SHA-256 of the model and weights files, and the path, size and modification time of every
input file.
"""

from __future__ import annotations

import fnmatch
import functools
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hookdump.engine.distributed import RANK_MANIFESTS, Ranks, rank_names
from hookdump.errors import HookdumpError, opt
from hookdump.format.manifest import samples_fed
from hookdump.model.weights import sha256, state_sha256
from hookdump.store.location import Remote
from hookdump.store.read.dump import Dump, read_manifest
from hookdump.store.read.manifest import read_remote_manifest
from hookdump.store.write.upload import Upload
from hookdump.store.write.writer import MANIFEST

if TYPE_CHECKING:
    from hookdump.engine.options import RunOptions
    from hookdump.inputs.samples import Feed
    from hookdump.model.loading import LoadedModel

RESUME = opt("resume", True)
# a torchrun rank's part that holds nothing yet (the other ranks' parts may)
_NOTHING: dict[str, Any] = {"tensors": {}, "shards": [], "sample_ids": [], "num_samples": 0}


def sources(loaded: LoadedModel, feed: Feed | None) -> dict[str, Any]:
    """The files a dump is made from, as the manifest records them."""
    found: dict[str, Any] = {}
    for name, path in (
        ("model", loaded.sources.model_file),
        ("weights", loaded.sources.weights_file),
    ):
        if path is not None:
            found[name] = {"path": str(path), "sha256": sha256(path)}
    if loaded.sources.files:  # a Hugging Face folder's weights
        found["model_files"] = [{"path": str(p), "sha256": sha256(p)} for p in loaded.sources.files]
    found["definition"] = [{"path": str(p), "sha256": sha256(p)} for p in loaded.sources.definition]
    if loaded.sources.live:  # a module handed over in Python: its weights as they are now
        found["state_dict"] = {"class": loaded.spec, "sha256": state_sha256(loaded.module)}
    if feed is not None:
        found["input"] = [_stat(path) for path in feed.files]
    return found


def _stat(path: Path) -> list[Any]:
    info = os.stat(path)
    return [str(path), info.st_size, info.st_mtime_ns]


def check_sources(out: str, before: Any, now: dict[str, Any]) -> None:
    """Refuse to resume when a file the dump was made from has changed (one line naming it).
    A dump from a hookdump that did not record its sources is taken as it is."""
    if not isinstance(before, dict):
        return
    fix = f"restore it, or start anew with {opt('overwrite', True)}"
    for name in ("model", "weights"):
        flag = opt(name)
        old, new = before.get(name), now.get(name)
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


def _check_definition(out: str, before: dict[str, Any], now: dict[str, Any], fix: str) -> None:
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


def _short(entry: dict[str, Any] | None) -> str:
    if not entry:
        return "none"
    return str(entry.get("sha256", "?"))[:12]


class _Place:
    """Where an interrupted dump is: a local folder, or a prefix at a URL (`upload`)."""

    def __init__(self, out: Path, upload: Upload | None) -> None:
        self.out, self.upload = out, upload
        self.label = str(upload.url if upload is not None else out)

    def exists(self) -> bool:
        return self.upload is not None or self.out.is_dir()

    @functools.cached_property
    def _listed(self) -> list[str]:
        """The prefix's entries, listed once: nothing writes there while a resume looks."""
        assert self.upload is not None
        return self.upload.entries()

    def has(self, name: str) -> bool:
        if self.upload is not None:
            return name in self._listed
        return (self.out / name).exists()

    def manifest(self, name: str) -> dict[str, Any]:
        """A manifest there, read and checked."""
        if self.upload is None:
            return read_manifest(self.out / name).to_json()
        remote: Remote = self.upload.remote
        return read_remote_manifest(remote, _gone(remote.url / name), name).to_json()

    def rank_manifests(self) -> list[str]:
        if self.upload is not None:
            names = self._listed
        else:
            names = [p.name for p in self.out.iterdir()] if self.out.is_dir() else []
        return sorted(n for n in names if fnmatch.fnmatchcase(n, RANK_MANIFESTS))


def _gone(where: str) -> Any:
    return lambda _: HookdumpError(f"{where} is gone; start anew with {opt('overwrite', True)}")


def previous_dump(
    options: RunOptions, ranks: Ranks | None = None, upload: Upload | None = None
) -> dict[str, Any] | None:
    """The incomplete dump that `resume` carries on (None: nothing there yet, start anew).
    Under torchrun, this rank's own part of it (empty where the rank wrote nothing).
    `upload`: the dump is at its URL (`options.dump.out` is the local spool)."""
    out = options.dump.out
    if out is None:
        raise HookdumpError(
            f"{opt('resume', True)} needs {opt('out')}: the folder of the interrupted dump"
        )
    place = _Place(out, upload)
    manifest = _one_process(place) if ranks is None else _this_rank(place, ranks)
    if manifest is None:  # nothing there: it starts anew (a rank, beside the others' parts)
        return dict(_NOTHING) if ranks is not None and place.exists() else None
    _check_recipe(options, manifest, place.label)  # whatever it holds: it must be this run's
    if not manifest["shards"]:  # nothing was finished (by this rank): it starts anew
        return None if ranks is None else {**_NOTHING, "run_id": manifest.get("run_id")}
    listed = manifest.get("sample_ids")
    if listed is not None and len(listed) < samples_fed(manifest):
        raise HookdumpError(
            f"{RESUME}: the manifest in {place.label} does not list its samples' ids, so the "
            f"dump cannot be carried on; start anew with {opt('overwrite', True)}"
        )
    return manifest


def _check_recipe(options: RunOptions, manifest: dict[str, Any], out: str) -> None:
    before = manifest.get("recipe") or {}
    for name, value in options.recipe().items():
        if name not in before and value is False:  # an option newer than the dump, off
            continue
        if before.get(name) != value:
            raise HookdumpError(
                f"{RESUME}: {opt(name)} was {before.get(name)!r:.80} for the dump in {out}, now "
                f"{value!r:.80}; resume with the same options, or start anew with "
                f"{opt('overwrite', True)}"
            )


def _one_process(place: _Place) -> dict[str, Any] | None:
    """The manifest a one-process run left (None: none, the run starts anew)."""
    out = place.label
    if place.has(MANIFEST):
        manifest = (
            Dump(place.out).manifest.to_json() if place.upload is None else place.manifest(MANIFEST)
        )
        if manifest.get("complete"):
            raise HookdumpError(f"{RESUME}: {out} is already complete; nothing to do")
        return manifest
    by_ranks = place.rank_manifests()
    if by_ranks:
        world = place.manifest(by_ranks[0]).get("processes", "several")
        raise HookdumpError(
            f"{RESUME}: the dump in {out} was started under torchrun; resume it with "
            f"torchrun --nproc-per-node {world}"
        )
    return None


def _this_rank(place: _Place, ranks: Ranks) -> dict[str, Any] | None:
    """The manifest this torchrun rank left (None where it wrote none)."""
    out = place.label
    if place.has(MANIFEST):
        raise HookdumpError(
            f"{RESUME}: the dump in {out} was started by one process; resume it without torchrun"
        )
    if not place.exists():
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
