"""Rendering results for people: the summary table of a run and the layer listing."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING

from rich.console import Console
from rich.table import Table
from rich.text import Text

if TYPE_CHECKING:
    from hookdump.layer_listing import LayerRow
    from hookdump.runner import RunResult

TIMES = "\u00d7"


def format_bytes(n: float) -> str:
    """1536 -> '1.5 KiB'."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")


def format_number(value: float | None) -> str:
    """Four significant digits; '-' where there is no value."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    return f"{value:.4g}"


def format_shape(shape: Sequence[int]) -> str:
    """[64, 56, 56] -> '64x56x56' (with a multiplication sign); a scalar is '()'."""
    return TIMES.join(map(str, shape)) if shape else "()"


def summary_table(result: RunResult) -> Table:
    """One row per captured key in forward order, with totals in the footer."""
    table = Table(show_footer=True, header_style="bold", footer_style="bold", box=None)
    table.add_column("key", footer=f"{len(result.keys)} tensors", no_wrap=True)
    table.add_column("module")
    table.add_column("shape", no_wrap=True)
    table.add_column("dtype", no_wrap=True)
    table.add_column("size", justify="right", no_wrap=True, footer=format_bytes(result.total_bytes))
    for name in ("mean", "std", "min", "max"):
        table.add_column(name, justify="right", no_wrap=True)
    table.add_column("nan/inf", justify="right", no_wrap=True)
    for item in result.keys:
        stats = item.stats
        bad = stats.nan + stats.inf
        table.add_row(
            Text(item.info.key),
            Text(item.info.module_type),
            format_shape(item.shape),
            item.dtype,
            format_bytes(item.nbytes),
            format_number(stats.mean if stats.count else None),
            format_number(stats.std),
            format_number(stats.min if stats.count else None),
            format_number(stats.max if stats.count else None),
            Text(f"{stats.nan}/{stats.inf}", style="bold red" if bad else "dim"),
        )
    return table


def summary_footer(result: RunResult) -> str:
    """The line under the table: samples, time, and where the dump went."""
    where = f"dump: {result.out}" if result.out else "not saved (pass --out DIR to keep it)"
    shards = len(result.manifest["shards"]) if result.manifest else 0
    files = f" ({shards} shard{'s' if shards != 1 else ''} + manifest.json)" if shards else ""
    line = f"{result.num_samples} samples in {result.wall_time:.2f} s; {where}{files}"
    if result.skipped:
        line += f"; {len(result.skipped)} non-tensor or unbatched values skipped"
    return line


def print_summary(result: RunResult, console: Console) -> None:
    """The table and its footer line."""
    console.print(summary_table(result))
    console.print(summary_footer(result), markup=False, highlight=False)


def layers_table(rows: Sequence[LayerRow]) -> Table:
    """One row per selected module: name, class, parameters, output shape, calls."""
    table = Table(header_style="bold", box=None)
    table.add_column("name", no_wrap=True)
    table.add_column("class")
    table.add_column("params", justify="right")
    table.add_column("output (per sample)")
    table.add_column("calls", justify="right")
    for row in rows:
        table.add_row(
            Text(row.name),
            Text(row.module_type),
            f"{row.params:,}",
            Text(format_outputs(row)),
            str(row.calls),
        )
    return table


def format_outputs(row: LayerRow) -> str:
    """A module's output shapes: '64x56x56', or 'logits: 10, 0: 4' for structured ones."""
    if not row.outputs:
        return "-"
    parts = []
    for part, shape in row.outputs.items():
        text = format_shape(shape) if part == "" else f"{part}: {format_shape(shape)}"
        parts.append(f"{text} (no batch dim)" if part in row.unbatched else text)
    return ", ".join(parts[:4]) + (f", … ({len(parts)} parts)" if len(parts) > 4 else "")
