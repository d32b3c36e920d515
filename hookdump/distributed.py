"""Running under `torchrun`: each rank dumps a contiguous slice of the samples into its own
shards; rank 0 gathers what the others wrote and writes the one manifest."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import torch

from hookdump.errors import HookdumpError


@dataclass(frozen=True)
class Ranks:
    """This process's place among `world` processes."""

    rank: int
    world: int
    local_rank: int

    @property
    def main(self) -> bool:
        return self.rank == 0

    def span(self, total: int) -> tuple[int, int]:
        """The contiguous rows `first:stop` of `total` that this rank dumps."""
        first = self.rank * total // self.world
        return first, (self.rank + 1) * total // self.world

    def gather(self, value: Any) -> list[Any]:
        """Every rank's `value`, in rank order (on every rank)."""
        values: list[Any] = [None] * self.world
        torch.distributed.all_gather_object(values, value)
        return values

    def barrier(self) -> None:
        torch.distributed.barrier()


def from_environment(device: str) -> Ranks | None:
    """The ranks `torchrun` set up (WORLD_SIZE > 1), with the process group started."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world <= 1:
        return None
    ranks = Ranks(int(os.environ["RANK"]), world, int(os.environ.get("LOCAL_RANK", "0")))
    if not torch.distributed.is_initialized():
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
