"""Pictures made of tiles, drawn with matplotlib: the channels of a `[C, H, W]` sample as a
grid of feature maps, and attention heads (`[heads, T, T]`) as a heatmap each.

Which tiles: every one (at most a fixed number, the first), those `channels` names, or the
`top` K of highest mean, highest first. How coloured: on one scale for every tile (`shared`,
the default: a colour is a value, and a dead channel looks dead) or each tile stretched over
its own min..max (`per-channel`: every map's structure shows, whatever its range). The title
says which, and the colour bar's label says what its numbers are.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from hookdump.errors import HookdumpError, opt
from hookdump.tools.pictures.canvas import CMAP, Picture, fitted, plain, pyplot, saved
from hookdump.tools.pictures.charts import DPI

SCALES = ("shared", "per-channel")
MAX_TILES = 1024  # feature maps drawn, whatever the dump holds
MAX_HEADS = 16  # attention heads drawn
# the grid's pixels, whatever the maps' size: tiles shrink (area) to keep within it
MAX_PIXELS = 1 << 22
MIN_LABEL_PX = 14  # tiles drawn smaller than this go without their channel numbers
NAN_COLOUR = (255, 0, 0, 255)  # NaN and Inf cells: never a colour of the scale
EMPTY_COLOUR = (255, 255, 255, 0)  # the grid's cells past the last tile


@dataclass(frozen=True)
class Tiling:
    """Which tiles a picture shows and how they are coloured, as `show` was asked."""

    channels: str | None = None  # "0-15,32": channels (or heads) by number
    top: int | None = None  # the K of highest mean, highest first
    scale: str = "shared"

    def check(self) -> None:
        """The choices that need no data, checked before any is read."""
        if self.scale not in SCALES:
            raise HookdumpError(
                f"{opt('scale')} {self.scale!r} is not a colour scale; say shared (one scale "
                "for every tile) or per-channel (each tile over its own min..max)"
            )
        if self.top is not None and not 1 <= self.top <= MAX_TILES:
            raise HookdumpError(
                f"{opt('top')} {self.top} must be from 1 to {MAX_TILES}: the number of tiles "
                "to draw, those of highest mean"
            )
        if self.channels is not None:
            _numbers(self.channels, None, "channel")

    @property
    def asked(self) -> bool:
        return self.channels is not None or self.top is not None or self.scale != "shared"


def choose(values: torch.Tensor, tiling: Tiling, most: int, unit: str) -> tuple[list[int], str]:
    """The tiles of `values` (`[C, ...]`) to draw and a phrase saying which they are."""
    total = values.shape[0]
    chosen = _numbers(tiling.channels, total, unit) if tiling.channels is not None else None
    pool = chosen if chosen is not None else range(total)
    if tiling.top is not None:
        subset = values if chosen is None else values[torch.tensor(chosen, dtype=torch.long)]
        flat = subset.reshape(len(pool), -1)  # a view when every channel is in the pool
        finite = torch.isfinite(flat)
        sums = torch.where(finite, flat, 0.0).sum(1)
        means = torch.where(finite.any(1), sums / finite.sum(1).clamp(min=1), -math.inf)
        order = torch.argsort(means, descending=True, stable=True)[: min(tiling.top, most)]
        picked = [pool[int(i)] for i in order]
        among = f"{len(pool)} picked" if chosen is not None else f"{total}"
        return picked, f"the {len(picked)} of {among} {unit}s with the highest mean, highest first"
    if chosen is not None:
        picked = chosen[:most]
        cut = f" (the first {most} of the {len(chosen)} asked)" if len(chosen) > most else ""
        return picked, f"{len(picked)} picked {unit}s of {total}{cut}"
    if total > most:
        return list(range(most)), f"the first {most} of {total} {unit}s"
    return list(range(total)), f"{total} {unit}s" if total != 1 else f"1 {unit}"


def grid(values: torch.Tensor, out: Path, title: str, tiling: Tiling) -> Picture:
    """`[C, H, W]` maps as a grid of tiles numbered by channel, NaN and Inf in red."""
    picked, which = choose(values, tiling, MAX_TILES, "channel")
    maps = values[torch.tensor(picked, dtype=torch.long)]
    count, height, width = maps.shape
    cols = math.ceil(math.sqrt(count * height / width))  # a grid about as wide as tall
    cols = max(1, min(count, cols))
    rows = math.ceil(count / cols)
    maps = _fit(maps, rows, cols)
    size = f"{height}x{width} map" + (
        f", shrunk to {maps.shape[1]}x{maps.shape[2]}" if maps.shape[1:] != (height, width) else ""
    )
    height, width = maps.shape[1:]
    scaled, low, high = _scaled(maps, tiling.scale)
    plt = pyplot()
    colours = plt.get_cmap(CMAP)
    norm = plt.Normalize(vmin=low, vmax=high)
    rgba = torch.from_numpy(colours(norm(scaled.nan_to_num(0.0).numpy()), bytes=True))
    bad = ~torch.isfinite(maps)
    rgba[bad] = torch.tensor(NAN_COLOUR, dtype=rgba.dtype)
    canvas = torch.tensor(EMPTY_COLOUR, dtype=rgba.dtype).repeat(rows * height, cols * width, 1)
    for index in range(count):
        row, col = divmod(index, cols)
        canvas[row * height : (row + 1) * height, col * width : (col + 1) * width] = rgba[index]
    figure, axes = plt.subplots(figsize=(10.0, 9.0), dpi=DPI, layout="constrained")
    try:
        axes.imshow(canvas.numpy(), interpolation=_interpolation(figure, canvas.shape[1]))
        for row in range(1, rows):
            axes.axhline(row * height - 0.5, color="white", linewidth=0.8)
        for col in range(1, cols):
            axes.axvline(col * width - 0.5, color="white", linewidth=0.8)
        _number_tiles(figure, axes, picked, cols, height, width)
        axes.set_xticks([])
        axes.set_yticks([])
        nan = ", NaN and Inf in red" if bool(bad.any()) else ""
        axes.set_xlabel(f"{which}: each tile one channel's {size}{nan}")
        bar = figure.colorbar(plt.cm.ScalarMappable(norm=norm, cmap=colours), ax=axes, shrink=0.8)
        bar.set_label(_bar_label(tiling.scale, "channel"))
        axes.set_title(plain(f"{title}\n{_scale_phrase(tiling.scale, 'channel')}"))
        return saved(figure, axes, out, "grid", (rows, cols), count, which)
    finally:
        plt.close(figure)


def heads(
    values: torch.Tensor,
    out: Path,
    title: str,
    what: str,
    tiling: Tiling,
    labels: list[str] | None = None,
) -> Picture:
    """`[heads, T, T]` (query x key) as a heatmap per head on the colour scale asked, tiles
    packed in a grid that fits them; `labels`: the tokens, on both axes (every Nth where
    they are many), query tokens on the left column, key tokens on the bottom row."""
    picked, which = choose(values, tiling, MAX_HEADS, "head")
    shown = values[torch.tensor(picked, dtype=torch.long)]
    scaled, low, high = _scaled(shown, tiling.scale)
    count = len(picked)
    cols = min(count, 4 if labels else math.ceil(math.sqrt(count)))
    rows = math.ceil(count / cols)
    tile = 3.2 if labels else 2.4  # inches a head takes: room for the token labels
    plt = pyplot()
    figure, grid_axes = plt.subplots(
        rows,
        cols,
        figsize=(cols * tile + 1.6, rows * tile + 1.4),
        dpi=DPI,
        squeeze=False,
        layout="constrained",
    )  # room for the shared colour bar
    try:
        image = None
        for index, axes in enumerate(grid_axes.flat):
            if index >= count:
                axes.axis("off")
                continue
            image = axes.imshow(
                scaled[index].numpy(), cmap=CMAP, vmin=low, vmax=high, interpolation="nearest"
            )
            axes.set_title(f"head {picked[index]}", fontsize=10)
            axes.tick_params(labelsize=8)
            if labels is not None:
                _token_ticks(axes, labels, index % cols == 0, index // cols == rows - 1)
        assert image is not None  # at least one head is drawn
        figure.colorbar(
            image, ax=list(grid_axes.flat), label=_bar_label(tiling.scale, "head", what)
        )
        heading = f"{title}\n{which}; {_scale_phrase(tiling.scale, 'head')}"
        figure.suptitle(fitted(plain(heading), figure, 11), fontsize=11)
        figure.supxlabel("key token" if labels else "key position")
        figure.supylabel("query token" if labels else "query position")
        return saved(figure, None, out, f"{what} per head", (0, 0), count, which)
    finally:
        plt.close(figure)


TOKEN_TICKS = 24  # token labels on an axis, at most: every Nth beyond


def _token_ticks(axes: Any, labels: list[str], left: bool, bottom: bool) -> None:
    """Token labels on a head's axes (thinned to TOKEN_TICKS), on the outer tiles only."""
    step = max(1, math.ceil(len(labels) / TOKEN_TICKS))
    shown = list(range(0, len(labels), step))
    names = [plain(labels[i]) for i in shown]
    axes.set_xticks(shown, names if bottom else [""] * len(shown), rotation=90, fontsize=8)
    axes.set_yticks(shown, names if left else [""] * len(shown), fontsize=8)


