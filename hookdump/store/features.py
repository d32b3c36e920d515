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
import math
import struct
import threading
from collections.abc import Iterator, Mapping
from dataclasses import dataclass

import torch

FIELDS = ("count", "mean", "var", "min", "max", "norm_mean", "rows")
F64 = torch.float64
# elements of a batch read at a time by `batch_stats`: each piece is read from memory once,
# and its reductions then read it from the cache (with its float64 copy, 1.5 MiB)
PIECE = 1 << 18


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


def _as_features(tensor: torch.Tensor) -> torch.Tensor:
    """A contiguous batch as [A, F, B] without a copy: F features, and a row for each of
    the A * B pairs (a [C, H, W] sample is [1, C, H * W], rows of [T, D] are [T, D, 1])."""
    sample = tuple(tensor.shape[1:])
    if len(sample) == 3:
        return tensor.view(len(tensor), sample[0], sample[1] * sample[2])
    features = features_of(sample)
    return tensor.view(tensor.numel() // features, features, 1)


def _pieces(shape: torch.Size) -> Iterator[tuple[slice, slice]]:
    """[A, F, B] cut into pieces of about PIECE elements, each of whole rows (all F
    features of some (a, b) pairs): several a, or one a and several b."""
    count, features, across = shape
    per = PIECE // (features * across)
    if per >= 1:
        for a in range(0, count, per):
            yield slice(a, a + per), slice(None)
        return
    step = max(1, PIECE // features)
    for a in range(count):
        for b in range(0, across, step):
            yield slice(a, a + 1), slice(b, b + step)


class _Scratch(threading.local):
    """Each thread's memory for `batch_stats`' pieces, made once (no page faults)."""

    def __init__(self) -> None:
        self.kept: dict[tuple[torch.dtype, int], torch.Tensor] = {}

    def take(self, dtype: torch.dtype, shape: torch.Size, slot: int = 0) -> torch.Tensor:
        size = shape.numel()
        kept = self.kept.get((dtype, slot))
        if kept is None or kept.numel() < size:
            kept = self.kept[(dtype, slot)] = torch.empty(max(size, PIECE), dtype=dtype)
        return kept[:size].view(shape)


_SCRATCH = _Scratch()


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

    def update(self, tensor: torch.Tensor) -> None:
        """Fold in a batch of samples, whatever its values: NaN and infinities are left out
        per feature, and a row holding one has no norm (`batch_stats` is the fast way for a
        batch without them)."""
        x = as_rows(tensor)
        if not x.is_floating_point() or len(x) == 0:
            return
        x = x.double()  # squares of values near float32's largest overflow it
        ok = torch.isfinite(x)
        count = ok.sum(0)
        x = torch.where(ok, x, 0.0)
        mean = x.sum(0, dtype=F64) / count.clamp(min=1)
        # squared deviations from the batch's own mean, rounded to x's dtype (no
        # cancellation whatever the mean), corrected for that rounding exactly; summed in
        # x's dtype (pairwise: about 1e-7 relative), batches merged in float64
        centre = mean.to(x.dtype)
        deviations = torch.where(ok, x - centre, 0.0)
        m2 = (deviations * deviations).sum(0).double()
        m2 -= count * (mean - centre.double()) ** 2
        low = torch.where(ok, x, torch.inf).amin(0).double()
        high = torch.where(ok, x, -torch.inf).amax(0).double()
        whole = x[ok.all(1)]
        norms = float(torch.linalg.vector_norm(whole, dim=1).sum(dtype=F64))
        self.merge(FeatureStats(count, mean, m2.clamp(min=0), low, high, len(whole), norms))

    def whole(self) -> tuple[int, float, float, float, float]:
        """Count, mean, sum of squared deviations, min and max over every feature."""
        count = self.count.double()
        total = float(count.sum())
        if not total:
            return 0, 0.0, 0.0, float("inf"), float("-inf")
        mean = float((count * self.mean).sum()) / total
        m2 = float((self.m2 + count * (self.mean - mean) ** 2).sum())
        return int(total), mean, m2, float(self.min.min()), float(self.max.max())

    def merge(self, other: FeatureStats) -> None:
        """Fold in statistics gathered elsewhere (a batch, another rank's, a resumed run's)."""
        total = self.count + other.count
        share = other.count.double() / total.clamp(min=1)  # int / int is float32
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
        seen = self.count > 0  # a feature with no finite value has no mean, min or max
        return {
            "count": self.count,
            "mean": torch.where(seen, self.mean, torch.nan),
            "var": torch.where(seen, self.m2 / self.count.clamp(min=1), torch.nan),
            "min": torch.where(seen, self.min, torch.nan),
            "max": torch.where(seen, self.max, torch.nan),
            "norm_mean": torch.tensor(
                self.norm_sum / self.rows if self.rows else torch.nan, dtype=F64
            ),
            "rows": torch.tensor(self.rows),
        }


def batch_stats(tensor: torch.Tensor) -> FeatureStats | None:
    """A floating batch's per-feature statistics, its memory read once; None where it
    holds a NaN or an infinity (`FeatureStats.update` then masks them) or is not floating.

    Piece by piece (`_pieces`), on memory made once per thread: the float64 sum, the
    squared deviations from the piece's own mean (rounded to the values' dtype, so nothing
    cancels; the rounding corrected exactly below), the minimum and maximum, and the rows'
    norms, each reading the piece from the cache. The pieces merge as batches do (Chan et
    al.), all at once. Whole-batch float64 copies, a transposed copy of [C, H, W] batches
    and their temporaries made vision dumps 2.3x slower (benchmarks/README.md)."""
    if not tensor.is_floating_point() or tensor.numel() == 0:
        return None
    values = _as_features(tensor.contiguous())
    dtype = values.dtype if values.dtype in (torch.float32, F64) else torch.float32
    pieces = list(_pieces(values.shape))
    sums = torch.empty(len(pieces), values.shape[1], dtype=F64)
    m2 = torch.empty(len(pieces), values.shape[1], dtype=dtype)
    lows, highs = torch.empty_like(m2), torch.empty_like(m2)
    norms, counts = torch.empty(len(pieces), dtype=F64), torch.empty(len(pieces), dtype=F64)
    for index, (along, across) in enumerate(pieces):
        piece = values[along, :, across]
        if piece.dtype != dtype:
            piece = _SCRATCH.take(dtype, piece.shape, 1).copy_(piece)
        counts[index] = rows = piece.shape[0] * piece.shape[2]
        wide = piece if dtype == F64 else _SCRATCH.take(F64, piece.shape).copy_(piece)
        torch.sum(wide, (0, 2), out=sums[index])
        centre = (sums[index] / rows).to(dtype)[:, None]
        spare = _SCRATCH.take(dtype, piece.shape)
        torch.sum(torch.sub(piece, centre, out=spare).square_(), (0, 2), out=m2[index])
        torch.amin(piece, (0, 2), out=lows[index])
        torch.amax(piece, (0, 2), out=highs[index])
        norm = torch.mul(piece, piece, out=spare).sum(1).sqrt_()
        torch.sum(norm, (0, 1), dtype=F64, out=norms[index])
    low, high = lows.amin(0).double(), highs.amax(0).double()
    if not (bool(low.isfinite().all()) and bool(high.isfinite().all())):
        return None
    if dtype != F64 and not (bool(m2.isfinite().all()) and math.isfinite(float(norms.sum()))):
        return batch_stats(tensor.double())  # squares past float32's largest: again, wider
    each = counts[:, None]
    means = sums / each
    exact = m2.double() - each * (means - means.to(dtype).double()) ** 2
    total = counts.sum()
    mean = sums.sum(0) / total
    deviations = (exact.clamp(min=0) + each * (means - mean) ** 2).sum(0)
    count = torch.full((values.shape[1],), int(total), dtype=torch.int64)
    return FeatureStats(count, mean, deviations, low, high, int(total), float(norms.sum()))


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
