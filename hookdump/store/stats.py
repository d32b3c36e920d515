"""Running statistics of captured tensors, accumulated batch by batch."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import torch

from hookdump.format.keys import KeyInfo
from hookdump.store.features import FeatureStats, batch_stats, features_of

HIST_BINS = 12
HIST_SAMPLE = 1 << 16  # elements of each batch that feed the sparkline's histogram
HIST_RUN = 256  # taken in runs of this many neighbours: an element a cache line is slow
# elements per chunk of the one pass: 1 MiB of float32, read from memory once and then from
# the cache: several times faster than four whole-tensor passes
_CHUNK = 1 << 18


def _one_pass(flat: torch.Tensor) -> tuple[float, float, float, float]:
    """Min, max, sum and sum of squares of a flat float tensor, chunk by chunk: each
    chunk's four reductions read it while it is in the cache. Chunks' sums (float32
    within a chunk) are added in float64: relative error about 1e-6."""
    mins, maxs, sums, squares = [], [], [], []
    for chunk in flat.split(_CHUNK):
        lo, hi = torch.aminmax(chunk)
        mins.append(lo)
        maxs.append(hi)
        sums.append(chunk.sum())
        squares.append(torch.dot(chunk, chunk))
    return (
        float(torch.stack(mins).min()),
        float(torch.stack(maxs).max()),
        float(torch.stack(sums).double().sum()),
        float(torch.stack(squares).double().sum()),
    )


def _sample(flat: torch.Tensor) -> torch.Tensor:
    """About HIST_SAMPLE elements of `flat`, evenly spread in runs of HIST_RUN."""
    runs = HIST_SAMPLE // HIST_RUN
    if flat.numel() <= HIST_SAMPLE:
        return flat
    stride = flat.numel() // runs
    return flat[: runs * stride].reshape(runs, stride)[:, :HIST_RUN]


@dataclass
class TensorStats:
    """Mean, std, min and max over the finite elements seen so far, and NaN/Inf counts."""

    count: int = 0
    mean: float = 0.0
    m2: float = 0.0  # sum of squared deviations from the mean (Chan et al.'s parallel update)
    min: float = math.inf
    max: float = -math.inf
    nan: int = 0
    inf: int = 0
    # a coarse histogram, over the first batch's finite range, of an evenly strided sample of
    # each batch; later values outside that range are counted in the edge bins: a sketch
    hist: list[int] | None = None
    hist_range: tuple[float, float] = (0.0, 0.0)

    @property
    def std(self) -> float:
        return math.sqrt(self.m2 / self.count) if self.count else math.nan

    def update(self, tensor: torch.Tensor) -> None:
        """Fold one batch of values in (a few fast passes: this runs on every byte dumped)."""
        x = tensor.detach()
        if x.is_complex():
            x = x.abs()
        if x.dtype not in (torch.float32, torch.float64):
            x = x.float()
        if x.numel() == 0:
            return
        flat = x.reshape(-1)
        lo, hi, summed, squares = _one_pass(flat)  # NaN and Inf propagate to these
        if not (math.isfinite(lo) and math.isfinite(hi)):
            finite = torch.isfinite(flat)
            nan = int(torch.isnan(flat).sum())
            self.nan += nan
            self.inf += int((~finite).sum()) - nan
            flat = flat[finite]
            if flat.numel() == 0:
                return
            lo, hi, summed, squares = _one_pass(flat)
        n = flat.numel()
        batch_mean = summed / n
        batch_m2 = squares - n * batch_mean * batch_mean
        if batch_m2 <= 1e-3 * n * batch_mean * batch_mean:
            # the mean dwarfs the spread: E[x^2] - E[x]^2 cancels, so take the slow exact way
            var, mean = torch.var_mean(flat, correction=0)
            batch_mean, batch_m2 = float(mean), float(var) * n
        total = self.count + n
        delta = batch_mean - self.mean
        self.m2 += max(batch_m2, 0.0) + delta * delta * self.count * n / total
        self.mean += delta * n / total
        self.count = total
        self.min = min(self.min, lo)
        self.max = max(self.max, hi)
        self._histogram(flat, lo, hi)

    def fold(self, whole: tuple[int, float, float, float, float], values: torch.Tensor) -> None:
        """Fold in one batch's statistics made already (count, mean, sum of squared
        deviations, min, max: `FeatureStats.whole`, all finite) and its `values`' sketch."""
        count, mean, m2, lo, hi = whole
        if not count:
            return
        self.merge(TensorStats(count, mean, m2, lo, hi))
        self._histogram(values.reshape(-1), lo, hi)

    def add_zeros(self, count: int) -> None:
        """Fold in `count` zeros without reading them (a hole in a sparse shard)."""
        if count <= 0:
            return
        zeros = TensorStats(count, 0.0, 0.0, 0.0, 0.0)
        if self.hist is None:
            self.hist_range, self.hist = (0.0, 1.0), [0] * HIST_BINS
        first, last = self.hist_range
        at = (
            0
            if last <= first
            else min(HIST_BINS - 1, max(0, int(-first / (last - first) * HIST_BINS)))
        )
        hist = list(self.hist)
        hist[at] += min(count, HIST_SAMPLE)  # as a batch's sample counts
        self.merge(zeros)
        self.hist = hist

    def _histogram(self, flat: torch.Tensor, lo: float, hi: float) -> None:
        if self.hist is None:
            self.hist_range = (lo, hi if hi > lo else lo + 1.0)
            self.hist = [0] * HIST_BINS
        first, last = self.hist_range
        sample = _sample(flat)  # a sparkline needs no more
        counts = torch.histc(sample.float().clamp(first, last), bins=HIST_BINS, min=first, max=last)
        self.hist = [a + int(b) for a, b in zip(self.hist, counts.tolist(), strict=True)]

    def merge(self, other: TensorStats) -> None:
        """Fold in statistics gathered elsewhere (another rank's), exactly but the sketch."""
        if other.count:
            total = self.count + other.count
            delta = other.mean - self.mean
            self.m2 += other.m2 + delta * delta * self.count * other.count / total
            self.mean += delta * other.count / total
            self.count = total
            self.min, self.max = min(self.min, other.min), max(self.max, other.max)
        self.nan += other.nan
        self.inf += other.inf
        if self.hist is None:
            self.hist, self.hist_range = other.hist, other.hist_range
        elif other.hist is not None and other.hist_range == self.hist_range:
            self.hist = [a + b for a, b in zip(self.hist, other.hist, strict=True)]

    def as_dict(self) -> dict[str, float | int | None]:
        """JSON-safe values (None where nothing finite was seen)."""

        def clean(v: float) -> float | None:
            return v if math.isfinite(v) else None

        return {
            "mean": clean(self.mean) if self.count else None,
            "std": clean(self.std),
            "min": clean(self.min),
            "max": clean(self.max),
            "nan": self.nan,
            "inf": self.inf,
        }