def _numbers(spec: str, total: int | None, unit: str) -> list[int]:
    """`0-15,32` as the numbers it names, in its order, each once; checked against the
    `total` `unit`s there are, when given."""
    picked: list[int] = []
    for part in spec.split(","):
        first, dash, last = part.strip().partition("-")
        try:
            low = int(first)
            high = int(last) if dash else low
        except ValueError:
            raise HookdumpError(
                f"{opt('channels')} {spec!r}: {part.strip()!r} is not a number or a range; "
                "say e.g. 0-15,32"
            ) from None
        if low < 0 or high < low:
            raise HookdumpError(
                f"{opt('channels')} {spec!r}: {part.strip()!r} is not a range of channels; "
                "say FIRST-LAST with FIRST <= LAST, counting from 0"
            )
        if total is not None and high >= total:
            raise HookdumpError(
                f"{opt('channels')} {spec!r}: there are {total} {unit}s (0 to {total - 1}), "
                f"no {high}"
            )
        if total is None:
            high = min(high, low + MAX_TILES)  # only the syntax is checked: no range built
        picked.extend(range(low, high + 1))
    return list(dict.fromkeys(picked))


def _fit(maps: torch.Tensor, rows: int, cols: int) -> torch.Tensor:
    """The maps shrunk (by area, NaN kept where any was) so the grid holds at most
    MAX_PIXELS pixels."""
    height, width = maps.shape[1:]
    if rows * cols * height * width <= MAX_PIXELS:
        return maps
    factor = math.sqrt(MAX_PIXELS / (rows * cols * height * width))
    size = (max(1, int(height * factor)), max(1, int(width * factor)))
    finite = torch.isfinite(maps)
    shrunk = F.interpolate(torch.where(finite, maps, 0.0)[:, None], size=size, mode="area")
    whole = F.interpolate(finite[:, None].float(), size=size, mode="area")
    return torch.where(whole == 1, shrunk, math.nan)[:, 0]


