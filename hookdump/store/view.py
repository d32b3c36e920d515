"""What the row readers (`batches`, `dataset`, `rows`) need of a dump: its layout and a way
to open a listed shard, checked. `store.reader.Dump` is one; typing the readers against this
protocol keeps them from importing the reader that imports them (no import circle)."""

from __future__ import annotations

from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any, Protocol

from hookdump.format import KeyInfo

# the most a reader holds of one shard at a time (rows read in slices), whatever its
# header claims
SLICE_BYTES = 64 << 20
SLICE_ROWS = 1 << 20


class DumpView(Protocol):
    """A dump as its row readers see it."""

    path: Path

    @property
    def num_samples(self) -> int: ...

    @property
    def shards(self) -> list[dict[str, Any]]: ...

    @property
    def ragged(self) -> bool: ...

    def keys(self) -> list[str]: ...

    def __contains__(self, key: object) -> bool: ...

    def info(self, key: str) -> KeyInfo: ...

    def row_bytes(self, keys: list[str]) -> int: ...

    def shard_of(self, index: int) -> dict[str, Any]: ...

    def shard_path(self, shard: dict[str, Any]) -> str: ...

    def open_shard(self, shard: dict[str, Any], keys: list[str]) -> AbstractContextManager[Any]: ...


def rows_per_slice(row_bytes: int, budget: int = SLICE_BYTES) -> int:
    """How many rows of `row_bytes` each a slice of `budget` bytes holds (at least one,
    at most `SLICE_ROWS`)."""
    return max(1, min(SLICE_ROWS, budget // row_bytes if row_bytes else SLICE_ROWS))
