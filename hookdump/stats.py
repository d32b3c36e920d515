"""Running statistics of captured tensors, accumulated batch by batch."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import torch

from hookdump.capturing import KeyInfo

HIST_BINS = 12


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
    # a coarse histogram over the first batch's finite range; later values outside it are
    # counted in the edge bins (exact for one batch, a sketch for more)
    hist: list[int] | None = None
    hist_range: tuple[float, float] = (0.0, 0.0)

    @property
    def std(self) -> float:
        return math.sqrt(self.m2 / self.count) if self.count else math.nan

    def update(self, tensor: torch.Tensor) -> None:
        """Fold one batch of values in."""
        x = tensor.detach()
        if x.is_complex():
            x = x.abs()
        if x.dtype not in (torch.float32, torch.float64):
            x = x.float()
        if x.numel() == 0:
            return
        finite = torch.isfinite(x)
        if not bool(finite.all()):
            nan = int(torch.isnan(x).sum())
            self.nan += nan
            self.inf += int((~finite).sum()) - nan
            x = x[finite]
            if x.numel() == 0:
                return
        var, mean = torch.var_mean(x, correction=0)
        lo, hi = torch.aminmax(x)
        n, batch_mean, batch_m2 = x.numel(), float(mean), float(var) * x.numel()
        total = self.count + n
        delta = batch_mean - self.mean
        self.m2 += batch_m2 + delta * delta * self.count * n / total
        self.mean += delta * n / total
        self.count = total
        self.min = min(self.min, float(lo))
        self.max = max(self.max, float(hi))
        self._histogram(x, float(lo), float(hi))

    def _histogram(self, x: torch.Tensor, lo: float, hi: float) -> None:
        if self.hist is None:
            self.hist_range = (lo, hi if hi > lo else lo + 1.0)
            self.hist = [0] * HIST_BINS
        first, last = self.hist_range
        counts = torch.histc(x.clamp(first, last), bins=HIST_BINS, min=first, max=last)
        self.hist = [a + int(b) for a, b in zip(self.hist, counts.tolist(), strict=True)]

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


@dataclass
class KeySummary:
    """One captured key: where it came from, its per-sample shape and its statistics."""

    info: KeyInfo
    shape: tuple[int, ...]
    dtype: str
    nbytes: int = 0
    stats: TensorStats = field(default_factory=TensorStats)

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
