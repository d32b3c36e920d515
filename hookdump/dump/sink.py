"""From hooks to disk: a thread casts, summarises and writes each captured tensor as it
arrives, while the forward pass goes on.

The first batch streams into its own shard, tensor by tensor. Later batches do the same
when a batch is at least half a shard; smaller ones are gathered into shards of about
`--shard-size`, each batch's rows written straight to their place in the file. Nothing is
held beyond the tensors in flight, and at most `pending` batches are (one by default: a
batch's tensors stream to disk while its own forward runs, and the next forward waits until
they are written): memory stays bounded by a batch, whatever `--num-samples` is. A second
batch in flight raised peak memory and gained no speed (benchmarks/README.md).
"""

from __future__ import annotations

import contextlib
import functools
import os
import queue
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from hookdump.dump.commit import Committer
from hookdump.dump.folder import describe_os_error
from hookdump.dump.memory import (
    IN_FLIGHT_BYTES,
    POOL_MIN_BYTES,
    Budget,
    BufferPool,
    Release,
    Slots,
)
from hookdump.dump.plan import ShardPlan
from hookdump.dump.shards import PlannedShard, ShardFile
from hookdump.dump.stats import KeySummary
from hookdump.dump.writer import DumpWriter
from hookdump.errors import HookdumpError, opt
from hookdump.format import KeyInfo, dtype_name


# what the main thread hands the worker, in order
@dataclass(frozen=True)
class _Begin:
    start: int
    stop: int
    keys_expected: int
    samples: tuple[int, int] | None


@dataclass(frozen=True)
class _Tensor:
    key: str
    tensor: torch.Tensor
    info: KeyInfo
    nbytes: int  # taken from the budget, given back once written
    ready: Any  # a CUDA event to wait on before reading `tensor`, or None


@dataclass(frozen=True)
class _End:
    pass


@dataclass(frozen=True)
class _Stop:
    close: bool  # write what is gathered (else drop it: an abort)


_END, _CLOSE, _ABORT = _End(), _Stop(close=True), _Stop(close=False)
_Message = _Begin | _Tensor | _End | _Stop


