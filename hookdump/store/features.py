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

import functools
import threading
from collections.abc import Mapping
from dataclasses import dataclass

import torch

from hookdump.store.feature_pass import feature_pass
from hookdump.store.header import header_of

FIELDS = ("count", "mean", "var", "min", "max", "norm_mean", "rows")
F64 = torch.float64
# fewer values per feature than this (a [C, 2, 2] sample's four) are read as rows of
# features: the compiled loop over one feature's values would be mostly its setup
FEW = 16


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


def batch_stats(tensor: torch.Tensor, centre: torch.Tensor | None = None) -> FeatureStats | None:
    """A floating batch's per-feature statistics, its memory read once; None where it
    holds a NaN or an infinity (`FeatureStats.update` then masks them) or is not floating.

    `centre`: a value per feature near its mean (the key's running mean), which the sums
    are taken around; without one, the first sample's (or first rows') mean. Where a
    feature's mean lies more than twice its spread from the centre, the batch is read again
    around its own mean, so the sum of squares never loses more than a few bits to
    cancellation. A CUDA batch's are taken on the device (`on_device`)."""
    if not tensor.is_floating_point() or tensor.numel() == 0:
        return None
    if tensor.device.type != "cpu":
        return on_device(tensor).host()
    values = _as_features(tensor.contiguous())
    if values.dtype not in (torch.float32, F64):
        values = values.float()
    if 1 < values.shape[2] < FEW:  # a few values per feature: read as rows instead
        values = values.transpose(1, 2).reshape(-1, values.shape[1], 1)
    if centre is None:
        centre = values[:1].mean((0, 2)) if values.shape[2] > 1 else values[:64].mean((0, 2))
    return _from_pass(values, centre.double())


@functools.cache
def warm_up() -> None:
    """Load the compiled pass (`feature_pass`) in a background thread, once per process:
    its first call takes about 0.3 s of numba's setting up, which then overlaps the
    model's loading and first forward instead of delaying the first batch's write."""
    batch = torch.zeros(1, 1, FEW)
    thread = threading.Thread(target=batch_stats, args=(batch,), name="hookdump-warm-up")
    thread.daemon = True
    thread.start()


def _from_pass(values: torch.Tensor, centre: torch.Tensor) -> FeatureStats | None:
    rows = values.shape[0] * values.shape[2]
    for again in (False, True):
        centre = centre.to(values.dtype).double()  # as the pass takes it
        s1, s2, lo, hi, norms = (
            torch.from_numpy(a) for a in feature_pass(values.numpy(), centre.numpy())
        )
        if not (bool(lo.isfinite().all()) and bool(hi.isfinite().all())):
            return None  # an infinity (a NaN is skipped by min and max, and found next)
        if bool(s1.isnan().any()) or bool(norms.isnan().any()):
            return None
        if not (bool(s2.isfinite().all()) and bool(norms.isfinite().all())):
            if values.dtype == F64:
                return None
            return _from_pass(values.double(), centre)  # squares past float32's largest
        offset = s1 / rows
        shift = rows * offset * offset
        m2 = s2 - shift
        if again or bool((shift <= 4 * m2).all()):
            break
        centre = centre + offset  # far from the centre: again around the batch's mean
    count = torch.full((values.shape[1],), rows, dtype=torch.int64)
    return FeatureStats(
        count, centre + offset, m2.clamp(min=0), lo.double(), hi.double(), rows, float(norms[0])
    )


@dataclass(frozen=True)
class OnDevice:
    """A CUDA batch's per-feature statistics as taken on the device (`on_device`), read by
    the host only once the copy of the batch is done (no synchronisation per tensor)."""

    sums: torch.Tensor  # [5, F] float64: mean, sum of squared deviations, min, max, finite
    norms: torch.Tensor  # float64: the sum of the rows' norms
    rows: int

    def host(self) -> FeatureStats | None:
        """The statistics, on the host; None where the batch held a NaN or an infinity."""
        mean, m2, low, high, finite = self.sums.cpu()
        if not bool(finite.all()):
            return None
        count = torch.full((len(mean),), self.rows, dtype=torch.int64)
        return FeatureStats(count, mean, m2, low, high, self.rows, float(self.norms))


def on_device(tensor: torch.Tensor) -> OnDevice:
    """`batch_stats` of a batch in a GPU's memory, queued on its stream before the copy to
    the host (float64 whole-tensor passes: cheap at a GPU's memory bandwidth)."""
    x = as_rows(tensor).double()
    mean = x.mean(0)
    m2 = (x - mean).square_().sum(0)
    finite = torch.isfinite(x).all(0).double()
    sums = torch.stack((mean, m2, x.amin(0), x.amax(0), finite))
    return OnDevice(sums, torch.linalg.vector_norm(x, dim=1).sum(), len(x))


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
        header, _ = header_of(lambda nbytes, offset: raw[offset : offset + nbytes], len(raw))
        tensors = load(raw)
    except (SafetensorError, OSError, RuntimeError, ValueError) as exc:
        raise ValueError(f"{where} is not a safetensors file ({exc})") from None
    meta = header.get("__metadata__")
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
