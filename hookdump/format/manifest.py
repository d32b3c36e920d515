"""The dump's names, and the one check every manifest read from disk goes through.

Dumps get shared, downloaded and attached to bug reports, so a manifest is untrusted input:
`validate_manifest` checks its types, names and row ranges once, and every reader relies on
what it checked. A problem is an `InvalidDump` naming the field and what is wrong with it.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from hookdump.choices import TENSOR_KINDS
from hookdump.errors import InvalidDump
from hookdump.format.dtypes import DTYPES
from hookdump.format.names import STATS_FILE
from hookdump.format.values import is_integer

FORMAT = "hookdump/1"
KINDS = TENSOR_KINDS  # a key's `kind` in the manifest


def recipe(name: str | None = None) -> dict[str, Any]:
    """Field metadata: the option shapes a dump's contents, so `--resume` compares it (under
    `name` in the manifest's recipe, default the field's own)."""
    return {"recipe": name or True}


def samples_fed(manifest: Mapping[str, Any]) -> int:
    """The samples a (validated) manifest's rows come from: its rows themselves, or with
    token rows the sequences whose tokens they are."""
    return int(manifest.get("num_sequences", manifest["num_samples"]))


@dataclass(frozen=True)
class ShardEntry:
    """A listed shard, as the writer lists it and the readers take it: its file and the
    dump rows `start:stop` it holds (token rows: the sequences whose tokens end in it end
    at `sequences`), its size and checksum (a CRC32C, or with `--checksum sha256` a SHA-256;
    neither in a dump from before them), the ETag of
    its object at a URL, and the inputs skipped up to its end (what `--resume` needs to
    drop it and those after it)."""

    file: str
    start: int
    stop: int
    sequences: int | None = None
    bytes: int | None = None
    sha256: str | None = None
    etag: str | None = None
    inputs_skipped: int | None = None
    crc32c: str | None = None

    @property
    def rows(self) -> int:
        return self.stop - self.start

    @property
    def samples_fed(self) -> int:
        """The samples (sequences, for token rows) fed up to this shard's end."""
        return self.stop if self.sequences is None else self.sequences

    @classmethod
    def of_json(cls, entry: Mapping[str, Any]) -> ShardEntry:
        """A (validated) manifest's entry."""
        fields = {name: entry.get(name) for name in _SHARD_FIELDS[3:]}
        for digest in ("sha256", "crc32c"):
            value = fields[digest]
            if isinstance(value, str):
                fields[digest] = value.lower()
        return cls(entry["file"], entry["start"], entry["stop"], **fields)

    def to_json(self) -> dict[str, Any]:
        """The entry as a manifest lists it (fields not known left out)."""
        return {
            name: getattr(self, name) for name in _SHARD_FIELDS if getattr(self, name) is not None
        }

    def after(self, rows: int, samples: int, skipped: int) -> ShardEntry:
        """This entry placed after `rows` rows of `samples` samples (and `skipped` skipped
        inputs) of other processes' (a torchrun rank's, a Ray part's)."""
        return dataclasses.replace(
            self,
            start=self.start + rows,
            stop=self.stop + rows,
            sequences=None if self.sequences is None else self.sequences + samples,
            inputs_skipped=None if self.inputs_skipped is None else self.inputs_skipped + skipped,
        )


_SHARD_FIELDS = (
    "file",
    "start",
    "stop",
    "sequences",
    "bytes",
    "sha256",
    "etag",
    "inputs_skipped",
    "crc32c",
)


