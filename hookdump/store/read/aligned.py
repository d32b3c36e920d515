"""`hookdump.aligned(...)`, an `Aligned`: rows of keys from several dumps (or several keys
of one) read together, row i of each the same sample or token, with one shuffle: for
crosscoders (a base and a fine-tuned model on one corpus) and transcoders (an MLP's input
and output).

The dumps must hold the same rows in the same order: the same sample ids, and for token
rows the same `__sample__`, `__position__` and `__token_ids__` at every row. The manifests'
row counts and sample ids are compared before anything is read; the token columns are read
with every block and compared as the pass goes, and the first row where they disagree ends
it in one line naming it. The pass is `Dump.batches`' own (`store.read.batches`): blocks
are cut where any of the dumps starts a shard, so every block lies in one shard of each,
and each block's rows go straight to their places in the batches, dump by dump.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch

from hookdump.errors import HookdumpError, keywords_checked, opt
from hookdump.format.keys import SAMPLE, TOKEN_KEYS
from hookdump.store.read.batches import (
    BUFFER_BYTES,
    ROW,
    PassOptions,
    check,
    pass_batches,
    plan_blocks,
)
from hookdump.store.read.dataset import DumpDataset
from hookdump.store.read.reader import ShardReader
from hookdump.store.read.rows import ShardRows
from hookdump.store.read.scatter import BatchMemory, Places


class _Columns:
    """One dump's share of an aligned pass: its keys under the caller's names."""

    def __init__(self, dump: ShardReader, names: dict[str, str]) -> None:
        self.dump, self.names = dump, names  # caller's name -> the dump's key
        self.rows = ShardRows(dump, list(names.values()))

    def renamed(self, values: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """The dump's keys' tensors under the caller's names."""
        return {name: values[key] for name, key in self.names.items()}


class _AlignedRows:
    """A pass's `RowSource` over several dumps: each block read from every dump in turn."""

    def __init__(self, columns: list[_Columns]) -> None:
        self.columns = columns
        self.ahead = max(c.rows.ahead for c in columns)

    def allocate(self, count: int) -> dict[str, torch.Tensor]:
        made: dict[str, torch.Tensor] = {}
        for column in self.columns:
            made.update(column.renamed(column.rows.allocate(count)))
        return made

    def scatter(self, lo: int, hi: int, places: Places, positions: torch.Tensor) -> None:
        for column in self.columns:
            batches = [
                {key: batch[name] for name, key in column.names.items()} for batch in places.batches
            ]
            column.rows.scatter(lo, hi, Places(batches, places.size), positions)

    def will_need(self, lo: int, hi: int) -> None:
        for column in self.columns:
            column.rows.will_need(lo, hi)

    def close(self) -> None:
        for column in self.columns:
            column.rows.close()


@dataclass(frozen=True)
class AlignedPass:
    """A pass over aligned dumps, as `DumpDataset` takes it: each reader and the keys read
    from it under the caller's names (token columns added where compared)."""

    sources: tuple[tuple[ShardReader, dict[str, str]], ...]
    memory: BatchMemory = field(default_factory=BatchMemory, compare=False)

    def check(self, options: PassOptions) -> None:
        for reader, names in self.sources:
            check(reader, list(names.values()), options)

    def batches(self, options: PassOptions) -> Iterator[dict[str, torch.Tensor]]:
        self.check(options)
        columns = [_Columns(reader, dict(names)) for reader, names in self.sources]
        blocks, group = _blocks(columns, options)
        batches = pass_batches(blocks, _AlignedRows(columns), options, group, self.memory)
        return _checked(batches, columns, [reader for reader, _ in self.sources])


