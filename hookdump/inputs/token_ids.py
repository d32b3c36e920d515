"""Pre-tokenized input (`--input FILE --per-token`): token ids tokenized elsewhere, fed to a
language model as `model(input_ids=..., attention_mask=...)` with no tokenizer.

A file holds `input_ids` (and optionally `attention_mask`, 1 for real tokens):
- `.safetensors` or `.pt`: tensors under those names, `[N, T]`;
- `.npy`: the `[N, T]` ids (every token real);
- a `.parquet` file, a folder of parquet shards or a saved `datasets` folder: a column
  `input_ids` of id lists (rows may differ in length), and `attention_mask` where present.

Rows are read as needed (memory maps, row slices, record batches) and a batch is padded to
its longest row (padding is masked out, and token rows never write it). Sample ids are row
numbers. Ids are checked against the model's vocabulary before the forward, so a wrong file
is one line, not an index error deep in an embedding.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from hookdump.errors import HookdumpError, opt
from hookdump.format.rows import SampleIds
from hookdump.inputs.files import TENSOR_SUFFIXES, open_tensor_file
from hookdump.inputs.samples import Batch, Feed, TextTally, left_padded_positions, share_of
from hookdump.inputs.tables import is_table, record_batches, table_files

IDS, MASK = "input_ids", "attention_mask"
READ_ROWS = 1024  # rows of a tensor file read at a time

Row = tuple[torch.Tensor, torch.Tensor]  # one sample's ids and mask, [T] each


def is_token_file(source: str) -> bool:
    """Whether `--input` names a file that can hold token ids (tensor files hold other
    input too: they are token ids under `--per-token`)."""
    path = Path(source)
    return path.suffix in TENSOR_SUFFIXES or is_table(path)


@dataclass(frozen=True)
class TokenModel:
    """What a model takes of token ids: ids below `vocab`, at most `positions` tokens a
    sample (a longer row is refused, naming it), and whether its forward takes
    `position_ids` (a left-padded batch then brings its own, `left_padded_positions`)."""

    vocab: int
    positions: int | None = None
    position_ids: bool = False


def token_input(
    source: str,
    model: TokenModel,
    *,
    limit: int | None = None,
    done: Sequence[int] | None = None,
    share: tuple[int, int] | None = None,
    special_ids: list[int] | None = None,
    tokenizer_files: list[Path] | None = None,
) -> Feed:
    """The rows of `source` (see the module's docstring) as a `Feed` of token batches for
    `model`; `done`: rows already dumped (resuming: the feed goes on after them); `share`
    (rank, world): a torchrun rank's contiguous slice; `special_ids` and `tokenizer_files`:
    of the model folder's tokenizer, where one was read."""
    path = Path(source)
    if not path.exists():
        raise HookdumpError(f"{opt('input')} {source}: no such file or folder")
    if is_table(path):
        files = [path] if path.is_file() else table_files(path, "input")
        count, rows = _table_rows(files)
    else:
        files = [path]
        count, rows = _tensor_rows(path)
    total = count if limit is None else min(limit, count)
    first, stop = share_of(total, share)
    ids = SampleIds(done or [])
    tally = TextTally()

    def batches(batch_size: int) -> Iterator[Batch]:
        start = first + len(ids)
        made = itertools.islice(rows(start), stop - start)
        row = len(ids)
        while chunk := list(itertools.islice(made, batch_size)):
            _check_lengths(chunk, first + row, model.positions, source)
            batch = _batch(chunk, row, model, source, first)
            ids.extend(range(first + row, first + row + len(chunk)))
            tally.count(sum(int(m.sum()) for _, m in chunk), batch.kwargs[IDS].numel())
            yield batch
            row += len(chunk)

    return Feed(
        "token ids",
        stop - first,
        ids,
        batches,
        first=first,
        tally=tally,
        files=files + list(tokenizer_files or []),
        special_ids=list(special_ids or []),
    )


def _tensor_rows(path: Path) -> tuple[int, Callable[[int], Iterator[Row]]]:
    columns = open_tensor_file(path)
    if IDS not in columns and len(columns) == 1:  # a lone array (.npy): the ids
        columns = {IDS: next(iter(columns.values()))}
    if IDS not in columns:
        raise HookdumpError(
            f"{opt('input')} {path} holds no {IDS!r} tensor (it holds "
            f"{', '.join(sorted(columns)[:8])}); save the token ids under {IDS!r}"
        )
    shape, read_ids = columns[IDS]
    mask_column = columns.get(MASK)
    if len(shape) != 2 or (mask_column is not None and mask_column[0] != shape):
        mask_shape = f" and {MASK} {mask_column[0]}" if mask_column else ""
        raise HookdumpError(
            f"{opt('input')} {path}: {IDS} is {shape}{mask_shape}; token ids are [samples, "
            "tokens], with a mask of the same shape"
        )

    def rows(start: int) -> Iterator[Row]:
        for at in range(start, shape[0], READ_ROWS):
            end = min(at + READ_ROWS, shape[0])
            block = _integers(read_ids(at, end), IDS, path)
            mask = (
                torch.ones_like(block)
                if mask_column is None
                else _integers(mask_column[1](at, end), MASK, path)
            )
            yield from zip(block, mask, strict=True)

    return shape[0], rows


def _table_rows(files: list[Path]) -> tuple[int, Callable[[int], Iterator[Row]]]:
    count = sum(batch.num_rows for file in files for batch in record_batches(file, [IDS], "input"))

    def rows(start: int) -> Iterator[Row]:
        passed = 0
        for file in files:
            for batch in record_batches(file, [IDS, MASK], "input"):
                if passed + batch.num_rows <= start:  # resuming: whole batches passed over
                    passed += batch.num_rows
                    continue
                _check_column_types(batch, file)
                ids = batch.column(IDS).to_pylist()
                masks = batch.column(MASK).to_pylist() if MASK in batch.schema.names else None
                for index in range(max(0, start - passed), batch.num_rows):
                    yield _table_row(ids[index], masks and masks[index], file, passed + index)
                passed += batch.num_rows

    return count, rows


def _check_lengths(chunk: list[Row], first: int, positions: int | None, source: str) -> None:
    """Rows no longer than the model's positions (else its embedding fails deep inside)."""
    if positions is None:
        return
    for index, (tokens, _) in enumerate(chunk):
        if len(tokens) > positions:
            raise HookdumpError(
                f"{opt('input')} {source}: row {first + index} has {len(tokens)} token ids, "
                f"more than the model takes in a sample ({positions} positions); cut the rows "
                f"to at most {positions} tokens"
            )


def _check_column_types(batch: Any, file: Path) -> None:
    """Ids and masks are lists of integers (a list of floats is not cut to integers)."""
    import pyarrow as pa

    for name in (IDS, MASK):
        if name not in batch.schema.names:
            continue
        kind = batch.schema.field(name).type
        listed = pa.types.is_list(kind) or pa.types.is_large_list(kind)
        if not (listed and pa.types.is_integer(kind.value_type)):
            raise HookdumpError(
                f"{opt('input')} {file}: column {name} is {kind}, not lists of integers; "
                "save the token ids as integers"
            )


def _table_row(ids: object, mask: object, file: Path, row: int) -> Row:
    where = f"{opt('input')} {file} row {row}"
    for name, values in ((IDS, ids), (MASK, mask)):
        if isinstance(values, list) and any(v is None for v in values):
            raise HookdumpError(f"{where}: {name} holds a missing value (null); fill or drop it")
    try:
        tokens = torch.tensor(ids if ids is not None else [], dtype=torch.int64)
        real = torch.ones_like(tokens) if mask is None else torch.tensor(mask, dtype=torch.int64)
    except (TypeError, ValueError, RuntimeError, OverflowError):
        raise HookdumpError(
            f"{where}: {IDS} and {MASK} must be lists of integers; found {type(ids).__name__}"
        ) from None
    if tokens.dim() != 1 or real.shape != tokens.shape:
        raise HookdumpError(f"{where}: {MASK} has {real.numel()} values for {tokens.numel()} ids")
    return tokens, real


def _integers(tensor: torch.Tensor, name: str, path: Path) -> torch.Tensor:
    if tensor.is_floating_point() or tensor.is_complex() or tensor.dtype == torch.bool:
        if name == MASK and tensor.dtype == torch.bool:
            return tensor.long()
        raise HookdumpError(
            f"{opt('input')} {path}: {name} holds {tensor.dtype} values; save integer ids"
        )
    return tensor.long()


def _batch(chunk: list[Row], start: int, model: TokenModel, source: str, first: int) -> Batch:
    """Rows right-padded to the longest (masked-out ids set to 0), checked: a mask of 0s and
    1s, a real token in every row, real ids below `vocab`."""
    width = max(len(ids) for ids, _ in chunk)
    tokens = torch.zeros(len(chunk), width, dtype=torch.int64)
    mask = torch.zeros(len(chunk), width, dtype=torch.int64)
    for index, (ids, real) in enumerate(chunk):
        tokens[index, : len(ids)], mask[index, : len(real)] = ids, real
    where = f"{opt('input')} {source} row"
    odd = (mask != 0) & (mask != 1)
    if bool(odd.any()):
        raise HookdumpError(
            f"{where} {first + start + _first_row(odd)}: {MASK} holds values other than 0 and 1"
        )
    if not bool(mask.any(1).all()):
        raise HookdumpError(
            f"{where} {first + start + _first_row(~mask.any(1, keepdim=True))}: "
            "no real token (its mask is all 0 or it is empty)"
        )
    tokens = tokens.where(mask.bool(), 0)
    vocab = model.vocab
    outside = (tokens < 0) | (tokens >= vocab)
    if bool(outside.any()):
        row = _first_row(outside)
        raise HookdumpError(
            f"{where} {first + start + row}: token id {int(tokens[outside][0])} is outside the "
            f"model's vocabulary (0 to {vocab - 1}); was the file tokenized for this model?"
        )
    inputs = {IDS: tokens, MASK: mask}
    if model.position_ids:
        inputs |= left_padded_positions(inputs, mask)
    return Batch((), inputs, start, start + len(chunk))


def _first_row(where: torch.Tensor) -> int:
    return int(where.any(1).nonzero()[0, 0])
