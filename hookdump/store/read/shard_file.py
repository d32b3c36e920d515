"""A safetensors file read with `pread`: its header parsed and checked against the file, and
rows read straight into tensors of their own. No memory map, so a reader never needs address
space for more than the rows it asked for (a shard larger than `ulimit -v` reads as well as
a small one), and a header's claims cost nothing until rows are read.

The interface is the part of `safetensors.safe_open` the readers use: `keys`, `metadata`,
`get_slice(key)` (`get_shape`, `get_dtype`, `[rows]` or `[rows, inner]`) and `get_tensor`.
The bytes come from a `Blob`: a local file (`LocalBlob`, read with `pread`) or an object at a
URL (`store.location.RemoteBlob`, read with ranged requests).
"""

from __future__ import annotations

import math
from typing import Any

import torch

from hookdump.format.dtypes import DTYPE_OF_SAFETENSORS, ITEMSIZE
from hookdump.store.header import SafetensorsError, header_of
from hookdump.store.media.blob import Blob, LocalBlob


def read_header(blob: Blob) -> tuple[dict[str, Any], int]:
    """The parsed header of `blob` and where its data starts."""
    return header_of(blob.pread, blob.size)


class SafetensorsFile:
    """An open safetensors file (a context manager; `close` releases it)."""

    def __init__(self, source: str | Blob) -> None:
        self.blob = LocalBlob(source) if isinstance(source, str) else source
        try:
            header, self._data = read_header(self.blob)
            self._metadata = header.pop("__metadata__", None)
            size = self.blob.size - self._data
            self._entries = {key: _Entry.of(key, entry, size) for key, entry in header.items()}
        except BaseException:
            self.blob.close()
            raise

    def __enter__(self) -> SafetensorsFile:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def close(self) -> None:
        self.blob.close()

    def keys(self) -> list[str]:
        return list(self._entries)

    def metadata(self) -> dict[str, str] | None:
        return self._metadata if isinstance(self._metadata, dict) else None

    def span(self, key: str) -> tuple[int, int] | None:
        """Where `key`'s bytes lie in the file, `start:end` (checked inside it when the
        header was read); None for a key the file lacks."""
        entry = self._entries.get(key)
        return None if entry is None else (self._data + entry.begin, self._data + entry.end)

    def get_slice(self, key: str) -> _Slice:
        return _Slice(self, self._entries[key])

    def get_tensor(self, key: str) -> torch.Tensor:
        return self.get_slice(key)[:]

    def holds_data(self, key: str, offset: int, nbytes: int) -> bool:
        """Whether bytes `offset:offset + nbytes` of `key`'s data have any block on disk;
        False for a hole of a sparse file, which reads as zeros (`SEEK_DATA`; True where the
        system cannot tell)."""
        return self.blob.holds_data(self._data + self._entries[key].begin + offset, nbytes)

    def read(self, into: torch.Tensor, offset: int) -> None:
        """Fill `into` (contiguous) with the bytes at `offset` of the data."""
        want = into.numel() * into.element_size()
        if not want:
            return
        # as bytes; reshape makes a 0-d tensor one element of the same memory
        view = into.reshape(-1).view(torch.uint8).numpy().data.cast("B")
        got = self.blob.readinto(view, self._data + offset)
        if got != want:
            raise SafetensorsError(f"the file ends inside its rows (read {got} of {want} bytes)")


class _Entry:
    """One tensor's dtype, shape and place in the data, checked against the file."""

    def __init__(self, key: str, dtype: str, shape: list[int], begin: int, end: int) -> None:
        self.key, self.dtype_name, self.shape = key, dtype, shape
        self.begin, self.end = begin, end

    @classmethod
    def of(cls, key: str, entry: Any, data_bytes: int) -> _Entry:
        where = f"tensor {key[:80]!r}"
        if not isinstance(entry, dict):
            raise SafetensorsError(f"{where} is not an object")
        dtype, shape, span = entry.get("dtype"), entry.get("shape"), entry.get("data_offsets")
        if not isinstance(dtype, str):
            raise SafetensorsError(f"{where} has no dtype")
        if not (isinstance(shape, list) and all(type(d) is int and d >= 0 for d in shape)):
            raise SafetensorsError(f"{where} has no valid shape")
        if not (isinstance(span, list) and len(span) == 2 and all(type(v) is int for v in span)):
            raise SafetensorsError(f"{where} has no valid data offsets")
        itemsize = ITEMSIZE.get(DTYPE_OF_SAFETENSORS.get(dtype, ""))  # None: a dtype not read
        begin, end = span
        sized = itemsize is None or end - begin == math.prod(shape) * itemsize
        if not 0 <= begin <= end <= data_bytes or not sized:
            raise SafetensorsError(
                f"{where}'s bytes {begin}:{end} are not its shape {shape} inside the file"
            )
        return cls(key, dtype, shape, begin, end)

    @property
    def torch_dtype(self) -> torch.dtype:
        name = DTYPE_OF_SAFETENSORS.get(self.dtype_name)
        if name is None:
            raise SafetensorsError(
                f"tensor {self.key[:80]!r} has dtype {self.dtype_name[:20]!r}, "
                "which hookdump does not read"
            )
        return getattr(torch, name)


class _Slice:
    """Rows of one tensor, read when indexed: `[lo:hi]` (rows), `[lo:hi, a:b]` (and only
    `a:b` of each row's first dimension)."""

    def __init__(self, file: SafetensorsFile, entry: _Entry) -> None:
        self._file, self._entry = file, entry

    def get_shape(self) -> list[int]:
        return list(self._entry.shape)

    def get_dtype(self) -> str:
        return self._entry.dtype_name

    def __getitem__(self, index: slice | tuple[slice, slice]) -> torch.Tensor:
        rows, inner = index if isinstance(index, tuple) else (index, None)
        shape, dtype = self._entry.shape, self._entry.torch_dtype
        if not shape:  # a 0-d tensor
            out = torch.empty((), dtype=dtype)
            self._file.read(out, self._entry.begin)
            return out
        lo, hi, step = rows.indices(shape[0])
        if step != 1:
            raise ValueError("rows are read in steps of one")
        count = max(0, hi - lo)
        row_bytes = math.prod(shape[1:]) * dtype.itemsize
        if inner is None:
            out = torch.empty((count, *shape[1:]), dtype=dtype)
            self._file.read(out, self._entry.begin + lo * row_bytes)
            return out
        a, b, _ = inner.indices(shape[1])
        width = max(0, b - a)
        part_bytes = math.prod(shape[2:]) * dtype.itemsize
        out = torch.empty((count, width, *shape[2:]), dtype=dtype)
        for n in range(count):  # rows this large are read a part at a time
            self._file.read(out[n], self._entry.begin + (lo + n) * row_bytes + a * part_bytes)
        return out
