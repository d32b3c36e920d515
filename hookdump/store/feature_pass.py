"""One read of a batch's memory for its per-feature statistics: compiled loops (numba) that
take, per feature, the sum and the sum of squares of the values' deviations from a given
centre, the minimum and the maximum, and the sum of the rows' L2 norms, all at once.

Torch's reductions read the batch once per statistic and round each through a temporary;
these loops read each value once, from the cache where a row is read twice, and run at
15-30 GB/s on one thread (`benchmarks/feature_stats.py`). The sums are taken in the values'
dtype over blocks of at most `BLOCK` values and the blocks added in float64, so a float32
sum's rounding stays near float32's epsilon relative to the deviations (the caller picks a
centre near the mean, which bounds them by the spread). Compiled once per dtype and cached
on disk (`cache=True`).
"""

from __future__ import annotations

import math
from typing import Any

import numba
import numpy as np
from llvmlite import ir
from numba.extending import intrinsic

# elements a sum takes in the values' own dtype before it is added to a float64 total
BLOCK = 512
# reassociation lets the loops keep several sums at once (vectorised); no flag that assumes
# the values finite: a NaN or an infinity must reach the sums, where the caller sees it
_FAST = {"reassoc", "nsz", "contract", "arcp"}


def _min_max(name: str) -> Any:
    """llvm.minnum / llvm.maxnum: numba's own min() is a compare and a branch, which keeps
    a loop from being vectorised. A NaN is skipped by these, and seen in the sums instead."""

    @intrinsic
    def call(typingctx: Any, a: Any, b: Any) -> Any:
        def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
            kind = args[0].type
            fn = builder.module.declare_intrinsic(
                f"llvm.{name}", [kind], ir.FunctionType(kind, [kind, kind])
            )
            return builder.call(fn, args, fastmath=("nnan", "nsz"))

        return a(a, b), codegen

    return call


_lower, _upper = _min_max("minnum"), _min_max("maxnum")


def _compiled(fast: bool = True) -> Any:
    """numba.njit, its machine code cached on disk where numba finds a folder to write
    (beside this file, or the user's cache), else compiled anew in each process."""

    def compile(function: Any) -> Any:
        flags = _FAST if fast else False
        try:
            return numba.njit(cache=True, nogil=True, fastmath=flags)(function)
        except RuntimeError:  # "no locator available": nowhere to cache
            return numba.njit(nogil=True, fastmath=flags)(function)

    return compile


@_compiled()
def across(
    x: Any, centre: Any, s1: Any, s2: Any, lo: Any, hi: Any, squares: Any, zero: Any
) -> float:  # pragma: no cover - compiled
    """x [A, F, B] (a [C, H, W] sample's channels, F, each with B values): per feature f,
    adds the sum of x - centre[f] to s1[f], of its squares to s2[f], and folds the minimum
    and maximum into lo[f] and hi[f]; returns the sum of the A * B rows' norms (`squares`:
    [B] of x's dtype, scratch for one a's rows; `zero`: 0 of x's dtype)."""
    count, features, width = x.shape
    norms = 0.0
    for a in range(count):
        squares[:] = 0
        for f in range(features):
            c = centre[f]
            low = lo[f]
            high = hi[f]
            total = 0.0
            square = 0.0
            values = x[a, f]
            for start in range(0, width, BLOCK):
                block = values[start : start + BLOCK]
                t1 = zero
                t2 = zero
                for b in range(len(block)):
                    v = block[b]
                    d = v - c
                    t1 += d
                    t2 += d * d
                    low = _lower(low, v)
                    high = _upper(high, v)
                total += t1
                square += t2
            for b in range(width):  # the row, still in the cache
                squares[b] += values[b] * values[b]
            s1[f] += total
            s2[f] += square
            lo[f] = low
            hi[f] = high
        for b in range(width):
            norms += math.sqrt(squares[b])
    return norms


@_compiled()
def along(
    x: Any, centre: Any, s1: Any, s2: Any, lo: Any, hi: Any, sums: Any, zero: Any
) -> float:  # pragma: no cover - compiled
    """x [R, F] (rows of F features): as `across`, over R rows (`sums`: [2, F] of x's
    dtype, scratch for a block's sums)."""
    rows, features = x.shape
    t1, t2 = sums[0], sums[1]
    norms = 0.0
    for start in range(0, rows, BLOCK):
        t1[:] = 0
        t2[:] = 0
        for r in range(start, min(rows, start + BLOCK)):
            row = x[r]
            square = zero
            for f in range(features):
                v = row[f]
                d = v - centre[f]
                t1[f] += d
                t2[f] += d * d
                lo[f] = _lower(lo[f], v)
                hi[f] = _upper(hi[f], v)
                square += v * v
            norms += math.sqrt(square)
        for f in range(features):
            s1[f] += t1[f]
            s2[f] += t2[f]
    return norms


def feature_pass(x: np.ndarray, centre: np.ndarray) -> tuple[np.ndarray, ...]:
    """`x` [A, F, B] (contiguous, float32 or float64) in one read: per feature the sums of
    (x - centre) and of its squares (float64), the minimum and maximum (x's dtype); and the
    sum of the rows' norms, as a float64 array of one value."""
    features = x.shape[1]
    s1, s2 = np.zeros(features), np.zeros(features)
    lo = np.full(features, np.inf, dtype=x.dtype)
    hi = np.full(features, -np.inf, dtype=x.dtype)
    centre = centre.astype(x.dtype, copy=False)
    zero = x.dtype.type(0)
    if x.shape[2] == 1:
        sums = np.empty((2, features), dtype=x.dtype)
        norms = along(x.reshape(x.shape[0], features), centre, s1, s2, lo, hi, sums, zero)
    else:
        squares = np.empty(x.shape[2], dtype=x.dtype)
        norms = across(x, centre, s1, s2, lo, hi, squares, zero)
    return s1, s2, lo, hi, np.array([norms])


@_compiled(fast=False)
def _count(x: Any, first: float, last: float, counts: Any) -> None:  # pragma: no cover
    # a range of one value (x + 1.0 == x past 2^53): every value in the first bin
    scale = len(counts) / (last - first) if last > first else 0.0
    top = len(counts) - 1
    for i in range(x.shape[0]):
        for j in range(x.shape[1]):
            v = min(max(float(x[i, j]), first), last)
            counts[min(int((v - first) * scale), top)] += 1


def histogram(x: np.ndarray, first: float, last: float, bins: int) -> list[int]:
    """How many of `x`'s values (2-D, finite) fall in each of `bins` equal bins from `first`
    to `last`, those outside counted in the end bins: `torch.histc` of
    the values clamped to the range, without its copies (a tenth of its time)."""
    counts = np.zeros(bins, dtype=np.int64)
    _count(x, first, last, counts)
    return [int(c) for c in counts]
