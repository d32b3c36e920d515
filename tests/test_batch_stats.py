"""The one-read statistics of a batch (`store.features.batch_stats`, issue 43): piece by
piece on reused memory, they equal float64 reductions over the whole batch for every way a
batch is cut (several samples a piece, one sample cut across its positions, features wider
than a piece), every floating dtype, and values far from zero; a batch holding NaN or an
infinity goes the masked way. And the threads that run them run torch on one thread."""

from __future__ import annotations

import threading

import pytest
import torch

from hookdump.format.keys import KeyInfo
from hookdump.store import features
from hookdump.store.features import FeatureStats, batch_stats
from hookdump.store.stats import KeySummary
from hookdump.worker import Worker


def reference(batch: torch.Tensor) -> dict[str, torch.Tensor]:
    """Count, mean, sum of squared deviations, min, max per feature; rows; norm sum."""
    rows = batch.double()
    rows = rows.movedim(1, -1) if rows.dim() == 4 else rows
    rows = rows.reshape(-1, rows.shape[-1] if rows.dim() > 1 else 1)
    mean = rows.mean(0)
    return {
        "mean": mean,
        "m2": ((rows - mean) ** 2).sum(0),
        "min": rows.amin(0),
        "max": rows.amax(0),
        "rows": torch.tensor(len(rows)),
        "norms": rows.norm(dim=1).sum(),
    }


def check(got: FeatureStats | None, batch: torch.Tensor) -> None:
    assert got is not None
    want = reference(batch)
    assert torch.equal(got.count, torch.full_like(got.count, int(want["rows"])))
    torch.testing.assert_close(got.mean, want["mean"], rtol=1e-9, atol=1e-12)
    torch.testing.assert_close(got.m2, want["m2"], rtol=1e-6, atol=1e-9)
    assert torch.equal(got.min, want["min"]) and torch.equal(got.max, want["max"])
    assert got.rows == int(want["rows"])
    torch.testing.assert_close(torch.tensor(got.norm_sum, dtype=torch.float64), want["norms"],
                               rtol=1e-6, atol=0.0)  # fmt: skip


@pytest.mark.parametrize(
    "shape",
    [
        (6, 3, 5, 7),  # [C, H, W]: several samples a piece
        (3, 16, 40, 40),  # [C, H, W] larger than a piece: cut across its positions
        (9, 33, 20),  # [T, D] token rows
        (7, 50),  # [D] vectors
        (11,),  # a number per sample
        (2, 3, 300),  # features wider than a piece
    ],
)
def test_equal_float64_reductions_for_every_cut(
    shape: tuple[int, ...], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(features, "PIECE", 256)  # many pieces, of every kind, on small data
    torch.manual_seed(0)
    batch = torch.randn(shape) * 3 + 0.5
    check(batch_stats(batch), batch)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float16, torch.bfloat16])
