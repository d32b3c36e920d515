"""Reading dumps: `hookdump.load(DIR)` gives every key's rows across shards, in sample order."""

from __future__ import annotations

import bisect
import contextlib
import json
import math
import os
import stat
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import torch

from hookdump.errors import HookdumpError, InvalidDump, did_you_mean, printable
from hookdump.format import (
    DTYPE_OF_SAFETENSORS,
    FORMAT,
    ITEMSIZE,
    MANIFEST,
    KeyInfo,
    format_bytes,
    parse_key,
    samples_fed,
    validate_manifest,
)
from hookdump.store.batches import BUFFER_BYTES, PassOptions, iter_batches
from hookdump.store.dataset import DumpDataset
from hookdump.store.folder import inside
from hookdump.store.safetensors_file import SafetensorsFile
from hookdump.store.view import SLICE_BYTES, rows_per_slice

MAX_MANIFEST_BYTES = 1 << 30
# what parsing a manifest may build, whatever its bytes: JSON's small objects cost 20 to 70
# times their text, so the values (commas) and containers are counted before the parse
MAX_MANIFEST_VALUES = 32_000_000
MAX_MANIFEST_CONTAINERS = 4_000_000
REPR_KEYS = 12  # the keys a Dump's repr lists


def read_manifest(path: Path) -> dict[str, Any]:
    """Read and check a manifest: a regular file inside its folder (never a FIFO, a device
    or a link out of the folder), of sane size, holding a valid manifest."""
    _inside(path, path.parent, "manifest")
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        raise InvalidDump(f"cannot read {path}: {exc.strerror or exc}") from None
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode):  # before fdopen, which refuses a folder on its own
        os.close(fd)
        raise InvalidDump(f"{path} is not a regular file; refused")
    with os.fdopen(fd, "rb") as file:
        if info.st_size > MAX_MANIFEST_BYTES:
            raise InvalidDump(f"{path} is {info.st_size} bytes, too large for a manifest")
        data = file.read(info.st_size + 1)  # never a buffer of the largest size allowed
    values = data.count(b",") + 1
    containers = data.count(b"{") + data.count(b"[")
    if values > MAX_MANIFEST_VALUES or containers > MAX_MANIFEST_CONTAINERS:
        raise InvalidDump(
            f"{path} holds {values:,} values and {containers:,} objects and lists, more than "
            f"a manifest may ({MAX_MANIFEST_VALUES:,} and {MAX_MANIFEST_CONTAINERS:,}); refused"
        )
    try:
        parsed = json.loads(data)
    except (ValueError, RecursionError, MemoryError) as exc:
        reason = "out of memory" if isinstance(exc, MemoryError) else str(exc)[:200]
        raise InvalidDump(f"{path} is not readable JSON: {reason}") from None
    return validate_manifest(parsed, str(path))


def _allocation_failed(exc: BaseException) -> bool:
    """Whether `exc` is memory that could not be had: Python's, or torch's allocator or
    file mapping ("... can't allocate memory", "... Cannot allocate memory")."""
    return isinstance(exc, MemoryError) or "allocate" in str(exc)


def _inside(path: Path, folder: Path, what: str) -> str:
    """`path` resolved, if it stays inside `folder` (symlinks followed); else InvalidDump
    (naming only the entry, never where it points)."""
    real = os.path.realpath(path)
    if not inside(real, os.path.realpath(folder)):
        raise InvalidDump(
            f"{what} {path.name!r} of {folder} resolves outside the dump folder; refused"
        )
    return real