class Aligned:
    """Keys of several dumps (or several keys of one) read together: row i of each the same
    sample or token (see the module's docstring). `batches` and `dataset` take the
    arguments of `Dump.batches` and `Dump.dataset`; each batch holds a tensor per name.

    Example:
        >>> pairs = hookdump.aligned({"base": ("base/", "h.5"), "chat": ("chat/", "h.5")})
        >>> for batch in pairs.batches(4096, shuffle=True):
        ...     train_step(batch["base"], batch["chat"])
    """

    def __init__(
        self,
        sources: Mapping[str, tuple[Any, str]],
        storage_options: Mapping[str, Any] | None = None,
    ) -> None:
        """`sources`: a name for each stream -> (a `Dump`, or its folder or URL; the key to
        read from it). Raises HookdumpError where the dumps' manifests say they do not hold
        the same rows (their row counts, sample ids); token rows are compared as read."""
        self.pass_ = AlignedPass(_opened(sources, storage_options))

    @keywords_checked
    def batches(
        self,
        batch_size: int,
        *,
        shuffle: bool = False,
        seed: int = 0,
        with_index: bool = False,
        drop_last: bool = False,
        start: int = 0,
        buffer_bytes: int = BUFFER_BYTES,
    ) -> Iterator[dict[str, torch.Tensor]]:
        """As `Dump.batches`, one shuffle for every stream (`buffer_bytes` for them all)."""
        options = PassOptions(batch_size, shuffle, seed, with_index, drop_last, start, buffer_bytes)
        return self.pass_.batches(options)

    @keywords_checked
    def dataset(
        self,
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
        """As `Dump.dataset`: DataLoader workers and ranks together give every row once."""
        options = PassOptions(batch_size, shuffle, seed, with_index, drop_last, start, buffer_bytes)
        return DumpDataset(self.pass_, options, rank, world_size)


@keywords_checked
def aligned(
    sources: Mapping[str, tuple[Any, str]], storage_options: Mapping[str, Any] | None = None
) -> Aligned:
    """`Aligned(sources)`: several dumps' keys read together (see `Aligned`)."""
    return Aligned(sources, storage_options)


def _opened(
    sources: Mapping[str, tuple[Any, str]], storage_options: Mapping[str, Any] | None
) -> tuple[tuple[ShardReader, dict[str, str]], ...]:
    """Each dump opened once, with the keys read from it by name; checked alike."""
    from hookdump.store.read.dump import Dump

    if not isinstance(sources, Mapping) or not sources:
        raise HookdumpError(
            f"{opt('sources')} must map a name to (dump, key) for each stream, e.g. "
            '{"base": ("base/", "h.5"), "chat": ("chat/", "h.5")}'
        )
    opened: dict[str, tuple[ShardReader, dict[str, str]]] = {}
    for name, source in sources.items():
        if not (isinstance(source, tuple) and len(source) == 2 and isinstance(source[1], str)):
            raise HookdumpError(f"{opt('sources')}[{name!r}] must be (dump, key), not {source!r}")
        if not isinstance(name, str) or name == ROW or name.startswith("__"):
            raise HookdumpError(f"{opt('sources')}: {name!r} is not a name for a stream")
        dump = source[0] if isinstance(source[0], Dump) else Dump(source[0], storage_options)
        reader, names = opened.setdefault(str(dump.path), (dump.reader, {}))
        if source[1] in names.values():
            raise HookdumpError(
                f"{opt('sources')} names {source[1]!r} of {dump.path} twice; read it once"
            )
        reader.check_key(source[1])
        names[name] = source[1]
    readers = [reader for reader, _ in opened.values()]
    _check_same_rows(readers)
    if len(readers) > 1 and readers[0].manifest.token_rows:  # compared as the pass goes
        for index, (_, names) in enumerate(opened.values()):
            names.update({f"{column}.{index}": column for column in TOKEN_KEYS})
    return tuple(opened.values())


def _check_same_rows(readers: list[ShardReader]) -> None:
    """The manifests agree: complete, as many rows, the same sample ids, the same kind."""
    first = readers[0]
    for other in readers[1:]:
        where = f"{first.path} and {other.path}"
        if other.num_samples != first.num_samples:
            raise HookdumpError(
                f"{where} hold {first.num_samples} and {other.num_samples} rows; aligned "
                "reading needs dumps of the same rows (the same input, options and seed)"
            )
        if other.manifest.token_rows != first.manifest.token_rows:
            raise HookdumpError(f"{where}: one holds token rows, the other a row per sample")
        ids_a, ids_b = first.manifest.sample_ids, other.manifest.sample_ids
        if ids_a != ids_b:
            at = next(
                (
                    i
                    for i, (a, b) in enumerate(zip(ids_a or [], ids_b or [], strict=False))
                    if a != b
                ),
                0,
            )
            raise HookdumpError(
                f"{where} disagree at sample {at}: their sample ids differ; aligned reading "
                "needs the same samples in the same order"
            )


def _blocks(columns: list[_Columns], options: PassOptions) -> tuple[torch.Tensor, int]:
    """The pass's blocks, cut where any dump starts a shard and sized for every dump's
    keys together (`plan_blocks`); and how many a buffer takes."""
    readers = [c.dump for c in columns]
    row_bytes = sum(c.dump.row_bytes(list(set(c.names.values()))) for c in columns)
    rows = readers[0].num_samples
    bounds = sorted({0, rows, *(s.start for r in readers for s in r.shards)})
    return plan_blocks(bounds, row_bytes, options)


def _checked(
    batches: Iterator[dict[str, torch.Tensor]],
    columns: list[_Columns],
    readers: list[ShardReader],
) -> Iterator[dict[str, torch.Tensor]]:
    """The batches, once their token columns agree across the dumps (then left out)."""
    names = [
        [f"{column}.{index}" for column in TOKEN_KEYS]
        for index in range(len(columns))
        if f"{TOKEN_KEYS[0]}.{index}" in columns[index].names
    ]
    for batch in batches:
        if names:
            first = [batch.pop(n) for n in names[0]]
            for index, others in enumerate(names[1:], 1):
                theirs = [batch.pop(n) for n in others]
                for column, a, b in zip(TOKEN_KEYS, first, theirs, strict=True):
                    if not torch.equal(a, b):
                        at = int((a != b).nonzero()[0])
                        sample = int(first[TOKEN_KEYS.index(SAMPLE)][at])
                        raise HookdumpError(
                            f"{readers[0].path} and {readers[index].path} disagree at a "
                            f"token row: {column} {int(a[at])} against {int(b[at])} (a token "
                            f"of sample {sample}); aligned reading needs the same tokens"
                        )
        yield batch
