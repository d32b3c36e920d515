"""Batches' rows into shards, on the sink's thread: each batch streams into a shard of its
own or is gathered into a planned shard (`ShardPlan` decides), full shards are finished and
handed to the committer, and the first batch's size tells whether the disk has room.
Without `--out` nothing is written: `NoShards` takes the same calls and does nothing."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Protocol

import torch

from hookdump.errors import HookdumpError, opt
from hookdump.format.keys import KeyInfo
from hookdump.format.rows import Rows
from hookdump.store.folder import describe_os_error
from hookdump.store.write.commit import Committer
from hookdump.store.write.plan import ShardPlan
from hookdump.store.write.room import DiskBudget
from hookdump.store.write.shards import PlannedShard, ShardFile
from hookdump.store.write.writer import DumpWriter

Lend = Callable[[], Callable[[], None] | None]  # the copy's release, if the shard may keep it


class Shards(Protocol):
    """Where the sink's rows go (see `ShardFiller`)."""

    @property
    def estimated_bytes(self) -> int | None: ...
    def begin(self, rows: Rows, keys_expected: list[str]) -> None: ...
    def write(
        self, key: str, tensor: torch.Tensor, info: KeyInfo, start: int, lend: Lend
    ) -> None: ...
    def end(
        self, rows: Rows, keys: list[str], nbytes: int, written: Callable[[], None]
    ) -> None: ...
    def flush(self) -> None: ...
    def drop_open(self) -> None: ...
    def close(self) -> None: ...
    def failure(self, exc: OSError) -> HookdumpError: ...


class NoShards:
    """No `--out`: the rows are summarised by the sink, and written nowhere."""

    estimated_bytes = None

    def begin(self, rows: Rows, keys_expected: list[str]) -> None:
        pass

    def write(self, key: str, tensor: torch.Tensor, info: KeyInfo, start: int, lend: Lend) -> None:
        pass

    def end(self, rows: Rows, keys: list[str], nbytes: int, written: Callable[[], None]) -> None:
        pass

    def flush(self) -> None:
        pass

    def drop_open(self) -> None:
        pass

    def close(self) -> None:
        pass

    def failure(self, exc: OSError) -> HookdumpError:
        return HookdumpError(f"capturing failed: {describe_os_error(exc)}")


class ShardFiller:
    """Writes the batches' rows into `writer`'s shards, sized by `plan`. `copies`: processes
    writing as much as this one (torchrun ranks), whose room is needed too."""

    def __init__(
        self, writer: DumpWriter, plan: ShardPlan, copies: int = 1, budget: DiskBudget | None = None
    ) -> None:
        self.writer = writer
        self._budget = budget  # --max-disk: a new shard waits for room
        self.estimated_bytes: int | None = None  # what the rest of the dump will take
        self._plan = plan
        self._copies = copies
        self._committer = Committer(writer, prompt=budget is not None)
        self._shard: ShardFile | None = None  # the batch streaming into a shard of its own
        self._planned: PlannedShard | None = None
        # the rows not yet committed: the planned shard's batches, and batches of no row
        # (token rows that kept none), whose sample ids the next shard's rows carry
        self._pending: list[Rows] = []
        self._room_checked = False

    def begin(self, rows: Rows, keys_expected: list[str]) -> None:
        """Rows `rows` come next: a shard of their own, or room in the planned shard."""
        self._committer.raise_if_failed()  # no more batches once a commit has failed
        planned = self._planned
        if planned is not None and not self._plan.fits(
            self._pending[0].start, planned.rows, rows.start, rows.stop
        ):
            self._commit_planned()
        if self._budget is not None and (self._plan.streams or self._planned is None):
            committer = self._committer
            budget = self._budget
            budget.wait(
                self.writer, self._plan.shard_bytes, committer.wait, lambda: committer.queued
            )
        if self._plan.streams:
            self._shard = self.writer.open_shard(keys_expected)
        elif self._planned is None:
            size = self._plan.planned_rows(rows.start, rows.stop, rows.end_sample)
            self._planned = self.writer.plan_shard(size)
        self._pending.append(rows)

    def write(self, key: str, tensor: torch.Tensor, info: KeyInfo, start: int, lend: Lend) -> None:
        """One key's rows from row `start` on (`lend`: see `ShardFile.write`)."""
        self.writer.note_key(key, info, tensor, start)
        if self._shard is not None:
            self._shard.write(key, tensor, lend())
        elif self._planned is not None:
            self._planned.write_rows(key, start - self._pending[0].start, tensor)

    def end(self, rows: Rows, keys: list[str], nbytes: int, written: Callable[[], None]) -> None:
        """The batch of `rows` brought `keys` and `nbytes`: commit its shard (calling
        `written` once its values are in the file), or the planned shard once full."""
        known = list(self.writer.tensors)
        if self.writer.keys_fixed and keys != known:
            missing = sorted(set(known) - set(keys))
            new = sorted(set(keys) - set(known))
            raise HookdumpError(
                f"the keys changed at sample {rows.start} (missing: {missing[:3]}, new: "
                f"{new[:3]}): the model's control flow depends on its input; "
                f"{opt('exclude')} those modules"
            )
        if self._shard is not None:
            shard, self._shard = self._shard, None
            written()  # the values are in the file: the next forward need not wait for syncs
            if not rows.count:  # nothing to list; its samples go with the next shard
                shard.abort()
                return
            if not self._room_checked:  # before the first shard is listed (or a dump moved)
                self._room_checked = True
                self._plan.first_batch(rows.count, (rows.first_sample, rows.end_sample))
                try:
                    self._check_room(rows, nbytes)
                except BaseException:
                    shard.abort()
                    raise
            self._commit(shard)
            self._plan.streamed(rows.count, nbytes)
        elif self._planned is not None and self._planned.filled >= self._planned.rows:
            self._commit_planned()

    def flush(self) -> None:
        """Commit what is gathered, and wait until every shard is committed."""
        self._commit_planned()
        self._committer.wait()

    def drop_open(self) -> None:
        """Drop the shards being written; those complete are committed (or fail) first."""
        for shard in (self._shard, self._planned):
            if shard is not None:
                shard.abort()
        self._shard = self._planned = None
        with contextlib.suppress(BaseException):  # the error being handled comes first
            self._committer.wait()

    def close(self) -> None:
        self._committer.close()

    def failure(self, exc: OSError) -> HookdumpError:
        """The error for a write that failed (a full disk, say): the shards written so far
        stay usable."""
        then = (
            "the complete shards are kept: once that is fixed, run the same command "
            f"with {opt('resume', True)}"
            if self.writer.shards
            else "the folder is as it was"
        )
        return HookdumpError(
            f"writing to {self.writer.out} failed: {describe_os_error(exc)}; {then}"
        )

    def _check_room(self, rows: Rows, nbytes: int) -> None:
        """Estimate the dump's bytes from this first batch's `nbytes` (per sample, times the
        samples expected) and refuse it if the disk cannot hold them."""
        expected = self._plan.expected()
        if expected is None:
            return
        needed = nbytes * max(0, expected - rows.first_sample) // max(1, rows.samples)
        self.estimated_bytes = needed = needed * self._copies
        self.writer.check_room(needed, written=nbytes)

    def _commit_planned(self) -> None:
        if self._planned is None or not self._planned.filled:
            return
        planned, self._planned = self._planned, None
        self._commit(planned)

    def _commit(self, shard: ShardFile | PlannedShard) -> None:
        rows, self._pending = Rows.joined(self._pending), []
        self.writer.finish_shard(shard, rows.start, rows.stop)  # here, while the disk has room
        self._committer.commit(shard, rows)
