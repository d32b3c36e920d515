"""Running statistics and their rendering, against hand-computed values."""

from __future__ import annotations

import io
import math

import torch
from rich.console import Console

from hookdump.cli.render import can_draw_sparklines, format_bytes, sparkline
from hookdump.store.stats import HIST_BINS, TensorStats


def test_stats_over_batches_equal_stats_of_the_whole() -> None:
    torch.manual_seed(0)
    whole = torch.randn(10, 5, 3) * 3 + 1
    stats = TensorStats()
    for part in whole.split(3):
        stats.update(part)
    assert stats.count == whole.numel()
    assert math.isclose(stats.mean, float(whole.double().mean()), rel_tol=1e-6)
    assert math.isclose(stats.std, float(whole.double().std(correction=0)), rel_tol=1e-6)
    assert (stats.min, stats.max) == (float(whole.min()), float(whole.max()))


def test_non_finite_values_are_counted_and_left_out() -> None:
    stats = TensorStats()
    stats.update(torch.tensor([1.0, float("nan"), 3.0, float("inf"), -float("inf")]))
    assert (stats.nan, stats.inf, stats.count) == (1, 2, 2)
    assert (stats.mean, stats.min, stats.max, stats.std) == (2.0, 1.0, 3.0, 1.0)


def test_extremes_and_non_finite_values_in_a_later_chunk_are_found() -> None:
    """The pass goes chunk by chunk (2**18 elements): what sits past the first chunk counts."""
    x = torch.zeros(3 * 2**18 + 5)
    x[2**18 + 7], x[-1], x[-2] = float("nan"), 9.0, -4.0
    x[2 * 2**18] = float("inf")
    stats = TensorStats()
    stats.update(x)
    assert (stats.nan, stats.inf, stats.count) == (1, 1, x.numel() - 2)
    assert (stats.min, stats.max) == (-4.0, 9.0)
    assert math.isclose(stats.mean, 5.0 / (x.numel() - 2), rel_tol=1e-6)


def test_histogram_and_sparkline_by_hand() -> None:
    stats = TensorStats()
    # 0 .. 11 once each, plus nine more zeros: bin 0 holds 10, every other bin 1
    stats.update(torch.cat([torch.arange(12.0), torch.zeros(9)]))
    assert stats.hist == [10] + [1] * (HIST_BINS - 1)
    assert sparkline(stats.hist) == "█" + "▁" * (HIST_BINS - 1)
    assert sparkline([0, 4, 8]) == " ▄█"
    assert sparkline([0, 0]) == ""


def test_sparklines_only_where_the_console_can_draw_them() -> None:
    assert can_draw_sparklines(Console(file=io.StringIO(), force_terminal=False))
    ascii_console = Console(file=io.TextIOWrapper(io.BytesIO(), encoding="ascii"))
    assert not can_draw_sparklines(ascii_console)


def test_format_bytes() -> None:
    assert [format_bytes(n) for n in (0, 1023, 1536, 3 * 2**20)] == [
        "0 B", "1023 B", "1.5 KiB", "3.0 MiB",
    ]  # fmt: skip


def test_stats_stay_exact_when_the_mean_dwarfs_the_spread() -> None:
    torch.manual_seed(0)
    for offset in (0.0, 5.0, 1000.0):  # 1000: E[x^2] - E[x]^2 would cancel in float32
        x = torch.randn(3, 100_001) * 2 + offset  # more than one 2**18 chunk, and a tail
        stats = TensorStats()
        stats.update(x)
        exact = x.double()
        assert math.isclose(stats.mean, float(exact.mean()), rel_tol=1e-6, abs_tol=1e-6)
        assert math.isclose(stats.std, float(exact.std(correction=0)), rel_tol=1e-4)
