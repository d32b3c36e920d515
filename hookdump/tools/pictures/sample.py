"""`show KEY`: one sample of one key drawn as the picture that suits its shape, in the format
the file's extension names (`.png`, `.svg`, `.pdf`).

- `[C, H, W]`: a grid of feature maps (`pictures.grids`);
- attention patterns and scores `[heads, T, T]`: a heatmap per head (`pictures.grids`);
- `[T, D]` rows: a heatmap, rows named by their tokens where the dump has them; a sequence
  of token rows named by its id (`-s prompts.txt:2`) likewise, drawn whole, a generated
  response below a line;
- a vector: bars, or a sorted profile when long; one number: the number;
- a mixture-of-experts block's routing (`M:topk_ids`, ...): tokens by experts, each cell
  the weight the token gave the expert (`pictures.routing`);
- anything else: a histogram of its values.

Other than a map's channels, dimensions of size 1 are dropped first (`[C, 1, W]` is
`[C, W]`, `[1, D]` a vector); the title keeps the shape as captured.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from hookdump.choices import ROUTING_KINDS
from hookdump.errors import HookdumpError, did_you_mean, opt
from hookdump.format.keys import RESPONSE, SAMPLE, TOKEN_IDS
from hookdump.store.read.dump import Dump
from hookdump.tools.pictures import charts, grids
from hookdump.tools.pictures.canvas import Picture, check_format
from hookdump.tools.pictures.routing import routing_picture
from hookdump.tools.pictures.tokens import Tokens, row_token, sample_tokens, written

MAX_ROW_BYTES = 256 << 20
MAX_SEQUENCE_ROWS = 4096  # a sequence drawn whole: its first rows at most
MAX_SUGGESTED = 100_000  # the most sample ids searched for a did-you-mean


def known_key(
    dump_path: str | Path, key: str, storage_options: Mapping[str, Any] | None = None
) -> Dump:
    """The dump, opened, once `key` is known to be in it (else one line, the nearest keys
    named)."""
    dump = Dump(dump_path, storage_options)
    if key not in dump:
        raise HookdumpError(
            f"KEY {key!r} is not in {dump.path}{did_you_mean(key, dump.keys())}; "
            f"`hookdump inspect {dump_path}` lists the keys"
        )
    return dump


def draw_sample(
    dump_path: str | Path,
    key: str,
    out: Path,
    sample: int | str = 0,
    tiling: grids.Tiling | None = None,
    storage_options: Mapping[str, Any] | None = None,
    padding: bool = False,
) -> Picture:
    """Draw `key` of sample `sample` (a row number, or a sample id: see `pick_row`) from a
    dump into `out`; `tiling` picks and colours the tiles of a feature-map grid or of
    attention heads. A text sample's padding positions are left out, unless `padding`."""
    tiling = tiling or grids.Tiling()
    check_format(out)
    tiling.check()
    dump = known_key(dump_path, key, storage_options)
    named = sample
    sample = pick_row(dump, sample)
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
    whole = _sequence_named(dump, key, named, sample)
    if whole is not None:
        return _draw_sequence(dump, key, whole, out)
    return _draw(dump, key, sample, dump.row(key, sample).float(), out, tiling, padding)


def _sequence_named(dump: Dump, key: str, named: int | str, first: int) -> range | None:
    """The token rows of the sequence `named` names (a sample id of a dump of token rows,
    whose rows of `key` are vectors: drawn whole); None for a row number or anything else."""
    text = str(named).strip()
    info = dump.info(key)
    if (
        not dump.manifest.token_rows
        or isinstance(named, int)
        or text.lstrip("-").isdigit()
        or len(info.shape) != 1
        or info.kind in ROUTING_KINDS
    ):
        return None
    sequence = int(dump.row(SAMPLE, first))
    # at least its first row, whatever a forged, unsorted `__sample__` makes the search find
    return range(first, max(first + 1, _first_token_row(dump, sequence + 1, missing_ok=True)))