@dataclass(frozen=True)
class Manifest(Mapping[str, Any]):
    """A checked manifest, as the readers take it: the fields they use, typed, and every
    field of the JSON by name (`manifest["input"]`: what made the dump), read-only.

    Made only by `Manifest.of` (after `validate_manifest`) or `Manifest.of_checked`."""

    fields: Mapping[str, Any]
    complete: bool
    num_samples: int
    tensors: Mapping[str, Mapping[str, Any]]
    shards: tuple[ShardEntry, ...]
    sample_ids: list[Any] | None  # None: the ids are the row numbers (left out)
    token_rows: bool
    samples_fed: int  # the samples (sequences, for token rows) the rows come from
    run_id: str | None

    @classmethod
    def of(cls, data: Any, where: str) -> Manifest:
        """The record of parsed JSON `data` from `where`, once it is a valid manifest."""
        return cls.of_checked(validate_manifest(data, where))

    @classmethod
    def of_checked(cls, data: dict[str, Any]) -> Manifest:
        """The record of a manifest already checked (or made here, as a writer makes one)."""
        shards = tuple(ShardEntry.of_json(s) for s in data["shards"])
        return cls(
            fields=MappingProxyType(data),
            complete=bool(data["complete"]),
            num_samples=int(data["num_samples"]),
            tensors=MappingProxyType(data["tensors"]),
            shards=shards,
            sample_ids=data.get("sample_ids"),
            token_rows=data.get("rows") == "tokens",
            samples_fed=samples_fed(data),
            run_id=data.get("run_id"),
        )

    @classmethod
    def empty(cls, run_id: str | None = None) -> Manifest:
        """What a torchrun rank that had finished nothing carries on from."""
        fields = {"complete": False, "num_samples": 0, "tensors": {}, "shards": []}
        return cls.of_checked({**fields, "sample_ids": [], "run_id": run_id})

    @property
    def recipe(self) -> Mapping[str, Any]:
        """The options that shaped the dump's contents (what `--resume` compares)."""
        return self.fields.get("recipe") or {}

    def reopened(self) -> Manifest:
        """This dump carried on as an incomplete one (`--resume` of a damaged dump)."""
        return Manifest.of_checked({**self.fields, "complete": False})

    def cut(self, kept: int) -> Manifest:
        """This manifest as if only its first `kept` shards (at least one) had been listed:
        the rows, sample ids, generations and skipped inputs up to the last one's end."""
        last = self.shards[kept - 1]
        fed = last.samples_fed
        cut = {**self.fields, "shards": list(self.fields["shards"][:kept])}
        cut["num_samples"] = last.stop
        if "num_sequences" in self.fields:
            cut["num_sequences"] = fed
        if self.sample_ids is not None:
            cut["sample_ids"] = self.sample_ids[:fed]
        if self.fields.get("generated") is not None:
            cut["generated"] = self.fields["generated"][:fed]
        skipped = self.fields.get("skipped_inputs", [])
        upto = last.inputs_skipped
        cut["skipped_inputs"] = skipped[: len(skipped) if upto is None else upto]
        return Manifest.of_checked(cut)

    def __getitem__(self, name: str) -> Any:
        return self.fields[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self.fields)

    def __len__(self) -> int:
        return len(self.fields)

    def to_json(self) -> dict[str, Any]:
        """The fields as a plain dict, for JSON."""
        return dict(self.fields)

    def __reduce__(self) -> tuple[Any, tuple[dict[str, Any]]]:
        # pickled as its fields (a DataLoader worker started by spawn gets the dataset so)
        return (Manifest.of_checked, (dict(self.fields),))


# a shard is a plain file name inside the dump folder: no folders, no '..', no hidden tricks
_SHARD_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.+-]*$")
# optional fields that the readers and --resume use, with the type each must have
_OPTIONAL = {
    "sample_ids": list,
    "skipped": list,
    "skipped_inputs": list,
    "recipe": dict,
    "sources": dict,
    "model": dict,
    "input": dict,
    "selection": dict,
    "rows": str,
    "num_sequences": int,
    "run_id": str,
    "generation": dict,
    "generated": list,
    "consumed": list,  # shards a follower deleted (hookdump.follow consume=True)
    "failed": str,  # the error a run ended with, for a follower (its shards are kept)
}
STOPS = ("eos", "length")  # why a generated sequence stopped


def validate_manifest(data: Any, where: str) -> dict[str, Any]:
    """`data` (parsed JSON from `where`) if it is a well-formed manifest, else InvalidDump."""

    def bad(what: str) -> InvalidDump:
        return InvalidDump(f"{where}: {what}; it is not a valid hookdump manifest")

    if not isinstance(data, dict):
        raise bad(f"the top level is {_kind(data)}, not an object")
    if data.get("format") != FORMAT:
        raise InvalidDump(
            f"{where} has format {str(data.get('format'))[:40]!r}; this hookdump reads {FORMAT!r}"
        )
    if not isinstance(data.get("complete"), bool):
        raise bad(f"'complete' is {_kind(data.get('complete'))}, not true or false")
    num_samples = _count(data.get("num_samples"), "'num_samples'", bad)
    tensors = data.get("tensors")
    if not isinstance(tensors, dict):
        raise bad(f"'tensors' is {_kind(tensors)}, not an object")
    for key, meta in tensors.items():
        _check_tensor(key, meta, bad)
    shards = data.get("shards")
    if not isinstance(shards, list):
        raise bad(f"'shards' is {_kind(shards)}, not a list")
    rows = _check_shards(shards, bad)
    if num_samples != rows:
        raise bad(f"'num_samples' is {num_samples} but the shards hold rows 0 to {rows}")
    _check_optional(data, bad)
    _check_stats(data.get("feature_stats"), bad)
    return data


def _check_stats(entry: Any, bad: Any) -> None:
    """The per-feature statistics' entry: the one file name, its size and SHA-256."""
    if entry is None:
        return
    if not isinstance(entry, dict) or entry.get("file") != STATS_FILE:
        raise bad(f"'feature_stats' must be an object naming the file {STATS_FILE!r}")
    _count(entry.get("bytes"), "'feature_stats' 'bytes'", bad)
    if not (isinstance(entry.get("sha256"), str) and _SHA256.match(entry["sha256"])):
        raise bad("'feature_stats' 'sha256' is not 64 hexadecimal digits")


