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

import functools
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from hookdump.errors import HookdumpError, opt
from hookdump.format.dtypes import dtype_name
from hookdump.format.keys import KeyInfo
from hookdump.format.rows import Rows
from hookdump.store.features import OnDevice
from hookdump.store.stats import KeySummary, device_stats
from hookdump.store.write.filler import NoShards, ShardFiller, Shards
from hookdump.store.write.memory import (
    IN_FLIGHT_BYTES,
    POOL_MIN_BYTES,
    Budget,
    BufferPool,
    Release,
    Slots,
)
from hookdump.store.write.plan import ShardPlan
from hookdump.store.write.room import DiskBudget
from hookdump.store.write.writer import DumpWriter
from hookdump.worker import Worker


# what the main thread hands the worker, in order
@dataclass(frozen=True)
class _Begin:
    rows: Rows
    keys_expected: list[str]


@dataclass(frozen=True)
class _Tensor:
    key: str
    tensor: torch.Tensor
    info: KeyInfo
    nbytes: int  # taken from the budget, given back once written
    ready: Any  # a CUDA event to wait on before reading `tensor`, or None
    taken: OnDevice | None = None  # its statistics, taken on the GPU before the copy


@dataclass(frozen=True)
class _End:
    pass


@dataclass(frozen=True)
class _Flush:
    pass


_END, _FLUSH = _End(), _Flush()
_Message = _Begin | _Tensor | _End | _Flush


