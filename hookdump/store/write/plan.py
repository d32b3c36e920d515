"""How big shards are, decided from what arrives: a plain value with no files and no thread,
so that each decision can be tested on its own.

The first batch streams into a shard of its own. Later batches do the same while a batch is
at least half of `--shard-size`; once one is smaller, batches are gathered into planned
shards of about `--shard-size` (a whole number of such batches), each no bigger than the
rows still to come, so that a last shard is never planned larger than it will be filled.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass


@dataclass
class ShardPlan:
    """The shard-size decisions of one dump.

    Attributes:
        shard_bytes: `--shard-size`.
        total: the rows expected (None: not known; for token rows, say).
        expected: the samples expected, asked when the rows left are estimated (token rows:
            rows per sample, from the first batch, times the samples still to come).
        rows_per_shard: the rows of a planned shard (0: each batch streams into a shard of
            its own).
        rows_per_sample: the first batch's rows per sample (0 until it is known).
    """

    shard_bytes: int
    total: int | None = None
    expected: Callable[[], int | None] = lambda: None
    rows_per_shard: int = 0
    rows_per_sample: float = 0.0

    @property
    def streams(self) -> bool:
        """The next batch goes into a shard of its own, tensor by tensor."""
        return not self.rows_per_shard

    def first_batch(self, rows: int, samples: tuple[int, int]) -> None:
        """The first batch's `rows` came from `samples` (first, stop)."""
        first, last = samples
        self.rows_per_sample = rows / max(1, last - first)

    def streamed(self, rows: int, nbytes: int) -> None:
        """A batch of `rows` and `nbytes` streamed into its own shard: a batch under half a
        shard has the next ones gathered into planned shards of about `shard_bytes`."""
        if 2 * nbytes < self.shard_bytes:
            self.rows_per_shard = max(1, self.shard_bytes // max(1, nbytes)) * rows

    def fits(self, planned_start: int, planned_rows: int, start: int, stop: int) -> bool:
        """Rows `start:stop` fit in the shard planned from row `planned_start` (batches of
        varying rows, token rows, may not)."""
        return stop - planned_start <= planned_rows

    def planned_rows(self, start: int, stop: int, last_sample: int) -> int:
        """The rows of a shard planned from rows `start:stop` on (`last_sample`: the end of
        the samples that batch holds): about `shard_bytes`, at least the batch, and no more
        than the rows left, where they are known."""
        rows = max(self.rows_per_shard, stop - start)
        left = self.rows_left(start, stop, last_sample)
        return rows if left is None else max(stop - start, min(rows, left))

    def rows_left(self, start: int, stop: int, last_sample: int) -> int | None:
        """The rows still to come from `start` on: known (`total`), or, for token rows,
        expected from the samples still to come at the first batch's rows per sample (exact
        for packed windows of a known count)."""
        if self.total is not None:
            return self.total - start
        expected = self.expected() if self.rows_per_sample else None
        if expected is None:
            return None
        return stop - start + math.ceil(self.rows_per_sample * max(0, expected - last_sample))
