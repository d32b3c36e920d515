"""Every file name a dump holds or leaves beside it, made and parsed in this one place.

A dump's folder (or its URL's prefix) holds `manifest.json`, its shards
(`shard-NNNNN.safetensors`) and `stats.safetensors`. While a run goes on, each writer of
several keeps its own shards and manifest until they are joined: a torchrun rank's
`shard-rNN-NNNNN.safetensors` and `manifest-rNN.json`, a Ray part's `shard-pHEX-...` and
`manifest-pHEX.json`. Beside them go the run's notes (`running.json`, `waiting.json` or a
writer's own `waiting-rNN.json`, a URL's lock `hookdump.lock`), each follower's progress
(`follow-NAME.json`, `follow-NAME.inside`, `follow-NAME.lock`), files being written
(`NAME.tmp`; a shard's `.tmp2`, `.tmp-grow`) and an old dump's trash (`.hookdump-old-*`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

MANIFEST = "manifest.json"
STATS_FILE = "stats.safetensors"  # per-feature statistics (store.features), if made
RUNNING = "running.json"  # beside a dump being written: which run, whether it overwrites
WAITING = "waiting.json"  # beside a dump whose run waits for a follower (--max-disk)
URL_LOCK = "hookdump.lock"  # the one-writer lock object at a URL (store.write.url_lock)
EXPORT_MARKER = "hookdump-export.json"  # in every folder `hookdump export` writes
TRASH_PREFIX = ".hookdump-old-"  # an old dump being deleted (left behind if cut short)

_TAG = r"(?:r\d+|p[0-9a-f]+)"  # a torchrun rank's (`rNN`) or a Ray part's (`pHEX`) files
_WRITER = r"(?:r(?P<rank>\d+)|p(?P<part>[0-9a-f]+))"  # the same tag, its number kept
_NAME = r"[A-Za-z0-9_.-]{1,64}"  # a follower's name
# a finished shard of one process, of a torchrun rank (`-rNN-`) or of a Ray part (`-pHEX-`)
SHARD_FILE = re.compile(rf"^shard-(?:{_WRITER}-)?(?P<index>\d+)\.safetensors$")
# anything named like a shard, which `inspect --check` reports when no manifest lists it
SHARD_LIKE = re.compile(r"^shard-[A-Za-z0-9-]+\.safetensors$")
RANK_MANIFEST = re.compile(r"^manifest-r(\d+)\.json$")  # a torchrun rank's, until joined
PART_FILE = re.compile(r"^(shard|manifest)-p[0-9a-f]+[-.]")  # a Ray part's shard or manifest
WAITING_FILE = re.compile(rf"^waiting(-{_TAG})?\.json$")  # a writer waits for room
FOLLOWER_NAME = re.compile(rf"^{_NAME}$")
_FOLLOWER = re.compile(rf"follow-{_NAME}\.(json|inside|lock)(\.tmp)?")
_PROGRESS = re.compile(rf"follow-({_NAME})\.json")
# every name a dump (or an interrupted run, or a follower) leaves in its folder
DUMP_FILE = re.compile(
    rf"^(manifest(-{_TAG})?\.json(\.tmp)?"
    rf"|shard-({_TAG}-)?\d+\.safetensors(\.tmp(2|-grow)?)?"
    rf"|stats\.safetensors(\.tmp)?|(running|waiting(-{_TAG})?)\.json(\.tmp)?"
    rf"|{_FOLLOWER.pattern}"
    r"|\.hookdump-old-[\w-]+)$"
)
# the names that are never part of a finished dump: half-written files and old dumps' trash
LEFTOVER = re.compile(r"(\.tmp(2|-grow)?$)|^\.hookdump-old-")


def temporary(name: str) -> str:
    """The name a file is written under before it is renamed to `name`."""
    return name + ".tmp"


@dataclass(frozen=True)
class FileNames:
    """How a writer names its files: a torchrun rank or a Ray part has its own shard prefix
    and manifest until they are joined into the dump's."""

    shard_prefix: str = "shard-"
    manifest: str = MANIFEST

    @property
    def own_manifest(self) -> bool:
        return self.manifest != MANIFEST

    @property
    def waiting(self) -> str:
        """The file that says this writer waits for room (`--max-disk`)."""
        return self.manifest.replace("manifest", "waiting", 1)

    def shard(self, index: int) -> str:
        """The `index`-th shard's file (counted from 0)."""
        return f"{self.shard_prefix}{index:05d}.safetensors"


def rank_files(rank: int) -> FileNames:
    """A torchrun rank's files, until rank 0 joins them."""
    return FileNames(f"shard-r{rank:02d}-", f"manifest-r{rank:02d}.json")


def part_files(name: str) -> FileNames:
    """A Ray part's files (`name`: hex digits made from its samples' ids)."""
    return FileNames(f"shard-p{name}-", f"manifest-p{name}.json")


RANK_MANIFESTS = "manifest-r*.json"  # every rank's manifest, as an `fnmatch` pattern


def follow_file(name: str) -> str:
    """A follower's progress: the shards it finished (its `name` checked first)."""
    return f"follow-{name}.json"


def inside_file(name: str) -> str:
    """A follower's rows given out of the shards it is inside."""
    return f"follow-{name}.inside"


def follow_lock(name: str) -> str:
    """The lock a follower holds while it runs."""
    return f"follow-{name}.lock"


def is_follower_file(name: str) -> bool:
    """Whether `name` is one of a follower's files (never a run's to remove)."""
    return bool(_FOLLOWER.fullmatch(name))


def follower_of(file: str) -> str | None:
    """The follower whose progress `file` is (`follow-NAME.json`), else None."""
    found = _PROGRESS.fullmatch(file)
    return found[1] if found else None
