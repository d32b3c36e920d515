"""Per-feature statistics of a key, made while it is written: for each feature, the count of
finite values, their mean and variance (Chan et al.'s parallel update, float64), minimum and
maximum; and the mean L2 norm of a row, which sparse-autoencoder trainers scale by. They
merge exactly across batches, ranks and resumed runs, and go into the dump's
`stats.safetensors` (`stats_file`, `read_stats_file`).

A key's features are its last dimension, or the channel of a `[C, H, W]` sample: a sample of
shape `[T, D]` gives T rows of D features, one of `[C, H, W]` H * W rows of C. Only floating
keys have them (not token ids, positions or masks).
"""

from __future__ import annotations

import json
import struct
from collections.abc import Mapping
from dataclasses import dataclass

import torch

FIELDS = ("count", "mean", "var", "min", "max", "norm_mean", "rows")
F64 = torch.float64


def as_rows(tensor: torch.Tensor) -> torch.Tensor:
    """A batch of samples as rows of features (see the module's docstring); the rows are
    counted, not left to `reshape`, which cannot infer them for rows of no features."""
    sample = tuple(tensor.shape[1:])
    if len(sample) == 3:
        tensor = tensor.movedim(1, -1)  # the channel last
    rows = tensor.shape[:-1].numel() if sample else len(tensor)
    return tensor.reshape(rows, features_of(sample))


def features_of(shape: tuple[int, ...]) -> int:
    """How many features a sample of `shape` has."""
    if len(shape) == 3:
        return shape[0]
    return shape[-1] if shape else 1


@dataclass
class FeatureStats:
    """Running per-feature statistics (tensors of one value per feature)."""

    count: torch.Tensor  # int64: finite values seen
    mean: torch.Tensor
    m2: torch.Tensor  # sum of squared deviations from the mean
    min: torch.Tensor
    max: torch.Tensor
    rows: int = 0  # rows whose norm was taken (those wholly finite)
    norm_sum: float = 0.0

    @classmethod
    def empty(cls, features: int) -> FeatureStats:
        zeros = torch.zeros(features, dtype=F64)
        return cls(
            torch.zeros(features, dtype=torch.int64),
            zeros,
            zeros.clone(),
            torch.full((features,), torch.inf, dtype=F64),
            torch.full((features,), -torch.inf, dtype=F64),
        )

    def update(self, tensor: torch.Tensor, finite: bool) -> None:
        """Fold in a batch of samples (`finite`: it holds no NaN or infinity, known from the
        key's own statistics, so no mask is made)."""
        x = as_rows(tensor)
        if not x.is_floating_point() or len(x) == 0:
            return
        if x.dtype not in (torch.float32, F64):
            x = x.float()
        if finite:
            self._fold(x, None)
        else:
            self._fold(x, torch.isfinite(x))

    def _fold(self, x: torch.Tensor, ok: torch.Tensor | None) -> None:
        if ok is None:
            count = torch.full((x.shape[1],), len(x), dtype=torch.int64)
            summed = x.sum(0, dtype=F64)
        else:
            count = ok.sum(0)
            x = torch.where(ok, x, 0.0)
            summed = x.sum(0, dtype=F64)
        mean = summed / count.clamp(min=1)
        # squared deviations from the batch's own mean, rounded to x's dtype (no
        # cancellation whatever the mean), corrected for that rounding exactly; summed in
        # x's dtype (pairwise: about 1e-7 relative), batches merged in float64
        centre = mean.to(x.dtype)
        deviations = x - centre
        if ok is not None:
            deviations = torch.where(ok, deviations, 0.0)
        m2 = (deviations * deviations).sum(0).double()
        m2 -= count * (mean - centre.double()) ** 2
        lows = x if ok is None else torch.where(ok, x, torch.inf)
        highs = x if ok is None else torch.where(ok, x, -torch.inf)
        # amin and amax apart: torch's aminmax along a dimension is ten times slower
        low, high = lows.amin(0).double(), highs.amax(0).double()
        self.merge(FeatureStats(count, mean, m2.clamp(min=0), low, high))
        whole = x if ok is None else x[ok.all(1)]
        self.rows += len(whole)
        self.norm_sum += float(torch.linalg.vector_norm(whole, dim=1).sum(dtype=F64))

    def merge(self, other: FeatureStats) -> None:
        """Fold in statistics gathered elsewhere (a batch, another rank's, a resumed run's)."""
        total = self.count + other.count
        share = other.count / total.clamp(min=1)
        delta = other.mean - self.mean
        self.m2 = self.m2 + other.m2 + delta * delta * self.count * share
        self.mean = self.mean + delta * share
        self.count = total
        self.min = torch.minimum(self.min, other.min)
        self.max = torch.maximum(self.max, other.max)
        self.rows += other.rows
        self.norm_sum += other.norm_sum

    def fields(self) -> dict[str, torch.Tensor]:
        """The tensors `stats.safetensors` holds for a key, by field (`FIELDS`)."""
        var = self.m2 / self.count.clamp(min=1)
        return {
            "count": self.count,
            "mean": self.mean,
            "var": torch.where(self.count > 0, var, torch.nan),
            "min": self.min,
            "max": self.max,
            "norm_mean": torch.tensor(
                self.norm_sum / self.rows if self.rows else torch.nan, dtype=F64
            ),
            "rows": torch.tensor(self.rows),
        }


def stats_file(fields: Mapping[str, Mapping[str, torch.Tensor]], run_id: str | None) -> bytes:
    """The bytes of `stats.safetensors`: every key's fields (`KEY/FIELD`), as a dump holds
    them and an export carries them."""
    from safetensors.torch import save

    tensors = {f"{key}/{name}": value for key, by in fields.items() for name, value in by.items()}
    return save(tensors, metadata={"format": "hookdump/1", "run_id": run_id or ""})


def read_stats_file(
    raw: bytes, run_id: str | None, where: str
) -> dict[str, dict[str, torch.Tensor]]:
    """Every key's statistics from the bytes of `stats.safetensors` (checked against the
    manifest's size and SHA-256 before): key -> field -> tensor. Raises ValueError where
    the file is not such a file, or is another run's."""
    from safetensors import SafetensorError
    from safetensors.torch import load

    try:
        size = struct.unpack("<Q", raw[:8])[0]
        header = json.loads(raw[8 : 8 + size]) if size <= len(raw) - 8 else None
        tensors = load(raw)
    except (SafetensorError, RuntimeError, ValueError, struct.error) as exc:
        raise ValueError(f"{where} is not a safetensors file ({exc})") from None
    meta = header.get("__metadata__") if isinstance(header, dict) else None
    if not isinstance(meta, dict) or meta.get("run_id", "") != (run_id or ""):
        raise ValueError(f"{where} was written by another run than its manifest's")
    found: dict[str, dict[str, torch.Tensor]] = {}
    for name, tensor in tensors.items():
        key, _, field = name.rpartition("/")
        if field not in FIELDS or not key:
            raise ValueError(f"{where} holds {name[:80]!r}, not KEY/FIELD of {FIELDS}")
        found.setdefault(key, {})[field] = tensor
    for key, fields in found.items():
        if set(fields) != set(FIELDS):
            missing = sorted(set(FIELDS) - set(fields))
            raise ValueError(f"{where}: {key[:80]!r} lacks {missing}")
    return found
