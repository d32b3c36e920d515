"""What every layer shares: tensor keys and where they came from, the dump format's names and
dtypes, and the one check every manifest read from disk goes through.

Dumps get shared, downloaded and attached to bug reports, so a manifest is untrusted input:
`validate_manifest` checks its types, names and row ranges once, and every reader relies on
what it checked. A problem is an `InvalidDump` naming the field and what is wrong with it.

No torch at import time: the CLI's `--help` imports this.
"""

from __future__ import annotations

import itertools
import json
import math
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeGuard, overload

from hookdump.choices import TENSOR_KINDS
from hookdump.errors import HookdumpError, InvalidDump

if TYPE_CHECKING:
    import torch

FORMAT = "hookdump/1"
MANIFEST = "manifest.json"
KINDS = TENSOR_KINDS  # a key's `kind` in the manifest
# dtype names as the manifest writes them (torch's, less "torch.") -> safetensors' names
SAFETENSORS_DTYPES = {
    "float64": "F64", "float32": "F32", "float16": "F16", "bfloat16": "BF16", "int64": "I64",
    "int32": "I32", "int16": "I16", "int8": "I8", "uint8": "U8", "bool": "BOOL",
}  # fmt: skip
DTYPES = tuple(SAFETENSORS_DTYPES)
ITEMSIZE = {
    "float64": 8, "float32": 4, "float16": 2, "bfloat16": 2, "int64": 8, "int32": 4,
    "int16": 2, "int8": 1, "uint8": 1, "bool": 1,
}  # fmt: skip
DTYPE_OF_SAFETENSORS = {st: name for name, st in SAFETENSORS_DTYPES.items()}
# keys the dump keeps for the input itself and for token rows: never a module's
RESERVED_KEYS = (
    "__input_ids__",
    "__attention_mask__",
    "__token_ids__",
    "__sample__",
    "__position__",
)
# set on a module to show this class name instead of its own (unflattened export modules)
TYPE_ATTRIBUTE = "_hookdump_type"


def recipe(name: str | None = None) -> dict[str, Any]:
    """Field metadata: the option shapes a dump's contents, so `--resume` compares it (under
    `name` in the manifest's recipe, default the field's own)."""
    return {"recipe": name or True}


def format_bytes(n: float) -> str:
    """1536 -> '1.5 KiB': the one unit system of tables, reprs and errors."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")


def dtype_name(dtype: torch.dtype) -> str:
    """`torch.float32` -> `float32`."""
    return str(dtype).removeprefix("torch.")


@dataclass(frozen=True)
class KeyInfo:
    """Where a captured tensor came from, and its per-sample shape (all but the first
    dimension) and dtype. `rows`: the first dimension of the tensor a live capture saw
    (None when read from a dump, or for a 0-d tensor), which tells an unbatched value."""

    key: str
    module: str
    module_type: str
    kind: str
    call: int
    part: str | None
    shape: tuple[int, ...]
    dtype: torch.dtype
    rows: int | None = None

    @property
    def nbytes(self) -> int | None:
        """The bytes of `rows` rows (None when `rows` is not known)."""
        if self.rows is None:
            return None
        return self.rows * math.prod(self.shape) * self.dtype.itemsize


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
            first.start, last.stop, first.first_sample, last.end_sample, first.tokens,
            ids,
            tuple(s for span in spans for s in span.skipped),
        )  # fmt: skip

    def shard_entry(self, file: str) -> dict[str, Any]:
        """The manifest's entry for a shard of these rows (token rows: the samples whose
        tokens the shards hold end at `sequences`)."""
        entry: dict[str, Any] = {"file": file, "start": self.start, "stop": self.stop}
        if self.tokens:
            entry["sequences"] = self.end_sample
        return entry


# what a manifest may list of sample ids, so that what a run writes its readers read
# (`store.reader.MAX_MANIFEST_VALUES`, `MAX_MANIFEST_BYTES`) with room to spare
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


def samples_fed(manifest: dict[str, Any]) -> int:
    """The samples a (validated) manifest's rows come from: its rows themselves, or with
    token rows the sequences whose tokens they are."""
    return int(manifest.get("num_sequences", manifest["num_samples"]))


def tensor_key(module: str, kind: str, part: str | None, call: int) -> str:
    """The contract's key: `M`, `M:output.0`, `M:input.x`, `M:pattern`, with `@n` for the
    n-th extra call."""
    if part is None:  # a module's output, or a value of its own (`M:pattern`)
        key = module if kind == "output" else f"{module}:{kind}"
    else:
        key = f"{module}:{kind}.{part}"
    return f"{key}@{call}" if call else key


def parse_key(key: str) -> tuple[str, str, str | None, int]:
    """The inverse of `tensor_key`: (module, kind, part, call)."""
    base, at, call = key.rpartition("@")
    if not (at and call.isascii() and call.isdigit()):
        base, call = key, "0"
    module, colon, rest = base.partition(":")
    if not colon:
        return module, "output", None, int(call)
    kind, _, part = rest.partition(".")
    return module, kind, part or None, int(call)


# a shard is a plain file name inside the dump folder: no folders, no '..', no hidden tricks
_SHARD_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.+-]*$")
# optional fields that the readers and --resume use, with the type each must have
_OPTIONAL = {
    "sample_ids": list, "skipped": list, "skipped_inputs": list, "recipe": dict,
    "sources": dict, "model": dict, "input": dict, "selection": dict, "rows": str,
    "num_sequences": int, "run_id": str,
}  # fmt: skip


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
    return data


def _check_optional(data: dict[str, Any], bad: Any) -> None:
    for name, kind in _OPTIONAL.items():
        if name in data and not isinstance(data[name], kind):
            raise bad(f"{name!r} is {_kind(data[name])}, not a {kind.__name__}")
    for name in ("skipped", "skipped_inputs"):
        if not all(isinstance(item, dict) for item in data.get(name, [])):
            raise bad(f"{name!r} holds something other than objects")


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
    for name in ("module_type", "part"):
        if meta.get(name) is not None and not isinstance(meta[name], str):
            raise bad(f"{where} has {name!r} {_kind(meta[name])}, not a string")


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


def is_integer(value: object) -> TypeGuard[int]:
    """An `int` that is not a `bool` (which Python counts as one)."""
    return isinstance(value, int) and not isinstance(value, bool)


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
