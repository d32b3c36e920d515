"""One sample of one key drawn with matplotlib (tiles, feature maps and attention heads, are
`pictures.grids`): `[T, D]` rows (tokens x width) as a heatmap, with the tokens on the axis
when the dump holds the ids fed (`pictures.tokens`); vectors as bars (or,
when long, a sorted profile) with the top units named; one number as itself; anything else
as a histogram of its values.

Every picture has a title (key, module class, sample id, shape) and labelled axes, and a
colour bar where colour carries a value. Heatmaps use a sequential scale from the values'
min to their max, so the largest value is the brightest cell and outlier dimensions show as
bright columns.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import torch

from hookdump.tools.pictures.canvas import CMAP, Picture, fitted, plain, pyplot, saved

MAX_CELLS = 1 << 20  # cells a heatmap draws, whatever the tensor holds (rows and cols cut)
MAX_BARS = 256  # longer vectors are drawn as a sorted profile
PROFILE_POINTS = 4096  # a sorted profile's points at most (a picture is ~1,000 pixels wide)
SPLIT_COLOUR = "crimson"  # a generated sequence's response: its rows' labels, the line above
TOP_UNITS = 5  # the largest units named on a vector's picture, and the most negative
_LABEL_BOX = {"facecolor": "white", "alpha": 0.8, "edgecolor": "none"}
TOKEN_LABELS = 48  # token strings written on the axis, at most
PAD_MARK = " [pad]"  # a padding position's label, where padding is drawn
BINS = 64
SIZE, DPI = (10.0, 6.0), 100


def heatmap(
    values: torch.Tensor,
    out: Path,
    title: str,
    row_labels: list[str] | None = None,
    split: int | None = None,
) -> Picture:
    """`[rows, cols]` values as cells (NaN blank), rows labelled with `row_labels` (tokens);
    `split`: the first row of a second part (a generated sequence's response), a line above
    it and its rows' labels in the line's colour."""
    values = _cut(values)
    plt = pyplot()
    from matplotlib.ticker import MaxNLocator

    figure, axes = plt.subplots(figsize=SIZE, dpi=DPI)
    try:
        image = axes.imshow(values.numpy(), aspect="auto", cmap=CMAP, interpolation="nearest")
        figure.colorbar(image, ax=axes, label="value")
        axes.set_xlabel(f"dimension (of {values.shape[1]})")
        axes.xaxis.set_major_locator(MaxNLocator(integer=True))  # cells, not fractions
        if row_labels is not None:
            _label_rows(axes, row_labels[: values.shape[0]], split)
            axes.set_ylabel("token")
        else:
            axes.yaxis.set_major_locator(MaxNLocator(integer=True))
            axes.set_ylabel(f"row (of {values.shape[0]})")
        if split is not None and 0 < split < values.shape[0]:
            axes.axhline(split - 0.5, color=SPLIT_COLOUR, linewidth=2)
        axes.set_title(fitted(plain(title), figure))
        return saved(figure, axes, out, "heatmap", values.shape)
    finally:
        plt.close(figure)


def cls_and_patches(values: torch.Tensor, grid: int, out: Path, title: str) -> Picture:
    """A vision transformer's `[1 + grid², D]` rows: the patches' rows laid out as the image
    they come from (each patch's L2 norm, a `grid` x `grid` picture); the CLS row on its own
    strip, above a heatmap of the patches' rows on the same colour scale."""
    plt = pyplot()
    figure, axes = plt.subplot_mosaic(
        [["grid", "cls"], ["grid", "patches"]],
        figsize=(12.0, 5.5),
        dpi=DPI,
        width_ratios=[1.0, 1.5],
        height_ratios=[1, 9],
        layout="constrained",
    )
    try:
        norms = values[1:].norm(dim=1).reshape(grid, grid)
        shown = axes["grid"].imshow(norms.numpy(), cmap=CMAP, interpolation="nearest")
        figure.colorbar(shown, ax=axes["grid"], label="L2 norm of the patch's row", shrink=0.8)
        cls_norm = float(values[0].norm())
        axes["grid"].set_title(f"patches as laid out ({grid}x{grid}); CLS norm {cls_norm:.4g}")
        axes["grid"].set_xlabel("patch column")
        axes["grid"].set_ylabel("patch row")
        low, high = float(values.min()), float(values.max())
        strip = {"cmap": CMAP, "aspect": "auto", "interpolation": "nearest", "vmin": low}
        axes["cls"].imshow(values[:1].numpy(), vmax=high, **strip)
        axes["cls"].set_yticks([0], ["CLS"], fontsize=9)
        axes["cls"].set_xticks([])
        axes["cls"].set_title("the CLS row, then the patches' rows")
        rows = axes["patches"].imshow(values[1:].numpy(), vmax=high, **strip)
        axes["patches"].set_ylabel(f"patch (of {grid * grid}, row by row)")
        axes["patches"].set_xlabel(f"dimension (of {values.shape[1]})")
        figure.colorbar(rows, ax=[axes["cls"], axes["patches"]], label="value")
        figure.suptitle(fitted(plain(title), figure))
        which = f"CLS norm {cls_norm:.4g}, patches as a {grid}x{grid} grid"
        shape = tuple(values.shape)
        return saved(figure, axes["patches"], out, "CLS and patches", shape, which=which)
    finally:
        plt.close(figure)


def _extreme_units(data: torch.Tensor) -> tuple[list[int], list[int]]:
    """The TOP_UNITS largest units above 0 (all of them, where none is), and the TOP_UNITS
    most negative below 0."""
    count = min(TOP_UNITS, data.numel())
    high = torch.topk(data, count).indices.tolist()
    low = [u for u in torch.topk(-data, count).indices.tolist() if data[u] < 0]
    if (data < 0).any():
        high = [u for u in high if data[u] > 0]
    return high, [u for u in low if u not in high]


def profile(data: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """A long vector's values sorted, highest first, at most PROFILE_POINTS of them at evenly
    spaced ranks (the first and the last included): the drawn line is the whole profile's
    within a pixel, and a vector of millions of units costs the picture no more memory
    than one of thousands. Returns the ranks and the values there."""
    ordered = torch.sort(data.flatten(), descending=True).values
    count = ordered.numel()
    if count <= PROFILE_POINTS:
        return torch.arange(count), ordered
    ranks = torch.linspace(0, count - 1, PROFILE_POINTS, dtype=torch.float64).round().long()
    return ranks, ordered[ranks]


def vector(values: torch.Tensor, out: Path, title: str) -> Picture:
    """A `[D]` vector: a bar per unit (at most MAX_BARS), else its values sorted; the
    TOP_UNITS largest and the TOP_UNITS most negative named either way."""
    plt = pyplot()
    figure, axes = plt.subplots(figsize=SIZE, dpi=DPI)
    try:
        data = values.nan_to_num(nan=0.0)
        high, low = _extreme_units(data)
        if data.numel() <= MAX_BARS:
            axes.bar(range(data.numel()), data.numpy(), color="tab:blue")
            for unit in high + low:
                value = float(data[unit])
                axes.annotate(
                    str(unit),
                    (unit, value),
                    ha="center",
                    fontsize=8,
                    va="bottom" if value >= 0 else "top",
                )
            axes.set_xlabel(f"unit (of {data.numel()})")
            chart = "bars"
        else:
            ranks, sorted_values = profile(data)
            axes.plot(ranks.numpy(), sorted_values.numpy(), color="tab:blue")
            for units, words, (x, y, ha, va) in (
                (high, "largest units", (0.99, 0.97, "right", "top")),
                (low, "most negative units", (0.01, 0.03, "left", "bottom")),
            ):
                if units:
                    named = ", ".join(f"{unit} ({float(data[unit]):.4g})" for unit in units)
                    axes.text(
                        x,
                        y,
                        f"{words}: {named}",
                        transform=axes.transAxes,
                        ha=ha,
                        va=va,
                        fontsize=9,
                        bbox=_LABEL_BOX,
                    )
            axes.set_xlabel(f"units sorted by value (of {data.numel()})")
            chart = "sorted profile"
        axes.set_ylabel("value")
        axes.grid(True, alpha=0.3)
        axes.set_title(fitted(plain(title), figure))
        return saved(figure, None, out, chart, (0, 0))
    finally:
        plt.close(figure)


def histogram(values: torch.Tensor, out: Path, title: str) -> Picture:
    """The finite values' histogram, their mean marked, NaN and Inf counted."""
    flat = values.flatten()
    finite = flat[torch.isfinite(flat)]
    nan, inf = int(torch.isnan(flat).sum()), int(torch.isinf(flat).sum())
    plt = pyplot()
    figure, axes = plt.subplots(figsize=SIZE, dpi=DPI)
    try:
        if finite.numel():
            axes.hist(finite.double().numpy(), bins=BINS, color="tab:blue")
            mean = float(finite.double().mean())
            std = float(finite.double().std()) if finite.numel() > 1 else 0.0
            axes.axvline(
                mean, color="black", linestyle="--", label=f"mean {mean:.4g}, std {std:.4g}"
            )
            axes.legend(loc="upper right")
        else:
            axes.text(
                0.5,
                0.5,
                "no finite values",
                transform=axes.transAxes,
                ha="center",
                va="center",
                fontsize=14,
            )
        if nan or inf:
            axes.text(
                0.01,
                0.97,
                f"NaN: {nan:,}  Inf: {inf:,}",
                transform=axes.transAxes,
                ha="left",
                va="top",
                color="tab:red",
                fontsize=11,
            )
        axes.set_xlabel(f"value ({finite.numel():,} finite of {flat.numel():,})")
        axes.set_ylabel("count")
        axes.grid(True, alpha=0.3)
        axes.set_title(fitted(plain(title), figure))
        return saved(figure, None, out, "histogram", (0, 0))
    finally:
        plt.close(figure)


def number(value: float, out: Path, title: str) -> Picture:
    """One value, written large: a picture of one number is the number."""
    plt = pyplot()
    figure, axes = plt.subplots(figsize=(6.0, 3.0), dpi=DPI)
    try:
        axes.axis("off")
        axes.text(
            0.5,
            0.45,
            f"{value:.6g}",
            transform=axes.transAxes,
            ha="center",
            va="center",
            fontsize=36,
        )
        axes.set_title(fitted(plain(title), figure))
        return saved(figure, None, out, f"the value {value:.6g}", (0, 0))
    finally:
        plt.close(figure)


def _cut(values: torch.Tensor) -> torch.Tensor:
    """At most MAX_CELLS cells: the first rows, and the first columns of each."""
    cols = min(values.shape[1], MAX_CELLS)
    return values[: max(1, MAX_CELLS // cols), :cols]


def _label_rows(axes: Any, labels: list[str], split: int | None = None) -> None:
    """Token labels on the rows (every Nth beyond TOKEN_LABELS), padding's in grey, those
    from `split` on (a response's) in SPLIT_COLOUR."""
    step = max(1, math.ceil(len(labels) / TOKEN_LABELS))
    shown = list(range(0, len(labels), step))
    axes.set_yticks(shown)
    ticks = axes.set_yticklabels([plain(labels[i]) for i in shown], fontsize=9)
    for tick, index in zip(ticks, shown, strict=True):
        if labels[index].endswith(PAD_MARK):
            tick.set_color("grey")
        elif split is not None and index >= split:
            tick.set_color(SPLIT_COLOUR)
