"""Running under `torchrun`: each rank dumps a contiguous slice of the samples into its own
shards, listed in its own `manifest-rNN.json` as they complete (what `--resume` carries on
from); at the end rank 0 gathers what the others wrote, writes the one `manifest.json` and
removes the ranks' manifests."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from hookdump.errors import HookdumpError, opt
from hookdump.format.manifest import ShardEntry
from hookdump.format.names import FileNames, rank_files
from hookdump.format.rows import SampleIds
from hookdump.store.stats import KeySummary
from hookdump.store.write.place import DumpPlace


@dataclass(frozen=True)
class Ranks:
    """This process's place among `world` processes."""

    rank: int
    world: int
    local_rank: int
    owns_group: bool = False  # hookdump started the process group, so it shuts it down

    @property
    def main(self) -> bool:
        return self.rank == 0

    @property
    def share(self) -> tuple[int, int]:
        """(rank, world): which slice of the samples this rank dumps (`inputs.share_of`)."""
        return self.rank, self.world

    def gather(self, value: Any) -> list[Any]:
        """Every rank's `value`, in rank order (on every rank)."""
        values: list[Any] = [None] * self.world
        with self._together():
            torch.distributed.all_gather_object(values, value)
        return values

    def barrier(self) -> None:
        with self._together():
            torch.distributed.barrier()

    @contextlib.contextmanager
    def _together(self) -> Iterator[None]:
        """A collective that fails because another process of the job is gone (killed,
        its node lost) is one line: what this rank wrote is kept for `--resume`."""
        try:
            yield
        except Exception as exc:  # gloo's and NCCL's errors have no common base
            reason = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:160]
            raise HookdumpError(
                f"torchrun rank {self.rank}: another process of the job stopped ({reason}); "
                f"the finished shards are kept: start the job again with {opt('resume', True)}"
            ) from None

    def close(self) -> None:
        """Wait for every rank (rank 0 has written the manifest), then shut the process group
        down: left to the interpreter's exit, gloo's threads sometimes abort the process."""
        self.barrier()
        if self.owns_group:
            torch.distributed.destroy_process_group()


def from_environment(device: str) -> Ranks | None:
    """The ranks `torchrun` set up (WORLD_SIZE > 1), with the process group started."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world <= 1:
        return None
    owns_group = not torch.distributed.is_initialized()
    ranks = Ranks(
        int(os.environ["RANK"]), world, int(os.environ.get("LOCAL_RANK", "0")), owns_group
    )
    if owns_group:
        cuda = device.startswith("cuda") or (device == "auto" and torch.cuda.is_available())
        try:
            torch.distributed.init_process_group("nccl" if cuda else "gloo")
        except Exception as exc:
            raise HookdumpError(f"starting the torchrun process group failed: {exc}") from None
    return ranks


def rank_device(device: str, ranks: Ranks | None) -> str:
    """Under torchrun, each rank takes the GPU of its local rank."""
    if ranks is not None and device in ("auto", "cuda") and torch.cuda.is_available():
        return f"cuda:{ranks.local_rank}"
    return device


def rank_names(ranks: Ranks | None) -> FileNames:
    """A torchrun rank's file names: its shards' prefix and its own manifest."""
    return FileNames() if ranks is None else rank_files(ranks.rank)


@dataclass
class RankShare:
    """What one rank dumped, as it is sent to rank 0 at the end."""

    rows: int
    shards: list[ShardEntry]
    tensors: dict[str, dict[str, Any]]
    summaries: dict[str, KeySummary]
    ids: Sequence[Any]
    skipped: list[dict[str, str]]
    skipped_inputs: list[dict[str, str]]
    generated: list[list[Any]] = field(default_factory=list)  # --generate: per sample


def merge_ranks(ranks: Ranks, mine: RankShare) -> RankShare | None:
    """Every rank's part gathered onto rank 0 and joined in sample order (`join_shares`).
    None on other ranks."""
    everyone: list[RankShare] = ranks.gather(mine)
    return join_shares(everyone) if ranks.main else None


def join_shares(everyone: list[RankShare]) -> RankShare:
    """Parts of one dump joined in this order: the shards' rows renumbered, statistics
    merged, ids and skipped lists concatenated (the first part's skipped keys first)."""
    mine = everyone[0]
    with_rows = [p for p in everyone if p.rows]
    for part in with_rows[1:]:
        _check_same_keys(with_rows[0].tensors, part.tensors)
    shards, offset, samples, inputs_skipped = [], 0, 0, 0
    summaries: dict[str, KeySummary] = {}
    for part in everyone:
        shards += [shard.after(offset, samples, inputs_skipped) for shard in part.shards]
        offset += part.rows
        samples += len(part.ids)
        inputs_skipped += len(part.skipped_inputs)
        for key, summary in part.summaries.items():
            if key in summaries:
                summaries[key].merge(summary)
            else:
                summaries[key] = summary
    seen = {s["key"] for s in mine.skipped}
    return RankShare(
        rows=offset,
        shards=shards,
        tensors=with_rows[0].tensors if with_rows else {},
        summaries=summaries,
        ids=_joined_ids([p.ids for p in everyone]),
        skipped=mine.skipped + [s for p in everyone[1:] for s in p.skipped if s["key"] not in seen],
        skipped_inputs=[s for p in everyone for s in p.skipped_inputs],
        generated=[g for p in everyone for g in p.generated],
    )


def _check_same_keys(first: dict[str, dict[str, Any]], other: dict[str, dict[str, Any]]) -> None:
    """Parts of one dump hold the same keys, each of one per-sample shape and dtype."""
    if list(other) != list(first):
        raise HookdumpError(
            "the processes captured different keys: the model's control flow depends on its "
            f"input; {opt('exclude')} the modules that differ"
        )
    for key, meta in other.items():
        for what in ("shape", "dtype"):
            if meta[what] != first[key][what]:
                raise HookdumpError(
                    f"{key!r} has the {what} {first[key][what]} in one process's samples and "
                    f"{meta[what]} in another's; give every sample the same shape, or "
                    f"{opt('exclude')} that module"
                )


def drop_rank_manifests(place: DumpPlace, world: int) -> None:
    """Once `manifest.json` lists every rank's shards, the `world` ranks' own manifests are
    not needed."""
    place.remove(rank_files(rank).manifest for rank in range(world))


def _joined_ids(parts: list[Sequence[Any]]) -> SampleIds:
    """Every rank's sample ids, in rank order (row numbers stay a count)."""
    ids = SampleIds()
    for part in parts:
        ids.extend(part)
    return ids
