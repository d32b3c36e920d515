"""Rendering results for people: the summary table of a run and the layer listing."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING

from rich.console import Console
from rich.table import Table
from rich.text import Text

from hookdump.cli._errors import for_cli
from hookdump.cli._output import printable
from hookdump.format import format_bytes

if TYPE_CHECKING:
    from hookdump.engine.options import RunResult
    from hookdump.store.stats import KeySummary
    from hookdump.tools.diff import DiffResult
    from hookdump.tools.inspect import Inspection
    from hookdump.tools.layers import LayerRow

TIMES = "\u00d7"


def format_number(value: float | None) -> str:
    """Four significant digits; '-' where there is no value."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    return f"{value:.4g}"


def format_shape(shape: Sequence[int]) -> str:
    """[64, 56, 56] -> '64x56x56' (with a multiplication sign); a scalar is '()'."""
    return TIMES.join(map(str, shape)) if shape else "()"


SPARK = "▁▂▃▄▅▆▇█"


def sparkline(counts: Sequence[int] | None) -> str:
    """Counts as block characters (a space for an empty bin)."""
    if not counts or not max(counts):
        return ""
    top = max(counts)
    return "".join(
        SPARK[min(len(SPARK) - 1, (len(SPARK) * c - 1) // top)] if c else " " for c in counts
    )


def summary_table(keys: Sequence[KeySummary], sparklines: bool = False) -> Table:
    """One row per captured key in forward order, with totals in the footer.

    `sparklines` adds each key's value distribution (where the console can print it).
    """
    total = sum(k.nbytes for k in keys)
    table = Table(show_footer=True, header_style="bold", footer_style="bold", box=None)
    table.add_column("key", footer=f"{len(keys)} tensors", no_wrap=True)
    table.add_column("module")
    table.add_column("shape", no_wrap=True)
    table.add_column("dtype", no_wrap=True)
    table.add_column("size", justify="right", no_wrap=True, footer=format_bytes(total))
    for name in ("mean", "std", "min", "max"):
        table.add_column(name, justify="right", no_wrap=True)
    table.add_column("nan/inf", justify="right", no_wrap=True)
    if sparklines:
        table.add_column("distribution", no_wrap=True)
    for item in keys:
        stats = item.stats
        bad = stats.nan + stats.inf
        spark = [Text(sparkline(stats.hist), style="cyan")] if sparklines else []
        table.add_row(
            Text(printable(item.info.key)),
            Text(printable(item.info.module_type)),
            format_shape(item.shape),
            item.dtype,
            format_bytes(item.nbytes),
            format_number(stats.mean if stats.count else None),
            format_number(stats.std),
            format_number(stats.min if stats.count else None),
            format_number(stats.max if stats.count else None),
            Text(f"{stats.nan}/{stats.inf}", style="bold red" if bad else "dim"),
            *spark,
        )
    return table


def can_draw_sparklines(console: Console) -> bool:
    """Block characters need a Unicode console (not a legacy Windows or ASCII one)."""
    return (
        console.encoding.lower().replace("-", "").startswith("utf") and not console.legacy_windows
    )


def run_footer(result: RunResult) -> str:
    """The line under the table: samples, time, and where the dump went."""
    where = f"dump: {result.out}" if result.out else "not saved (pass --out DIR to keep it)"
    shards = len(result.manifest["shards"]) if result.manifest else 0
    files = f" ({shards} shard{'s' if shards != 1 else ''} + manifest.json)" if shards else ""
    rows = (
        f"{result.num_samples} tokens from {result.num_sequences} sequences"
        if result.num_sequences is not None
        else f"{result.num_samples} samples"
    )
    if result.real_tokens is not None:
        rows += f" ({result.real_tokens:.0%} of the positions computed were real tokens)"
    line = f"{rows} in {result.wall_time:.2f} s; {where}{files}"
    if result.out and result.estimated_bytes is not None:
        line += f", estimated {format_bytes(result.estimated_bytes)} before writing"
    if result.skipped:
        line += f"; {len(result.skipped)} non-tensor or unbatched values skipped"
    return line


def print_summary(result: RunResult, console: Console) -> None:
    """The table of a run and its footer line."""
    console.print(summary_table(result.keys, can_draw_sparklines(console)))
    console.print(run_footer(result), markup=False, highlight=False)


def print_inspection(found: Inspection, console: Console) -> None:
    """The table of a dump on disk, then whether it is complete and what is missing."""
    console.print(summary_table(found.keys, can_draw_sparklines(console)))
    model = found.manifest.get("model", {}).get("spec")
    source = f" of {model}" if model else ""
    shards = f"{found.shards} shard{'s' if found.shards != 1 else ''}"
    state = "complete" if found.complete else "INCOMPLETE"
    rows = f"{found.num_samples} samples"
    if found.manifest.get("rows") == "tokens":
        rows = f"{found.num_samples} tokens from {found.manifest.get('num_sequences')} sequences"
    console.print(
        f"{found.path}: dump{source}, {rows} in {shards}, {state}",
        markup=False,
        highlight=False,
    )
    for problem in found.problems:
        console.print(f"  - {for_cli(problem)}", markup=False, highlight=False, style="red")


def layers_table(rows: Sequence[LayerRow]) -> Table:
    """One row per selected module: name, class, parameters, output shape, calls."""
    table = Table(header_style="bold", box=None)
    table.add_column("name", no_wrap=True)
    table.add_column("class")
    table.add_column("params", justify="right")
    table.add_column("output (per sample)")
    table.add_column("calls", justify="right")
    with_ops = any(row.ops is not None for row in rows)
    if with_ops:
        table.add_column("ops (its own forward's)")
    for row in rows:
        cells: list[Text | str] = [
            Text(printable(row.name)),
            Text(printable(row.module_type + (" (attention)" if row.attention else ""))),
            f"{row.params:,}",
            Text(printable(format_outputs(row))),
            str(row.calls),
        ]
        if with_ops:
            cells.append(Text(printable(", ".join(row.ops or []) or "-")))
        table.add_row(*cells)
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


def print_diff(result: DiffResult, console: Console, show_all: bool = False) -> None:
    """The failing keys (or all) in forward order, then the verdict naming the first failure."""
    rows = result.keys if show_all else result.failures
    if rows:
        table = Table(header_style="bold", box=None)
        table.add_column("key", no_wrap=True)
        table.add_column("status", no_wrap=True)
        for name in ("max abs", "max rel", "cosine", "mismatched"):
            table.add_column(name, justify="right", no_wrap=True)
        for item in rows:
            compared = item.numel > 0
            table.add_row(
                Text(printable(item.key)),
                Text(
                    printable(f"{item.status} {item.detail}".strip()),
                    style="green" if item.ok else "bold red",
                ),
                format_number(item.max_abs) if compared else "-",
                format_number(item.max_rel) if compared else "-",
                format_number(item.cosine) if compared else "-",
                f"{item.mismatched}/{item.numel}" if compared else "-",
            )
        console.print(table)
    for problem in result.problems:
        console.print(f"- {problem}", markup=False, highlight=False, style="red")
    tolerance = f"atol={result.atol:g}, rtol={result.rtol:g}"
    failures = result.failures
    if failures:
        first = failures[0]
        console.print(
            f"{len(failures)} of {len(result.keys)} keys differ ({tolerance}); first diverging: "
            f"{first.key} (module {first.module})",
            markup=False,
            highlight=False,
        )
    elif result.problems:
        console.print(
            f"all {len(result.keys)} keys match ({tolerance}), but see above", markup=False
        )
    else:
        console.print(f"all {len(result.keys)} keys match ({tolerance})", markup=False)
