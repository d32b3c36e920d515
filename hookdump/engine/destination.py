"""Where a run's batches go: one object for the three ways a run writes its dump.

- plain: a new dump in `--out` (or, with `--overwrite`, one that replaces the dump there);
- resume: the rest of an interrupted dump, after the samples it already holds;
- a torchrun rank: its own shards and manifest, merged into one dump by rank 0 at the end;
- a part: likewise, for a process that joins the parts (a Ray job's: `engine.on_ray`).

Each writes to a `DumpPlace` (a folder, or a URL whose shards are finished in a local
spool, `out`), which answers for what differs between the two.

The batch loop only sees the writer (or None, without `--out`); everything that differs
between the modes happens here, before the loop (`open`, `start`) or after it (`finish`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from hookdump.engine.distributed import (
    Ranks,
    RankShare,
    drop_rank_manifests,
    merge_ranks,
    rank_names,
)
from hookdump.engine.options import RunOptions
from hookdump.engine.parts import clear_part
from hookdump.engine.resume import Sources, check_sources, keep_verified, previous_dump
from hookdump.errors import opt
from hookdump.format.manifest import Manifest, samples_fed
from hookdump.store.checksum import DEFAULT, Algorithm
from hookdump.store.features import stats_file
from hookdump.store.read.reader import ShardReader
from hookdump.store.read.summary import summarize
from hookdump.store.stats import KeySummary
from hookdump.store.write.place import DumpPlace
from hookdump.store.write.writer import DumpWriter, Part


@dataclass
class Destination:
    """The dump a run writes into (None: no `--out`), what it holds already, and its mode."""

    ranks: Ranks | None = None
    previous: Manifest | None = None  # the interrupted dump being resumed
    overwrite: bool = False
    place: DumpPlace | None = None  # where the dump lives (shards are finished in its `work`)
    part: Part | None = None  # a part of a dump that another process finishes
    writer: DumpWriter | None = field(default=None, init=False)

    @classmethod
    def open(
        cls, options: RunOptions, ranks: Ranks | None, place: DumpPlace | None = None
    ) -> Destination:
        """Check `--out` for the run the options describe (before the slow part)."""
        dump = options.dump
        if place is None:
            if dump.resume:
                previous_dump(options, ranks, place)  # refused: nothing to resume
            return cls(ranks)
        if dump.part is not None:  # the place holds the other parts: no check
            clear_part(dump.part.names, place)
            return cls(ranks, None, True, place, dump.part)
        previous = previous_dump(options, ranks, place) if dump.resume else None
        if previous is not None:
            previous = keep_verified(place, previous, rank_names(ranks))
        # resuming with nothing to carry on (or only a first shard cut short) starts anew
        overwrite = dump.overwrite or (dump.resume and previous is None)
        place.check(overwrite, keep_old=previous is not None)
        return cls(ranks, previous, overwrite, place)

    @property
    def where(self) -> str:
        """The dump's folder or URL, for messages."""
        return self.place.label if self.place is not None else "-"

    @property
    def done_ids(self) -> Sequence[Any]:
        """The ids of the samples already in the dump (resuming), in order."""
        if self.previous is None:
            return []
        listed = self.previous.get("sample_ids")
        fed = samples_fed(self.previous)
        return range(fed) if listed is None else listed[:fed]  # row numbers: a range

    @property
    def done_generated(self) -> list[list[Any]]:
        """--generate: each sample's [tokens generated, why it stopped] already dumped."""
        if self.previous is None:
            return []
        return list(self.previous.get("generated", []))[: samples_fed(self.previous)]

    @property
    def done_rows(self) -> int:
        """The rows already in the dump (samples, or tokens when rows are tokens)."""
        return self.previous["num_samples"] if self.previous is not None else 0

    @property
    def skipped_inputs_before(self) -> list[dict[str, str]]:
        return list(self.previous.get("skipped_inputs", [])) if self.previous else []

    def check_sources(self, made_from: Sources) -> None:
        """Resuming: the model, weights and input files must be those the dump was made from."""
        if self.previous is not None and self.place is not None:
            check_sources(self.where, self.previous.get("sources"), made_from)

    def start(
        self, *, shard_bytes: int, fields: Mapping[str, object], checksum: Algorithm = DEFAULT
    ) -> None:
        """Make the writer (`fields`: what the manifest records of the run; `checksum`:
        of each shard)."""
        if self.place is None:
            return
        names = self.part.names if self.part is not None else rank_names(self.ranks)
        if self.previous is not None:
            self.writer = DumpWriter.resume(
                self.place,
                self.previous,
                shard_bytes=shard_bytes,
                fields=dict(fields),
                names=names,
                checksum=checksum,
            )
        else:
            self.writer = DumpWriter(
                self.place,
                shard_bytes=shard_bytes,
                fields=dict(fields),
                names=names,
                checksum=checksum,
            )
        if self.part is not None:  # the dump's process has moved an old dump aside
            self.writer.clear_old_dump(here=False)
            self.writer.share_run_id(self.part.run_id)
        if self.ranks is not None:  # one dump, one run id: the resumed dump's, or rank 0's
            ids = self.ranks.gather(self.writer.run_id)
            self.writer.share_run_id(next((i for i in ids if i is not None), None))
        if self.ranks is not None and self.previous is None:
            self.ranks.barrier()  # every rank has checked --out before rank 0 touches it
            self.writer.clear_old_dump(here=self.ranks.main)  # before any rank writes
            self.ranks.barrier()

    def mark_running(self) -> None:
        """Beside the dump, say which run writes it and whether it replaces the dump there:
        what a follower (`hookdump.follow`) and `inspect` read."""
        replaces = self.overwrite and self.previous is None
        alone = self.part is None and (self.ranks is None or self.ranks.main)
        if self.place is not None and self.writer is not None and alone:
            self.place.mark_running(self.writer.run_id, replaces)

    def summaries_before(self) -> dict[str, KeySummary]:
        """Resuming: the statistics of the samples already in the dump."""
        if self.previous is None or self.place is None or not self.previous["shards"]:
            return {}  # (a torchrun rank that had written nothing)
        manifest = self.previous
        reader = ShardReader(self.place.medium, manifest)
        gone = reader.consumed()  # deleted by a follower: the statistics are of the rest
        return summarize(reader, [s for s in manifest.shards if s.file not in gone])

    def failed(self, error: str) -> None:
        """The run failed with `error`: the manifest of the shards kept says so, for a
        follower to end with (nothing is written where nothing was listed)."""
        writer = self.writer
        if writer is None or not writer.shards:
            return
        with contextlib.suppress(Exception):  # the run's own error comes first
            writer.write_manifest(complete=False, extra={"failed": error})
        with contextlib.suppress(Exception):
            writer.drop_room()  # no manifest comes after this one

    def interrupted(self) -> str:
        """What Ctrl-C leaves behind, and how to go on."""
        if self.writer is not None and self.writer.shards:
            rows = self.writer.shards[-1].stop
            return (
                f"{rows} samples are safe in {self.where}; run the same command with "
                f"{opt('resume', True)} to finish the dump"
            )
        return "nothing was written"

    def gather(self, part: RankShare) -> RankShare:
        """The whole dump: this run's part, or under torchrun every rank's part joined on
        rank 0 (the other ranks get their own)."""
        if self.ranks is None:
            return part
        return merge_ranks(self.ranks, part) or part

    def finish(self, whole: RankShare, extra: Mapping[str, object]) -> dict[str, object] | None:
        """Write the complete manifest of `whole` (on torchrun's rank 0 only), with `extra`
        fields; the manifest written, if any."""
        manifest = None
        if self.writer is not None and (self.ranks is None or self.ranks.main):
            if self.ranks is not None:
                self.writer.take_over(whole.shards, whole.tensors)
            features = {
                key: summary.features.fields()
                for key, summary in whole.summaries.items()
                if summary.features is not None and key in whole.tensors
            }
            manifest = self.writer.finish(
                {
                    "sample_ids": whole.ids,
                    **({"generated": whole.generated} if whole.generated else {}),
                    "skipped_inputs": whole.skipped_inputs,
                    "skipped": whole.skipped,
                    **extra,
                },
                stats_file(features, self.writer.run_id) if features else None,
            )
            if self.ranks is not None:
                drop_rank_manifests(self.writer.place, self.ranks.world)
        if self.ranks is not None:
            self.ranks.close()
        return manifest
