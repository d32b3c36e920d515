"""From hooks to disk: a thread casts, summarises and writes each captured tensor as it
arrives, while the forward pass goes on.

The first batch streams into its own shard, tensor by tensor. Later batches do the same
when a batch is at least half a shard; smaller ones are gathered into shards of about
`--shard-size`. At most `pending` batches are in flight, which bounds memory.
"""

from __future__ import annotations

import queue
import threading
from typing import Any

import torch

from hookdump.capturing import KeyInfo
from hookdump.dump_writer import DumpWriter, ShardFile, dtype_name
from hookdump.errors import HookdumpError
from hookdump.stats import KeySummary


class BatchSink:
    """Takes captured tensors from the main thread; its worker does everything else."""

    def __init__(
        self, writer: DumpWriter | None, save_dtype: torch.dtype | None, pending: int = 2
    ) -> None:
        self.writer = writer
        self.save_dtype = save_dtype
        self.summaries: dict[str, KeySummary] = {}
        self.unbatched: dict[str, dict[str, str]] = {}
        self._queue: queue.SimpleQueue[tuple[Any, ...]] = queue.SimpleQueue()
        self._slots = threading.Semaphore(pending)
        self._error: BaseException | None = None
        # the worker's own state
        self._batch = (0, 0)
        self._keys: list[str] = []
        self._shard: ShardFile | None = None
        self._stream = True
        self._gathered: dict[str, list[torch.Tensor]] = {}
        self._gathered_start = self._gathered_stop = 0
        self._gathered_bytes = 0
        self._batch_bytes = 0
        self._thread = threading.Thread(target=self._work, name="hookdump-sink", daemon=True)
        self._thread.start()

    # --- the main thread's side ---------------------------------------------------------

    def begin(self, start: int, stop: int, keys_expected: int = 0) -> None:
        """Rows `start:stop` come next; waits while `pending` batches are still in flight."""
        while not self._slots.acquire(timeout=0.05):
            self._raise_if_failed()
        self._raise_if_failed()
        self._queue.put(("begin", start, stop, keys_expected))

    def put(self, key: str, tensor: torch.Tensor, info: KeyInfo) -> None:
        """One captured tensor of the current batch (a copy nobody else will change)."""
        self._queue.put(("tensor", key, tensor, info))

    def end(self) -> None:
        """The current batch is complete."""
        self._queue.put(("end",))

    def close(self) -> None:
        """Write what is gathered and wait for the worker; re-raise its error, if any."""
        self._queue.put(("close",))
        self._thread.join()
        self._raise_if_failed()

    def abort(self) -> None:
        """Stop after an error or Ctrl-C in the main thread: drop the unfinished shard."""
        self._queue.put(("abort",))
        self._thread.join()

    def _raise_if_failed(self) -> None:
        if self._error is not None:
            raise self._error

    # --- the worker ---------------------------------------------------------------------

    def _work(self) -> None:
        while True:
            item = self._queue.get()
            if item[0] in ("close", "abort"):
                if self._error is None and item[0] == "close":
                    self._guard(self._flush_gathered)
                if self._shard is not None:
                    self._shard.abort()
                return
            if self._error is None:
                self._guard(getattr(self, f"_on_{item[0]}"), *item[1:])
            if item[0] == "end":
                self._slots.release()

    def _guard(self, step: Any, *args: Any) -> None:
        try:
            step(*args)
        except BaseException as exc:  # handed to the main thread, which raises it
            self._error = exc
            if self._shard is not None:
                self._shard.abort()
                self._shard = None

    def _on_begin(self, start: int, stop: int, keys_expected: int) -> None:
        self._batch, self._keys, self._batch_bytes = (start, stop), [], 0
        if self.writer is not None and self._stream:
            self._shard = self.writer.open_shard(keys_expected)
        elif not self._gathered:
            self._gathered_start = start

    def _on_tensor(self, key: str, tensor: torch.Tensor, info: KeyInfo) -> None:
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
        if self.save_dtype is not None and tensor.is_floating_point():
            tensor = tensor.to(self.save_dtype)
        tensor = tensor.cpu().contiguous()
        summary = self.summaries.get(key)
        if summary is None:
            summary = KeySummary(info, tuple(tensor.shape[1:]), dtype_name(tensor.dtype))
            self.summaries[key] = summary
        nbytes = tensor.numel() * tensor.element_size()
        summary.nbytes += nbytes
        summary.stats.update(tensor)
        self._keys.append(key)
        self._batch_bytes += nbytes
        if self.writer is None:
            return
        self.writer.describe(key, info, tensor, start)
        if self._shard is not None:
            self._shard.write(key, tensor)
        else:
            self._gathered.setdefault(key, []).append(tensor)
            self._gathered_bytes += nbytes

    def _on_end(self) -> None:
        start, stop = self._batch
        if self.writer is None:
            return
        known = list(self.writer.tensors)
        if self.writer.shards and self._keys != known:
            missing = sorted(set(known) - set(self._keys))
            new = sorted(set(self._keys) - set(known))
            raise HookdumpError(
                f"the keys changed at sample {start} (missing: {missing[:3]}, new: {new[:3]}): "
                "the model's control flow depends on its input; --exclude those modules"
            )
        if self._shard is not None:
            shard, self._shard = self._shard, None
            self.writer.commit_shard(shard, start, stop)
            # batches under half a shard are gathered into shards of about --shard-size
            self._stream = 2 * self._batch_bytes >= self.writer.shard_bytes
        else:
            self._gathered_stop = stop
            if self._gathered_bytes >= self.writer.shard_bytes:
                self._flush_gathered()

    def _flush_gathered(self) -> None:
        if self.writer is None or not self._gathered:
            return
        gathered, self._gathered, self._gathered_bytes = self._gathered, {}, 0
        shard = self.writer.open_shard(len(gathered))
        try:
            for key, parts in gathered.items():
                shard.write(key, parts[0] if len(parts) == 1 else torch.cat(parts))
        except BaseException:
            shard.abort()
            raise
        self.writer.commit_shard(shard, self._gathered_start, self._gathered_stop)
