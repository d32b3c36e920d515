"""ShardReader: the one way the read side opens a dump's shards. It opens a listed shard
(a regular file inside the folder), checks it once against the manifest, and reads rows
and slices of it with pread into tensors of their own. `Dump`, `batches`, `dataset`, the
summary, `diff` and `export` all read through it."""

from __future__ import annotations

import bisect
import contextlib
import hashlib
import math
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any, TypeVar

import torch

from hookdump.errors import InvalidDump, did_you_mean
from hookdump.format.dtypes import DTYPE_OF_SAFETENSORS, ITEMSIZE
from hookdump.format.keys import KeyInfo
from hookdump.format.manifest import Manifest, ShardEntry
from hookdump.format.names import STATS_FILE
from hookdump.store.checksum import CHUNK, checksum_of, matches, recorded
from hookdump.store.features import read_stats_file
from hookdump.store.location import UrlPath
from hookdump.store.media import Medium
from hookdump.store.media.blob import Blob
from hookdump.store.read.progress import consumed_shards
from hookdump.store.read.scatter import BatchMemory
from hookdump.store.read.shard_file import SafetensorsFile

# the most a reader holds of one shard at a time (rows read in slices), whatever its
# header claims
SLICE_BYTES = 64 << 20
SLICE_ROWS = 1 << 20
MAX_STATS_BYTES = 1 << 30  # per-feature statistics: 56 bytes a feature, far less in practice
T = TypeVar("T")


