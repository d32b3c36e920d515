"""Inspecting a dump on disk: per-key statistics from the files alone, and what is missing."""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from hookdump.errors import (
    HookdumpError,
    InvalidDump,
    Message,
    library_name,
    opt,
    printable,
    render_message,
)
from hookdump.format.keys import ATTENTION_MASK, RESPONSE, SAMPLE, TOKEN_IDS
from hookdump.format.manifest import Manifest, ShardEntry
from hookdump.format.names import LEFTOVER, SHARD_LIKE, URL_LOCK
from hookdump.store.checksum import recorded
from hookdump.store.location import UrlPath, local
from hookdump.store.media import Medium, open_medium
from hookdump.store.notes import note_alive, running_note
from hookdump.store.read.dump import Dump
from hookdump.store.read.summary import summarize
from hookdump.store.stats import KeySummary
from hookdump.store.write.url_lock import Holder
from hookdump.tools.experts import checked_ids, experts_of
from hookdump.tools.pictures.tokens import decoded


@dataclass(frozen=True)
class Checked:
    """What `inspect --check` verified of the shards' bytes, in words, and whether a shard
    failed."""

    said: str
    damaged: bool


class Damage(str):
    """A problem that makes a complete dump damaged (its files changed since written), not
    incomplete."""


@dataclass
class Inspection:
    """A dump's keys with statistics, and the problems that make it incomplete."""

    path: Path | UrlPath
    complete: bool
    num_samples: int
    shards: int
    keys: list[KeySummary]
    manifest: Manifest
    problems: list[str] = field(default_factory=list)
    # per key with per-feature statistics: features, mean row norm, smallest and largest std
    features: dict[str, dict[str, float]] = field(default_factory=dict)
    checked: Checked | None = None  # `check`: what was verified of the shards' bytes
    # --generate: how, why each sequence stopped, and the first sequence's text
    generation: dict[str, Any] | None = None
    consumed: dict[str, str] = field(default_factory=dict)  # shard -> the follower's name
    # an MoE block's `M:topk_ids` key -> how many times each expert was chosen (`experts`)
    experts: dict[str, list[int]] = field(default_factory=dict)

    @property
    def damaged(self) -> bool:
        checked = self.checked is not None and self.checked.damaged
        return checked or any(isinstance(p, Damage) for p in self.problems)

    @property
    def kind(self) -> str:
        """What was inspected: a `dump`, one `shard` of a dump, or another `safetensors`
        file (a model's weights, say), whose tensors are shown whole."""
        return str((self.manifest.get("lone_file") or {}).get("kind", "dump"))

    @property
    def total_bytes(self) -> int:
        return sum(k.nbytes for k in self.keys)

    def as_dict(self, name: Callable[[str, str | None], str] = library_name) -> dict[str, Any]:
        """As JSON holds it, options in messages named by `name` (the CLI's flags, say)."""
        return {
            "path": str(self.path),
            "kind": self.kind,
            "complete": self.complete,
            "num_samples": self.num_samples,
            "shards": self.shards,
            "total_bytes": self.total_bytes,
            "problems": [render_message(p, name) for p in self.problems],
            **(
                {"checked": self.checked.said, "damaged": self.checked.damaged}
                if self.checked
                else {}
            ),
            **({"experts": self.experts} if self.experts else {}),
            **({"generation": self.generation} if self.generation else {}),
            **({"consumed": sorted(self.consumed)} if self.consumed else {}),
            "model": self.manifest.get("model"),
            "tensors": [
                {**k.as_dict(), "features": self.features.get(k.info.key)} for k in self.keys
            ],
        }


def _incomplete(dump: Dump) -> str | Message:
    """What an incomplete manifest means: a run writing the dump now, or one that stopped."""
    shards = len(dump.manifest.shards)
    so_far = f"{dump.num_samples} samples ({shards} complete shard{'s' * (shards != 1)})"
    writer = _writer_now(dump.reader.medium, dump.manifest.run_id)
    if writer is not None:
        return f"being written by {writer}: {so_far} so far"
    return Message(
        f"manifest says incomplete: the run stopped after {so_far}; finish it with the same "
        f"command and {opt('resume', True)}"
    )