@dataclass
class _Batch:
    """The worker's view of the batch in hand."""

    rows: Rows
    keys: list[str] = field(default_factory=list)
    nbytes: int = 0  # captured bytes, as saved
    written: bool = False  # its values are written: its slot was given back


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
        budget: DiskBudget | None = None,
    ) -> None:
        """`writer`: where rows go (None: nowhere, they are only summarised); `total`: the
        rows expected (None: not known; shards are then sized by what arrives); `expected`:
        the samples expected, asked after the first batch for the disk-space estimate
        (default: `total`); `copies`: processes writing as much as this one (torchrun
        ranks), whose room is needed too; `summaries`: statistics to go on from (resuming);
        `budget`: `--max-disk`."""
        self.save_dtype = save_dtype
        self.summaries: dict[str, KeySummary] = dict(summaries or {})
        self.unbatched: dict[str, dict[str, str]] = {}
        self.bytes_done = 0  # captured bytes handled so far, for the progress bar
        self.pool = BufferPool(int(os.environ.get("HOOKDUMP_POOL_MIN_BYTES", POOL_MIN_BYTES)))
        self._slots = Slots(pending)
        self._budget = Budget(IN_FLIGHT_BYTES)
        self._batch = _Batch(Rows.of_samples(0, 0))
        self._shards: Shards = NoShards()
        if writer is not None:
            plan = ShardPlan(writer.shard_bytes, total, expected or (lambda: total))
            self._shards = ShardFiller(writer, plan, copies, budget)
        self._worker: Worker[_Message] = Worker(
            "hookdump-sink", self._handle, on_error=self._failed
        )

    @property
    def estimated_bytes(self) -> int | None:
        """What the rest of the dump will take, estimated from its first batch."""
        return self._shards.estimated_bytes

    # --- the main thread's side ---------------------------------------------------------

    def begin(self, rows: Rows, keys_expected: list[str] | None = None) -> None:
        """`rows` come next; waits while `pending` batches are still in flight."""
        self._slots.acquire()
        self._worker.submit(_Begin(rows, keys_expected or []))

    def keep(self, key: str, tensor: torch.Tensor, info: KeyInfo, fresh: bool) -> None:
        """One captured tensor of the current batch, as a hook hands it over (a `Receiver`):
        copied now unless `fresh`, so no later in-place op can change it. Raises nothing:
        after an error the worker drops it, and `end` or `close` raises."""
        nbytes = tensor.numel() * tensor.element_size()  # given back once written
        self._budget.take(nbytes)
        if tensor.is_cuda:
            # straight to pinned host memory, queued on the stream before any later in-place
            # op; the worker waits on the event, never a synchronize() per module. Freed
            # once written, the pinned block goes back to torch's cache for the next copy.
            host = torch.empty(tensor.shape, dtype=tensor.dtype, pin_memory=True)
            host.copy_(tensor, non_blocking=True)
            saved = tensor
            if self.save_dtype is not None and tensor.is_floating_point():
                saved = tensor.to(self.save_dtype)
            taken = device_stats(info, saved)
            ready = torch.cuda.Event()
            ready.record()
            message = _Tensor(key, host, info, nbytes, ready, taken)
            self._worker.submit(message, raise_error=False)
            return
        copy = tensor if fresh else self.pool.copy(tensor)
        self._worker.submit(_Tensor(key, copy, info, nbytes, None), raise_error=False)

    def end(self) -> None:
        """The current batch is complete."""
        self._worker.submit(_END)

    def close(self) -> None:
        """Write what is gathered and wait for the worker; re-raise its error, if any."""
        self._worker.submit(_FLUSH, raise_error=False)
        self._worker.close()
        self._finish()
        self._worker.raise_if_failed()

    def abort(self) -> None:
        """Stop after an error or Ctrl-C in the main thread: drop the unfinished shard."""
        self._worker.close()
        self._finish()

    def _finish(self) -> None:
        """The worker has stopped: drop what is still open, stop committing."""
        self._shards.drop_open()
        self._shards.close()

    # --- the worker ---------------------------------------------------------------------

    def _handle(self, message: _Message) -> None:
        try:
            match message:
                case _Begin(rows, keys_expected):
                    self._batch = _Batch(rows)
                    self._shards.begin(rows, keys_expected)
                case _Tensor():
                    self._on_tensor(message)
                case _End():
                    try:
                        self._on_end()
                    finally:
                        self._written()
                case _Flush():
                    self._shards.flush()
        except OSError as exc:  # a full disk, say: the shards written so far stay usable
            self._shards.drop_open()  # first: the shards being committed are listed or not
            raise self._shards.failure(exc) from exc

    def _failed(self, _: BaseException) -> None:
        """The main thread stops waiting for room and raises the error (`close`)."""
        self._budget.cancel()
        self._slots.cancel()
        self._shards.drop_open()

    def _written(self) -> None:
        """The current batch's values are written: the next batch may come (once)."""
        if not self._batch.written:
            self._batch.written = True
            self._slots.release()

    def _on_tensor(self, message: _Tensor) -> None:
        """`message.nbytes`: what `keep` took from the budget for it, given back once
        written."""
        key, tensor, info, nbytes = message.key, message.tensor, message.info, message.nbytes
        if message.ready is not None:
            message.ready.synchronize()
        # once written (or dropped) the buffer goes back to the pool and the next batch
        # reuses it: the shard may hand it back later, after the disk has read it
        release = Release(functools.partial(self._give_back, tensor, nbytes))
        try:
            self._take(key, tensor, info, release, message.taken)
        finally:
            release.unless_lent()

    def _give_back(self, tensor: torch.Tensor, nbytes: int) -> None:
        """`tensor`'s bytes are on their way to the file (or dropped): its buffer goes back
        to the pool, and the hooks may capture that much more."""
        self.pool.give_back(tensor)
        self._budget.give(nbytes)

    def _take(
        self,
        key: str,
        tensor: torch.Tensor,
        info: KeyInfo,
        release: Release,
        taken: OnDevice | None = None,
    ) -> None:
        """Summarise and write one tensor; `release` (giving its buffer back) is either lent
        to the shard, which calls it once the data is written, or left to the caller.
        `taken`: its statistics as taken on its GPU."""
        rows = self._batch.rows
        if tensor.dim() < 1 or tensor.shape[0] != rows.count:
            self.unbatched.setdefault(
                key,
                {
                    "key": key,
                    "reason": f"no batch dim (shape {list(tensor.shape)}, batch of {rows.count})",
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
        elif dtype_name(tensor.dtype) != summary.dtype:
            tensor = as_dtype(key, tensor, summary.dtype, rows.start)
            taken = None  # taken of other values
        nbytes = summary.add(tensor, taken)
        self._batch.keys.append(key)
        self._batch.nbytes += nbytes
        self.bytes_done += nbytes
        # the shard writes the copy in hand where it lies, and gives it back when the disk
        # has read it; a cast copy is the shard's alone
        self._shards.write(
            key, tensor, info, rows.start, lambda: release.lend() if tensor is given else None
        )

    def _on_end(self) -> None:
        keys = self._batch.keys
        if len(set(keys)) != len(keys):  # whatever the cause: never committed
            twice = next(k for i, k in enumerate(keys) if k in keys[:i])
            raise HookdumpError(f"two tensors of one batch came under the key {twice!r}")
        self._shards.end(self._batch.rows, keys, self._batch.nbytes, self._written)


def as_dtype(key: str, tensor: torch.Tensor, dtype: str, start: int) -> torch.Tensor:
    """`tensor` in the key's dtype (the first batch's), when no value changes on the way
    (int32 ids beside int64 ones, float16 beside float32); else one line naming both dtypes:
    a shard's rows of one dtype never hold another's bytes."""
    target = getattr(torch, dtype)
    cast = tensor.to(target)
    back = cast.to(tensor.dtype)
    if not bool(((back == tensor) | (back.isnan() & tensor.isnan())).all()):
        fix = (
            f"give {opt('save_dtype', 'torch.' + dtype)}"
            if tensor.is_floating_point() and cast.is_floating_point()
            else f"give every batch as {dtype}"
        )
        raise HookdumpError(
            f"{key!r} changed its dtype from {dtype} to {dtype_name(tensor.dtype)} at "
            f"sample {start}, and its values do not fit {dtype}; {fix}"
        )
    return cast
