"""Rendering one captured tensor as a PNG: a feature-map grid, a heatmap of `[T, D]` rows,
attention heads or a vector's bars (`tools.pictures`), else a histogram of its values."""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from PIL import Image, ImageDraw
from torchvision.utils import make_grid

from hookdump.errors import HookdumpError, did_you_mean, opt
from hookdump.store.reader import Dump
from hookdump.tools import pictures

MIN_TILE = 48  # feature maps smaller than this are enlarged (nearest) to stay legible
PAD = 2
SEPARATOR = (40, 90, 200)  # tile borders in blue, so they never blend into a grey map
BINS = 64
# what one picture may hold, whatever the dump claims: tiles past the first MAX_TILES are
# left out (and said so), and tiles shrink to keep the grid within MAX_PIXELS
MAX_TILES = 1024
MAX_PIXELS = 1 << 24
MAX_ROW_BYTES = 256 << 20


@dataclass
class Rendered:
    """What was drawn, for the one-line report (and the tests)."""

    chart: str  # grid or histogram
    path: Path
    width: int
    height: int
    tiles: int = 0
    channels: int = 0
    rows: int = 0
    cols: int = 0
    tile: int = 0

    def describe(self, key: str, sample: int) -> str:
        if self.chart == "grid":
            shown = (
                f"{self.tiles} channels"
                if self.tiles == self.channels
                else (f"the first {self.tiles} of {self.channels} channels")
            )
            return (
                f"wrote {self.path}: {key} sample {sample}, {shown} as a "
                f"{self.rows}x{self.cols} grid of {self.tile}px tiles"
            )
        return f"wrote {self.path}: histogram of {key} sample {sample}"


def render(
    dump_path: str | Path, key: str, out: Path, sample: int = 0
) -> Rendered | pictures.Picture:
    """Draw `key` of sample `sample` from a dump into the PNG `out`."""
    if out.suffix.lower() != ".png":  # the bytes are PNG's: a name must not say otherwise
        raise HookdumpError(
            f"{opt('out')} {out}: one tensor is drawn as a PNG; end the name in .png"
        )
    dump = Dump(dump_path)
    if key not in dump:
        raise HookdumpError(
            f"KEY {key!r} is not in {dump.path}{did_you_mean(key, dump.keys())}; "
            f"`hookdump inspect {dump_path}` lists the keys"
        )
    if not 0 <= sample < dump.num_samples:
        raise HookdumpError(
            f"{opt('sample')} {sample} is out of range: {dump.path} holds samples 0 to "
            f"{dump.num_samples - 1}"
        )
    if sample >= dump.rows_of(key):
        raise HookdumpError(
            f"{opt('sample')} {sample} is out of range: {key!r} has {dump.rows_of(key)} rows in "
            f"{dump.path} (its tensors have different numbers of rows)"
        )
    if dump.row_bytes([key]) > MAX_ROW_BYTES:
        raise HookdumpError(
            f"KEY {key!r}: a sample is {dump.row_bytes([key]) / (1 << 20):,.0f} MiB, more than "
            f"show draws ({MAX_ROW_BYTES >> 20} MiB); read it with hookdump.load(...).row(...)"
        )
    return _draw(dump, key, sample, dump.row(key, sample).float(), out)


def _draw(
    dump: Dump, key: str, sample: int, values: torch.Tensor, out: Path
) -> Rendered | pictures.Picture:
    """The picture that suits the sample's shape and kind."""
    info = dump.info(key)
    tokens = dump.manifest.get("rows") == "tokens"
    ids = dump.manifest.get("sample_ids")  # not Dump.sample_ids: that lists every row
    named = ids[sample] if isinstance(ids, list) and not tokens and sample < len(ids) else sample
    title = f"{key} ({info.module_type}), sample {named}, shape {list(values.shape)}"
    if info.kind in ("pattern", "scores") and values.dim() == 3:
        return pictures.heads(values, out, title, info.kind)
    if values.dim() == 3 and values.shape[0] and values.shape[1] > 1 and values.shape[2] > 1:
        return _grid(values, out)
    if values.dim() == 2 and values.shape[0] and values.shape[1]:
        labels = None if tokens else pictures.token_strings(dump, sample, values.shape[0])
        if labels is not None and len(labels) != values.shape[0]:
            labels = None  # not one per row: these rows are not the tokens fed
        return pictures.heatmap(values, out, title, labels)
    if values.dim() == 1 and values.numel() > 1:
        return pictures.vector(values, out, title)
    return _histogram(values, out, f"{key}  sample {sample}  shape {list(values.shape)}")


