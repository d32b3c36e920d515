"""Reading dumps: `hookdump.load(DIR)` gives every key's rows across shards, in sample order."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import torch

from hookdump.errors import HookdumpError, InvalidDump, keywords_checked, printable
from hookdump.format.dtypes import DTYPE_OF_SAFETENSORS
from hookdump.format.keys import KeyInfo, parse_key
from hookdump.format.manifest import FORMAT, Manifest
from hookdump.format.names import EXPORT_MARKER, MANIFEST
from hookdump.format.values import format_bytes
from hookdump.store.features import FIELDS
from hookdump.store.location import UrlPath
from hookdump.store.media import Medium, open_medium
from hookdump.store.read.batches import BUFFER_BYTES, PassOptions, as_keys, iter_batches
from hookdump.store.read.dataset import DumpDataset, KeysPass
from hookdump.store.read.manifest import manifest_at
from hookdump.store.read.reader import ShardReader, allocation_failed
from hookdump.store.read.shard_file import SafetensorsFile

REPR_KEYS = 12  # the keys a Dump's repr lists


class Dump(Mapping[str, torch.Tensor]):
    """A dump on disk, read lazily: only the shards a key needs are opened. A read-only
    mapping of key -> every sample of that key as one tensor (`keys`, `items`, `values`,
    `get`, `in`, `len`); `items()` and `values()` read one key at a time.

    The manifest is checked when the dump is opened, and each shard when it is read (a
    regular file inside the folder whose header agrees with the manifest); anything wrong
    is an `InvalidDump`.

    Attributes:
        path: the dump folder.
        manifest: the checked manifest, a read-only record (`complete`, `num_samples`,
            `shards`, ...) that also gives every field of the JSON by name
            (`dump.manifest["input"]`: what made the dump).
        reader: the `ShardReader` the tools read shards through.

    Example:
        >>> dump = hookdump.load("acts/")
        >>> dump.keys()[:2], dump.num_samples
        (['layer1.0.conv1', 'layer1.0.bn1'], 8)
        >>> dump["layer1.0.conv1"].shape           # every sample, in order
        torch.Size([8, 64, 56, 56])
        >>> dump.row("layer1.0.conv1", 3).shape    # one, from the one shard holding it
        torch.Size([64, 56, 56])
    """

    def __init__(
        self,
        path: str | os.PathLike[str] | ShardReader,
        storage_options: Mapping[str, Any] | None = None,
    ) -> None:
        if isinstance(path, ShardReader):  # a reader made already (a torchrun rank's part)
            self.reader = path
        else:
            self.reader = _open(open_medium(path, storage_options, strict=False))
        self.path, self.manifest = self.reader.path, self.reader.manifest

    @property
    def complete(self) -> bool:
        return self.manifest.complete

    @property
    def num_samples(self) -> int:
        """The rows of every key (token rows, for a `--per-token` dump)."""
        return self.manifest.num_samples

    def keys(self) -> list[str]:  # type: ignore[override]
        """The keys in forward order (a list: `dump.keys()[0]` is the first module's)."""
        return self.reader.keys()

    @property
    def sample_ids(self) -> list[Any]:
        """The samples' ids in row order (with token rows: the sequences'): file paths,
        row numbers, or the ids given to `hookdump.dump`."""
        ids = self.manifest.sample_ids
        return list(ids) if ids is not None else list(range(self.manifest.samples_fed))

    @property
    def consumed(self) -> dict[str, str]:
        """The shards a follower consumed (`hookdump.follow(..., consume=True)` deletes
        each once its rows were given out), each with the follower's name (`?` where only
        the run's manifest says so): their rows cannot be read."""
        return self.reader.consumed()

    def info(self, key: str) -> KeyInfo:
        """Where `key` came from (module, class, kind, call, part), its per-sample shape and
        dtype, and its rows in this dump (`info.nbytes`: the bytes they take)."""
        return self.reader.info(key)

    __eq__ = object.__eq__  # not Mapping's, which would read and compare every tensor
    __hash__ = object.__hash__

    def __contains__(self, key: object) -> bool:
        return key in self.reader

    def __iter__(self) -> Iterator[str]:
        return iter(self.manifest.tensors)

    def __len__(self) -> int:
        return len(self.manifest.tensors)

    def __getitem__(self, key: str) -> torch.Tensor:
        """All samples of `key`, in order, as one tensor `[num_samples, *shape]`."""
        self.reader.check_key(key)
        parts = [self.reader.read_shard(shard, [key])[key] for shard in self.manifest.shards]
        if len(parts) == 1:
            return parts[0]
        try:
            return torch.cat(parts)
        except (MemoryError, RuntimeError) as exc:
            if not allocation_failed(exc):
                raise
            whole = self.reader.row_bytes([key]) * self.reader.rows_of(key)
            raise InvalidDump(
                f"{key!r} of {self.path} does not fit in memory whole ({whole:,} bytes); read "
                "it in batches with Dump.batches or row by row with Dump.row"
            ) from None

    def stats(self, key: str) -> dict[str, torch.Tensor]:
        """Per-feature statistics of `key`, made while it was written (merged across
        batches, torchrun's ranks and resumed runs): one value per feature (the last
        dimension, or the channel of a `[C, H, W]` sample; a per-head attention key's
        (`q`, `k`, `v`, `z`, `q_pre_rope`, `k_pre_rope`) heads times their dimensions,
        head-major: `.view(heads, head_dim)` gives them per head) of `count` (finite values),
        `mean`, `var` (over the count, not count - 1), `std`, `min` and `max`, and the
        mean L2 norm of a row, `norm_mean`, over `rows` rows. Token rows: real tokens only.

        Example:
            >>> stats = hookdump.load("acts/").stats("transformer.h.5")
            >>> scale = stats["mean"].numel() ** 0.5 / stats["norm_mean"]  # SAELens' factor
        """
        self.reader.check_key(key)
        found = self.reader.feature_stats()
        if found is None:
            raise HookdumpError(
                f"{self.path} has no per-feature statistics (it was made before hookdump "
                "wrote them, or holds no floating-point key); compute them from "
                f"Dump.batches, or make the dump again"
            )
        if key not in found:
            raise HookdumpError(
                f"{key!r} of {self.path} has no per-feature statistics: only floating-point "
                "keys read as whole rows have them"
            )
        kept = dict(found[key])
        seen = kept["count"] > 0  # none finite: no mean, min or max (older dumps wrote 0, inf)
        for field in ("mean", "var", "min", "max"):
            kept[field] = torch.where(seen, kept[field].double(), torch.nan)
        kept["std"] = kept["var"].sqrt()
        return {field: kept[field] for field in (*FIELDS[:3], "std", *FIELDS[3:])}

    def row(self, key: str, index: int) -> torch.Tensor:
        """Sample `index` of `key`, read from the one shard that holds it."""
        reader = self.reader
        reader.check_key(key)
        if not 0 <= index < reader.rows_of(key):
            raise IndexError(
                f"row {index} of {key!r} is not in {self.path} ({reader.rows_of(key)})"
            )
        shard = reader.shard_of(index)
        with reader.open(shard, [key]) as f:
            return reader.read_rows(f, shard, key, index, index + 1)[0]

    @keywords_checked
    def batches(
        self,
        keys: list[str] | str,
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
            keys: the keys to read (a list, or one key as a string); row i of each is the
                same sample (or token).
            batch_size: rows per batch.
            shuffle: rows in an order drawn from the whole dump, fixed by `seed`: blocks of
                about 8 MiB of `keys` read in a random order across all shards, their rows
                mixed in buffers of half `buffer_bytes` (see `hookdump.store.read.batches`).
                Without it, rows come in order.
            seed: fixes the shuffled order.
            with_index: add `__row__`, each row's number in the dump (for sample ids,
                labels, `__sample__`).
            drop_last: leave out the last batch when it is short.
            start: begin at this batch of the pass (resuming: the same order, the batches
                before it not read).
            buffer_bytes: the memory budget: two buffers of half of it, one given out while
                the next is read (rows are mixed a buffer at a time); a pass holds at most
                it and the batches you keep (in order, a few batches). The batches' memory
                is kept for this Dump's next pass.

        Example:
            >>> for batch in hookdump.load("acts/").batches(["layer4"], 256, shuffle=True):
            ...     train_step(batch["layer4"])
        """
        options = PassOptions(batch_size, shuffle, seed, with_index, drop_last, start, buffer_bytes)
        return iter_batches(self.reader, as_keys(keys), options)

    @keywords_checked
    def dataset(
        self,
        keys: list[str] | str,
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
        `hookdump.store.read.dataset`); use it with `DataLoader(ds, batch_size=None,
        num_workers=N, pin_memory=True)`. `start` counts this rank's batches.
        """
        options = PassOptions(batch_size, shuffle, seed, with_index, drop_last, start, buffer_bytes)
        return DumpDataset(KeysPass(self.reader, list(as_keys(keys))), options, rank, world_size)

    def __repr__(self) -> str:
        """The summary in short: the dump, then a line per key (the first REPR_KEYS)."""
        state = "" if self.complete else ", incomplete"
        manifest = self.manifest
        rows = f"{self.num_samples} samples"
        if manifest.token_rows:
            rows = f"{self.num_samples} token rows from {manifest.samples_fed} sequences"
        elif manifest.get("lone_file", {}).get("kind") == "safetensors":
            rows = f"{self.num_samples} rows (a safetensors file, not a dump)"
        gone = self.consumed
        if gone:
            gone_rows = sum(s.rows for s in manifest.shards if s.file in gone)
            state += f", {len(gone)} shards ({gone_rows} rows) consumed by a follower"
        head = f"Dump({str(self.path)!r}, {len(self)} keys, {rows}{state})"
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


def _open(medium: Medium) -> ShardReader:
    """The reader of the dump in `medium` (its manifest read now, its shards when asked), or
    of one safetensors file read as a dump."""
    lone = medium.lone_entry()
    if lone is not None:
        return _open_file(*lone)
    if not medium.exists():
        raise HookdumpError(
            f"{medium.root} does not exist; give a dump folder or a .safetensors file"
        )

    def missing(root: Path | UrlPath) -> HookdumpError:
        return _not_an_export(medium) or _no_manifest(root)

    return ShardReader(medium, manifest_at(medium, missing))


def _open_file(medium: Medium, name: str) -> ShardReader:
    """The reader of entry `name`, one safetensors file, as a dump of its keys."""
    if not name.endswith(".safetensors"):
        raise HookdumpError(f"{medium.root / name} is not a dump folder or a .safetensors file")
    manifest, rows = _manifest_of_file(medium, name)
    ragged = rows if len(set(rows.values())) > 1 else None  # a weights file, say
    # the manifest was made from this very header: nothing to check it against
    return ShardReader(medium, manifest, check_headers=False, key_rows=ragged)


# how each export opens, as `hookdump export --to FORMAT` writes it (see tools.export)
_OPEN_EXPORT = {
    "hf": "datasets.load_from_disk({path!r})",
    "saelens": "SAELens, with cached_activations_path={path!r}",
    "npy": "numpy.load on its .npy files (index.json names each key's file)",
}


def _not_an_export(medium: Medium) -> HookdumpError | None:
    """A folder `hookdump export` wrote, said so, with how to open it (None: not one)."""
    try:
        marker = medium.read(EXPORT_MARKER, most=1_000_000)
    except HookdumpError:  # not a plain file: no export's
        return None
    if marker is None:
        return None
    try:
        written = json.loads(marker).get("format")
    except (ValueError, AttributeError, RecursionError):
        written = None
    path = medium.root
    how = _OPEN_EXPORT.get(written) if isinstance(written, str) else None
    made = f"to {written} " if how else ""
    opened = f"; open it with {how.format(path=str(path))}" if how else ""
    return HookdumpError(
        f"{path} is an export of a dump {made}(it holds {EXPORT_MARKER}), not a dump{opened}; "
        "hookdump reads the dump it was exported from"
    )


def _no_manifest(where: Path | UrlPath) -> HookdumpError:
    return HookdumpError(
        f"{where} has no {MANIFEST}: not a dump, or its run stopped before its first shard"
    )


@keywords_checked
def load(path: str | os.PathLike[str], storage_options: Mapping[str, Any] | None = None) -> Dump:
    """Open a dump: its manifest now, its tensors when asked for.

    Args:
        path: a dump folder (holding `manifest.json`), one `.safetensors` file (a shard,
            or any safetensors file: its rows count from 0), or a dump's URL
            (`s3://bucket/prefix`, any fsspec protocol).
        storage_options: fsspec options for a URL (credentials and endpoint otherwise come
            from the client's own environment and config).

    Returns:
        A `Dump`; `dump[key]` is every sample of `key` as one tensor.

    Raises:
        HookdumpError: the path is not a dump. InvalidDump (a HookdumpError): the manifest
            or a shard is malformed or unsafe (a shard outside the folder, not a regular
            file, or unlike the manifest), with a message naming the entry.
    """
    return Dump(path, storage_options)


def _manifest_of_file(medium: Medium, name: str) -> tuple[Manifest, dict[str, int]]:
    """A manifest for a lone safetensors file (keys parsed, rows from dim 0: the most any
    key has), and each key's rows."""
    path = medium.root / name
    try:
        with SafetensorsFile(medium.blob(name, "file")) as f:
            shapes = {k: f.get_slice(k).get_shape() for k in f.keys()}  # noqa: SIM118
            dtypes = {k: f.get_slice(k).get_dtype() for k in f.keys()}  # noqa: SIM118
            meta = f.metadata() or {}
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
        "shards": [{"file": name, "start": 0, "stop": num_rows}],
        # not a dump: one file, a shard of a dump or any safetensors file (weights, say)
        "lone_file": {
            "kind": "shard" if meta.get("format") == FORMAT else "safetensors",
            "shapes": {key: list(shape) for key, shape in shapes.items()},
        },
    }
    return Manifest.of_checked(manifest), rows
