"""The memory a run may hold beside the model: captured bytes in flight (`Budget`), batches
in flight (`Slots`), and the buffers that captured copies reuse (`BufferPool`)."""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable

import torch

from hookdump.store.write.direct_io import BLOCK

# glibc's largest dynamic mmap threshold: a freed block above it always goes back to the OS
# and is faulted in again when allocated, while smaller ones are recycled by malloc itself
POOL_MIN_BYTES = 32 << 20
# captured bytes not yet written that the forward may run ahead by: past this the hooks wait
# for the disk (a batch bigger than the disk can take while its forward runs would otherwise
# sit in memory whole; the wait costs no time, the disk being the slower of the two)
IN_FLIGHT_BYTES = 512 << 20


class Budget:
    """Bytes in flight, taken by the hooks and given back once written or dropped. A wait
    ends when the bytes fit, or at once when the budget is cancelled (the worker failed)."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.used = 0
        self._cancelled = False
        self._changed = threading.Condition()

    def take(self, n: int) -> None:
        """Wait until `n` more bytes fit (one tensor always does), or the budget is
        cancelled."""
        with self._changed:
            while self.used and self.used + n > self.limit and not self._cancelled:
                self._changed.wait()
            self.used += n

    def give(self, n: int) -> None:
        with self._changed:
            self.used -= n
            self._changed.notify_all()

    def cancel(self) -> None:
        """Nobody waits from now on."""
        with self._changed:
            self._cancelled = True
            self._changed.notify_all()


class Slots:
    """Batches in flight: `acquire` waits for a free slot, or returns at once once the
    slots are cancelled (the worker failed; the caller then raises its error)."""

    def __init__(self, count: int) -> None:
        self._free = count
        self._cancelled = False
        self._changed = threading.Condition()

    def acquire(self) -> None:
        with self._changed:
            while not self._free and not self._cancelled:
                self._changed.wait()
            self._free -= 1

    def release(self) -> None:
        with self._changed:
            self._free += 1
            self._changed.notify_all()

    def cancel(self) -> None:
        with self._changed:
            self._cancelled = True
            self._changed.notify_all()


def aligned_empty(like: torch.Tensor) -> torch.Tensor:
    """An uninitialised contiguous CPU tensor of `like`'s shape and dtype whose data starts
    at a BLOCK boundary (a slice of a slightly larger allocation); where that cannot be
    viewed (quantized, sparse or sub-byte tensors), a plain one."""
    if like.layout != torch.strided or like.is_quantized or like.element_size() < 1:
        return torch.empty(like.shape, dtype=like.dtype)
    nbytes = like.numel() * like.element_size()
    raw = torch.empty(nbytes + BLOCK, dtype=torch.uint8)
    skip = -raw.data_ptr() % BLOCK
    return raw[skip : skip + nbytes].view(like.dtype).view(like.shape)


class Release:
    """Gives a captured copy's buffer and budget back, once, however often it is called.
    Handed to a shard (`lend`), it is the shard's to call once the disk has read the bytes;
    otherwise its owner calls it when done (`unless_lent`)."""

    def __init__(self, give_back: Callable[[], None]) -> None:
        self._give_back: Callable[[], None] | None = give_back
        self._lock = threading.Lock()
        self.lent = False

    def lend(self) -> Release:
        """This release goes with the bytes: whoever takes them calls it."""
        self.lent = True
        return self

    def __call__(self) -> None:
        with self._lock:
            give_back, self._give_back = self._give_back, None
        if give_back is not None:
            give_back()

    def unless_lent(self) -> None:
        """Call it now, unless it went with the bytes."""
        if not self.lent:
            self()


class BufferPool:
    """CPU buffers for captured copies, handed back once written and reused by the next
    batch: a copy into memory already touched skips the page faults of a fresh one, and is
    many times faster. Only copies of at least `min_bytes` are pooled: smaller
    ones gained no speed (`layer4.*` at batch 32) and a pool holds them idle through the next
    forward, up to a batch of memory."""

    def __init__(self, min_bytes: int = POOL_MIN_BYTES) -> None:
        self.min_bytes = min_bytes
        self._free: dict[tuple[tuple[int, ...], torch.dtype], list[torch.Tensor]] = {}
        self._lent: Counter[tuple[tuple[int, ...], torch.dtype]] = Counter()
        self._lock = threading.Lock()

    def copy(self, tensor: torch.Tensor) -> torch.Tensor:
        """A copy of `tensor` in a reused buffer of its shape and dtype (or a new one),
        block-aligned so that the disk can read it where it lies (see `direct_io`)."""
        if tensor.numel() * tensor.element_size() < self.min_bytes:
            return aligned_empty(tensor).copy_(tensor)
        key = (tuple(tensor.shape), tensor.dtype)
        with self._lock:
            free = self._free.get(key)
            buffer = free.pop() if free else None
            self._lent[key] += 1
        return (aligned_empty(tensor) if buffer is None else buffer).copy_(tensor)

    def give_back(self, tensor: torch.Tensor) -> None:
        """Keep `tensor` for reuse, if a buffer of its kind is out on loan (a reduction's own
        result is not, and would only pile up)."""
        key = (tuple(tensor.shape), tensor.dtype)
        with self._lock:
            if self._lent[key]:
                self._lent[key] -= 1
                self._free.setdefault(key, []).append(tensor)

    def __len__(self) -> int:
        """Buffers waiting to be reused."""
        return sum(len(free) for free in self._free.values())
