"""A batch's rows in the dump, the samples they come from, and those samples' ids."""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, overload

from hookdump.errors import HookdumpError
from hookdump.format.manifest import ShardEntry
from hookdump.format.values import format_bytes


@dataclass(frozen=True)
class Rows:
    """Rows `start:stop` of a dump and the samples `first_sample:end_sample` they come from:
    the same span when a row is a sample; with token rows (`tokens`) each sample gives a row
    per token kept. Handed from the batch loop to the commit thread, it carries what the
    manifest records of those samples as it was when the batch was made: their ids, and the
    inputs skipped since the batch before (undecodable images)."""

    start: int
    stop: int
    first_sample: int
    end_sample: int
    tokens: bool = False
    ids: Sequence[Any] = ()  # a range where the ids are row numbers
    skipped: tuple[dict[str, str], ...] = ()
    # --generate: each sample's [tokens generated, why it stopped] (`manifest`'s `generated`)
    generated: tuple[tuple[int, str], ...] = ()

    @classmethod
    def of_samples(cls, start: int, stop: int) -> Rows:
        return cls(start, stop, start, stop)

    @property
    def count(self) -> int:
        return self.stop - self.start

    @property
    def samples(self) -> int:
        return self.end_sample - self.first_sample

    @staticmethod
    def joined(spans: list[Rows]) -> Rows:
        """The rows of consecutive `spans` (one shard gathering several batches) as one."""
        first, last = spans[0], spans[-1]
        ranges = [span.ids for span in spans if isinstance(span.ids, range)]
        ids: Sequence[Any]
        if (  # row numbers stay a range
            len(ranges) == len(spans)
            and all(r.step == 1 for r in ranges)
            and all(r.stop == after.start for r, after in itertools.pairwise(ranges))
        ):
            ids = range(ranges[0].start, ranges[-1].stop)
        else:
            ids = tuple(i for span in spans for i in span.ids)
        return Rows(
            first.start,
            last.stop,
            first.first_sample,
            last.end_sample,
            first.tokens,
            ids,
            tuple(s for span in spans for s in span.skipped),
            tuple(g for span in spans for g in span.generated),
        )

    def shard_entry(self, file: str) -> ShardEntry:
        """The manifest's entry for a shard of these rows (token rows: the samples whose
        tokens the shards hold end at `sequences`)."""
        return ShardEntry(file, self.start, self.stop, self.end_sample if self.tokens else None)


# what a manifest may list of sample ids, so that what a run writes its readers read
# (`store.read.manifest.MAX_MANIFEST_VALUES`, `MAX_MANIFEST_BYTES`) with room to spare
MAX_LISTED_IDS = 8_000_000
MAX_IDS_BYTES = 256 << 20
MAX_ID_CHARS = 4096


class SampleIds(Sequence[Any]):
    """Sample ids in row order. Ids that are their own row numbers (random input, a tensor
    file, `hookdump.dump`'s default, packed windows) are a count, not a list, and the
    manifest leaves `sample_ids` out for them; other ids are listed, within
    `MAX_LISTED_IDS` ids and `MAX_IDS_BYTES` of JSON, each at most `MAX_ID_CHARS` long (else
    a HookdumpError)."""

    def __init__(self, ids: Iterable[Any] = ()) -> None:
        self._numbered = 0  # ids 0..n-1, while no other id has come
        self._listed: list[Any] | None = None
        self.json_bytes = 0  # of the listed ids
        self.extend(ids)

    def extend(self, ids: Iterable[Any]) -> None:
        """Add `ids`, all or none (ids the manifest could not hold raise first)."""
        if self._listed is None:
            if isinstance(ids, range) and (
                not len(ids) or (ids.step == 1 and ids.start == self._numbered)
            ):
                self._numbered += len(ids)
                return
            values = list(ids)
            lead = 0  # the ids that go on counting rows
            while lead < len(values) and values[lead] == self._numbered + lead:
                if type(values[lead]) is not int:
                    break
                lead += 1
            if lead == len(values):
                self._numbered += lead
                return
            _check_listed(self._numbered + len(values), 0)
            listed = list(range(self._numbered + lead))
            nbytes = sum(len(str(i)) + 4 for i in listed)
            values = values[lead:]
        else:
            listed, nbytes, values = self._listed, self.json_bytes, list(ids)
        added = sum(_id_bytes(value) for value in values)
        _check_listed(len(listed) + len(values), nbytes + added)
        listed.extend(values)
        self._listed, self.json_bytes = listed, nbytes + added

    def truncate(self, count: int) -> None:
        """Keep the first `count` ids."""
        if self._listed is None:
            self._numbered = min(self._numbered, count)
        else:
            gone = self._listed[count:]
            del self._listed[count:]
            self.json_bytes -= sum(_id_bytes(value) for value in gone)

    def manifest_value(self) -> list[Any] | None:
        """What the manifest's `sample_ids` holds: None for row numbers (left out), else the
        list."""
        return None if self._listed is None else self._listed

    def __len__(self) -> int:
        return self._numbered if self._listed is None else len(self._listed)

    @overload
    def __getitem__(self, index: int) -> Any: ...
    @overload
    def __getitem__(self, index: slice) -> Sequence[Any]: ...
    def __getitem__(self, index: int | slice) -> Any:
        if self._listed is not None:
            return self._listed[index]
        return range(self._numbered)[index]


def _id_bytes(value: Any) -> int:
    """The bytes `value` takes in the manifest's JSON list (with its comma and indent)."""
    if isinstance(value, str):
        if len(value) > MAX_ID_CHARS:
            raise HookdumpError(
                f"a sample id of {len(value):,} characters ({value[:40]!r}...); ids are at most "
                f"{MAX_ID_CHARS:,} characters: give shorter ids"
            )
        if value.isascii() and value.isprintable():
            return len(value) + 4 + value.count('"') + value.count("\\")
    return len(json.dumps(value)) + 4


def _check_listed(count: int, nbytes: int) -> None:
    if count > MAX_LISTED_IDS or nbytes > MAX_IDS_BYTES:
        raise HookdumpError(
            f"the sample ids listed reach {count:,} ids in {format_bytes(nbytes)}, more than a "
            f"manifest holds ({MAX_LISTED_IDS:,} ids, {format_bytes(MAX_IDS_BYTES)}); "
            "split the input into several dumps, or use row numbers as ids"
        )


def ids_for_manifest(ids: Sequence[Any]) -> list[Any] | None:
    """The manifest's `sample_ids` for `ids` (None where they are the row numbers)."""
    if isinstance(ids, SampleIds):
        return ids.manifest_value()
    return SampleIds(ids).manifest_value()
