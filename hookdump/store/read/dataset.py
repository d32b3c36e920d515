"""`Dump.dataset`: a pass of `Dump.batches` as a `torch.utils.data.IterableDataset`, split
across DataLoader workers and torch.distributed ranks.

Each of the `workers x ranks` readers takes every n-th block of the pass's block order (see
`hookdump.store.read.batches`), so together they read every row once, and each mixes its own
rows in a buffer of its own (memory: a buffer per worker). The dataset yields whole batches:
give the DataLoader `batch_size=None`. Readers may end a few batches apart, since their
blocks hold different numbers of rows; with `drop_last` every batch is whole.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Protocol

import torch

from hookdump.errors import HookdumpError, opt
from hookdump.format.values import is_integer
from hookdump.store.read.batches import PassOptions, check, iter_batches
from hookdump.store.read.reader import ShardReader


class Pass(Protocol):
    """What a dataset reads: its arguments checked, and a pass's batches (picklable, for
    DataLoader workers started by spawn)."""

    def check(self, options: PassOptions) -> None: ...

    def batches(self, options: PassOptions) -> Iterator[dict[str, torch.Tensor]]: ...


@dataclass(frozen=True)
class KeysPass:
    """`keys` of one dump (`Dump.batches`)."""

    dump: ShardReader
    keys: list[str]

    def check(self, options: PassOptions) -> None:
        check(self.dump, self.keys, options)

    def batches(self, options: PassOptions) -> Iterator[dict[str, torch.Tensor]]:
        return iter_batches(self.dump, self.keys, options)


class DumpDataset(torch.utils.data.IterableDataset[dict[str, torch.Tensor]]):
    """Batches of a `Pass` (`keys` of a dump, or aligned dumps), this process's and this
    worker's share of a pass.

    `options.start` counts the batches this rank's DataLoader gave out before (it takes
    them from its workers in turn), so a rank resumes at its own step, in the same order
    while every worker has batches left. `rank` and
    `world_size` default to torch.distributed's (0 and 1 when it is not initialised).
    `set_epoch(n)` draws pass n's order (seed + n) in every rank alike.
    """

    def __init__(
        self,
        source: Pass,
        options: PassOptions,
        rank: int | None = None,
        world_size: int | None = None,
    ) -> None:
        source.check(options)
        if rank is not None or world_size is not None:
            _check_ranks(
                rank if rank is not None else 0, world_size if world_size is not None else 1
            )
        self.source, self.options = source, options
        self.rank, self.world_size = rank, world_size
        # in shared memory: DataLoader workers that persist across epochs see it change
        self._epoch = torch.zeros(1, dtype=torch.int64).share_memory_()

    @property
    def epoch(self) -> int:
        return int(self._epoch[0])

    def set_epoch(self, epoch: int) -> None:
        """Draw pass `epoch`'s order, in this process and in its DataLoader's workers, those
        started already (`persistent_workers=True`) included."""
        if not is_integer(epoch) or not 0 <= epoch < 1 << 62:
            raise HookdumpError(f"set_epoch takes an integer of at least 0, not {epoch!r}")
        self._epoch[0] = epoch

    def __iter__(self) -> Iterator[dict[str, torch.Tensor]]:
        info = torch.utils.data.get_worker_info()
        worker, workers = (info.id, info.num_workers) if info is not None else (0, 1)
        rank, world = self._ranks()
        start = self.options.start
        # the DataLoader takes a batch from each worker in turn, from worker 0: a pass
        # resumed at batch `start` gives worker 0 the share that was next in turn
        share = (worker + start) % workers
        options = dataclasses.replace(
            self.options,
            seed=self.options.seed + self.epoch,
            start=start // workers + int(share < start % workers),
            split=(rank * workers + share, world * workers),
        )
        return self.source.batches(options)

    def _ranks(self) -> tuple[int, int]:
        distributed = torch.distributed.is_available() and torch.distributed.is_initialized()
        rank = (
            self.rank
            if self.rank is not None
            else (torch.distributed.get_rank() if distributed else 0)
        )
        world = (
            self.world_size
            if self.world_size is not None
            else (torch.distributed.get_world_size() if distributed else 1)
        )
        _check_ranks(rank, world)
        return rank, world


def _check_ranks(rank: object, world: object) -> None:
    """Every rank reads its own blocks: `0 <= rank < world_size`."""
    if not is_integer(world) or world < 1:
        raise HookdumpError(f"{opt('world_size')} {world!r} must be an integer of at least 1")
    if not is_integer(rank) or not 0 <= rank < world:
        raise HookdumpError(
            f"{opt('rank')} {rank!r} must be an integer from 0 to {world - 1} "
            f"({opt('world_size')} {world})"
        )