# attention values of `[..., heads, head_dim]`: their features are each head's dimensions,
# not the dimensions pooled over the heads (nor, without token rows, the positions)
PER_HEAD = frozenset({"q", "k", "v", "z", "q_pre_rope", "k_pre_rope"})


@dataclass
class KeySummary:
    """One captured key: where it came from, its per-sample shape and its statistics."""

    info: KeyInfo
    shape: tuple[int, ...]
    dtype: str
    nbytes: int = 0
    stats: TensorStats = field(default_factory=TensorStats)
    # per feature (floating keys): None until a value is seen, or once some values could
    # not be read as rows (`lose_features`: a hole of a sparse shard, a row read in parts)
    features: FeatureStats | None = None
    features_lost: bool = False

    def merge(self, other: KeySummary) -> None:
        """Fold in the same key's summary from elsewhere (another rank's)."""
        self.nbytes += other.nbytes
        self.stats.merge(other.stats)
        if other.features_lost:
            self.lose_features()
        elif other.features is not None and not self.features_lost:
            if self.features is None:
                self.features = FeatureStats.empty(other.features.count.numel())
            self.features.merge(other.features)

    def lose_features(self) -> None:
        """Some values were not seen as rows: no per-feature statistics for this key."""
        self.features, self.features_lost = None, True

    def add_features(self, tensor: torch.Tensor, batch: FeatureStats | None = None) -> None:
        """Fold a batch of rows into the per-feature statistics (floating keys only), or
        its statistics made already (`batch`)."""
        if self.features_lost or not tensor.is_floating_point():
            return
        if tuple(tensor.shape[1:]) != self.shape:  # refused by the writer; else not rows alike
            self.lose_features()
            return
        if self.features is None:
            self.features = FeatureStats.empty(features_of(self._feature_shape()))
        if batch is None:
            self.features.update(self._as_rows(tensor))
        else:
            self.features.merge(batch)

    def count_bytes(self, nbytes: int) -> None:
        """Rows of `nbytes` are on disk (read back: their values are added apart)."""
        self.nbytes += nbytes

    def add(self, tensor: torch.Tensor) -> int:
        """Count a batch of this key's rows in; its bytes."""
        nbytes = tensor.numel() * tensor.element_size()
        self.nbytes += nbytes
        self.add_values(tensor)
        return nbytes

    def add_values(self, tensor: torch.Tensor) -> None:
        """Fold a batch of rows into the statistics (their bytes are counted apart): a
        floating batch without NaN or infinities in one read of its memory, whose
        per-feature statistics make the whole key's."""
        batch = batch_stats(self._as_rows(tensor))
        if batch is None:
            self.stats.update(tensor)
        else:
            self.stats.fold(batch.whole(), tensor)
        self.add_features(tensor, batch)

    def _per_head(self) -> bool:
        return self.info.kind in PER_HEAD and len(self.shape) >= 2

    def _feature_shape(self) -> tuple[int, ...]:
        """The per-sample shape the features are read from: a per-head key's heads and
        their dimensions as one (a feature per head and dimension, head-major)."""
        if not self._per_head():
            return self.shape
        return (*self.shape[:-2], self.shape[-2] * self.shape[-1])

    def _as_rows(self, tensor: torch.Tensor) -> torch.Tensor:
        return tensor.flatten(-2) if self._per_head() else tensor

    def as_dict(self) -> dict[str, Any]:
        return {
            "key": self.info.key,
            "module": self.info.module,
            "module_type": self.info.module_type,
            "kind": self.info.kind,
            "call": self.info.call,
            "shape": list(self.shape),
            "dtype": self.dtype,
            "bytes": self.nbytes,
            **self.stats.as_dict(),
        }
