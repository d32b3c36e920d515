"""Running statistics of captured tensors, accumulated batch by batch."""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any

import torch

from hookdump.format.keys import KeyInfo
from hookdump.store.feature_pass import histogram
from hookdump.store.features import FeatureStats, OnDevice, batch_stats, features_of, on_device

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


def _flat(tensor: torch.Tensor) -> torch.Tensor:
    """A batch's values, flat, as float32 or float64 (a complex value's magnitude)."""
    x = tensor.detach()
    if x.is_complex():
        x = x.abs()
    if x.dtype not in (torch.float32, torch.float64):
        x = x.float()
    return x.reshape(-1)


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
        flat = _flat(tensor)
        if flat.numel() == 0:
            return
        lo, hi, summed, squares = _one_pass(flat)  # NaN and Inf propagate to these
        if not (math.isfinite(lo) and math.isfinite(hi)):
            flat = self._drop_bad(flat)
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
        self.merge(TensorStats(n, batch_mean, max(batch_m2, 0.0), lo, hi))
        self._histogram(flat, lo, hi)

    def sketch(self, tensor: torch.Tensor, finite: tuple[float, float] | None = None) -> None:
        """Count a batch's NaN and infinities and sketch its finite values, its moments
        kept elsewhere (per feature: `KeySummary`); `finite`: its min and max, where it is
        known to hold only finite values."""
        if finite is not None:  # the sample is made float, not the batch
            self._histogram(tensor.reshape(-1), *finite)
            return
        flat = self._drop_bad(_flat(tensor))
        if flat.numel():
            lo, hi = torch.aminmax(flat)
            self._histogram(flat, float(lo), float(hi))

    def _drop_bad(self, flat: torch.Tensor) -> torch.Tensor:
        """`flat`'s finite values, its NaN and infinities counted."""
        finite = torch.isfinite(flat)
        nan = int(torch.isnan(flat).sum())
        self.nan += nan
        self.inf += int((~finite).sum()) - nan
        return flat[finite]

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
        if sample.dtype not in (torch.float32, torch.float64):
            sample = sample.float()
        counts = histogram(sample.view(-1, sample.shape[-1]).numpy(), first, last, HIST_BINS)
        self.hist = [a + b for a, b in zip(self.hist, counts, strict=True)]

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


def _per_head(info: KeyInfo, shape: tuple[int, ...]) -> bool:
    return info.kind in PER_HEAD and len(shape) >= 2


def feature_rows(info: KeyInfo, tensor: torch.Tensor) -> torch.Tensor:
    """A batch as its features are read: a per-head key's heads and their dimensions as
    one (a feature per head and dimension, head-major)."""
    return tensor.flatten(-2) if _per_head(info, tuple(tensor.shape[1:])) else tensor


def device_stats(info: KeyInfo, tensor: torch.Tensor) -> OnDevice | None:
    """A CUDA batch's per-feature statistics, queued on its device before its copy to the
    host (None for one that has no features: `KeySummary.add` then reads the copy)."""
    if not tensor.is_floating_point() or tensor.dim() < 1 or tensor.numel() == 0:
        return None
    return on_device(feature_rows(info, tensor))


@dataclass
class KeySummary:
    """One captured key: where it came from, its per-sample shape and its statistics, kept
    once: per feature where its values are seen as rows of floats (`features`), else for
    the key as a whole (`whole`: an integer key, or one whose features were lost)."""

    info: KeyInfo
    shape: tuple[int, ...]
    dtype: str
    nbytes: int = 0
    # the whole key's statistics where it has no `features`; beside them, its NaN and
    # infinity counts and its sketch only
    whole: TensorStats = field(default_factory=TensorStats)
    # per feature (floating keys): None until a value is seen, or once some values could
    # not be read as rows (`lose_features`: a hole of a sparse shard, a row read in parts)
    features: FeatureStats | None = None
    features_lost: bool = False

    @property
    def stats(self) -> TensorStats:
        """The whole key's statistics (made from its features' where it has them)."""
        if self.features is None:
            return self.whole
        count, mean, m2, lo, hi = self.features.whole()
        return replace(self.whole, count=count, mean=mean, m2=m2, min=lo, max=hi)

    def merge(self, other: KeySummary) -> None:
        """Fold in the same key's summary from elsewhere (another rank's)."""
        self.nbytes += other.nbytes
        if other.features is not None and self._can_take_features():
            if self.features is None:
                self.features = FeatureStats.empty(other.features.count.numel())
            self.features.merge(other.features)
            self.whole.merge(other.whole)  # NaN and infinity counts, and the sketch
            return
        if other.features_lost or (self.features is not None and other.whole.count):
            self.lose_features()
        self.whole.merge(other.stats)

    def lose_features(self) -> None:
        """Some values are not seen as rows: the key's statistics are kept whole from now."""
        if self.features is not None:
            self.whole.merge(TensorStats(*self.features.whole()))
        self.features, self.features_lost = None, True

    def count_bytes(self, nbytes: int) -> None:
        """Rows of `nbytes` are on disk (read back: their values are added apart)."""
        self.nbytes += nbytes

    def add(self, tensor: torch.Tensor, taken: OnDevice | None = None) -> int:
        """Count a batch of this key's rows in; its bytes. `taken`: its per-feature
        statistics as taken on the GPU it came from (`device_stats`)."""
        nbytes = tensor.numel() * tensor.element_size()
        self.nbytes += nbytes
        self.add_values(tensor, taken)
        return nbytes

    def add_values(self, tensor: torch.Tensor, taken: OnDevice | None = None) -> None:
        """Fold a batch of rows into the statistics (their bytes are counted apart): per
        feature where they are rows of floats (a batch without NaN or infinities in one read
        of its memory), else whole."""
        if not self._as_features(tensor):
            self.whole.update(tensor)
            return
        assert self.features is not None
        rows = feature_rows(self.info, tensor)
        seen = self.features
        if taken is not None:
            batch = taken.host()
        else:
            batch = batch_stats(rows, seen.mean.float() if bool(seen.count.any()) else None)
        if batch is None:  # NaN or infinities: masked per feature
            self.features.update(rows)
            self.whole.sketch(tensor)
        else:
            self.features.merge(batch)
            self.whole.sketch(tensor, (float(batch.min.min()), float(batch.max.max())))

    def add_zeros(self, count: int) -> None:
        """Fold in `count` zeros without reading them (a hole of a sparse shard): not rows."""
        self.lose_features()
        self.whole.add_zeros(count)

    def _can_take_features(self) -> bool:
        return not self.features_lost and (self.features is not None or not self.whole.count)

    def _as_features(self, tensor: torch.Tensor) -> bool:
        """Whether `tensor`'s values go into the per-feature statistics (made if need be)."""
        if not tensor.is_floating_point() or not self._can_take_features():
            return False
        if tuple(tensor.shape[1:]) != self.shape:  # refused by the writer; else not rows alike
            self.lose_features()
            return False
        if self.features is None:
            self.features = FeatureStats.empty(features_of(self._feature_shape()))
        return True

    def _per_head(self) -> bool:
        return _per_head(self.info, self.shape)

    def _feature_shape(self) -> tuple[int, ...]:
        """The per-sample shape the features are read from: a per-head key's heads and
        their dimensions as one (a feature per head and dimension, head-major)."""
        if not self._per_head():
            return self.shape
        return (*self.shape[:-2], self.shape[-2] * self.shape[-1])

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
