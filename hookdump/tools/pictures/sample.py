"""`show KEY`: one sample of one key drawn as the picture that suits its shape, in the format
the file's extension names (`.png`, `.svg`, `.pdf`).

- `[C, H, W]`: a grid of feature maps (`pictures.grids`);
- attention patterns and scores `[heads, T, T]`: a heatmap per head (`pictures.grids`);
- `[T, D]` rows: a heatmap, rows named by their tokens where the dump has them;
- a vector: bars, or a sorted profile when long; one number: the number;
- anything else: a histogram of its values.

Other than a map's channels, dimensions of size 1 are dropped first (`[C, 1, W]` is
`[C, W]`, `[1, D]` a vector); the title keeps the shape as captured.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from hookdump.errors import HookdumpError, did_you_mean, opt
from hookdump.store.read.dump import Dump
from hookdump.tools.pictures import charts, grids
from hookdump.tools.pictures.canvas import Picture, check_format

MAX_ROW_BYTES = 256 << 20


def draw_sample(
    dump_path: str | Path,
    key: str,
    out: Path,
    sample: int = 0,
    tiling: grids.Tiling | None = None,
    storage_options: Mapping[str, Any] | None = None,
) -> Picture:
    """Draw `key` of sample `sample` from a dump into `out`; `tiling` picks and colours the
    tiles of a feature-map grid or of attention heads."""
    tiling = tiling or grids.Tiling()
    check_format(out)
    tiling.check()
    dump = Dump(dump_path, storage_options)
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
    rows, row_bytes = dump.reader.rows_of(key), dump.reader.row_bytes([key])
    if sample >= rows:
        raise HookdumpError(
            f"{opt('sample')} {sample} is out of range: {key!r} has {rows} rows in "
            f"{dump.path} (its tensors have different numbers of rows)"
        )
    if row_bytes > MAX_ROW_BYTES:
        raise HookdumpError(
            f"KEY {key!r}: a sample is {row_bytes / (1 << 20):,.0f} MiB, more than "
            f"show draws ({MAX_ROW_BYTES >> 20} MiB); read it with hookdump.load(...).row(...)"
        )
    return _draw(dump, key, sample, dump.row(key, sample).float(), out, tiling)


def _draw(
    dump: Dump, key: str, sample: int, values: torch.Tensor, out: Path, tiling: grids.Tiling
) -> Picture:
    """The picture that suits the sample's shape and kind."""
    info = dump.info(key)
    tokens = dump.manifest.token_rows
    ids = dump.manifest.sample_ids  # not Dump.sample_ids: that lists every row
    named = ids[sample] if isinstance(ids, list) and not tokens and sample < len(ids) else sample
    module = f" ({info.module_type})" if info.module_type not in ("", "-") else ""  # lone files
    title = f"{key}{module}, sample {named}, shape {list(values.shape)}"
    if info.kind in ("pattern", "scores") and values.dim() == 3 and values.numel():
        return grids.heads(values, out, title, info.kind, tiling)
    shape = [size for size in values.shape if size != 1] if values.numel() else []
    kept = values.reshape(shape) if values.numel() else values
    if values.dim() == 3 and values.shape[0] and min(values.shape[1:]) > 1:
        return grids.grid(values, out, title, tiling)  # one channel too: a map is a map
    if tiling.asked:
        raise HookdumpError(
            f"{opt('channels')}, {opt('top')} and {opt('scale')} pick and colour the tiles of "
            f"a [C, H, W] sample or of attention heads; {key!r} is {list(values.shape)}"
        )
    if len(shape) == 2:
        labels = None
        if not tokens and values.dim() == 2:  # a [T, D] sample as captured
            labels = charts.token_strings(dump, sample, values.shape[0])
            if labels is not None and len(labels) != values.shape[0]:
                labels = None  # not one per row: these rows are not the tokens fed
        return charts.heatmap(kept, out, title, labels)
    if len(shape) == 1:
        return charts.vector(kept, out, title)
    if values.numel() == 1:
        return charts.number(float(values.flatten()[0]), out, title)
    return charts.histogram(values, out, title)