class Dump(Mapping[str, torch.Tensor]):
    """A dump on disk, read lazily: only the shards a key needs are opened. A read-only
    mapping of key -> every sample of that key as one tensor (`keys`, `items`, `values`,
    `get`, `in`, `len`); `items()` and `values()` read one key at a time.

    The manifest is checked when the dump is opened, and each shard when it is read (a
    regular file inside the folder whose header agrees with the manifest); anything wrong
    is an `InvalidDump`.

    Attributes:
        path: the dump folder.
        manifest: the checked manifest (`format`, `complete`, `num_samples`, `tensors`,
            `shards`, and what reproduces the dump).

    Example:
        >>> dump = hookdump.load("acts/")
        >>> dump.keys()[:2], dump.num_samples
        (['layer1.0.conv1', 'layer1.0.bn1'], 8)
        >>> dump["layer1.0.conv1"].shape           # every sample, in order
        torch.Size([8, 64, 56, 56])
        >>> dump.row("layer1.0.conv1", 3).shape    # one, from the one shard holding it
        torch.Size([64, 56, 56])
    """

    def __init__(self, path: str | Path) -> None:
        path = Path(path)
        self._headers_checked = True
        self._checked: set[str] = set()  # shard files whose header agreed with the manifest
        self._key_rows: dict[str, int] = {}
        if path.is_file() and path.suffix == ".safetensors":
            path = path.resolve()  # the file the user named, wherever a link to it points
            self.path = path.parent
            self.manifest: dict[str, Any]
            self.manifest, rows = _manifest_of_file(path)
            self._headers_checked = False  # the manifest was made from this very header
            if len(set(rows.values())) > 1:  # a weights file, say: each key its own rows
                self._key_rows = rows
            return
        self.path = path
        if not path.exists():
            raise HookdumpError(f"{path} does not exist; give a dump folder or a .safetensors file")
        if not path.is_dir():
            raise HookdumpError(f"{path} is not a dump folder or a .safetensors file")
        if not os.path.lexists(path / MANIFEST):
            raise HookdumpError(
                f"{path} has no {MANIFEST}: not a dump, or its run stopped before its first shard"
            )
        self.manifest = read_manifest(path / MANIFEST)

    @classmethod
    def of_manifest(cls, folder: Path, manifest: dict[str, Any]) -> Dump:
        """The dump in `folder` as `manifest` (already checked) describes it (a torchrun
        rank's own part)."""
        dump = cls.__new__(cls)
        dump.path, dump.manifest, dump._headers_checked = folder, manifest, True
        dump._key_rows, dump._checked = {}, set()
        return dump

    @property
    def complete(self) -> bool:
        return bool(self.manifest.get("complete"))

    @property
    def num_samples(self) -> int:
        return int(self.manifest["num_samples"])

    @property
    def tensors(self) -> dict[str, dict[str, Any]]:
        """Per-key metadata from the manifest (module, kind, call, per-sample shape, dtype)."""
        return self.manifest["tensors"]

    def keys(self) -> list[str]:  # type: ignore[override]
        """The keys in forward order (a list: `dump.keys()[0]` is the first module's)."""
        return list(self.tensors)

    @property
    def sample_ids(self) -> list[Any]:
        """The samples' ids in row order (with token rows: the sequences'): file paths,
        row numbers, or the ids given to `hookdump.dump`."""
        ids = self.manifest.get("sample_ids")
        return list(ids) if ids is not None else list(range(samples_fed(self.manifest)))

    def info(self, key: str) -> KeyInfo:
        """Where `key` came from (module, class, kind, call, part), its per-sample shape and
        dtype, and its rows in this dump (`info.nbytes`: the bytes they take)."""
        if key not in self.tensors:
            raise KeyError(f"{key!r} is not in {self.path}{did_you_mean(key, self.tensors)}")
        meta = self.tensors[key]
        return KeyInfo(
            key, meta["module"], meta.get("module_type") or "-", meta["kind"],
            int(meta.get("call", 0)), meta.get("part"), tuple(meta["shape"]),
            getattr(torch, meta["dtype"]), self.rows_of(key),
        )  # fmt: skip

    __eq__ = object.__eq__  # not Mapping's, which would read and compare every tensor
    __hash__ = object.__hash__

    @property
    def ragged(self) -> bool:
        """A lone safetensors file whose tensors have different numbers of rows (a weights
        file): rows of different keys are not the same samples."""
        return bool(self._key_rows)

    def rows_of(self, key: str) -> int:
        """The rows `key` has (`num_samples`, but for a ragged file)."""
        return self._key_rows.get(key, self.num_samples)

    def __contains__(self, key: object) -> bool:
        return key in self.tensors

    def __iter__(self) -> Iterator[str]:
        return iter(self.tensors)

    def __len__(self) -> int:
        return len(self.tensors)

    def __getitem__(self, key: str) -> torch.Tensor:
        """All samples of `key`, in order, as one tensor `[num_samples, *shape]`."""
        if key not in self.tensors:
            raise KeyError(f"{key!r} is not in {self.path}{did_you_mean(key, self.tensors)}")
        parts = [shard[key] for shard in self.iter_shards(keys=[key])]
        if len(parts) == 1:
            return parts[0]
        try:
            return torch.cat(parts)
        except (MemoryError, RuntimeError) as exc:
            if not _allocation_failed(exc):
                raise
            whole = self.row_bytes([key]) * self.rows_of(key)
            raise InvalidDump(
                f"{key!r} of {self.path} does not fit in memory whole ({whole:,} bytes); read "
                "it in batches with Dump.batches or row by row with Dump.row"
            ) from None

    def row(self, key: str, index: int) -> torch.Tensor:
        """Sample `index` of `key`, read from the one shard that holds it."""
        if key not in self.tensors:
            raise KeyError(f"{key!r} is not in {self.path}{did_you_mean(key, self.tensors)}")
        if not 0 <= index < self.rows_of(key):
            raise IndexError(f"row {index} of {key!r} is not in {self.path} ({self.rows_of(key)})")
        shard = self.shard_of(index)
        with self.open_shard(shard, [key]) as f:
            return self.read_rows(f, shard, key, index, index + 1)[0]

    def shard_of(self, index: int) -> dict[str, Any]:
        """The shard holding row `index` (found by bisection: shards follow each other)."""
        return self.shards[bisect.bisect_right(self.shards, index, key=lambda s: s["stop"])]

    def row_bytes(self, keys: list[str]) -> int:
        """The bytes of one row of each of `keys`, as the manifest gives them."""
        return sum(
            math.prod(self.tensors[key]["shape"]) * ITEMSIZE.get(self.tensors[key]["dtype"], 8)
            for key in keys
        )

    def slices(
        self, shard: dict[str, Any], keys: list[str], budget: int = SLICE_BYTES
    ) -> Iterator[tuple[int, int]]:
        """Row ranges (dump row numbers) that cover `shard`, each holding at most `budget`
        bytes of `keys` (and `SLICE_ROWS` rows), at least one row: how a reader reads a
        shard in bounded memory whatever its header claims."""
        step = rows_per_slice(self.row_bytes(keys), budget)
        for start in range(shard["start"], shard["stop"], step):
            yield start, min(start + step, shard["stop"])

    def batches(
        self,
        keys: list[str],
        batch_size: int,
        *,
        shuffle: bool = False,
        seed: int = 0,
        with_index: bool = False,
        drop_last: bool = False,
        start: int = 0,
        buffer_bytes: int = BUFFER_BYTES,
    ) -> Iterator[dict[str, torch.Tensor]]:
        """Every row of `keys` once per pass, in batches of `batch_size` (the last may be
        smaller), as dicts of aligned tensors: for training probes or sparse autoencoders.

        Args:
            keys: the keys to read; row i of each is the same sample (or token).
            batch_size: rows per batch.
            shuffle: rows in an order drawn from the whole dump, fixed by `seed`: blocks of
                about 8 MiB of `keys` read in a random order across all shards, their rows
                mixed in buffers of half `buffer_bytes` (see `hookdump.store.batches`).
                Without it, rows come in order.
            seed: fixes the shuffled order.
            with_index: add `__row__`, each row's number in the dump (for sample ids,
                labels, `__sample__`).
            drop_last: leave out the last batch when it is short.
            start: begin at this batch of the pass (resuming: the same order, the batches
                before it not read).
            buffer_bytes: the memory budget: two buffers of half of it, one given out while
                the next is read (rows are mixed a buffer at a time).

        Example:
            >>> for batch in hookdump.load("acts/").batches(["layer4"], 256, shuffle=True):
            ...     train_step(batch["layer4"])
        """
        options = PassOptions(batch_size, shuffle, seed, with_index, drop_last, start,
                              buffer_bytes)  # fmt: skip
        return iter_batches(self, keys, options)

    def dataset(
        self,
        keys: list[str],
        batch_size: int,
        *,
        shuffle: bool = False,
        seed: int = 0,
        with_index: bool = False,
        drop_last: bool = False,
        start: int = 0,
        buffer_bytes: int = BUFFER_BYTES,
        rank: int | None = None,
        world_size: int | None = None,
    ) -> DumpDataset:
        """`batches` as a `torch.utils.data.IterableDataset` whose DataLoader workers and
        torch.distributed ranks together give every row once (see
        `hookdump.store.dataset`); use it with `DataLoader(ds, batch_size=None,
        num_workers=N, pin_memory=True)`. `start` counts this rank's batches.
        """
        options = PassOptions(batch_size, shuffle, seed, with_index, drop_last, start,
                              buffer_bytes)  # fmt: skip
        return DumpDataset(self, keys, options, rank, world_size)

    @property
    def shards(self) -> list[dict[str, Any]]:
        """The shard files with their `start`/`stop` rows, in sample order."""
        return self.manifest["shards"]

    def iter_shards(self, keys: list[str] | None = None) -> Iterator[dict[str, torch.Tensor]]:
        """Each shard's tensors (or only `keys`), in sample order."""
        wanted = keys or self.keys()
        for shard in self.shards:
            with self.open_shard(shard, wanted) as f:
                tensors = self._read(shard, lambda f=f: {k: f.get_tensor(k) for k in wanted})
            yield tensors

    def shard_path(self, shard: dict[str, Any]) -> str:
        """The file of a listed shard, once it is known to be a regular file in the dump."""
        path = self.path / shard["file"]
        real = _inside(path, self.path, "shard")
        try:
            mode = os.stat(real).st_mode
        except OSError as exc:
            raise InvalidDump(f"cannot read shard {path}: {exc.strerror or exc}") from None
        if not stat.S_ISREG(mode):
            raise InvalidDump(f"shard {path} is not a regular file; refused")
        return real

    @contextlib.contextmanager
    def open_shard(self, shard: dict[str, Any], keys: list[str]) -> Iterator[Any]:
        """A listed shard opened (`SafetensorsFile`, to read `keys`), its header checked
        first: every key of the manifest is there, with the shard's rows and the manifest's
        per-sample shape and dtype."""
        path = self.shard_path(shard)
        opened = self._read(shard, lambda: SafetensorsFile(path))  # read with pread, unmapped
        try:
            self._check_run(opened, shard)
            if self._headers_checked and shard["file"] not in self._checked:
                self._check_header(opened, shard, self.keys())
                self._checked.add(shard["file"])  # of this run: the run id is checked above
            unknown = [key for key in keys if key not in self.tensors]
            if unknown:
                raise KeyError(f"{unknown[0]!r} is not in {self.path}")
            yield opened
        finally:
            opened.close()

    def _check_run(self, opened: Any, shard: dict[str, Any]) -> None:
        """A shard of the run the manifest lists (another run's `--overwrite` may have
        replaced it since the manifest was read)."""
        run_id = self.manifest.get("run_id")
        if run_id is None:  # a dump from before run ids
            return
        theirs = (opened.metadata() or {}).get("run_id")
        if theirs != run_id:
            raise InvalidDump(
                f"shard {self.path / shard['file']} is not of the run its manifest lists "
                f"(run id {str(theirs)[:32]!r}, not {run_id!r}): the dump changed while it was "
                "read (another run wrote over it); open it again"
            )

    def _check_header(self, opened: Any, shard: dict[str, Any], keys: list[str]) -> None:
        present = set(opened.keys())
        rows = shard["stop"] - shard["start"]
        for key in keys:
            where = f"shard {self.path / shard['file']}"
            if key not in present:
                raise InvalidDump(f"{where} has no tensor {key!r}, which the manifest lists")
            meta, part = self.tensors[key], opened.get_slice(key)
            want = [rows, *meta["shape"]]
            shape, dtype = list(part.get_shape()), DTYPE_OF_SAFETENSORS.get(part.get_dtype())
            if shape != want or dtype != meta["dtype"]:
                raise InvalidDump(
                    f"{where}: {key!r} is {dtype} {shape}, but the manifest says "
                    f"{meta['dtype']} {want}"
                )

    def read_rows(
        self,
        opened: Any,
        shard: dict[str, Any],
        key: str,
        start: int,
        stop: int,
        inner: slice | None = None,
    ) -> torch.Tensor:
        """Rows `start:stop` (dump row numbers) of `key` from a shard `open_shard` opened
        (`inner`: only that part of each row's first dimension), as a tensor of its own:
        read with pread, never a map of the shard."""
        rows = slice(start - shard["start"], stop - shard["start"])
        index = rows if inner is None else (rows, inner)
        return self._read(shard, lambda: opened.get_slice(key)[index])

    def _read(self, shard: dict[str, Any], read: Any) -> Any:
        try:
            return read()
        except (OSError, ValueError) as exc:  # ValueError: rows asked in steps (never)
            raise self._unreadable(shard, exc) from None
        except (MemoryError, RuntimeError) as exc:
            if not _allocation_failed(exc):
                raise
            raise self._unreadable(shard, MemoryError()) from None

    def _unreadable(self, shard: dict[str, Any], exc: BaseException) -> InvalidDump:
        where = self.path / shard["file"]
        if isinstance(exc, MemoryError):
            return InvalidDump(
                f"cannot read shard {where}: out of memory (its rows claim "
                f"{self.row_bytes(self.keys()) * (shard['stop'] - shard['start']):,} bytes); "
                "read it in batches with Dump.batches or row by row with Dump.row"
            )
        return InvalidDump(f"cannot read shard {where}: {str(exc)[:200]}")

    def __repr__(self) -> str:
        """The summary in short: the dump, then a line per key (the first REPR_KEYS)."""
        state = "" if self.complete else ", incomplete"
        head = f"Dump({str(self.path)!r}, {len(self)} keys, {self.num_samples} samples{state})"
        infos = [self.info(key) for key in self.keys()[:REPR_KEYS]]
        width = max((len(printable(i.key)) for i in infos), default=0)
        lines = [  # names escaped: a key cannot retitle the terminal a repr is printed to
            f"  {printable(i.key):<{width}}  {printable(i.module_type):<12} {i.kind:<11} "
            f"{list(i.shape)!s:<16} {str(i.dtype).removeprefix('torch.'):<8} "
            f"{format_bytes(i.nbytes or 0):>10}"
            for i in infos
        ]
        if len(self) > REPR_KEYS:
            lines.append(f"  ... {len(self) - REPR_KEYS} more keys")
        return "\n".join([head, *lines])


