"""Columnar files, read a record batch at a time: parquet files, folders of parquet shards,
and Hugging Face `datasets` folders saved with `save_to_disk` (arrow streams listed in their
`state.json`). pyarrow comes with the `corpora` extra and is imported only here."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from hookdump.errors import HookdumpError, opt

TABLE_SUFFIXES = (".parquet", ".arrow")
BATCH_ROWS = 1024  # rows of a parquet record batch


def table_files(folder: Path, option: str) -> list[Path]:
    """A `datasets` folder's arrow files in its own order (`save_to_disk`), or a folder's
    parquet shards by path; none for another folder. `option`: the option naming it."""
    state = folder / "state.json"
    if state.is_file():
        try:
            files = [
                folder / entry["filename"] for entry in json.loads(state.read_text())["_data_files"]
            ]
        except (ValueError, KeyError, TypeError) as exc:
            raise HookdumpError(
                f"{opt(option)} {folder}: its state.json does not list the dataset's files "
                f"({type(exc).__name__}); save it again with save_to_disk"
            ) from None
        if all(f.is_file() and f.parent == folder for f in files):
            return files
    return sorted(p for p in folder.rglob("*.parquet") if p.is_file())


def is_table(path: Path) -> bool:
    """Whether `path` is a parquet file, or a folder of parquet shards or a saved dataset."""
    if path.is_dir():
        return (path / "state.json").is_file() or any(path.rglob("*.parquet"))
    return path.suffix == ".parquet"


def record_batches(path: Path, columns: list[str], option: str) -> Iterator[Any]:
    """pyarrow record batches of `columns` of one parquet or arrow file, in order; a column
    it lacks is one error naming the columns it has (the first of `columns` is required,
    the rest are read where present)."""
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError:
        raise HookdumpError(
            f"{opt(option)} {path}: reading parquet and datasets needs pyarrow; "
            "pip install 'hookdump[corpora]'"
        ) from None
    try:
        if path.suffix == ".parquet":
            table = pq.ParquetFile(path)
            names = table.schema_arrow.names
            wanted = [c for c in columns if c in names]
            batches: Iterator[Any] = table.iter_batches(batch_size=BATCH_ROWS, columns=wanted)
        else:
            reader = pa.ipc.open_stream(pa.memory_map(str(path)))
            names = reader.schema.names
            wanted = [c for c in columns if c in names]
            batches = (batch.select(wanted) for batch in reader)
    except (OSError, pa.ArrowException) as exc:
        raise HookdumpError(f"{opt(option)}: cannot read {path} ({str(exc)[:200]})") from None
    if columns[0] not in names:
        what = f"{opt('text_field')} {columns[0]!r}" if option == "text" else repr(columns[0])
        raise HookdumpError(
            f"{what} is not a column of {path} (its columns: {', '.join(names[:8])})"
        )
    try:
        yield from batches
    except pa.ArrowException as exc:
        raise HookdumpError(f"{opt(option)}: cannot read {path} ({str(exc)[:200]})") from None
