"""`Manifest.cut`: what `--resume` keeps of a killed run's manifest when its later shards
are redone, checked field by field on a hand-made manifest of token rows (two sequences
per shard, ids, generations and skipped inputs recorded as the writer records them)."""

from __future__ import annotations

from typing import Any

from hookdump.format.manifest import Manifest


def _shard(n: int, start: int, stop: int, sequences: int, skipped: int) -> dict[str, Any]:
    entry = {"file": f"shard-{n:05d}.safetensors", "start": start, "stop": stop}
    return {**entry, "sequences": sequences, "inputs_skipped": skipped, "bytes": 10}


FIELDS: dict[str, Any] = {
    "complete": False,
    "rows": "tokens",
    "num_samples": 17,  # token rows
    "num_sequences": 6,
    "tensors": {"h": {"shape": [4]}},
    "shards": [_shard(0, 0, 5, 2, 1), _shard(1, 5, 11, 4, 1), _shard(2, 11, 17, 6, 3)],
    "sample_ids": ["a", "b", "c", "d", "e", "f"],
    "generated": [[1, "eos"], [2, "eos"], [3, "length"], [4, "eos"], [5, "eos"], [6, "eos"]],
    "skipped_inputs": ["x.jpg", "y.jpg", "z.jpg"],
    "run_id": "r1",
}


def test_a_cut_keeps_the_rows_ids_and_inputs_up_to_its_last_shard() -> None:
    manifest = Manifest.of_checked(FIELDS)
    cut = manifest.cut(2)
    assert [s.file for s in cut.shards] == ["shard-00000.safetensors", "shard-00001.safetensors"]
    assert (cut.num_samples, cut["num_sequences"], cut.samples_fed) == (11, 4, 4)
    assert cut.sample_ids == ["a", "b", "c", "d"]
    assert cut["generated"] == FIELDS["generated"][:4]
    assert cut["skipped_inputs"] == ["x.jpg"]  # the second shard's end had seen one
    assert (cut.run_id, cut.complete, cut["tensors"]) == ("r1", False, FIELDS["tensors"])
    assert manifest.num_samples == 17 and len(manifest.shards) == 3  # the record is unchanged


def test_a_complete_manifest_reopened_and_an_empty_one() -> None:
    reopened = Manifest.of_checked({**FIELDS, "complete": True}).reopened()
    assert reopened.complete is False and reopened.shards == Manifest.of_checked(FIELDS).shards
    empty = Manifest.empty("r9")
    assert (empty.shards, empty.num_samples, empty.samples_fed, empty.run_id) == ((), 0, 0, "r9")