def rows_per_slice(row_bytes: int, budget: int = SLICE_BYTES) -> int:
    """How many rows of `row_bytes` each a slice of `budget` bytes holds (at least one,
    at most `SLICE_ROWS`)."""
    return max(1, min(SLICE_ROWS, budget // row_bytes if row_bytes else SLICE_ROWS))


def allocation_failed(exc: BaseException) -> bool:
    """Whether `exc` is memory that could not be had: Python's, or torch's allocator
    ("... can't allocate memory", "... Cannot allocate memory")."""
    return isinstance(exc, MemoryError) or "allocate" in str(exc)


def key_info(key: str, meta: Mapping[str, Any], rows: int | None = None) -> KeyInfo:
    """A manifest's entry for `key` as a KeyInfo (a dtype torch does not have, in a lone
    safetensors file: float32, as its values would be read)."""
    return KeyInfo(
        key,
        meta["module"],
        meta.get("module_type") or "-",
        meta["kind"],
        int(meta.get("call", 0)),
        meta.get("part"),
        tuple(meta["shape"]),
        getattr(torch, meta["dtype"], torch.float32),
        rows,
        meta.get("standard_name"),
    )


class ShardReader:
    """The shards of one dump, as its manifest lists them.

    `key_rows`: a lone safetensors file whose keys have different numbers of rows (a
    weights file): each key's own. `check_headers`: False where the manifest was made from
    the shard's own header."""

    def __init__(
        self,
        medium: Medium,
        manifest: Manifest,
        *,
        check_headers: bool = True,
        key_rows: Mapping[str, int] | None = None,
    ) -> None:
        self.medium = medium  # where its files are read
        self.path: Path | UrlPath = medium.root
        self.manifest = manifest
        self._check_headers = check_headers
        self._key_rows = dict(key_rows or {})
        self._checked: set[str] = set()  # shard files whose header agreed with the manifest
        self._stats: dict[str, dict[str, torch.Tensor]] | None = None
        self.batch_memory = BatchMemory()  # every pass's batches, used again (scatter.py)

    @property
    def num_samples(self) -> int:
        return self.manifest.num_samples

    @property
    def shards(self) -> tuple[ShardEntry, ...]:
        return self.manifest.shards

    @property
    def ragged(self) -> bool:
        """Rows of different keys are not the same samples (a weights file)."""
        return bool(self._key_rows)

    def keys(self) -> list[str]:
        return list(self.manifest.tensors)

    def __iter__(self) -> Iterator[str]:
        return iter(self.manifest.tensors)

    def __contains__(self, key: object) -> bool:
        return key in self.manifest.tensors

    def check_key(self, key: str) -> None:
        """KeyError naming `key`, the dump and the nearest key, if the dump lacks it (a key
        that is not a str: TypeError saying what a key is)."""
        if not isinstance(key, str):
            first = next(iter(self.manifest.tensors), "layer1.0")
            raise TypeError(
                f"a key of {self.path} is its name, a str such as {first!r}, not "
                f"{type(key).__name__} {str(key)[:40]!r}"
            )
        if key not in self.manifest.tensors:
            raise KeyError(f"{key!r} is not in {self.path}{self._nearest(key)}")

    def _nearest(self, key: str) -> str:
        """The keys a missing `key` may mean: those of the module it names (a standard name
        such as `blocks.2.hook_resid_post` stores `transformer.h.2`), else the nearest."""
        of_module = [
            name
            for name, meta in self.manifest.tensors.items()
            if isinstance(module := meta.get("module"), str)
            and (module == key or module.endswith("." + key))
        ]
        if of_module:
            shown = ", ".join(of_module[:3]) + (", ..." if len(of_module) > 3 else "")
            return f" (module {key} is stored as {shown})"
        return did_you_mean(key, self.keys())

    def info(self, key: str) -> KeyInfo:
        self.check_key(key)
        return key_info(key, self.manifest.tensors[key], self.rows_of(key))

    def rows_of(self, key: str) -> int:
        """The rows `key` has (`num_samples`, but for a ragged file)."""
        return self._key_rows.get(key, self.num_samples)

    def row_bytes(self, keys: list[str]) -> int:
        """The bytes of one row of each of `keys`, as the manifest gives them."""
        tensors = self.manifest.tensors
        return sum(
            math.prod(tensors[key]["shape"]) * ITEMSIZE.get(tensors[key]["dtype"], 8)
            for key in keys
        )

    def shard_of(self, index: int) -> ShardEntry:
        """The shard holding row `index` (found by bisection: shards follow each other)."""
        return self.shards[bisect.bisect_right(self.shards, index, key=lambda s: s.stop)]

    def slices(
        self, shard: ShardEntry, keys: list[str], budget: int = SLICE_BYTES
    ) -> Iterator[tuple[int, int]]:
        """Row ranges (dump row numbers) that cover `shard`, each holding at most `budget`
        bytes of `keys` (and `SLICE_ROWS` rows), at least one row: how a shard is read in
        bounded memory whatever its header claims."""
        step = rows_per_slice(self.row_bytes(keys), budget)
        for start in range(shard.start, shard.stop, step):
            yield start, min(start + step, shard.stop)

    def blob(self, shard: ShardEntry) -> Blob:
        """A listed shard's bytes, opened: a regular file inside the folder, or the object
        under the dump's URL."""
        try:
            opened = self.guarded(shard, lambda: self.medium.blob(shard.file, "shard"))
        except InvalidDump:
            if self.medium.version(shard.file) is None:  # not there: a follower's to delete?
                self._refuse_consumed(shard)
            raise
        if shard.bytes is not None and opened.size != shard.bytes:
            opened.close()
            raise InvalidDump(
                f"shard {self.path / shard.file} is {opened.size} bytes; the manifest says "
                f"{shard.bytes} (cut short or replaced)"
            )
        return opened

    def verify(self, shard: ShardEntry, progress: Callable[[int], None] | None = None) -> bool:
        """Whether a listed shard's bytes have the checksum its manifest records (CRC32C or
        SHA-256; read whole, a CHUNK at a time; True where none is recorded). A size that
        differs, a header that disagrees with the manifest or the file's size, or a file
        that is not there or not a regular file, raises InvalidDump (`blob`, `open`)."""
        blob = self.blob(shard)
        try:
            with self.open(shard, [], blob):
                pass
            buffer = bytearray(CHUNK)
            view = memoryview(buffer)

            def chunks() -> Iterator[memoryview]:
                offset = 0
                while offset < blob.size:
                    got = blob.readinto(view[: min(CHUNK, blob.size - offset)], offset)
                    if got <= 0:
                        raise InvalidDump(
                            f"shard {self.path / shard.file} ends at byte {offset} of {blob.size}"
                        )
                    yield view[:got]
                    offset += got

            algorithm = recorded(shard)
            if algorithm is None:  # a dump from before checksums: its size alone
                return True
            try:
                found = checksum_of(chunks(), algorithm, progress)
            except OSError as exc:
                raise InvalidDump(
                    f"cannot read shard {self.path / shard.file}: {exc.strerror or exc}"
                ) from None
        finally:
            blob.close()
        return matches(shard, found)

    def feature_stats(self) -> dict[str, dict[str, torch.Tensor]] | None:
        """Every key's per-feature statistics from the dump's `stats.safetensors` (None: the
        manifest lists none), checked against the size and SHA-256 the manifest records
        and the run id; read once."""
        if self._stats is not None:
            return self._stats
        entry = self.manifest.fields.get("feature_stats")
        if entry is None:
            return None
        where = f"{self.path / STATS_FILE}"
        if entry["bytes"] > MAX_STATS_BYTES:
            raise InvalidDump(f"{where}: the manifest says {entry['bytes']:,} bytes; refused")
        listed = ShardEntry.of_json({**entry, "start": 0, "stop": 0})
        blob = self.blob(listed)
        try:
            raw = blob.pread(entry["bytes"], 0)
        except OSError as exc:
            raise InvalidDump(f"cannot read {where}: {exc.strerror or exc}") from None
        finally:
            blob.close()
        if hashlib.sha256(raw).hexdigest() != listed.sha256:
            raise InvalidDump(f"{where} does not match the SHA-256 its manifest records")
        try:
            self._stats = read_stats_file(raw, self.manifest.run_id, where)
        except ValueError as exc:
            raise InvalidDump(str(exc)) from None
        return self._stats

    @contextlib.contextmanager
    def open(
        self, shard: ShardEntry, keys: list[str], blob: Blob | None = None
    ) -> Iterator[SafetensorsFile]:
        """A listed shard opened to read `keys` (from `blob`, its bytes opened already, if
        given: it stays open), its header checked first (once per shard): every key of the
        manifest is there, with the shard's rows and the manifest's per-sample shape and
        dtype, and the shard is of the manifest's run."""
        kept = blob is not None
        blob = blob if blob is not None else self.blob(shard)
        opened = self.guarded(shard, lambda: SafetensorsFile(blob))
        try:
            self._check_run(opened, shard)
            if self._check_headers and shard.file not in self._checked:
                self._check_header(opened, shard, self.keys())
                self._checked.add(shard.file)  # of this run: the run id is checked above
            for key in keys:
                self.check_key(key)
            yield opened
        finally:
            if not kept:
                opened.close()

    def read_rows(
        self,
        opened: SafetensorsFile,
        shard: ShardEntry,
        key: str,
        start: int,
        stop: int,
        inner: slice | None = None,
    ) -> torch.Tensor:
        """Rows `start:stop` (dump row numbers) of `key` from a shard `open` opened
        (`inner`: only that part of each row's first dimension), as a tensor of its own."""
        rows = slice(start - shard.start, stop - shard.start)
        index = rows if inner is None else (rows, inner)
        return self.guarded(shard, lambda: opened.get_slice(key)[index])

    def read_shard(self, shard: ShardEntry, keys: list[str]) -> dict[str, torch.Tensor]:
        """Every row of `keys` in `shard`."""
        with self.open(shard, keys) as f:
            return self.guarded(shard, lambda: {k: f.get_tensor(k) for k in keys})

    def guarded(self, shard: ShardEntry, read: Callable[[], T]) -> T:
        """`read()`, its I/O and memory failures made an InvalidDump naming `shard`."""
        try:
            return read()
        except (OSError, ValueError) as exc:  # ValueError: rows asked in steps (never)
            raise self._unreadable(shard, exc) from None
        except (MemoryError, RuntimeError) as exc:
            if not allocation_failed(exc):
                raise
            raise self._unreadable(shard, MemoryError()) from None

    def _check_run(self, opened: SafetensorsFile, shard: ShardEntry) -> None:
        """A shard of the run the manifest lists (another run's `--overwrite` may have
        replaced it since the manifest was read)."""
        run_id = self.manifest.run_id
        if run_id is None:  # a dump from before run ids
            return
        theirs = (opened.metadata() or {}).get("run_id")
        if theirs != run_id:
            raise InvalidDump(
                f"shard {self.path / shard.file} is not of the run its manifest lists "
                f"(run id {str(theirs)[:32]!r}, not {run_id!r}): the dump changed while it was "
                "read (another run wrote over it); open it again"
            )

    def _check_header(self, opened: SafetensorsFile, shard: ShardEntry, keys: list[str]) -> None:
        present = set(opened.keys())
        for key in keys:
            where = f"shard {self.path / shard.file}"
            if key not in present:
                raise InvalidDump(f"{where} has no tensor {key!r}, which the manifest lists")
            meta, part = self.manifest.tensors[key], opened.get_slice(key)
            want = [shard.rows, *meta["shape"]]
            shape, dtype = list(part.get_shape()), DTYPE_OF_SAFETENSORS.get(part.get_dtype())
            if shape != want or dtype != meta["dtype"]:
                raise InvalidDump(
                    f"{where}: {key!r} is {dtype} {shape}, but the manifest says "
                    f"{meta['dtype']} {want}"
                )

    def consumed(self) -> dict[str, str]:
        """The listed shards a follower consumed (deleted once given out: see
        `hookdump.follow`), each with the follower's name (`?` where only the run's
        manifest says so)."""
        listed = {shard.file for shard in self.manifest.shards}
        found = {f: "?" for f in self.manifest.fields.get("consumed", []) if f in listed}
        by = consumed_shards(self.medium)
        found.update((f, who) for f, who in by.items() if f in listed)
        return found

    def _refuse_consumed(self, shard: ShardEntry) -> None:
        who = self.consumed().get(shard.file)
        if who is not None:
            by = "a follower" if who == "?" else f"the follower {who!r}"
            raise InvalidDump(
                f"shard {self.path / shard.file} (rows {shard.start}:{shard.stop}) was "
                f"consumed by {by} (hookdump.follow with consume=True): its rows were deleted "
                "once given out, and are not in the dump"
            )

    def _unreadable(self, shard: ShardEntry, exc: BaseException) -> InvalidDump:
        where = self.path / shard.file
        if isinstance(exc, MemoryError):
            return InvalidDump(
                f"cannot read shard {where}: out of memory (its rows claim "
                f"{self.row_bytes(self.keys()) * shard.rows:,} bytes); "
                "read it in batches with Dump.batches or row by row with Dump.row"
            )
        return InvalidDump(f"cannot read shard {where}: {str(exc)[:200]}")