def _check_optional(data: dict[str, Any], bad: Any) -> None:
    for name, kind in _OPTIONAL.items():
        if name in data and not isinstance(data[name], kind):
            raise bad(f"{name!r} is {_kind(data[name])}, not a {kind.__name__}")
    for name in ("skipped", "skipped_inputs"):
        if not all(isinstance(item, dict) for item in data.get(name, [])):
            raise bad(f"{name!r} holds something other than objects")
    for item in data.get("generated", []):
        if not (
            isinstance(item, list)
            and len(item) == 2
            and isinstance(item[0], int)
            and not isinstance(item[0], bool)
            and item[0] >= 0
            and item[1] in STOPS
        ):
            raise bad(f"'generated' holds {str(item)[:40]!r}, not [tokens, one of {STOPS}]")


def _check_tensor(key: Any, meta: Any, bad: Any) -> None:
    where = f"tensor {str(key)[:80]!r}"
    if not isinstance(key, str) or not key:
        raise bad(f"{where} has an empty key")
    if not isinstance(meta, dict):
        raise bad(f"{where} is {_kind(meta)}, not an object")
    if not isinstance(meta.get("module"), str):
        raise bad(f"{where} has no 'module' name")
    if meta.get("kind") not in KINDS:
        raise bad(f"{where} has 'kind' {str(meta.get('kind'))[:40]!r}, not one of {KINDS}")
    _count(meta.get("call", 0), f"{where} 'call'", bad)
    shape = meta.get("shape")
    if not isinstance(shape, list):
        raise bad(f"{where} has 'shape' {_kind(shape)}, not a list")
    for dim in shape:
        _count(dim, f"{where} 'shape'", bad)
    if meta.get("dtype") not in DTYPES:
        raise bad(f"{where} has 'dtype' {str(meta.get('dtype'))[:40]!r}, not one of {DTYPES}")
    for name in ("module_type", "part", "standard_name"):
        if meta.get(name) is not None and not isinstance(meta[name], str):
            raise bad(f"{where} has {name!r} {_kind(meta[name])}, not a string")


_SHA256 = re.compile(r"^[0-9a-fA-F]{64}$")  # as sha256sum writes it, or upper case
_CRC32C = re.compile(r"^[0-9a-fA-F]{8}$")


def _check_shards(shards: list[Any], bad: Any) -> int:
    """The row count the shards cover, once each is a safe file name over the next rows."""
    rows = 0
    names: set[str] = set()
    for index, shard in enumerate(shards):
        if not isinstance(shard, dict):
            raise bad(f"shard {index} is {_kind(shard)}, not an object")
        name = shard.get("file")
        if not isinstance(name, str) or not _SHARD_NAME.match(name) or name in names:
            raise bad(
                f"shard {index} has a 'file' that is {_name_problem(name, names)}: a shard "
                "must be a plain file name inside the dump folder, listed once"
            )
        names.add(name)
        start = _count(shard.get("start"), f"shard {name!r} 'start'", bad)
        stop = _count(shard.get("stop"), f"shard {name!r} 'stop'", bad)
        if start != rows or stop < start:
            raise bad(
                f"shard {name!r} covers rows {start} to {stop}; shards must follow each "
                f"other from row 0 (the next starts at {rows})"
            )
        for field in ("bytes", "inputs_skipped"):
            if field in shard:
                _count(shard[field], f"shard {name!r} '{field}'", bad)
        if "sha256" in shard and not (
            isinstance(shard["sha256"], str) and _SHA256.match(shard["sha256"])
        ):
            raise bad(f"shard {name!r} 'sha256' is not 64 hexadecimal digits")
        if "crc32c" in shard and not (
            isinstance(shard["crc32c"], str) and _CRC32C.match(shard["crc32c"])
        ):
            raise bad(f"shard {name!r} 'crc32c' is not 8 hexadecimal digits")
        if "etag" in shard and not (isinstance(shard["etag"], str) and len(shard["etag"]) <= 200):
            raise bad(f"shard {name!r} 'etag' is not a short string")
        rows = stop
    return rows


def _name_problem(name: Any, seen: set[str]) -> str:
    """What is wrong with a shard's file name, without echoing a path that leads elsewhere."""
    if not isinstance(name, str):
        return _kind(name)
    if name in seen:
        return f"listed twice ({name!r})"
    if name.startswith(("/", "\\")):
        return "an absolute path"
    if "/" in name or "\\" in name or name in (".", ".."):
        return "a path, not a file name"
    return "not a plain file name (letters, digits, '_', '.', '+', '-')"


def _count(value: Any, what: str, bad: Any) -> int:
    if not is_integer(value) or value < 0:
        raise bad(f"{what} is {_kind(value)}, not a whole number of at least 0")
    return value


def _kind(value: Any) -> str:
    if value is None:
        return "missing"
    if isinstance(value, bool | int | float):
        return f"{value!r}"[:40]
    return f"a {type(value).__name__}" if not isinstance(value, str) else f"{value[:40]!r}"