def _grid(maps: torch.Tensor, out: Path) -> Rendered:
    """Channels as tiles (at most MAX_TILES), each normalised to its own min..max (NaN
    drawn black), enlarged to MIN_TILE where the grid stays within MAX_PIXELS, else shrunk
    to fit it."""
    total = maps.shape[0]
    maps = maps[:MAX_TILES]
    channels, height, width = maps.shape
    flat = maps.reshape(channels, -1)
    finite = torch.isfinite(flat)
    lo = torch.where(finite, flat, torch.inf).amin(1).clamp(max=torch.finfo().max)
    hi = torch.where(finite, flat, -torch.inf).amax(1).clamp(min=-torch.finfo().max)
    span = (hi - lo).clamp(min=1e-12)
    scaled = ((maps - lo[:, None, None]) / span[:, None, None]).nan_to_num(0.0).clamp(0, 1)
    cols = math.ceil(math.sqrt(channels))
    rows = math.ceil(channels / cols)
    side = max(height, width)
    fits = math.isqrt(MAX_PIXELS // (rows * cols)) - PAD  # the longest side a tile may have
    target = min(max(side, side * math.ceil(MIN_TILE / side)), max(1, fits))
    tiles = scaled[:, None]
    if target != side:
        size = (max(1, height * target // side), max(1, width * target // side))
        mode = "nearest" if target > side else "area"
        tiles = F.interpolate(tiles, size=size, mode=mode)
    grid = make_grid(tiles, nrow=cols, padding=PAD, pad_value=-1.0)  # -1 marks the padding
    padding = grid[0] < 0
    rgb = grid.clamp(min=0)
    for channel, level in enumerate(SEPARATOR):
        rgb[channel][padding] = level / 255
    pixels = (rgb * 255).round().to(torch.uint8).permute(1, 2, 0).contiguous().numpy()
    _save(Image.fromarray(pixels, mode="RGB"), out)
    return Rendered(
        "grid", out, pixels.shape[1], pixels.shape[0], channels, total, rows, cols,
        tiles.shape[2],
    )  # fmt: skip


def _histogram(values: torch.Tensor, out: Path, title: str) -> Rendered:
    """A histogram of the finite values, with their range, mean and any NaN/Inf counted."""
    width, height, margin = 640, 360, 40
    flat = values.flatten()
    finite = flat[torch.isfinite(flat)]
    nan, inf = int(torch.isnan(flat).sum()), int(torch.isinf(flat).sum())
    image = Image.new("RGB", (width, height), "white")
    draw = ImageDraw.Draw(image)
    draw.text((margin, 10), title, fill="black")
    if finite.numel():
        lo, hi = float(finite.min()), float(finite.max())
        counts = torch.histc(finite, bins=BINS, min=lo, max=hi if hi > lo else lo + 1)
        plot_w, plot_h = width - 2 * margin, height - 3 * margin
        bar_w = plot_w / BINS
        top = float(counts.max())
        for i, count in enumerate(counts.tolist()):
            bar_h = plot_h * count / top if top else 0
            x0 = margin + i * bar_w
            y1 = margin + plot_h
            draw.rectangle([x0, y1 - bar_h, x0 + bar_w - 1, y1], fill=(70, 110, 180))
        axis_y = margin + plot_h
        draw.line([margin, axis_y, width - margin, axis_y], fill="black")
        draw.text((margin, axis_y + 6), f"{lo:.4g}", fill="black")
        right = f"{hi:.4g}"
        draw.text((width - margin - 6 * len(right), axis_y + 6), right, fill="black")
        mean, std = float(finite.mean()), float(finite.std()) if finite.numel() > 1 else 0.0
        summary = f"n={finite.numel()}  mean={mean:.4g}  std={std:.4g}  max count={int(top)}"
        draw.text((margin, axis_y + 22), summary, fill="black")
    if nan or inf or not finite.numel():
        draw.text((margin, 26), f"NaN: {nan}  Inf: {inf}", fill=(200, 0, 0))
    _save(image, out)
    return Rendered("histogram", out, width, height)


def _save(image: Image.Image, out: Path) -> None:
    try:
        image.save(out, format="PNG")
    except OSError as exc:
        raise HookdumpError(f"{opt('out')} {out}: cannot write the PNG ({exc})") from None