def _scaled(tiles: torch.Tensor, scale: str) -> tuple[torch.Tensor, float, float]:
    """The tiles as drawn and the colour scale's ends: their values between the finite min
    and max (shared), or each tile's mapped onto 0..1 (per-channel)."""
    flat = tiles.reshape(tiles.shape[0], -1)
    finite = torch.isfinite(flat)
    biggest = torch.finfo(flat.dtype).max
    lows = torch.where(finite, flat, math.inf).amin(1).clamp(max=biggest)
    highs = torch.where(finite, flat, -math.inf).amax(1).clamp(min=-biggest)
    if scale == "per-channel":
        span = (highs - lows).clamp(min=1e-30)[:, None, None]
        return (tiles - lows[:, None, None]) / span, 0.0, 1.0
    if not bool(finite.any()):
        return tiles, 0.0, 1.0
    low, high = float(lows.min()), float(highs.max())
    return tiles, low, high if high > low else low + 1.0


def _scale_phrase(scale: str, unit: str) -> str:
    if scale == "per-channel":
        return f"each {unit} scaled to its own min..max (--scale per-channel)"
    return f"one colour scale for every {unit} (--scale shared)"


def _bar_label(scale: str, unit: str, what: str = "value") -> str:
    if scale == "per-channel":
        return f"{what}: 0 at each {unit}'s min, 1 at its max"
    return what


def _interpolation(figure: Any, columns: int) -> str:
    """Cells as squares where the grid is enlarged, smoothed where it is shrunk."""
    return "nearest" if columns <= figure.get_figwidth() * figure.dpi else "antialiased"


def _number_tiles(
    figure: Any, axes: Any, picked: list[int], cols: int, height: int, width: int
) -> None:
    """Each tile's channel number in its top-left corner, when tiles are big enough to read."""
    figure.canvas.draw()  # the layout, so the tiles' size on the page is known
    tile_px = axes.get_window_extent().width / cols
    if tile_px < MIN_LABEL_PX:
        return
    size = max(4.0, min(9.0, tile_px / 5))
    for index, channel in enumerate(picked):
        row, col = divmod(index, cols)
        axes.text(
            col * width - 0.5,
            row * height - 0.5,
            str(channel),
            fontsize=size,
            ha="left",
            va="top",
            color="black",
            bbox={"facecolor": "white", "alpha": 0.7, "edgecolor": "none", "pad": 0.5},
        )