class BatchSink:
    """Takes captured tensors from the main thread; its worker does everything else."""

    def __init__(
        self,
        writer: DumpWriter | None,
        save_dtype: torch.dtype | None,
        total: int | None = None,
        pending: int = 1,
        *,
        expected: Callable[[], int | None] | None = None,
        copies: int = 1,
        summaries: dict[str, KeySummary] | None = None,
    ) -> None:
        """`total`: the rows expected (None: not known; shards are then sized by what
        arrives); `expected`: the samples expected, asked after the first batch for the
        disk-space estimate (default: `total`); `copies`: processes writing as much as this
        one (torchrun ranks), whose room is needed too; `summaries`: statistics to go on
        from (resuming)."""
        self.writer = writer
        self.save_dtype = save_dtype
        self.summaries: dict[str, KeySummary] = dict(summaries or {})
        self.unbatched: dict[str, dict[str, str]] = {}
        self.bytes_done = 0  # captured bytes handled so far, for the progress bar
        self.estimated_bytes: int | None = None  # what the rest of the dump will take
        self.pool = BufferPool(int(os.environ.get("HOOKDUMP_POOL_MIN_BYTES", POOL_MIN_BYTES)))
        self._queue: queue.SimpleQueue[_Message] = queue.SimpleQueue()
        self._slots = Slots(pending)
        self._error: BaseException | None = None
        # the worker's own state
        self._batch = (0, 0)
        self._sequences: int | None = None
        self._keys: list[str] = []
        # `total`: rows expected (an upper bound when images may be skipped)
        shard_bytes = writer.shard_bytes if writer else 0
        self._plan = ShardPlan(shard_bytes, total, expected or (lambda: total))
        self._copies = copies
        self._samples = (0, 0)  # the samples whose rows the current batch holds
        self._shard: ShardFile | None = None
        self._planned: PlannedShard | None = None
        self._planned_start = 0
        self._released = False  # the current batch's slot was given back
        self._batch_bytes = 0
        self._room_checked = False
        self._committer = Committer(writer) if writer is not None else None
        self._budget = Budget(IN_FLIGHT_BYTES)
        self._thread = threading.Thread(target=self._work, name="hookdump-sink", daemon=True)
        self._thread.start()

    # --- the main thread's side ---------------------------------------------------------

    def begin(
        self,
        start: int,
        stop: int,
        keys_expected: int = 0,
        samples: tuple[int, int] | None = None,
    ) -> None:
        """Rows `start:stop` come next (`samples`: the samples they come from, when rows are
        tokens); waits while `pending` batches are still in flight."""
        self._slots.acquire()
        self._raise_if_failed()
        self._queue.put(_Begin(start, stop, keys_expected, samples))

    def keep(self, key: str, tensor: torch.Tensor, info: KeyInfo, fresh: bool) -> None:
        """One captured tensor of the current batch, as a hook hands it over (a `Receiver`):
        copied now unless `fresh`, so no later in-place op can change it."""
        nbytes = tensor.numel() * tensor.element_size()  # given back once written
        self._budget.take(nbytes)
        if tensor.is_cuda:
            # straight to pinned host memory, queued on the stream before any later in-place
            # op; the worker waits on the event, never a synchronize() per module. Freed
            # once written, the pinned block goes back to torch's cache for the next copy.
            host = torch.empty(tensor.shape, dtype=tensor.dtype, pin_memory=True)
            host.copy_(tensor, non_blocking=True)
            ready = torch.cuda.Event()
            ready.record()
            self._queue.put(_Tensor(key, host, info, nbytes, ready))
            return
        copy = tensor if fresh else self.pool.copy(tensor)
        self._queue.put(_Tensor(key, copy, info, nbytes, None))

    def end(self) -> None:
        """The current batch is complete."""
        self._queue.put(_END)

    def close(self) -> None:
        """Write what is gathered and wait for the worker; re-raise its error, if any."""
        self._queue.put(_CLOSE)
        self._thread.join()
        self._raise_if_failed()

    def abort(self) -> None:
        """Stop after an error or Ctrl-C in the main thread: drop the unfinished shard."""
        self._queue.put(_ABORT)
        self._thread.join()

    def _raise_if_failed(self) -> None:
        if self._error is not None:
            raise self._error

    # --- the worker ---------------------------------------------------------------------

    def _work(self) -> None:
        while True:
            match self._queue.get():
                case _Begin(start, stop, keys_expected, samples):
                    self._guard(self._on_begin, start, stop, keys_expected, samples)
                case _Tensor(key, tensor, info, nbytes, ready):
                    self._guard(self._on_tensor, key, tensor, info, nbytes, ready)
                case _End():
                    self._guard(self._on_end)
                    self._release()
                case _Stop(close):
                    if close:
                        self._guard(self._commit_planned)
                        self._guard(self._wait_for_commits)
                    self._drop_open_shards()
                    if self._committer is not None:
                        self._committer.close()
                    return

    def _release(self) -> None:
        """The current batch's values are written: the next batch may come (once)."""
        if not self._released:
            self._released = True
            self._slots.release()

    def _wait_for_commits(self) -> None:
        if self._committer is not None:
            self._committer.wait()

    def _guard(self, step: Any, *args: Any) -> None:
        """Run a step of the worker, unless an earlier one failed; its error is kept for
        the main thread."""
        if self._error is not None:
            return
        try:
            step(*args)
        except OSError as exc:  # a full disk, say: the shards written so far stay usable
            self._drop_open_shards()  # first: the shards being committed are listed or not
            where = self.writer.out if self.writer else "the dump"
            then = (
                "the complete shards are kept: once that is fixed, run the same command "
                f"with {opt('resume', True)}"
                if self.writer is not None and self.writer.shards
                else "the folder is as it was"
            )
            self._error = HookdumpError(
                f"writing to {where} failed: {describe_os_error(exc)}; {then}"
            )
            self._wake_main()
        except BaseException as exc:  # handed to the main thread, which raises it
            self._error = exc
            self._wake_main()
            self._drop_open_shards()

    def _wake_main(self) -> None:
        """The main thread stops waiting for room and raises the error."""
        self._budget.cancel()
        self._slots.cancel()

    def _drop_open_shards(self) -> None:
        """Drop the shards being written; those complete are committed (or fail) first."""
        for shard in (self._shard, self._planned):
            if shard is not None:
                shard.abort()
        self._shard = self._planned = None
        if self._committer is not None:
            with contextlib.suppress(BaseException):  # the error being handled comes first
                self._committer.wait()

    def _on_begin(
        self, start: int, stop: int, keys_expected: int, samples: tuple[int, int] | None
    ) -> None:
        self._batch, self._keys, self._batch_bytes = (start, stop), [], 0
        self._released = False
        self._samples = samples or (start, stop)
        if self.writer is None:
            return
        assert self._committer is not None
        self._committer.raise_if_failed()  # no more batches once a commit has failed
        planned = self._planned
        if planned is not None and not self._plan.fits(self._planned_start, planned.rows,
                                                       start, stop):  # fmt: skip
            self._commit_planned()
        self._sequences = samples[1] if samples is not None else None  # what shards record
        if self._plan.streams:
            self._shard = self.writer.open_shard(keys_expected)
        elif self._planned is None:
            rows = self._plan.planned_rows(start, stop, self._samples[1])
            self._planned, self._planned_start = self.writer.plan_shard(rows), start

    def _on_tensor(
        self, key: str, tensor: torch.Tensor, info: KeyInfo, nbytes: int, ready: Any
    ) -> None:
        """`nbytes`: what `keep` took from the budget for it, given back once written."""
        if ready is not None:
            ready.synchronize()
        # once written (or dropped) the buffer goes back to the pool and the next batch
        # reuses it: the shard may hand it back later, after the disk has read it
        release = Release(functools.partial(self._written, tensor, nbytes))
        try:
            self._take(key, tensor, info, release)
        finally:
            release.unless_lent()

    def _written(self, tensor: torch.Tensor, nbytes: int) -> None:
        """`tensor`'s bytes are on their way to the file (or dropped): its buffer goes back
        to the pool, and the hooks may capture that much more."""
        self.pool.give_back(tensor)
        self._budget.give(nbytes)

    def _take(self, key: str, tensor: torch.Tensor, info: KeyInfo, release: Release) -> None:
        """Summarise and write one tensor; `release` (giving its buffer back) is either lent
        to the shard, which calls it once the data is written, or left to the caller."""
        start, stop = self._batch
        if tensor.dim() < 1 or tensor.shape[0] != stop - start:
            self.unbatched.setdefault(
                key,
                {
                    "key": key,
                    "reason": f"no batch dim (shape {list(tensor.shape)}, batch of {stop - start})",
                },
            )
            return
        given = tensor
        if self.save_dtype is not None and tensor.is_floating_point():
            tensor = tensor.to(self.save_dtype)
        tensor = tensor.cpu().contiguous()
        summary = self.summaries.get(key)
        if summary is None:
            summary = KeySummary(info, tuple(tensor.shape[1:]), dtype_name(tensor.dtype))
            self.summaries[key] = summary
        nbytes = summary.add(tensor)
        self._keys.append(key)
        self._batch_bytes += nbytes
        self.bytes_done += nbytes
        if self.writer is None:
            return
        self.writer.describe(key, info, tensor, start)
        if self._shard is not None:
            # the shard writes the copy in hand where it lies, and gives it back when the
            # disk has read it; a cast copy is the shard's alone
            self._shard.write(key, tensor, release.lend() if tensor is given else None)
        elif self._planned is not None:
            self._planned.write_rows(key, start - self._planned_start, tensor)

    def _on_end(self) -> None:
        start, stop = self._batch
        if len(set(self._keys)) != len(self._keys):  # whatever the cause: never committed
            twice = next(k for i, k in enumerate(self._keys) if k in self._keys[:i])
            raise HookdumpError(f"two tensors of one batch came under the key {twice!r}")
        if self.writer is None:
            return
        known = list(self.writer.tensors)
        if self.writer.keys_fixed and self._keys != known:
            missing = sorted(set(known) - set(self._keys))
            new = sorted(set(self._keys) - set(known))
            raise HookdumpError(
                f"the keys changed at sample {start} (missing: {missing[:3]}, new: {new[:3]}): "
                f"the model's control flow depends on its input; {opt('exclude')} those modules"
            )
        if self._shard is not None:
            shard, self._shard = self._shard, None
            # the values are in the file: the next forward need not wait for the syncs
            self._release()
            if stop == start:  # no row (token rows that kept none): nothing to list
                shard.abort()
                return
            if not self._room_checked:  # before the first shard is listed (or a dump moved)
                self._room_checked = True
                self._plan.first_batch(stop - start, self._samples)
                try:
                    self._check_room()
                except BaseException:
                    shard.abort()
                    raise
            self._commit(shard, start, stop)
            self._plan.streamed(stop - start, self._batch_bytes)
        elif self._planned is not None and self._planned.filled >= self._planned.rows:
            self._commit_planned()

    def _check_room(self) -> None:
        """Estimate the dump's bytes from this first batch's (per sample, times the samples
        expected) and refuse it if the disk cannot hold them."""
        expected = self._plan.expected()
        if expected is None or self.writer is None:
            return
        first, stop = self._samples
        needed = self._batch_bytes * max(0, expected - first) // max(1, stop - first)
        self.estimated_bytes = needed = needed * self._copies
        self.writer.check_room(needed, written=self._batch_bytes)

    def _commit_planned(self) -> None:
        if self.writer is None or self._planned is None or not self._planned.filled:
            return
        planned, self._planned = self._planned, None
        stop = self._planned_start + planned.filled
        self._commit(planned, self._planned_start, stop)

    def _commit(self, shard: ShardFile | PlannedShard, start: int, stop: int) -> None:
        assert self._committer is not None and self.writer is not None
        self.writer.finish_shard(shard, start, stop)  # here, while the disk has room
        self._committer.commit(shard, start, stop, self._sequences)