def _writer_now(where: Medium, run_id: str | None = None) -> str | None:
    """The run writing the dump now, as its note beside the dump names it (a URL's: its
    lock object), or None where no run is (the note gone, or its process). `run_id`: the
    manifest's, which the note names (None: no manifest yet)."""
    try:
        holder = Holder.parse(where.read(URL_LOCK, 4096) or b"")  # a medium with no lock's
        if holder is not None:
            return holder.describe() if holder.alive(time.time()) is not False else None
        running = running_note(where)
    except HookdumpError:
        return None
    if running is None or running.get("run_id") != (run_id or running.get("run_id")):
        return None
    pid, host, started = running.get("pid"), running.get("host"), running.get("started")
    if not isinstance(pid, int) or not isinstance(host, str) or not note_alive(running):
        return None  # killed: its note stays behind
    since = (
        time.strftime(" since %Y-%m-%d %H:%M:%S UTC", time.gmtime(started))
        if isinstance(started, int | float) and 0 < started < 1e11
        else ""
    )
    return f"a run on {printable(host)} (pid {pid}){since}"


def _open(path: str | Path, storage_options: Mapping[str, Any] | None) -> Dump:
    """The dump; where it has no manifest yet, one line saying so if a run is writing it."""
    try:
        return Dump(path, storage_options)
    except HookdumpError:
        try:
            writer = _writer_now(open_medium(path, storage_options))
        except HookdumpError:
            writer = None
        if writer is None:
            raise
        from hookdump.store.write.commit import COMMIT_EVERY  # (not for every inspect)

        raise HookdumpError(
            f"{path} is being written by {writer}, and no shard is listed yet (a folder's "
            f"are listed every {COMMIT_EVERY:g} s, and at the end): inspect it again then"
        ) from None


def inspect_dump(
    path: str | Path,
    storage_options: Mapping[str, Any] | None = None,
    *,
    check: bool = False,
    progress: Callable[[int, int], None] | None = None,
) -> Inspection:
    """Read every shard once (never the whole dump at a time) and summarise each key
    (`path` a folder, a .safetensors file or a URL, with fsspec's `storage_options`).
    `check`: first read every shard's bytes against the size and checksum (CRC32C or
    SHA-256) its manifest records (`progress(done, total)`: bytes read so far, of all)."""
    dump = _open(path, storage_options)
    lone = dump.manifest.get("lone_file")  # one file's: the folder it is in is not looked at
    listed = _listing(dump.reader.medium) if lone is None else None
    problems: list[str] = []
    if not dump.complete:
        problems.append(_incomplete(dump))
    stray = sorted(n for n in listed or () if LEFTOVER.search(n))
    if stray:
        problems.append(
            f"half-written files or an old dump's remains from an interrupted run: "
            f"{', '.join(stray[:5])}{', ...' if len(stray) > 5 else ''}"
        )
    consumed = dump.reader.consumed()
    readable, missing = _present(dump, consumed, listed)
    problems.extend(_missing(dump, missing))
    checked = None
    if check and dump.manifest.get("lone_file") is None:
        said, readable = _verify(dump, readable, problems, progress)
        checked = Checked(said, len(readable) + len(missing) < len(dump.manifest.shards))
    summaries = summarize(dump.reader, readable)
    features = _features(dump, problems)
    problems.extend(_unlisted(dump, consumed, listed))  # after what makes the dump itself bad
    if dump.complete and (
        missing
        or (checked is not None and checked.damaged)
        or any(isinstance(p, Damage) for p in problems)
    ):
        problems.append(
            Message(
                f"to repair it, run the command that made it again with {opt('resume', True)}: it "
                "keeps the shards that match their records and rewrites the rest"
            )
        )
    if lone is not None and lone.get("kind") == "safetensors":  # each tensor whole: no rows
        shapes = lone.get("shapes", {})
        summaries = {
            key: dataclasses.replace(summary, shape=tuple(shapes.get(key, summary.shape)))
            for key, summary in summaries.items()
        }
    return Inspection(
        dump.path if lone is None else Path(local(path)),
        dump.complete and not problems,
        dump.num_samples,
        len(readable),
        list(summaries.values()),
        dump.manifest,
        problems,
        features,
        checked,
        _generation(dump, readable),
        consumed,
        _expert_load(dump, readable),
    )


