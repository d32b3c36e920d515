"""`hookdump export` and `hookdump.export`: a dump rewritten in a format other tools read.

- `hf`: a Hugging Face `datasets` folder (`datasets.load_from_disk` reads it): a row per
  dump row, a column per key (a fixed-shape array), and `__sample_id__`, the row's sample id
  as a string (for token rows, its sequence's);
- `saelens`: the layout SAELens' cached-activations path reads (`cached_activations_path`):
  a `datasets` folder with a row per sequence, the `[context_size, d_in]` activations of one
  key under the hook's name, and `token_ids` (int32). Only a dump of token rows whose every
  sequence gives the same number of consecutive tokens fits (a packed `--per-token` dump);
- `npy`: one `.npy` file per key (`numpy.load(mmap_mode="r")` maps it), `index.json` naming
  each key's file, and `sample_ids.json`.

Each carries the exported keys' per-feature statistics, where the dump has them, as the
dump holds them (`stats.safetensors`, under the names written), and the marker file names
each key's mean row norm and SAELens' norm scaling factor.

Rows are read in order a chunk at a time (`Dump.batches`) and written as they come: memory
holds a chunk, never a key or a shard. Everything is written into a temporary folder beside
`out`, renamed into place when complete: an interrupted export leaves no half folder, and
`overwrite` replaces a previous export only once the new one is whole. A format without
bfloat16 (arrow, numpy) gets float32, and the result says so.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import math
import os
import re
import shutil
import uuid
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from fnmatch import fnmatchcase
from pathlib import Path
from typing import Any

import numpy as np
import torch

from hookdump.choices import ExportTarget, parse_export_target
from hookdump.errors import HookdumpError, did_you_mean, keywords_checked, opt, printable
from hookdump.format.keys import POSITION, RESPONSE, SAMPLE, TOKEN_IDS, TOKEN_KEYS
from hookdump.format.names import EXPORT_MARKER, STATS_FILE
from hookdump.store.features import stats_file
from hookdump.store.folder import allocate, inside
from hookdump.store.read.dump import Dump
from hookdump.store.write.direct_io import pwrite_all
from hookdump.tools.routing import routing_keys, write_routing

MARKER = EXPORT_MARKER  # in every export: what `overwrite` may replace
CHUNK_BYTES = 64 << 20  # rows read and written at a time, at most
CHUNK_ROWS = 1 << 20
ARROW_FILE_BYTES = 512 << 20  # a `datasets` folder's arrow files are about this large
SAMPLE_ID = "__sample_id__"
MAX_CONTEXT = 1 << 17  # token rows of one saelens sequence, at most
MAX_NAME = 200  # characters of a key kept in its file's name (with room for `-N.npy`)
WIDENED = {"bfloat16": "float32"}  # dtypes arrow and numpy lack, and what they become


@dataclass
class ExportResult:
    """What an export wrote."""

    out: Path
    to: ExportTarget
    rows: int  # rows written: the dump's, or sequences for `saelens`
    keys: list[str]
    notes: list[str] = field(default_factory=list)  # e.g. a dtype written as another


@keywords_checked
def export(
    dump: Dump | str | os.PathLike[str],
    out: str | os.PathLike[str],
    *,
    to: ExportTarget,
    keys: str | list[str] | None = None,
    hook_name: str | None = None,
    completion_only: bool = False,
    overwrite: bool = False,
    storage_options: Mapping[str, Any] | None = None,
) -> ExportResult:
    """Write a dump in another format, as `hookdump export` does.

    Args:
        dump: a `Dump`, or the folder (or .safetensors file, or URL) of one.
        out: the folder to write, made whole in a temporary folder beside it and renamed
            into place; a non-empty one only with `overwrite`, and only when it holds an
            earlier export and nothing else.
        to: `hf` (a `datasets.load_from_disk` folder), `saelens` (SAELens' cached
            activations: packed token dumps only), `npy` (a `.npy` per key) or `routing`
            (one file: each token's chosen experts, int32 `[tokens, moe_layers, top_k]`
            per sequence, for routing replay; `out` is the file).
        keys: globs of the keys to write (default: all; `saelens`: one key; `routing`: the
            MoE blocks' `M:topk_ids`).
        hook_name: `saelens`: the activations' column, SAELens' `hook_name` (default: the
            key's standard name, `blocks.5.hook_resid_post`, where the manifest records one;
            else the key).
        completion_only: `routing`: the prompt's tokens are -1, not replayed.
        storage_options: fsspec options for a dump at a URL.

    Returns:
        An `ExportResult`: the rows written and notes (a dtype written as another).

    Example:
        >>> hookdump.export("acts/", "acts-hf/", to="hf", keys="layer4")
    """
    if not isinstance(dump, Dump):
        dump = Dump(dump, storage_options)
    to = parse_export_target(to)
    if not dump.complete:
        raise HookdumpError(
            f"{dump.path} is incomplete; finish it with {opt('resume', True)} before exporting"
        )
    if to == "routing" or completion_only:
        return _routing(dump, out, to, keys, completion_only, overwrite)
    chosen = _exportable(dump, [keys] if isinstance(keys, str) else list(keys or ["*"]))
    if to == "saelens" and hook_name is None:
        hook_name = _standard_name(dump, chosen)
    target = Path(out)
    if target.is_symlink():  # the folder it names is the export's, as `run --out` takes it
        target = Path(os.path.realpath(target))
    _check_out(dump, target, overwrite)
    temp = target.parent / f".{target.name}.export-{uuid.uuid4().hex[:8]}"
    try:
        temp.mkdir(parents=True)
        result = _WRITERS[to](dump, chosen, temp, hook_name)
        result.out = target
        names = {key: hook_name for key in result.keys} if to == "saelens" and hook_name else {}
        statistics = _statistics(dump, result.keys, temp, names, vectors=to == "saelens")
        (temp / MARKER).write_text(
            json.dumps(
                {
                    "format": to,
                    "dump": str(dump.path),
                    "run_id": dump.manifest.get("run_id"),
                    "rows": result.rows,
                    "keys": result.keys,
                    "notes": result.notes,
                    "statistics": statistics,
                    "files": sorted(p.name for p in temp.iterdir()),  # what `overwrite` may remove
                },
                indent=2,
            )
            + "\n"
        )
        _into_place(temp, target)
    except OSError as exc:  # a full disk, a name the file system refuses: nothing is left
        shutil.rmtree(temp, ignore_errors=True)
        raise HookdumpError(
            f"writing the export to {target} failed: {exc.strerror or exc}; make room or "
            "choose another folder"
        ) from None
    except BaseException:
        shutil.rmtree(temp, ignore_errors=True)
        raise
    return result


def _routing(
    dump: Dump,
    out: str | os.PathLike[str],
    to: ExportTarget,
    keys: str | list[str] | None,
    completion_only: bool,
    overwrite: bool,
) -> ExportResult:
    if to != "routing":
        raise HookdumpError(f"{opt('completion_only', True)} is for {opt('to')} routing")
    chosen = routing_keys(dump, [keys] if isinstance(keys, str) else list(keys or []))
    count = write_routing(dump, Path(out), chosen, completion_only, overwrite)
    return ExportResult(Path(out), to, count, chosen)


def _exportable(dump: Dump, patterns: list[str]) -> list[str]:
    """The keys `patterns` choose, each with values in aligned rows."""
    chosen = _select(dump, patterns)
    if dump.reader.ragged:
        raise HookdumpError(
            f"{dump.path}: its tensors have different numbers of rows; export needs rows aligned"
        )
    empty = [key for key in chosen if not dump.reader.row_bytes([key])]
    if empty:  # no value to write, however many rows the dump claims
        raise HookdumpError(
            f"{empty[0]!r} has no value in a row (shape "
            f"{dump.manifest.tensors[empty[0]]['shape']}); "
            f"nothing to export: choose other keys with {opt('keys')}"
        )
    return chosen


def _statistics(
    dump: Dump, keys: list[str], temp: Path, names: dict[str, str], vectors: bool = False
) -> dict[str, dict[str, float | None]]:
    """The exported keys' per-feature statistics, carried into the export as
    `stats.safetensors` (under the names written, `KEY/FIELD` as in a dump), and in brief
    for the marker: each key's mean row norm and SAELens' norm scaling factor
    (sqrt(d) / mean row norm), which SAELens would otherwise estimate from a pass.
    `vectors`: rows are written as flat vectors, whose norms the statistics (of each row's
    last dimension) do not hold for rows of more dimensions: those get none."""
    found = dump.reader.feature_stats() or {}
    chosen = [key for key in keys if key in found]
    if not chosen:
        return {}
    fields = {names.get(key, key): found[key] for key in chosen}
    (temp / STATS_FILE).write_bytes(stats_file(fields, dump.manifest.run_id))
    brief: dict[str, dict[str, float | None]] = {}
    for key in chosen:
        if vectors and len(dump.manifest.tensors[key]["shape"]) > 1:
            brief[names.get(key, key)] = {"norm_mean": None, "norm_scaling_factor": None}
            continue
        norm, features = float(found[key]["norm_mean"]), found[key]["mean"].numel()
        brief[names.get(key, key)] = {
            "norm_mean": norm,
            "norm_scaling_factor": math.sqrt(features) / norm if norm > 0 else None,
        }
    return brief


def _select(dump: Dump, patterns: list[str]) -> list[str]:
    chosen: list[str] = []
    for pattern in patterns:
        found = [key for key in dump if fnmatchcase(key, pattern)]
        if not found:
            raise HookdumpError(
                f"{opt('keys')} {pattern!r} matches no key of {dump.path}"
                f"{did_you_mean(pattern, dump.keys())}"
            )
        chosen += [key for key in found if key not in chosen]
    return chosen


def _check_out(dump: Dump, out: Path, overwrite: bool) -> None:
    real = os.path.realpath(out)
    source = os.path.realpath(dump.path) if isinstance(dump.path, Path) else None
    if source is not None and (real == source or inside(real, source) or inside(source, real)):
        raise HookdumpError(
            f"the export folder {out} and the dump {dump.path} overlap; export to a folder "
            "of its own"
        )
    if out.exists() and not out.is_dir():
        raise HookdumpError(f"{out} is a file; export to a folder")
    if out.is_dir() and any(out.iterdir()):
        if not overwrite:
            raise HookdumpError(f"{out} is not empty; give {opt('overwrite', True)} to replace it")
        if not (out / MARKER).is_file():
            raise HookdumpError(
                f"{out} is not empty and holds no export of hookdump ({MARKER}); "
                f"{opt('overwrite', True)} replaces only an export: choose another folder"
            )
        foreign = _foreign_files(out)
        if foreign:
            raise HookdumpError(
                f"{out} holds {printable(foreign[0])!r}"
                f"{f' and {len(foreign) - 1} more' if len(foreign) > 1 else ''}, which no "
                f"export wrote; {opt('overwrite', True)} replaces only an export's own files: "
                "move them, or choose another folder"
            )


# what an export writes, for a marker that does not list its files (written before it did)
_EXPORT_FILES = re.compile(
    r"^(index\.json|sample_ids\.json|state\.json|dataset_info\.json|[^/]*\.npy|stats\.safetensors|"
    r"data-\d+-of-\d+\.arrow)$"
)


def _foreign_files(out: Path) -> list[str]:
    """The entries of a previous export's folder that the export did not write."""
    try:
        listed = json.loads((out / MARKER).read_text()).get("files")
    except (OSError, ValueError, AttributeError):
        listed = None
    names = sorted(entry.name for entry in out.iterdir() if entry.name != MARKER)
    if isinstance(listed, list):
        return [name for name in names if name not in listed]
    return [name for name in names if not _EXPORT_FILES.match(name)]


def _into_place(temp: Path, out: Path) -> None:
    if not out.exists():
        temp.rename(out)
        return
    old = out.parent / f".{out.name}.replaced-{uuid.uuid4().hex[:8]}"
    out.rename(old)
    temp.rename(out)
    shutil.rmtree(old, ignore_errors=True)


def _chunks(dump: Dump, keys: list[str]) -> Iterator[dict[str, torch.Tensor]]:
    rows = max(1, min(CHUNK_ROWS, CHUNK_BYTES // max(1, dump.reader.row_bytes(keys))))
    yield from dump.batches(keys, rows)


def _widened(dtype: str, key: str, notes: list[str]) -> str:
    if dtype in WIDENED:
        notes.append(f"{key}: {dtype} written as {WIDENED[dtype]} (the format has no {dtype})")
        return WIDENED[dtype]
    return dtype


def _numpy(tensor: torch.Tensor, dtype: str) -> np.ndarray[Any, Any]:
    if str(tensor.dtype).removeprefix("torch.") != dtype:
        tensor = tensor.float()
    return tensor.numpy()


# --- npy -----------------------------------------------------------------------------------


def _npy(dump: Dump, keys: list[str], temp: Path, hook_name: str | None) -> ExportResult:
    """Each key's file gets its header and all its disk blocks first (a full disk fails
    there, as an OSError), then its rows with `pwrite`: no file is mapped, so no write into
    a page the disk cannot supply kills the process."""
    notes: list[str] = []
    index: dict[str, dict[str, Any]] = {}
    files: dict[str, tuple[int, int]] = {}  # key -> (fd, where the rows start)
    names = _file_names(keys)
    try:
        for key in keys:
            meta = dump.manifest.tensors[key]
            dtype = _widened(meta["dtype"], key, notes)
            file = f"{names[key]}.npy"
            index[key] = {"file": file, "dtype": dtype, "shape": meta["shape"]}
            files[key] = _npy_file(temp / file, np.dtype(dtype), [dump.num_samples, *meta["shape"]])
        row = 0
        for chunk in _chunks(dump, keys) if dump.num_samples else ():
            size = len(chunk[keys[0]])
            for key in keys:
                fd, start = files[key]
                data = np.ascontiguousarray(_numpy(chunk[key], index[key]["dtype"]))
                row_bytes = data.nbytes // size if size else 0
                pwrite_all(fd, data.reshape(-1).view(np.uint8).data, start + row * row_bytes)
            row += size
        for fd, _ in files.values():
            os.fsync(fd)
    finally:
        for fd, _ in files.values():
            os.close(fd)
    (temp / "index.json").write_text(json.dumps(index, indent=2) + "\n")
    # the manifest's ids (null where it has none: the ids are the row numbers)
    (temp / "sample_ids.json").write_text(json.dumps(dump.manifest.sample_ids) + "\n")
    return ExportResult(temp, "npy", dump.num_samples, keys, notes)


def _npy_file(path: Path, dtype: np.dtype[Any], shape: list[int]) -> tuple[int, int]:
    """A new `.npy` file of `shape`: its header written, its data's blocks allocated; the
    open descriptor and the offset where the data starts."""
    header = {
        "descr": np.lib.format.dtype_to_descr(dtype),
        "fortran_order": False,
        "shape": tuple(shape),
    }
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
    try:
        with os.fdopen(os.dup(fd), "wb") as handle:
            np.lib.format.write_array_header_2_0(handle, header)
            start = handle.tell()
        allocate(fd, start, math.prod(shape) * dtype.itemsize)
    except BaseException:
        os.close(fd)
        raise
    return fd, start


def _file_names(keys: list[str]) -> dict[str, str]:
    """A file name per key: characters other than letters, digits, `.`, `@`, `-`, `_` made
    `_`, a leading dot too, and a number added where two would meet."""
    names: dict[str, str] = {}
    taken: set[str] = set()
    for key in keys:
        base = re.sub(r"[^A-Za-z0-9.@_-]", "_", key)
        base = "_" + base[1:] if base.startswith(".") else base
        if len(base) > MAX_NAME:  # a file name has at most 255 bytes: cut, and keep it unique
            digest = hashlib.sha256(key.encode("utf-8", "surrogatepass")).hexdigest()[:16]
            base = f"{base[: MAX_NAME - 17]}-{digest}"
        name, n = base, 1
        while name.lower() in taken:
            name, n = f"{base}-{n}", n + 1
        taken.add(name.lower())
        names[key] = name
    return names


# --- datasets (hf and saelens) -------------------------------------------------------------


def _datasets() -> Any:
    try:
        import datasets
    except ImportError:
        raise HookdumpError(
            f"{opt('to')} hf and saelens write a datasets folder, which needs the datasets "
            "package: pip install 'hookdump[export]'"
        ) from None
    return datasets


def _feature(datasets: Any, shape: list[int], dtype: str) -> Any:
    """A column of fixed-shape rows: a value, a fixed-length list, or an ArrayND."""
    if not shape:
        return datasets.Value(dtype)
    if len(shape) == 1:
        return datasets.Sequence(datasets.Value(dtype), length=shape[0])
    if len(shape) > 5:
        raise HookdumpError(
            f"{opt('to')} hf: a row of {len(shape)} dimensions {shape} has no datasets feature "
            f"(at most 5); export it with {opt('to')} npy"
        )
    arrays = [datasets.Array2D, datasets.Array3D, datasets.Array4D, datasets.Array5D]
    return arrays[len(shape) - 2](shape=tuple(shape), dtype=dtype)


class _ArrowFolder:
    """A `datasets` folder written a batch of rows at a time: the rows go to arrow files
    in a staging folder (datasets' own `ArrowWriter`, about ARROW_FILE_BYTES each), which
    `finish` opens without copying (`Dataset.from_file`) and hands to `save_to_disk`, so
    the folder's layout and metadata are the library's own."""

    def __init__(self, folder: Path, features: Any) -> None:
        self.datasets = _datasets()
        self.folder, self.features = folder, features
        self.staging = folder / ".parts"
        self.staging.mkdir()
        self.files: list[Path] = []
        self._writer: Any = None
        self._bytes = 0

    def write(self, columns: dict[str, Any], nbytes: int) -> None:
        if self._writer is None or self._bytes >= ARROW_FILE_BYTES:
            self._close()
            from datasets.arrow_writer import ArrowWriter

            self.files.append(self.staging / f"part-{len(self.files):05d}.arrow")
            self._writer = ArrowWriter(features=self.features, path=str(self.files[-1]))
            self._bytes = 0
        self._writer.write_batch(columns)
        self._bytes += nbytes

    def finish(self) -> None:
        if not self.files:  # no row: an empty dataset of these columns
            self.write({name: [] for name in self.features}, 0)
        self._close()
        datasets = self.datasets
        parts = [datasets.Dataset.from_file(str(path)) for path in self.files]
        whole = datasets.concatenate_datasets(parts)
        shown = datasets.is_progress_bar_enabled()
        datasets.disable_progress_bars()  # hookdump prints its own lines, never a bar here
        try:
            whole.save_to_disk(str(self.folder), max_shard_size=ARROW_FILE_BYTES)
        finally:
            if shown:
                datasets.enable_progress_bars()
        del whole, parts
        shutil.rmtree(self.staging)

    def _close(self) -> None:
        if self._writer is not None:
            self._writer.finalize()
            self._writer.close()
            self._writer = None


def _hf(dump: Dump, keys: list[str], temp: Path, hook_name: str | None) -> ExportResult:
    datasets = _datasets()
    notes: list[str] = []
    dtypes = {key: _widened(dump.manifest.tensors[key]["dtype"], key, notes) for key in keys}
    _refuse_clash(keys, SAMPLE_ID, "the column of sample ids", "keys")
    tensors = dump.manifest.tensors
    features = datasets.Features(
        {key: _feature(datasets, tensors[key]["shape"], dtypes[key]) for key in keys}
        | {SAMPLE_ID: datasets.Value("string")}
    )
    tokens = dump.manifest.token_rows
    read = keys + ([SAMPLE] if tokens and SAMPLE not in keys else [])
    ids = dump.manifest.sample_ids or []  # none: ids are row numbers
    folder = _ArrowFolder(temp, features)
    row = 0
    for chunk in _chunks(dump, read) if dump.num_samples else ():
        size = len(chunk[read[0]])
        samples = chunk[SAMPLE].tolist() if tokens else range(row, row + size)
        columns: dict[str, Any] = {key: _numpy(chunk[key], dtypes[key]) for key in keys}
        columns[SAMPLE_ID] = [str(ids[i]) if 0 <= i < len(ids) else str(i) for i in samples]
        folder.write(columns, size * dump.reader.row_bytes(keys))
        row += size
    folder.finish()
    return ExportResult(temp, "hf", dump.num_samples, keys, notes)


def _saelens(dump: Dump, keys: list[str], temp: Path, hook_name: str | None) -> ExportResult:
    datasets = _datasets()
    captured = [key for key in keys if key not in (*TOKEN_KEYS, RESPONSE)]
    if not dump.manifest.token_rows or any(k not in dump for k in TOKEN_KEYS):
        raise HookdumpError(
            f"{opt('to')} saelens needs token rows ({opt('per_token', True)}, packed with "
            f"{opt('context_size')}); {dump.path} holds a row per sample"
        )
    if len(captured) != 1:
        raise HookdumpError(
            f"{opt('to')} saelens writes one key under the hook's name; {opt('keys')} chose "
            f"{len(captured)} ({', '.join(captured[:4])}): give {opt('keys')} one key"
        )
    key = captured[0]
    shape = dump.manifest.tensors[key]["shape"]
    if not shape:
        raise HookdumpError(
            f"{opt('to')} saelens: {key!r} has a number per row; SAELens trains on vectors [d_in]"
        )
    d_in = math.prod(shape)
    notes: list[str] = []
    if len(shape) > 1:  # heads: SAELens' own store flattens them (`hook_z`)
        notes.append(f"{key}: rows of shape {shape} written flattened to {d_in}, as SAELens does")
    dtype = _widened(dump.manifest.tensors[key]["dtype"], key, notes)
    extra = [RESPONSE] if RESPONSE in dump else []  # generated: which tokens are the response
    sequences = _sequences(dump, key, extra)
    first = next(sequences, None)
    if first is None:
        raise HookdumpError(f"{dump.path} holds no token row to export")
    context = first[1].shape[1]
    name = hook_name or key
    _refuse_clash([name], "token_ids", "the column of token ids", "hook_name")
    _refuse_clash([name], "response", "the column of the response mask", "hook_name")
    features = {
        name: datasets.Array2D(shape=(context, d_in), dtype=dtype),
        "token_ids": datasets.Sequence(datasets.Value("int32"), length=context),
    }
    if extra:
        features["response"] = datasets.Sequence(datasets.Value("uint8"), length=context)
    folder = _ArrowFolder(temp, datasets.Features(features))
    count = 0
    for acts, token_ids, *response in itertools.chain([first], sequences):
        columns = {
            name: _numpy(acts.reshape(len(acts), context, d_in), dtype),
            "token_ids": token_ids.int().numpy(),
        }
        if response:
            columns["response"] = response[0].numpy()
        folder.write(columns, acts.numel() * acts.element_size())
        count += len(acts)
    folder.finish()
    notes.append(
        f"{count} sequences of {context} tokens: SAELens' context_size is {context}, "
        f"d_in {d_in}, hook_name {name!r}"
    )
    return ExportResult(temp, "saelens", count, [key], notes)


def _standard_name(dump: Dump, keys: list[str]) -> str | None:
    """The standard name the manifest records for the one key captured (None: none)."""
    captured = [key for key in keys if key not in (*TOKEN_KEYS, RESPONSE)]
    if len(captured) != 1:
        return None
    name = dump.manifest.tensors[captured[0]].get("standard_name")
    return name if isinstance(name, str) else None


def _refuse_clash(names: list[str], reserved: str, what: str, option: str) -> None:
    """A name the format keeps for itself never replaces data."""
    if reserved in names:
        raise HookdumpError(
            f"{opt(option)} {reserved!r} is the name of {what} in this format; "
            f"{'export the other keys' if option == 'keys' else 'give another name'}"
        )


def _sequences(dump: Dump, key: str, extra: list[str]) -> Iterator[tuple[torch.Tensor, ...]]:
    """Whole sequences of token rows, [sequences, context, d_in], and the token ids and each
    key of `extra` [sequences, context], a chunk at a time; a sequence of another length, or
    whose positions do not follow each other, is refused in one line."""
    read = [key, *TOKEN_KEYS, *extra]
    context: int | None = None
    held: dict[str, torch.Tensor] | None = None  # rows of a sequence cut by a chunk's end
    for chunk in _chunks(dump, read):
        if held is not None:
            chunk = {k: torch.cat([held[k], chunk[k]]) for k in read}
        samples = chunk[SAMPLE]
        cuts = (samples[1:] != samples[:-1]).nonzero().flatten() + 1
        bounds = [0, *cuts.tolist(), len(samples)]
        context = context or (bounds[1] - bounds[0] if len(bounds) > 2 else None)
        whole = bounds[-2] if len(bounds) > 2 else 0  # the last run may go on in the next chunk
        for lo, hi in itertools.pairwise(bounds):
            if hi <= whole:
                _check_sequence(dump, chunk, lo, hi, context)
        if context is not None and whole:
            yield _as_sequences(chunk, key, extra, whole, context)
        held = {k: v[whole:] for k, v in chunk.items()}
        if len(held[key]) > (context or MAX_CONTEXT):  # never a sequence held whole
            _check_sequence(dump, held, 0, len(held[key]), context or MAX_CONTEXT)
    if held is not None and len(held[key]):
        size = len(held[key])
        context = context or size
        _check_sequence(dump, held, 0, size, context)
        yield _as_sequences(held, key, extra, size, size)


def _as_sequences(
    rows: dict[str, torch.Tensor], key: str, extra: list[str], count: int, context: int
) -> tuple[torch.Tensor, ...]:
    """The first `count` rows as sequences of `context`: `key` [n, context, ...], then the
    token ids and each of `extra` [n, context]."""
    values = rows[key][:count]
    return (
        values.reshape(-1, context, *values.shape[1:]),
        *(rows[k][:count].reshape(-1, context) for k in (TOKEN_IDS, *extra)),
    )


def _check_sequence(
    dump: Dump, rows: dict[str, torch.Tensor], lo: int, hi: int, context: int | None
) -> None:
    positions = rows[POSITION][lo:hi]
    steps = positions[1:] - positions[:-1]
    if hi - lo > MAX_CONTEXT and context == MAX_CONTEXT:
        raise HookdumpError(
            f"{opt('to')} saelens: sample {int(rows['__sample__'][lo])} of {dump.path} has more "
            f"than {MAX_CONTEXT:,} token rows, longer than any context SAELens trains on"
        )
    if hi - lo != context or bool((steps != 1).any()):
        sample = int(rows[SAMPLE][lo])
        raise HookdumpError(
            f"{opt('to')} saelens needs every sequence's tokens in order, as many each: sample "
            f"{sample} of {dump.path} has {hi - lo} token rows"
            f"{'' if hi - lo != context else ' not in order'}, not {context} (a dump packed "
            f"with {opt('context_size')}, without {opt('skip_special_tokens', True)}, fits)"
        )


_WRITERS = {"npy": _npy, "hf": _hf, "saelens": _saelens}
