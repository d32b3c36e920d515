"""Pictures of a whole dump, drawn with matplotlib (the `plot` extra): its statistics along
the forward order (`show --depth`: where values blow up, the first picture of a NaN hunt),
and the relative error of two dumps key by key (`diff --plot`: the picture a CI job keeps).

The format follows the file's extension (`.png`, `.svg`, `.pdf`). Keys are drawn in forward
order, at most MAX_LABELS of them named on the axis, so a dump of thousands of keys is still
one readable figure.
"""

from __future__ import annotations

import contextlib
import math
import textwrap
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hookdump.format.keys import RESERVED_KEYS
from hookdump.store.stats import KeySummary
from hookdump.tools.diff import DiffResult, KeyDiff
from hookdump.tools.pictures.canvas import check_format, fitted, plain, pyplot, save

MAX_LABELS = 40  # keys named on the x axis; the others are ticks only
WIDTH, HEIGHT, DPI = 12.0, 6.0, 100  # inches, and pixels per inch: 1200x600 PNGs
LEGEND_WIDTH = 28  # characters of a legend's label per line


@dataclass
class Drawn:
    """What a picture shows, for the one-line report (and the tests)."""

    path: Path
    keys: int
    marked: str | None  # the key marked: the first non-finite, or the first diverging
    names: list[str] = field(default_factory=list)  # the keys along the x axis, in order
    series: dict[str, list[float]] = field(default_factory=dict)  # each curve drawn, by label
    legend_clear: bool = False  # the legend lies outside the plotted area
    plotted: float = 0.0  # the plotted area's share of the picture's width

    def describe(self, what: str) -> str:
        mark = f"; marked {self.marked!r}" if self.marked else ""
        return f"wrote {self.path}: {what} of {self.keys} keys{mark}"


def depth_plot(keys: list[KeySummary], out: Path, title: str, bookkeeping: bool = False) -> Drawn:
    """Mean, mean ± std (within min..max) and min..max of every key along the forward
    order, on a symmetric log scale; keys holding NaN or Inf marked in red, the first one
    named. The keys hookdump keeps beside token rows (`__token_ids__`, `__sample__`,
    `__position__`, ...) are left out unless `bookkeeping`: they are not activations."""
    check_format(out)
    plt = pyplot()
    keys = [k for k in keys if bookkeeping or k.info.key not in RESERVED_KEYS]
    x = list(range(len(keys)))
    stats = [k.stats for k in keys]

    def value(v: float, s: Any) -> float:
        return v if s.count and math.isfinite(v) else math.nan

    mean = [value(s.mean, s) for s in stats]
    std = [s.std if s.count else math.nan for s in stats]
    low = [value(s.min, s) for s in stats]
    high = [value(s.max, s) for s in stats]
    # the band is clipped to the values there are: a ReLU's never dips below its min of 0
    below = [max(m - d, lo) for m, d, lo in zip(mean, std, low, strict=True)]
    above = [min(m + d, hi) for m, d, hi in zip(mean, std, high, strict=True)]
    bad = [i for i, s in enumerate(stats) if s.nan + s.inf]
    with _figure(plt) as axes:
        axes.fill_between(x, low, high, color="tab:blue", alpha=0.15, label="min to max")
        axes.fill_between(x, below, above, color="tab:blue", alpha=0.35, label="mean ± std")
        axes.plot(x, mean, color="tab:blue", marker=".", label="mean")
        for index in bad:
            axes.axvline(index, color="tab:red", alpha=0.4)
        if bad:
            first = keys[bad[0]]
            axes.axvline(
                bad[0], color="tab:red", linewidth=2, label=plain(f"NaN/Inf from {first.info.key}")
            )
        axes.set_yscale("symlog", linthresh=_linear_range(mean, std, low, high))
        _key_axis(axes, [k.info.key for k in keys])
        axes.set_ylabel("value (symmetric log scale)")
        axes.set_title(fitted(plain(title), axes.figure))
        clear, plotted = _legend_beside(axes)
        axes.grid(True, alpha=0.3)
        save(axes.figure, out)
    series = {"mean": mean, "band low": below, "band high": above, "min": low, "max": high}
    names = [k.info.key for k in keys]
    marked = keys[bad[0]].info.key if bad else None
    return Drawn(out, len(keys), marked, names, series, clear, plotted)