_NAMES = {"crc32c": "CRC32C", "sha256": "SHA-256"}


def _missing(dump: Dump, missing: list[ShardEntry]) -> list[str]:
    """The listed shards not there, in a problem (none: no problem)."""
    if not missing:
        return []
    first = missing[0]
    where = f"{first.file} (samples {first.start}:{first.stop})"
    if len(missing) == 1:
        return [f"{where} is missing"]
    shards = len(dump.manifest.shards)
    return [f"{len(missing):,} of {shards:,} shards are missing, the first {where}"]


def _listing(medium: Medium) -> set[str] | None:
    """The entries beside the dump, listed once (None: the listing failed)."""
    try:
        return set(medium.names())
    except HookdumpError:
        return None


def _unlisted(dump: Dump, consumed: Mapping[str, str], names: set[str] | None) -> list[str]:
    """Shard files beside a complete dump that its manifest does not list (another run's,
    or copied in): not part of the dump, and a leftover as CI counts them."""
    if not dump.complete or names is None:
        return []
    listed = {shard.file for shard in dump.manifest.shards} | set(consumed)
    found = sorted(n for n in names if SHARD_LIKE.match(n) and n not in listed)
    if not found:
        return []
    shown = ", ".join(printable(n) for n in found[:5]) + (", ..." if len(found) > 5 else "")
    files = "shard file" if len(found) == 1 else "shard files"
    return [
        f"{len(found):,} {files} its manifest does not list (not part of the dump: move "
        f"them out): {shown}"
    ]


def _present(
    dump: Dump, consumed: Mapping[str, str], names: set[str] | None
) -> tuple[list[ShardEntry], list[ShardEntry]]:
    """The listed shards there to read (`names`: the entries listed; None: take each to be
    there), and those missing (a problem to report; anything else wrong is refused when
    read); those a follower consumed are said apart."""
    readable: list[ShardEntry] = []
    missing: list[ShardEntry] = []
    for shard in dump.manifest.shards:
        exists = names is None or shard.file in names
        if shard.file in consumed and not exists:
            continue
        (readable if exists else missing).append(shard)
    return readable, missing


def _expert_load(dump: Dump, readable: list[ShardEntry]) -> dict[str, list[int]]:
    """How many times each expert of each MoE block was chosen over the readable shards
    (`--capture routing`: its `M:topk_ids`, a few int64 a row, read shard by shard)."""
    load: dict[str, list[int]] = {}
    for key, meta in dump.manifest.tensors.items():
        if meta.get("kind") != "topk_ids":
            continue
        experts = experts_of(dump, key)
        counts = torch.zeros(experts or 0, dtype=torch.int64)
        masked = ATTENTION_MASK in dump and len(meta.get("shape") or []) == 2  # [T, k] rows
        for shard in readable:
            read = dump.reader.read_shard(shard, [key, ATTENTION_MASK] if masked else [key])
            ids = checked_ids(read[key], experts, key, str(dump.path / shard.file))
            if masked:  # a padding position's choices are no token's
                ids = ids[read[ATTENTION_MASK].bool()[:, : ids.shape[1]]]
            found = torch.bincount(ids.flatten(), minlength=len(counts))
            if len(found) > len(counts):  # no logits kept: as many as the ids name
                counts = torch.nn.functional.pad(counts, (0, len(found) - len(counts)))
            counts[: len(found)] += found
        load[key] = counts.tolist()
    return load


FIRST_ROWS = 4096  # the most rows read for the first sequence's text


