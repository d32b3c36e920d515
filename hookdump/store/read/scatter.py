"""Rows read straight into the batches they are given out in: each row of a block goes to
its place in its batch (a shuffled pass's order) in one copy, the kernel's, with `preadv`
and one I/O vector per run of rows that stay together; and batch memory used again once
nothing refers to it. A gather from a read buffer into a new batch was a second copy of
every byte, and new memory a page fault per 4 KiB: together three quarters of a pass's
CPU time, which a busy machine does not have to spare (benchmarks/README.md).

`Slabs` hands out batch tensors. Each is made on memory the pool keeps (a numpy array),
through a view of it that the tensor's storage holds: once no tensor, view or NumPy array
of the user's refers to that storage, the view is gone (a weak reference says so) and the
memory is used for a later batch. Memory the user still holds is never written.
"""

from __future__ import annotations

import math
import threading
import weakref

import numpy as np
import torch


class Places:
    """Where the rows of one buffer go: output position p is row p % size of batch
    p // size, in `batches` (per key, contiguous tensors of `size` rows, the last of as
    many or fewer)."""

    def __init__(self, batches: list[dict[str, torch.Tensor]], size: int) -> None:
        self.batches, self.size = batches, size
        keys = list(batches[0]) if batches else []
        counts = [len(next(iter(b.values()))) for b in batches] if keys else []
        if any(n != size for n in counts[:-1]) or any(n > size for n in counts[-1:]):
            raise ValueError(f"batches of {counts} rows are not of {size}")
        self.rows = sum(counts)  # positions 0 to rows - 1
        self._addresses = {
            key: np.array([b[key].data_ptr() for b in batches], dtype=np.uint64) for key in keys
        }

    def vectors(self, key: str, row_bytes: int, positions: np.ndarray) -> np.ndarray:
        """I/O vectors for consecutive rows bound for `positions`: one per run of rows
        that land next to each other in one batch."""
        count, size = len(positions), self.size
        if count and not 0 <= int(positions.min()) <= int(positions.max()) < self.rows:
            raise IndexError(f"rows bound outside the {self.rows} places of the batches")
        starts_run = np.ones(count, dtype=bool)
        starts_run[1:] = (positions[1:] != positions[:-1] + 1) | (positions[1:] % size == 0)
        firsts = np.flatnonzero(starts_run)
        lengths = np.diff(np.append(firsts, count)).astype(np.uint64)
        at = positions[firsts]
        vectors = np.empty((len(firsts), 2), dtype=np.uint64)
        vectors[:, 0] = self._addresses[key][at // size] + (at % size).astype(np.uint64) * (
            np.uint64(row_bytes)
        )
        vectors[:, 1] = lengths * np.uint64(row_bytes)
        return vectors

    def put(self, key: str, rows: torch.Tensor, positions: torch.Tensor) -> None:
        """Copy `rows` (in block order) to `positions`."""
        if len(rows) and rows[0].numel():
            self.put_bytes(key, _row_bytes(rows), positions.numpy())

    def put_bytes(self, key: str, rows: np.ndarray, where: np.ndarray) -> None:
        """Copy the rows' bytes (`rows`: [n, bytes of a row], in block order) to positions
        `where`, batch by batch, with NumPy (torch's indexing took a fifth of a shuffled
        pass's reading thread)."""
        whole = np.dtype((np.void, rows.shape[1]))  # a row one item: moved whole
        rows = rows.view(whole).reshape(-1)
        order = np.argsort(where, kind="stable")
        batch = where[order] // self.size
        firsts = np.flatnonzero(np.diff(batch, prepend=-1))
        for first, last in zip(firsts, [*firsts[1:], len(order)], strict=True):
            taken = order[first:last]
            target = _row_bytes(self.batches[int(batch[first])][key]).view(whole).reshape(-1)
            target[where[taken] % self.size] = rows[taken]


def _row_bytes(rows: torch.Tensor) -> np.ndarray:
    """The bytes of contiguous `rows` as a [rows, bytes of a row] NumPy view."""
    return rows.contiguous().view(torch.uint8).numpy().reshape(len(rows), -1)


Kept = list[tuple[np.ndarray, "weakref.ref[np.ndarray] | None"]]


class BatchMemory:
    """The blocks of batch memory a `Dump` keeps for all its passes (a second pass, the
    next epoch of a dataset, another `batches` of it): fresh memory costs a page fault per
    page, half a pass's CPU where a first touch is slow. Per key, as `Slabs` handed them
    out; a block the caller still holds is never handed out again."""

    def __init__(self) -> None:
        self._kept: dict[str, Kept] = {}
        self._lock = threading.Lock()  # passes of one Dump may read at once

    def __reduce__(self) -> tuple[type[BatchMemory], tuple[()]]:
        return BatchMemory, ()  # to a DataLoader worker: memory of its own, none sent

    def slabs(self, template: dict[str, torch.Tensor], keep: int) -> Slabs:
        """A pass's `Slabs` for batches shaped as `template`'s rows, on this memory."""
        with self._lock:
            kept = {key: self._kept.setdefault(key, []) for key in template}
        return Slabs(template, keep, (kept, self._lock))


class Slabs:
    """Batch tensors (shaped per key as `template`'s rows) on memory used again once nothing
    refers to it (see the module's docstring); at most `keep` blocks of memory per key kept
    (in `kept`, a `BatchMemory`'s lists, where the memory outlives the pass)."""

    def __init__(
        self,
        template: dict[str, torch.Tensor],
        keep: int,
        kept: tuple[dict[str, Kept], threading.Lock] | None = None,
    ) -> None:
        self.keep = keep
        self._forms = {key: (tuple(t.shape[1:]), t.dtype) for key, t in template.items()}
        self._kept, self._lock = kept or ({key: [] for key in template}, threading.Lock())

    def take(self, rows: int) -> dict[str, torch.Tensor]:
        """One batch's tensors of `rows` rows, uninitialised."""
        with self._lock:
            return {key: self._one(key, rows) for key in self._forms}

    def _one(self, key: str, rows: int) -> torch.Tensor:
        shape, dtype = self._forms[key]
        nbytes = rows * math.prod(shape) * dtype.itemsize
        if nbytes == 0:  # rows of no bytes: nothing to keep
            return torch.empty((rows, *shape), dtype=dtype)
        kept = self._kept[key]
        free = [i for i, (_, held) in enumerate(kept) if held is None or held() is None]
        for index in free:
            if len(kept[index][0]) >= nbytes:
                return self._on(kept[index][0], key, index, (nbytes, rows))
        memory = np.empty(nbytes, dtype=np.uint8)
        if len(kept) < self.keep:
            kept.append((memory, None))
            return self._on(memory, key, len(kept) - 1, (nbytes, rows))
        if free:  # a block too small for this pass's batches gives way
            return self._on(memory, key, free[0], (nbytes, rows))
        return self._on(memory, key, None, (nbytes, rows))

    def _on(
        self, memory: np.ndarray, key: str, index: int | None, size: tuple[int, int]
    ) -> torch.Tensor:
        shape, dtype = self._forms[key]
        nbytes, rows = size
        view = memory[:nbytes]  # the storage holds it: alive while any tensor of it is
        if index is not None:
            self._kept[key][index] = (memory, weakref.ref(view))
        return torch.from_numpy(view).view(dtype).view(rows, *shape)
