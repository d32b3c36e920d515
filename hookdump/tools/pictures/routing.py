"""`show M:topk_ids` (or `M:topk_weights`, `M:router_logits`) of a mixture-of-experts block:
a sequence's tokens by the block's experts, each cell the weight the token gave the expert
(blank where it did not choose it), so which experts each token chose, and how much, reads
at a glance; each expert's column says how many of the tokens shown chose it.

Per-sample routing (`[T, k]`) draws the sample's tokens; token rows draw the rows of the
row's sequence (its `__sample__`), around the row asked for."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import torch

from hookdump.format.keys import SAMPLE, TOKEN_IDS
from hookdump.tools.experts import checked_ids, experts_of
from hookdump.tools.pictures.canvas import Picture, fitted, plain, pyplot, saved
from hookdump.tools.pictures.tokens import sample_tokens, written

MAX_TOKENS = 512  # the most tokens drawn: a longer sequence's first ones
MAX_LABELS = 64  # token labels on the rows (every n-th beyond)


def routing_picture(dump: Any, key: str, row: int, out: Path, padding: bool, title: str) -> Picture:
    """Draw the routing of the sample (or the token row's sequence) `row` of the block that
    wrote `key` (one of its three routing keys)."""
    stem, _, call = key.partition("@")
    module = stem.rsplit(":", 1)[0]
    suffix = f"@{call}" if call else ""
    ids_key, weights_key = f"{module}:topk_ids{suffix}", f"{module}:topk_weights{suffix}"
    experts = experts_of(dump, ids_key)
    if dump.manifest.token_rows:
        first, stop = _sequence_rows(dump, row)
        read = _rows(dump, [k for k in (ids_key, weights_key, TOKEN_IDS) if k in dump], first, stop)
        ids, weights = read[ids_key], read[weights_key]
        labels = written(dump, read[TOKEN_IDS].tolist()) if TOKEN_IDS in read else None
    else:
        ids, weights = dump.row(ids_key, row), dump.row(weights_key, row)
        tokens = sample_tokens(dump, row)
        labels = None
        if tokens is not None:
            real = torch.tensor(tokens.real[: len(ids)]) | padding
            ids, weights = ids[real], weights[real]
            labels = [w for w, r in zip(tokens.strings, real.tolist(), strict=False) if r]
    ids, weights = ids[:MAX_TOKENS], weights.float()[:MAX_TOKENS]
    ids = checked_ids(ids, experts, ids_key, f"{dump.path} (row {row}'s sequence)")
    count = experts or (int(ids.max()) + 1 if ids.numel() else 1)
    grid = torch.full((len(ids), count), math.nan)
    grid.scatter_(1, ids, weights)
    return _draw(grid, labels, out, title)


def _sequence_rows(dump: Any, row: int) -> tuple[int, int]:
    """The token rows of the sequence row `row` belongs to (at most MAX_TOKENS of them),
    found in the rows of `__sample__` around it, read at once."""
    if SAMPLE not in dump:
        return row, row + 1
    lo, hi = max(0, row - MAX_TOKENS + 1), min(dump.num_samples, row + MAX_TOKENS)
    same = (_rows(dump, [SAMPLE], lo, hi)[SAMPLE] == dump.row(SAMPLE, row)).tolist()
    first, stop = row - lo, row - lo + 1
    while first > 0 and same[first - 1]:
        first -= 1
    while stop < len(same) and stop - first < MAX_TOKENS and same[stop]:
        stop += 1
    return lo + first, lo + stop


def _rows(dump: Any, keys: list[str], first: int, stop: int) -> dict[str, torch.Tensor]:
    """Rows `first:stop` of `keys`, each shard they lie in opened once."""
    reader = dump.reader
    parts: dict[str, list[torch.Tensor]] = {key: [] for key in keys}
    at = first
    while at < stop:
        shard = reader.shard_of(at)
        end = min(stop, shard.stop)
        with reader.open(shard, keys) as opened:
            for key in keys:
                parts[key].append(reader.read_rows(opened, shard, key, at, end))
        at = end
    return {key: torch.cat(values) for key, values in parts.items()}


def _draw(grid: torch.Tensor, labels: list[str] | None, out: Path, title: str) -> Picture:
    plt = pyplot()
    tokens, experts = grid.shape
    size = (max(8.0, min(16.0, 3 + 0.35 * experts)), max(4.5, min(14.0, 2 + 0.22 * tokens)))
    figure, axes = plt.subplots(figsize=size, dpi=100)
    try:
        top = max(1.0, float(grid.nan_to_num(0.0).max()))  # weights of 1 at most, mostly
        image = axes.imshow(
            grid.numpy(), aspect="auto", cmap="viridis", vmin=0.0, vmax=top, interpolation="nearest"
        )
        axes.set_facecolor("white")  # experts not chosen: blank
        figure.colorbar(image, ax=axes, label="weight (blank: not chosen)")
        load = (~grid.isnan()).sum(0).tolist()
        step = max(1, math.ceil(experts / 32))
        axes.set_xticks(range(0, experts, step))
        axes.set_xticklabels([f"{e}\n{load[e]}" for e in range(0, experts, step)], fontsize=8)
        axes.set_xlabel(f"expert (of {experts}), and how many of the {tokens} tokens chose it")
        shown = range(0, tokens, max(1, math.ceil(tokens / MAX_LABELS)))
        axes.set_yticks(list(shown))
        if labels is not None:
            axes.set_yticklabels([plain(labels[i]) for i in shown], fontsize=8)
            axes.set_ylabel("token")
        else:
            axes.set_ylabel(f"token (of {tokens})")
        axes.set_title(fitted(plain(title), figure, 10), fontsize=10)
        figure.tight_layout()
        return saved(figure, axes, out, "routing", (tokens, experts))
    finally:
        plt.close(figure)