def diff_plot(result: DiffResult, out: Path, title: str) -> Drawn:
    """The max relative error of every key compared, along the forward order, on a log
    scale; keys that differ in red, the first diverging one marked and named."""
    check_format(out, "plot")
    plt = pyplot()
    items = result.keys
    x = list(range(len(items)))
    series = _error_series(items)
    errors, cosine, mismatched = series.values()
    failing = [n for n, i in enumerate(items) if not i.ok]
    with _figure(plt) as axes:
        axes.plot(x, errors, color="tab:blue", marker=".", label="max relative error")
        axes.plot(x, cosine, color="tab:orange", marker=".", label="1 - cos")
        axes.plot(
            x, mismatched, color="tab:green", marker=".", label="fraction of values mismatched"
        )
        axes.scatter(
            [n for n in failing if not math.isnan(errors[n])],
            [errors[n] for n in failing if not math.isnan(errors[n])],
            color="tab:red",
            zorder=3,
            label="differs",
        )
        if failing:
            axes.axvline(
                failing[0],
                color="tab:red",
                linewidth=2,
                label=plain(f"first diverging: {items[failing[0]].key}"),
            )
        axes.axhline(
            max(result.rtol, TINY),
            color="grey",
            linestyle="--",
            label=f"rtol {result.rtol:g} (and atol {result.atol:g}: |a - b| <= atol + rtol |b|)",
        )
        axes.axhline(
            TINY,
            color="grey",
            linestyle=":",
            linewidth=1,
            label=f"0 (no error at all), drawn at {TINY:g}",
        )
        axes.set_yscale("log")
        axes.set_ylim(bottom=TINY / 10)
        # half a key of room each side: a line marking the first key stays off the axis
        axes.set_xlim(-0.5, len(items) - 0.5)
        _key_axis(axes, [i.key for i in items])
        axes.set_ylabel("error (log scale)")
        axes.set_title(fitted(plain(title), axes.figure))
        clear, plotted = _legend_beside(axes)
        axes.grid(True, alpha=0.3)
        save(axes.figure, out, "plot")
    marked = items[failing[0]].key if failing else None
    return Drawn(out, len(items), marked, [i.key for i in items], series, clear, plotted)


TINY = 1e-12  # an error of 0 drawn at the axis' floor


def _error_series(items: list[KeyDiff]) -> dict[str, list[float]]:
    """Each key's max relative error, 1 - cos and fraction of values mismatched (NaN where
    nothing was compared), 0 drawn as TINY."""

    def floor(value: float | None) -> float:
        return max(value, TINY) if value is not None and math.isfinite(value) else math.nan

    return {
        "max relative error": [floor(i.max_rel if i.numel else None) for i in items],
        "1 - cos": [floor(None if i.cosine is None else 1 - i.cosine) for i in items],
        "mismatched": [floor(i.mismatched / i.numel if i.numel else None) for i in items],
    }


def _legend_beside(axes: Any) -> tuple[bool, float]:
    """The legend to the right of the plot, off the data, its labels wrapped narrow (long
    ones took a third of the picture's width); whether it lies clear of the plotted area
    once the figure is laid out, and the plotted area's share of the width."""
    handles, labels = axes.get_legend_handles_labels()
    labels = [textwrap.fill(label, LEGEND_WIDTH) for label in labels]
    legend = axes.legend(
        handles,
        labels,
        loc="upper left",
        bbox_to_anchor=(1.01, 1.0),
        borderaxespad=0.0,
        fontsize=9,
    )
    figure = axes.figure
    figure.tight_layout()
    renderer = figure.canvas.get_renderer()
    plotted = axes.get_window_extent(renderer)
    share = plotted.width / figure.bbox.width
    return bool(legend.get_window_extent(renderer).x0 >= plotted.x1), float(share)


@contextlib.contextmanager
def _figure(plt: Any) -> Iterator[Any]:
    """One figure's axes, closed after."""
    figure, axes = plt.subplots(figsize=(WIDTH, HEIGHT), dpi=DPI)
    try:
        yield axes
    finally:
        plt.close(figure)


def _linear_range(*series: list[float]) -> float:
    """symlog's linear region: three decades below the largest magnitude, so the scale shows
    orders of magnitude without stretching values near zero across the picture."""
    values = [abs(v) for s in series for v in s if math.isfinite(v) and v != 0]
    if not values:
        return 1.0
    return float(10 ** (math.floor(math.log10(max(values))) - 3))


def _key_axis(axes: Any, names: list[str]) -> None:
    step = max(1, math.ceil(len(names) / MAX_LABELS))
    shown = list(range(0, len(names), step))
    axes.set_xticks(shown)
    axes.set_xticklabels(
        [plain(_short(names[i])) for i in shown], rotation=60, ha="right", fontsize=8
    )
    axes.set_xlabel(f"keys in forward order ({len(names)})")
    axes.set_xlim(-0.5, max(len(names) - 0.5, 0.5))


def _short(name: str, most: int = 40) -> str:
    return name if len(name) <= most else "…" + name[-(most - 1) :]