def _generation(dump: Dump, readable: list[ShardEntry]) -> dict[str, Any] | None:
    """A generated dump's settings, its sequences' stops, and its first sequence's prompt and
    response as text (from at most FIRST_ROWS rows of the first shard)."""
    settings = dump.manifest.get("generation")
    if not isinstance(settings, dict):
        return None
    stops: dict[str, int] = {}
    for _, stop in dump.manifest.get("generated", []):
        stops[stop] = stops.get(stop, 0) + 1
    found: dict[str, Any] = {**settings, "stops": stops}
    keys = [TOKEN_IDS, SAMPLE, RESPONSE]
    first = dump.manifest.shards[0] if dump.manifest.shards else None
    if first is None or first not in readable or any(k not in dump for k in keys):
        return found
    rows = min(first.stop, FIRST_ROWS)
    read = dump.batches(keys, batch_size=rows)
    batch = next(read, None)
    read.close()  # type: ignore[attr-defined]
    if batch is None:
        return found
    own = batch[SAMPLE] == batch[SAMPLE][0]
    ids, response = batch[TOKEN_IDS][own].tolist(), batch[RESPONSE][own].bool().tolist()
    sequence = int(batch[SAMPLE][0])
    listed = dump.manifest.sample_ids
    found["first"] = {
        "sequence": listed[sequence] if listed is not None else sequence,
        "prompt": decoded(dump, [i for i, r in zip(ids, response, strict=True) if not r]),
        "response": decoded(dump, [i for i, r in zip(ids, response, strict=True) if r]),
    }
    return found


def _verify(
    dump: Dump,
    shards: list[ShardEntry],
    problems: list[str],
    progress: Callable[[int, int], None] | None,
) -> tuple[str, list[ShardEntry]]:
    """Every shard's bytes against the size and checksum its manifest records, in order:
    the first that fails is a problem (with how many more do); what was checked, in words,
    and the shards that passed."""
    total = sum(shard.bytes or 0 for shard in shards)
    done = 0

    def read(nbytes: int) -> None:
        nonlocal done
        done += nbytes
        if progress is not None:
            progress(done, total)

    passed, failed = [], []
    for shard in shards:
        try:
            if dump.reader.verify(shard, read):
                passed.append(shard)
                continue
            failed.append(
                f"shard {dump.path / shard.file} (samples {shard.start}:{shard.stop}) does not "
                f"match the {_NAMES[recorded(shard) or 'sha256']} its manifest records: its "
                "bytes changed after it was written"
            )
        except InvalidDump as exc:
            failed.append(str(exc))
    if failed:
        more = f" (and {len(failed) - 1:,} more shards fail)" if len(failed) > 1 else ""
        problems.append(failed[0] + more)
    kinds = {_NAMES[k] for k in (recorded(shard) for shard in shards) if k is not None}
    unrecorded = sum(recorded(shard) is None for shard in shards)
    shards_word = f"{len(shards):,} shard{'s' if len(shards) != 1 else ''}"
    named = " and ".join(sorted(kinds)) or "checksums"
    if unrecorded == len(shards) and shards:
        said = (
            f"sizes only of {shards_word}: the manifest records no checksum (a dump written "
            "before hookdump recorded them)"
        )
    elif unrecorded:
        said = f"sizes of {shards_word}, {named} of the {len(shards) - unrecorded:,} recorded"
    else:
        said = f"sizes and {named} of {shards_word}"
    return said, passed


def _features(dump: Dump, problems: list[str]) -> dict[str, dict[str, float]]:
    """What the dump's per-feature statistics say of each key, in brief; a file that fails
    its checks is a problem."""
    try:
        found = dump.reader.feature_stats() or {}
    except InvalidDump as exc:  # a complete dump's: changed since (a missing shard: incomplete)
        problems.append(Damage(exc) if dump.complete else str(exc))
        return {}
    brief = {}
    for key in [k for k in dump if k in found]:  # in the manifest's order
        values = found[key]
        std = values["var"].sqrt()
        finite = std[std.isfinite()]
        brief[key] = {
            "features": int(values["mean"].numel()),
            "norm_mean": float(values["norm_mean"]),
            "std_min": float(finite.min()) if len(finite) else math.nan,
            "std_max": float(finite.max()) if len(finite) else math.nan,
        }
    return brief