def load(path: str | Path) -> Dump:
    """Open a dump: its manifest now, its tensors when asked for.

    Args:
        path: a dump folder (holding `manifest.json`) or one `.safetensors` file (a shard,
            or any safetensors file: its rows count from 0).

    Returns:
        A `Dump`; `dump[key]` is every sample of `key` as one tensor.

    Raises:
        HookdumpError: the path is not a dump. InvalidDump (a HookdumpError): the manifest
            or a shard is malformed or unsafe (a shard outside the folder, not a regular
            file, or unlike the manifest), with a message naming the entry.
    """
    return Dump(path)


def _manifest_of_file(path: Path) -> tuple[dict[str, Any], dict[str, int]]:
    """A manifest for a lone safetensors file (keys parsed, rows from dim 0: the most any
    key has), and each key's rows."""
    try:
        with SafetensorsFile(str(path)) as f:
            shapes = {k: f.get_slice(k).get_shape() for k in f.keys()}  # noqa: SIM118
            dtypes = {k: f.get_slice(k).get_dtype() for k in f.keys()}  # noqa: SIM118
    except OSError as exc:
        raise HookdumpError(f"cannot read {path} as safetensors: {exc}") from None
    # its metadata's start/stop are another dump's row numbers: a lone file's rows start at 0
    rows = {key: shape[0] if shape else 0 for key, shape in shapes.items()}
    num_rows = max(rows.values(), default=0)
    tensors = {}
    for key, shape in shapes.items():
        module, kind, part, call = parse_key(key)
        tensors[key] = {
            "module": module,
            "module_type": None,
            "kind": kind,
            "call": call,
            "part": part,
            "shape": list(shape[1:]),
            "dtype": DTYPE_OF_SAFETENSORS.get(dtypes[key], str(dtypes[key]).lower()),
        }
    manifest = {
        "format": FORMAT,
        "complete": True,
        "num_samples": num_rows,
        "tensors": tensors,
        "shards": [{"file": path.name, "start": 0, "stop": num_rows}],
    }
    return manifest, rows