def _draw_sequence(dump: Dump, key: str, whole: range, out: Path) -> Picture:
    """A generated (or any) sequence's token rows of `key` (`whole`, its first rows drawn
    where they are many) as one `[tokens, features]` heatmap, the tokens on the rows, the
    response's below a line and in its colour."""
    most = min(MAX_SEQUENCE_ROWS, MAX_ROW_BYTES // max(1, dump.reader.row_bytes([key])))
    rows = whole[: max(1, most)]
    values = torch.stack([dump.row(key, row).float() for row in rows])
    ids = [int(dump.row(TOKEN_IDS, row)) for row in rows] if TOKEN_IDS in dump else []
    labels = written(dump, ids) if ids else None
    response = [bool(dump.row(RESPONSE, row)) for row in rows] if RESPONSE in dump else []
    split = response.index(True) if True in response else None
    sequence = int(dump.row(SAMPLE, rows[0]))
    ids_of = dump.manifest.sample_ids
    name = ids_of[sequence] if isinstance(ids_of, list) and sequence < len(ids_of) else sequence
    info = dump.info(key)
    told = ""
    if split is not None:
        told = f": {split} of the prompt, {len(rows) - split} of the response (below the line)"
    cut = f" (the first {len(rows)} of {len(whole)})" if len(rows) < len(whole) else ""
    title = (
        f"{key} ({info.module_type}), sequence {name}, {len(rows)} tokens{cut}{told}, "
        f"shape [{len(rows)}, {values.shape[1]}]"
    )
    return charts.heatmap(values, out, title, labels, split)


def pick_row(dump: Dump, sample: int | str) -> int:
    """The row `sample` names: a row number (an int, or digits), or a sample id as the
    manifest records it (a file path, an id given to `hookdump.dump`); with token rows, the
    first row of that sequence."""
    text = str(sample).strip()
    if isinstance(sample, int) or text.lstrip("-").isdigit():
        return int(text)
    ids = dump.manifest.sample_ids
    if ids is None:
        raise HookdumpError(
            f"{opt('sample')} {text!r}: the samples of {dump.path} have no ids but their row "
            "numbers; give a row number"
        )
    listed = [str(i) for i in ids]
    if text not in listed:
        near = did_you_mean(text, listed) if len(listed) <= MAX_SUGGESTED else ""
        raise HookdumpError(
            f"{opt('sample')} {text!r} is neither a row number nor a sample id of "
            f"{dump.path}{near or f' (its ids are like {listed[0]!r})'}"
        )
    index = listed.index(text)
    if not dump.manifest.token_rows:
        return index
    return _first_token_row(dump, index)


def _first_token_row(dump: Dump, sequence: int, missing_ok: bool = False) -> int:
    """The first token row of sequence `sequence` (`__sample__` grows along the rows: a
    binary search, a row read at each step); `missing_ok`: the first row of a later one,
    or the row count, where the sequence kept no row."""
    lo, hi = 0, dump.num_samples
    while lo < hi:
        middle = (lo + hi) // 2
        if int(dump.row(SAMPLE, middle)) < sequence:
            lo = middle + 1
        else:
            hi = middle
    if missing_ok:
        return lo
    if lo == dump.num_samples or int(dump.row(SAMPLE, lo)) != sequence:
        raise HookdumpError(
            f"{opt('sample')}: sequence {sequence} kept no token row in {dump.path}"
        )
    return lo


def _draw(
    dump: Dump,
    key: str,
    sample: int,
    values: torch.Tensor,
    out: Path,
    tiling: grids.Tiling,
    padding: bool = False,
) -> Picture:
    """The picture that suits the sample's shape and kind."""
    info = dump.info(key)
    title = _title(dump, key, info.module_type, sample, values)
    if info.kind in ROUTING_KINDS and ":" in key:  # tokens by experts, whichever was named
        return routing_picture(dump, key, sample, out, padding, title)
    words = None if dump.manifest.token_rows else sample_tokens(dump, sample)
    if info.kind in ("pattern", "scores") and values.dim() == 3 and values.numel():
        values, labels, title = _words_kept(values, words, padding, title, (1, 2))
        return grids.heads(values, out, title, info.kind, tiling, labels)
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
        grid = _patch_grid(dump, values)
        if grid is not None:
            return charts.cls_and_patches(values, grid, out, title)
        if values.dim() == 2:  # a [T, D] sample as captured: its rows are the tokens fed
            kept, labels, title = _words_kept(kept, words, padding, title, (0,))
        return charts.heatmap(kept, out, title, labels)
    if len(shape) == 1:
        return charts.vector(kept, out, title)
    if values.numel() == 1:
        return charts.number(float(values.flatten()[0]), out, title)
    return charts.histogram(values, out, title)


_VISION_TRANSFORMERS = ("vit", "deit", "beit", "dino", "visiontransformer", "siglip")


def _patch_grid(dump: Dump, values: torch.Tensor) -> int | None:
    """The side of the patch grid, when `values` are a vision transformer's `[1 + side²,
    D]` rows: a CLS row, then the patches in raster order (None otherwise)."""
    if values.dim() != 2 or dump.manifest.token_rows:
        return None
    side = math.isqrt(max(values.shape[0] - 1, 0))
    model = dump.manifest.get("model") or {}
    names = " ".join(str(model.get(k, "")) for k in ("spec", "class", "architecture")).lower()
    if side < 2 or side * side != values.shape[0] - 1:
        return None
    return side if any(name in names for name in _VISION_TRANSFORMERS) else None


def _title(dump: Dump, key: str, module_type: str, sample: int, values: torch.Tensor) -> str:
    """Key, module class, which sample (a token row: its token, sequence and position), and
    the shape as captured."""
    module = f" ({module_type})" if module_type not in ("", "-") else ""  # lone files
    token = row_token(dump, sample)
    if token is not None:
        text, sequence, position, response = token
        said = ", the response" if response else ""
        which = f"token {text!r} (sequence {sequence}, position {position}{said})"
    else:
        ids = dump.manifest.sample_ids  # not Dump.sample_ids: that lists every row
        tokens = dump.manifest.token_rows
        listed = ids[sample] if isinstance(ids, list) and not tokens and sample < len(ids) else None
        which = f"sample {sample if listed is None else listed}"
    return f"{key}{module}, {which}, shape {list(values.shape)}"


def _words_kept(
    values: torch.Tensor, words: Tokens | None, padding: bool, title: str, dims: tuple[int, ...]
) -> tuple[torch.Tensor, list[str] | None, str]:
    """`values` with the padding positions (along `dims`) left out, and the tokens of the
    positions kept, as labels; with `padding`, every position, padding labelled `[pad]`.
    Untouched where the positions are not the sample's tokens."""
    if words is None or len(words.strings) != values.shape[dims[0]]:
        return values, None, title
    if padding:
        labels = [
            w if real else f"{w} [pad]" for w, real in zip(words.strings, words.real, strict=True)
        ]
        return values, labels, title + ("; padding marked [pad]" if words.padding else "")
    keep = [i for i, real in enumerate(words.real) if real]
    if len(keep) == len(words.real):
        return values, words.strings, title
    index = torch.tensor(keep, dtype=torch.long)
    for dim in dims:
        values = values.index_select(dim, index)
    note = f"; {words.padding} padding positions left out"
    return values, [words.strings[i] for i in keep], title + note