def test_every_floating_dtype(dtype: torch.dtype, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(features, "PIECE", 512)
    torch.manual_seed(1)
    batch = (torch.randn(4, 6, 9, 9) * 2).to(dtype)
    check(batch_stats(batch), batch.double())


def test_far_from_zero_nothing_cancels() -> None:
    """Features whose mean dwarfs their spread: E[x^2] - E[x]^2 would lose every digit."""
    torch.manual_seed(2)
    batch = torch.randn(64, 8, 16, 16) * 0.01 + 1000.0
    check(batch_stats(batch), batch)


def test_a_mean_near_zero_is_exact() -> None:
    """Sums in float32 are off by about 1e-10 of the spread: the mean of a feature whose
    mean is near zero would be wrong in its first digits; float64 sums are not."""
    torch.manual_seed(3)
    batch = torch.randn(64, 64, 56, 56)
    got = batch_stats(batch)
    assert got is not None
    want = batch.double().mean((0, 2, 3))
    torch.testing.assert_close(got.mean, want, rtol=1e-6, atol=1e-9 * float(want.abs().max()))


def test_nan_or_infinity_take_the_masked_way() -> None:
    batch = torch.randn(5, 4)
    for bad in (torch.nan, torch.inf, -torch.inf):
        spoilt = batch.clone()
        spoilt[2, 1] = bad
        assert batch_stats(spoilt) is None
    assert batch_stats(torch.arange(6).view(3, 2)) is None  # not floating
    assert batch_stats(torch.empty(0, 4)) is None


def test_the_whole_key_from_its_features() -> None:
    torch.manual_seed(4)
    batches = [torch.randn(5, 3, 4, 4) * 2 + 1, torch.randn(2, 3, 4, 4) - 3]
    info = KeyInfo("k", "m", "Conv2d", "output", 0, None, (3, 4, 4), torch.float32)
    summary = KeySummary(info, (3, 4, 4), "float32")
    for batch in batches:
        summary.add(batch)
    every = torch.cat(batches).double()
    stats = summary.stats
    assert stats.count == every.numel()
    assert stats.mean == pytest.approx(float(every.mean()), rel=1e-12)
    assert stats.std == pytest.approx(float(every.std(correction=0)), rel=1e-6)
    assert (stats.min, stats.max) == (float(every.min()), float(every.max()))
    assert sum(stats.hist or []) == every.numel()


def _whole_matches(summary: KeySummary, batches: list[torch.Tensor], rel: float = 1e-12) -> None:
    """The whole key's statistics are those of every finite value (kept per feature: float64
    sums, 1e-12; kept whole: float32 within a chunk, `rel` 1e-6)."""
    every = torch.cat([b.reshape(-1) for b in batches]).double()
    finite = every[every.isfinite()]
    stats = summary.stats
    assert stats.count == finite.numel()
    assert stats.mean == pytest.approx(float(finite.mean()), rel=rel)
    assert stats.std == pytest.approx(float(finite.std(correction=0)), rel=1e-6)
    assert (stats.min, stats.max) == (float(finite.min()), float(finite.max()))
    assert (stats.nan, stats.inf) == (int(every.isnan().sum()), int(every.isinf().sum()))


def test_a_key_keeps_its_statistics_once() -> None:
    """Per feature where its values are rows of floats (the whole key's made from them, only
    the NaN/Inf counts and sketch beside), whole once features are lost, whole for integers."""
    torch.manual_seed(5)
    info = KeyInfo("k", "m", "Linear", "output", 0, None, (4,), torch.float32)
    batches = [torch.randn(6, 4) * 3 + 2, torch.randn(3, 4) - 1]
    batches[1][1, 2] = torch.nan
    batches[1][2, 0] = -torch.inf
    summary = KeySummary(info, (4,), "float32")
    for batch in batches:
        summary.add(batch)
    assert summary.features is not None and summary.whole.count == 0
    assert int(summary.features.count.sum()) == 9 * 4 - 2
    _whole_matches(summary, batches)
    mean = torch.cat(batches).double().nan_to_num(0.0, 0.0, 0.0).sum(0) / summary.features.count
    torch.testing.assert_close(summary.features.mean, mean, rtol=1e-12, atol=0.0)

    summary.lose_features()  # a row read in parts, say: the moments move, nothing is lost
    more = torch.randn(2, 4) * 5
    summary.add(more)
    assert summary.features is None and summary.whole.count == 9 * 4 - 2 + 8
    _whole_matches(summary, [*batches, more], rel=1e-6)

    ids = KeySummary(KeyInfo("i", "m", "Embedding", "input", 0, None, (3,), torch.int64),
                     (3,), "int64")  # fmt: skip
    ids.add(torch.arange(12).view(4, 3))
    assert ids.features is None and not ids.features_lost and ids.stats.count == 12


def test_merged_summaries_keep_one_accumulator() -> None:
    """Two ranks' per-feature summaries merge per feature; with a rank whose features were
    lost, the whole key's statistics (still exact) are kept and the features dropped."""
    torch.manual_seed(6)
    info = KeyInfo("k", "m", "Linear", "output", 0, None, (3,), torch.float32)
    parts = [torch.randn(5, 3) + 100, torch.randn(4, 3) * 0.1, torch.randn(7, 3)]
    ranks = [KeySummary(info, (3,), "float32") for _ in parts]
    for rank, part in zip(ranks, parts, strict=True):
        rank.add(part)
    joined = KeySummary(info, (3,), "float32")
    joined.merge(ranks[0])
    joined.merge(ranks[1])
    assert joined.features is not None and joined.whole.count == 0
    _whole_matches(joined, parts[:2])
    ranks[2].lose_features()
    joined.merge(ranks[2])
    assert joined.features is None and joined.features_lost
    _whole_matches(joined, parts)


@pytest.mark.skipif(torch.get_num_threads() < 2, reason="torch runs on one thread here")
def test_worker_threads_run_torch_on_one_thread() -> None:
    seen: list[int] = []
    worker: Worker[int] = Worker("t", lambda _: seen.append(torch.get_num_threads()))
    worker.submit(0)
    worker.close()
    other: list[int] = []
    thread = threading.Thread(target=lambda: other.append(torch.get_num_threads()))
    thread.start()
    thread.join()
    assert seen == [1]
    assert torch.get_num_threads() >= 2 and other[0] >= 2  # nobody else changed


def test_the_cli_has_openmp_wait_asleep_unless_told_otherwise() -> None:
    from hookdump.cli import wait_passively

    environ: dict[str, str] = {}
    wait_passively(environ)
    assert environ == {"OMP_WAIT_POLICY": "PASSIVE"}
    for own in ({"OMP_WAIT_POLICY": "ACTIVE"}, {"GOMP_SPINCOUNT": "1000"}, {"KMP_BLOCKTIME": "5"}):
        environ = dict(own)
        wait_passively(environ)
        assert environ == own
