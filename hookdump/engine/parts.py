"""A dump written in parts by other processes (the tasks of a Ray job, `engine.on_ray`).

One process locks and checks `--out` and moves an old dump aside; each task writes its part
as a run of its own (`DumpOptions.part`: `shard-pHEX-NNNNN.safetensors` and
`manifest-pHEX.json`, with the dump's run id) and hands back what it wrote (`share_of`);
the first process joins the parts in the data's order into the one `manifest.json` and
removes the parts' manifests (`drop_parts`).

A part is named by a hash of its samples' ids, so a task run again (its process was killed)
writes the same names, after removing what the killed attempt left (`clear_part`).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from hookdump.engine.distributed import RankShare
from hookdump.engine.options import RunResult
from hookdump.format.manifest import ShardEntry
from hookdump.format.names import PART_FILE, FileNames
from hookdump.store.write.place import DumpPlace

# the manifest's fields that each part has its own of; the joined dump's are made anew
_GROWING = {
    "format",
    "run_id",
    "complete",
    "num_samples",
    "num_sequences",
    "sample_ids",
    "skipped_inputs",
    "skipped",
    "wall_time_s",
    "tensors",
    "shards",
}


@dataclass(frozen=True)
class PartResult:
    """What a task hands back: its part's share of the dump and its manifest's other fields
    (the model, the selection, the versions...), or the one line of its error."""

    name: str
    share: RankShare | None = None
    fields: dict[str, Any] = field(default_factory=dict)
    error: str | None = None


def part_name(ids: Sequence[Any]) -> str:
    """The name of the part holding the samples `ids` (the same for the same ids)."""
    text = json.dumps(list(ids), separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def clear_part(names: FileNames, place: DumpPlace) -> None:
    """Remove what an earlier attempt at this part left (its process was killed)."""
    place.remove_strays(lambda name: name.startswith((names.shard_prefix, names.manifest)))


def share_of(name: str, result: RunResult) -> PartResult:
    """What part `name`'s run wrote, to be joined with the other parts."""
    manifest = result.manifest or {}
    ids = manifest.get("sample_ids")
    fed = result.num_sequences if result.num_sequences is not None else result.num_samples
    share = RankShare(
        rows=result.num_samples,
        shards=[ShardEntry.of_json(entry) for entry in manifest.get("shards", [])],
        tensors=dict(manifest.get("tensors", {})),
        summaries={summary.info.key: summary for summary in result.keys},
        ids=range(fed) if ids is None else list(ids),
        skipped=list(result.skipped),
        skipped_inputs=list(result.skipped_inputs),
    )
    fields = {key: value for key, value in manifest.items() if key not in _GROWING}
    return PartResult(name, share, fields)


def drop_parts(place: DumpPlace, listed: set[str]) -> None:
    """Once `manifest.json` lists every part's shards: the parts' manifests, and any part's
    file it does not list, removed."""
    place.remove_strays(lambda name: bool(PART_FILE.match(name)) and name not in listed)
