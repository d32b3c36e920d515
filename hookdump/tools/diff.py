"""Comparing two dumps key by key, sample rows aligned, one row segment at a time.

Elements pass where both are finite and `|a - b| <= atol + rtol * |b|` (as
`torch.allclose`), or where both are the same non-finite value (NaN in both, or the same
Inf): a dump always matches itself, and an Inf matches nothing but the same Inf.

A key saved in another dtype in B (float32 against bfloat16, say) is compared by value, in
the wider dtype, and passes or fails by the tolerance like any other; the change is noted
(`KeyDiff.dtypes`), and is a failure in itself only with `strict_dtype` (for CI).
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping
from contextlib import ExitStack
from dataclasses import dataclass, field
from fnmatch import fnmatchcase
from pathlib import Path
from typing import Any

import torch

from hookdump.choices import DiffStatus
from hookdump.errors import CheckFailed, HookdumpError, did_you_mean, opt
from hookdump.format.keys import POSITION, SAMPLE
from hookdump.format.manifest import ShardEntry
from hookdump.store.location import UrlPath
from hookdump.store.read.dump import Dump
from hookdump.store.read.reader import SLICE_BYTES, ShardReader, rows_per_slice
from hookdump.tools.routing import CHOSEN


@dataclass
class KeyDiff:
    """How one key compares: its status and, where comparable, the size of the difference."""

    key: str
    module: str | None
    status: DiffStatus
    detail: str = ""
    max_abs: float = 0.0
    max_rel: float = 0.0
    mismatched: int = 0
    numel: int = 0
    _dot: float = 0.0
    _norm_a: float = 0.0
    _norm_b: float = 0.0
    dtypes: str = ""  # "float32 vs bfloat16": B holds the key in another dtype

    @property
    def ok(self) -> bool:
        return self.status == "match"

    @property
    def cosine(self) -> float | None:
        if self.numel == 0:
            return None
        if self._norm_a == 0 or self._norm_b == 0:
            return 1.0 if self._norm_a == self._norm_b else 0.0
        # rounding takes a cosine of equal vectors just past 1 (1 - cos printed as -4e-10)
        return min(1.0, max(-1.0, self._dot / math.sqrt(self._norm_a * self._norm_b)))

    def as_dict(self) -> dict[str, Any]:
        def clean(v: float | None) -> float | None:
            return v if v is not None and math.isfinite(v) else None

        return {
            "key": self.key,
            "module": self.module,
            "status": self.status,
            "detail": self.detail,
            "max_abs": clean(self.max_abs) if self.numel else None,
            "max_rel": clean(self.max_rel) if self.numel else None,
            "cosine": clean(self.cosine),
            "mismatched": self.mismatched,
            "numel": self.numel,
            "dtypes": self.dtypes or None,
        }


@dataclass
class Agreement:
    """A MoE block's routing in A and B (its `M:topk_ids`): of `tokens` rows compared, how
    many choose the same experts (as a set: the order of the top-k aside), and the first
    row that does not (-1: none), with its sample and position in A."""

    key: str
    tokens: int = 0
    agree: int = 0
    first: int = -1
    where: str = ""  # the first row's sample and position, as A records them

    @property
    def share(self) -> float:
        return self.agree / self.tokens if self.tokens else 1.0

    def add(self, ta: torch.Tensor, tb: torch.Tensor, lo: int) -> None:
        same = (ta.sort(-1).values == tb.sort(-1).values).reshape(len(ta), -1).all(-1)
        self.tokens += len(same)
        self.agree += int(same.sum())
        if self.first < 0 and not bool(same.all()):
            self.first = lo + int((~same).nonzero()[0])

    def as_dict(self) -> dict[str, Any]:
        return {
            "key": self.key,
            "tokens": self.tokens,
            "agree": self.agree,
            "share": self.share,
            "first_differing_row": self.first if self.first >= 0 else None,
            "first_differing_at": self.where or None,
        }


@dataclass
class DiffResult:
    """Every compared key in forward order, and problems that concern the dumps as a whole."""

    a: Path | UrlPath
    b: Path | UrlPath
    atol: float
    rtol: float
    keys: list[KeyDiff]
    num_samples: tuple[int, int]
    problems: list[str] = field(default_factory=list)
    routing: list[Agreement] = field(default_factory=list)  # MoE blocks' chosen experts

    @property
    def failures(self) -> list[KeyDiff]:
        return [k for k in self.keys if not k.ok]

    @property
    def match(self) -> bool:
        return not self.failures and not self.problems

    def as_dict(self) -> dict[str, Any]:
        first = self.failures[0] if self.failures else None
        return {
            "a": str(self.a),
            "b": str(self.b),
            "match": self.match,
            "atol": self.atol,
            "rtol": self.rtol,
            "num_samples": list(self.num_samples),
            "problems": self.problems,
            "first_diverging": first.as_dict() if first else None,
            "keys": [k.as_dict() for k in self.keys],
            "routing": [r.as_dict() for r in self.routing],
        }


def diff_dumps(
    path_a: str | Path,
    path_b: str | Path,
    atol: float = 1e-8,
    rtol: float = 1e-5,
    keys: list[str] | None = None,
    storage_options: Mapping[str, Any] | None = None,
    strict_dtype: bool = False,
) -> DiffResult:
    """Compare dump B against dump A (the reference order is A's forward order); either may
    be a URL, read with fsspec's `storage_options`. `strict_dtype`: a key saved in another
    dtype fails whatever its values (without it, its values are compared)."""
    if atol < 0 or rtol < 0:
        raise HookdumpError(f"{opt('atol')} {atol} and {opt('rtol')} {rtol} must not be negative")
    a, b = Dump(path_a, storage_options).reader, Dump(path_b, storage_options).reader
    order = _selected(a.keys() + [k for k in b if k not in a], keys or [])
    _check_shared(a, b, order, (path_a, path_b), bool(keys))
    rows = min(a.num_samples, b.num_samples)
    results = {
        key: _compare_meta(key, a.manifest.tensors.get(key), b.manifest.tensors.get(key))
        for key in order
    }
    for key in order:  # ragged files (weights): a key's own rows must agree
        if (
            results[key].status == "match"
            and a.rows_of(key) != b.rows_of(key)
            and (a.ragged or b.ragged)
        ):
            rows_ab = f"{a.rows_of(key)} vs {b.rows_of(key)} rows"
            results[key] = KeyDiff(key, results[key].module, "shape", rows_ab)
    compared = [key for key in order if results[key].status == "match"]
    routing = {key: Agreement(key) for key in compared if key.endswith(CHOSEN)}
    per_row = max(a.row_bytes(compared), b.row_bytes(compared))
    # a slice a quarter of the readers': comparing makes several temporaries of its size
    step = rows_per_slice(per_row, SLICE_BYTES // 4)
    for lo, hi, shard_a, shard_b in _segments(a, b, rows if per_row else 0, step):
        with ExitStack() as stack:
            fa = stack.enter_context(a.open(shard_a, compared))
            fb = stack.enter_context(b.open(shard_b, compared))
            for key in compared:
                top = min(hi, a.rows_of(key), b.rows_of(key))  # a ragged file's key: its rows
                if lo >= top:
                    continue
                ta, tb = (
                    a.read_rows(fa, shard_a, key, lo, top),
                    b.read_rows(fb, shard_b, key, lo, top),
                )
                _accumulate(results[key], ta, tb, atol, rtol)
                if key in routing:
                    routing[key].add(ta, tb, lo)
                del ta, tb  # before the next key's slice is read
    _judge([results[key] for key in compared], strict_dtype)
    return DiffResult(
        a.path,
        b.path,
        atol,
        rtol,
        [results[k] for k in order],
        (a.num_samples, b.num_samples),
        _problems(a, b, rows),
        [_placed(a, agreement) for agreement in routing.values()],
    )


def _judge(compared: list[KeyDiff], strict_dtype: bool) -> None:
    """Each compared key's status, once every row is in."""
    for item in compared:
        if item.mismatched:
            item.status = "differ"
        elif strict_dtype and item.dtypes:
            item.status, item.detail = "dtype", item.dtypes


def _placed(a: ShardReader, agreement: Agreement) -> Agreement:
    """`agreement` with its first differing row's sample and position, as A records them."""
    row = agreement.first
    if row < 0 or SAMPLE not in a or POSITION not in a:
        return agreement
    shard = next(s for s in a.shards if s.start <= row < s.stop)
    with a.open(shard, [SAMPLE, POSITION]) as file:
        sample = int(a.read_rows(file, shard, SAMPLE, row, row + 1)[0])
        position = int(a.read_rows(file, shard, POSITION, row, row + 1)[0])
    ids = a.manifest.sample_ids
    name = ids[sample] if ids is not None and 0 <= sample < len(ids) else sample
    agreement.where = f"sample {name!r}, position {position}"
    return agreement


def _check_shared(
    a: ShardReader, b: ShardReader, order: list[str], paths: tuple[object, object], chosen: bool
) -> None:
    """Two dumps with no key in common are not compared key by key: one line, exit 1."""
    if not any(key in a and key in b for key in order):
        raise CheckFailed(
            f"A ({paths[0]}) and B ({paths[1]}) share no key"
            f"{' of ' + opt('keys') if chosen else ''}: {_some(a.keys())} against "
            f"{_some(b.keys())}; they are dumps of different models or layers"
        )


def _some(keys: list[str]) -> str:
    """`n keys ('a', 'b', ...)`, for a line."""
    shown = ", ".join(repr(k) for k in keys[:2]) + (", ..." if len(keys) > 2 else "")
    return f"{len(keys)} key{'s' if len(keys) != 1 else ''} ({shown})"


def _selected(order: list[str], patterns: list[str]) -> list[str]:
    """The keys that `patterns` (globs) pick, in `order`; all of them without patterns."""
    for pattern in patterns:
        if not any(fnmatchcase(k, pattern) for k in order):
            raise HookdumpError(
                f"{opt('keys')} {pattern!r} matches no key of either "
                f"dump{did_you_mean(pattern, order)}"
            )
    if not patterns:
        return order
    return [k for k in order if any(fnmatchcase(k, p) for p in patterns)]


def _compare_meta(
    key: str, meta_a: Mapping[str, Any] | None, meta_b: Mapping[str, Any] | None
) -> KeyDiff:
    """How a key compares by its manifest entries alone (match: compare its values)."""
    module = (meta_a or meta_b or {}).get("module")
    if meta_a is None or meta_b is None:
        return KeyDiff(key, module, "only in B" if meta_a is None else "only in A")
    if meta_a["shape"] != meta_b["shape"]:
        return KeyDiff(key, module, "shape", f"{meta_a['shape']} vs {meta_b['shape']}")
    changed = (
        f"{meta_a['dtype']} vs {meta_b['dtype']}" if meta_a["dtype"] != meta_b["dtype"] else ""
    )
    return KeyDiff(key, module, "match", dtypes=changed)


def _problems(a: ShardReader, b: ShardReader, rows: int) -> list[str]:
    """What concerns the dumps as a whole: different sample counts, incomplete dumps."""
    problems = []
    if a.num_samples != b.num_samples:
        problems.append(
            f"num_samples differ: A has {a.num_samples}, B has {b.num_samples}; "
            f"compared the first {rows}"
        )
    for dump, name in ((a, "A"), (b, "B")):
        if not dump.manifest.complete:
            problems.append(f"{name} ({dump.path}) is an incomplete dump")
    return problems


def _segments(
    a: ShardReader, b: ShardReader, rows: int, step: int
) -> Iterator[tuple[int, int, ShardEntry, ShardEntry]]:
    """Row ranges of at most `step` rows over which one shard of A and one shard of B both
    hold every row, found in one walk along both shard lists."""
    i = j = lo = 0
    while lo < rows:
        while a.shards[i].stop <= lo:
            i += 1
        while b.shards[j].stop <= lo:
            j += 1
        hi = min(a.shards[i].stop, b.shards[j].stop, rows, lo + step)
        yield lo, hi, a.shards[i], b.shards[j]
        lo = hi


def _accumulate(
    diff: KeyDiff, ta: torch.Tensor, tb: torch.Tensor, atol: float, rtol: float
) -> None:
    """Fold a slice of rows in, with a few temporaries of the slice's size (sums of
    products in float64)."""
    work = _wider(ta.dtype, tb.dtype)
    x, y = ta.to(work).reshape(-1), tb.to(work).reshape(-1)
    delta = (x - y).abs_()
    scale = y.abs()
    finite = torch.isfinite(x) & torch.isfinite(y)
    # an Inf in B makes the tolerance infinite: only finite pairs are judged by it
    close = (delta <= scale.mul(rtol).add_(atol)) & finite
    close |= x == y  # the same Inf
    close |= torch.isnan(x) & torch.isnan(y)
    diff.mismatched += close.numel() - int(close.sum())
    diff.numel += x.numel()
    odd = ~close & ~finite  # a non-finite pair that differs: the row names the first
    if not diff.detail and bool(odd.any()):
        first = int(odd.nonzero()[0])
        diff.detail = f"{_value(x[first])} vs {_value(y[first])}"
    del close, odd
    if not bool(finite.all()):
        x, y, delta, scale = x[finite], y[finite], delta[finite], scale[finite]
    if not x.numel():
        return
    diff.max_abs = max(diff.max_abs, float(delta.max()))
    # relative to the larger of the two: 2 at most (opposite signs), 1 where one side is 0
    # (a ReLU's zero against a small value was an infinite error relative to B), 0/0 -> 0
    rel = delta.div_(torch.maximum(scale, x.abs())).nan_to_num_(nan=0.0)
    diff.max_rel = max(diff.max_rel, float(rel.max()))
    diff._dot += float((x * y).sum(dtype=torch.float64))
    diff._norm_a += float((x * x).sum(dtype=torch.float64))
    diff._norm_b += float((y * y).sum(dtype=torch.float64))


def _wider(a: torch.dtype, b: torch.dtype) -> torch.dtype:
    """The dtype both sides are compared in: the wider of the two, at least float32, and
    float64 for 64-bit integers (exact to 2**53) or float64."""
    if torch.float64 in (a, b) or torch.int64 in (a, b):
        return torch.float64
    promoted = torch.promote_types(a, b)
    if promoted.is_complex:
        return promoted
    return torch.float64 if promoted.itemsize > 4 else torch.float32


def _value(v: torch.Tensor) -> str:
    """One element as the row shows it: `inf`, `-inf`, `nan`, or the number."""
    return f"{float(v):.4g}"
