"""`--max-disk`: a run keeps no more than a budget of shards under `--out`, waiting for a
follower (`hookdump.follow(..., consume=True)`) to consume them.

Shards are committed as soon as they are finished (never held for a group: a follower
reads them). Before a shard is begun, where the shards on disk might not leave room for it,
every finished shard is committed and listed, and the run waits while the listed shards
still present, with the next one, would pass the budget: the bytes under `--out` never pass
it (the shard being written counted in). It looks again every
`poll_s` (the place's); it says so once, and marks the wait in a file of its own
(`FileNames.waiting`) for a follower.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from hookdump.errors import opt
from hookdump.format.values import format_bytes
from hookdump.store.write.shards import header_room
from hookdump.store.write.writer import DumpWriter

HEADER_ROOM = 64 << 10  # a shard file's bytes beyond its rows' data, at most (its header)


class DiskBudget:
    """The bytes a run's shards may take under `--out` at once (`limit`), and the wait for
    room; `notice` is told, once, that the run waits."""

    def __init__(self, limit: int, notice: Callable[[str], None] | None = None) -> None:
        self.limit = limit
        self.notice = notice
        self._said = False

    def wait(
        self,
        writer: DumpWriter,
        coming: int,
        committed: Callable[[], None],
        queued: Callable[[], int] = lambda: 0,
    ) -> None:
        """Wait until the listed shards still present and `coming` bytes fit the budget
        (`committed`: lists every finished shard first; `queued`: how many finished shards
        are not listed yet). Where the listed shards, the finished ones not listed and the
        next (each taken as the largest shard so far, or `coming`, and a header) fit, nothing
        waits."""
        largest = max([coming, *(shard.bytes or 0 for shard in writer.shards)])
        if writer.present_bytes() + (queued() + 1) * (largest + HEADER_ROOM) <= self.limit:
            return
        committed()
        coming += header_room(writer.tensors)  # the next shard's file: its header too
        try:
            while (held := writer.present_bytes()) + coming > self.limit and held:
                # a follower gives out the rows it holds back
                writer.place.mark_waiting(writer.names.waiting, True)
                if not self._said and self.notice is not None:
                    self._said = True
                    self.notice(
                        f"waiting for room: {format_bytes(held)} of shards not consumed yet "
                        f"fill {opt('max_disk')} {format_bytes(self.limit)}; a follower with "
                        "consume=True frees it"
                    )
                time.sleep(writer.place.poll_s)
        finally:
            writer.place.mark_waiting(writer.names.waiting, False)
