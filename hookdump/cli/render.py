"""Rendering results for people: the summary table of a run and the layer listing."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from rich.console import Console
from rich.table import Table
from rich.text import Text

from hookdump.cli._errors import for_cli
from hookdump.cli._output import printable
from hookdump.format.keys import INPUT_IDS, TOKEN_KEYS
from hookdump.format.values import format_bytes

if TYPE_CHECKING:
    from hookdump.engine.options import RunResult
    from hookdump.store.stats import KeySummary, TensorStats
    from hookdump.tools.diff import Agreement, DiffResult, KeyDiff
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


def counted(count: int, word: str, words: str | None = None) -> str:
    """`1 sample`, `2 samples` (`words`: an irregular plural)."""
    return f"{count} {word if count == 1 else words or word + 's'}"


SPARK = "▁▂▃▄▅▆▇█"


def sparkline(counts: Sequence[int] | None) -> str:
    """Counts as block characters (a space for an empty bin)."""
    if not counts or not max(counts):
        return ""
    top = max(counts)
    return "".join(
        SPARK[min(len(SPARK) - 1, (len(SPARK) * c - 1) // top)] if c else " " for c in counts
    )


# the columns a narrow console drops first (nan/inf only when every count is zero)
DROPPED_FIRST = ("distribution", "module", "dtype", "nan/inf")
NARROWEST_KEY = 12  # a key column narrower than this folds its keys rather than shrinking
FOLDED_KEY = 30  # columns are dropped to give the key this much; longer keys fold
# rows of a summary table at most (rich takes about 1.4 ms a row): the first ones, and any
# later key holding NaN or Inf; the footer counts every key, and --json lists them all
TABLE_KEYS = 1000


@dataclass
class _Column:
    name: str
    cells: list[Text]
    justify: Literal["left", "right"] = "left"
    footer: str = ""

    @property
    def width(self) -> int:
        return max(len(self.name), len(self.footer), *(c.cell_len for c in self.cells))


def summary_table(
    keys: Sequence[KeySummary], sparklines: bool = False, width: int | None = None
) -> Table:
    """One row per captured key in forward order, with totals in the footer.

    `sparklines` adds each key's value distribution (where the console can print it).
    `width`: the console's columns; a narrower table drops the distribution, module, dtype
    and an all-zero nan/inf column in that order, then folds long keys onto more lines.
    Numbers are never cut.
    """
    columns = _summary_columns(keys, sparklines)
    if width is not None:
        columns = _fitted(columns, width)
    return _table(columns, width, folding=("key",), footer=True)


def shown_keys(keys: Sequence[KeySummary]) -> list[KeySummary]:
    """The keys a summary table lists: all up to `TABLE_KEYS`, else the first `TABLE_KEYS`
    and, after them, those holding NaN or Inf (up to as many again)."""
    if len(keys) <= TABLE_KEYS:
        return list(keys)
    later = [k for k in keys[TABLE_KEYS:] if k.stats.nan + k.stats.inf][:TABLE_KEYS]
    return [*keys[:TABLE_KEYS], *later]


def _print_summary_table(keys: Sequence[KeySummary], console: Console) -> None:
    """The summary table, at most `shown_keys` of it, and a line for the keys left out."""
    shown = shown_keys(keys)
    table = summary_table(shown, can_draw_sparklines(console), console.width)
    if len(shown) < len(keys):  # the footer counts and sums every key, not the rows shown
        _footers(table, keys)
    # crop=False: a table still wider than the console wraps there, never loses a number
    console.print(table, crop=False)
    if len(shown) < len(keys):
        console.print(
            f"... {len(keys) - len(shown):,} more keys not shown (--json lists every key)",
            markup=False,
            highlight=False,
        )


def _footers(table: Table, keys: Sequence[KeySummary]) -> None:
    for column in table.columns:
        if column.header == "key":
            column.footer = counted(len(keys), "tensor")
        elif column.header == "size":
            column.footer = format_bytes(sum(k.nbytes for k in keys))


def _table(
    columns: list[_Column], width: int | None, folding: tuple[str, ...], footer: bool = False
) -> Table:
    """`columns` as a table for a console `width` wide: every column whole but the `folding`
    ones, which share the room left, the first of them served first, and wrap onto more
    lines where they must. With no room, the table is printed wider than the console (the
    terminal wraps it) rather than cut."""
    folds = [c for c in columns if c.name in folding]
    allotted = {c.name: c.width for c in folds}
    padding = 2 * len(columns)
    # the table's outer edges lose their padding where that spares a name its fold
    edges = width is None or sum(c.width for c in columns) + padding <= width
    padding -= 0 if edges else 2
    if width is not None:
        room = width - padding - sum(c.width for c in columns if c not in folds)
        allotted = {c.name: min(c.width, NARROWEST_KEY) for c in folds}
        room -= sum(allotted.values())
        for column in folds:  # in order: the key or name first
            more = max(0, min(room, column.width - allotted[column.name]))
            allotted[column.name] += more
            room -= more
    total = sum(allotted.get(c.name, c.width) for c in columns) + padding
    table = Table(
        show_footer=footer,
        header_style="bold",
        footer_style="bold",
        box=None,
        width=total,
        pad_edge=edges,
    )
    for column in columns:
        table.add_column(
            column.name,
            footer=column.footer,
            justify=column.justify,
            no_wrap=column.name not in allotted,
            overflow="fold",
            width=allotted.get(column.name, column.width),
        )
        if column.name in folding:
            column.cells = [_broken(cell, allotted[column.name]) for cell in column.cells]
        for cell in column.cells:
            cell.justify = column.justify
    for row in zip(*(column.cells for column in columns), strict=True):
        table.add_row(*row)
    return table


# a long name folds after a dot, colon or slash where it can, else after an underscore
BREAKS = ("./:", "_")


def _broken(cell: Text, width: int) -> Text:
    """A plain cell whose names are wider than `width`, each name broken into lines after a
    dot, colon or slash, else an underscore (`blocks.5.` `hook_resid_post`), mid-word only
    where a word is wider than `width`; rich wraps the rest at its spaces."""
    text = cell.plain
    indent = len(text) - len(text.lstrip(" "))  # a tree's indentation, kept on every line
    words = text[indent:].split(" ")
    if (
        max(len(word) for word in words) <= width - indent
        or cell.spans
        or len(text) != cell.cell_len
        or any(c.isspace() and c != " " for c in text)
    ):
        return cell
    lines = " ".join(_name_lines(word, max(width - indent, 8)) for word in words)
    return Text("\n".join(" " * indent + line for line in lines.split("\n")), style=cell.style)


def _name_lines(name: str, width: int) -> str:
    lines = []
    while len(name) > width:
        cut = next((c for seps in BREAKS if (c := _last(name, seps, width) + 1)), 0)
        cut = cut or _camel(name, width)  # a class name: `MixtralTopK` `Router`
        lines.append(name[: cut or width])
        name = name[cut or width :]
    return "\n".join([*lines, name])


def _camel(name: str, width: int) -> int:
    """Where a CamelCase word may break within `width`: before its last capital that
    starts a word (after a small letter, or before one: `TopK|Router`; 0: nowhere)."""
    capitals = [i for i in range(1, min(width, len(name) - 1) + 1) if name[i].isupper()]
    starts = [i for i in capitals if name[i - 1].islower() or name[i + 1].islower()]
    return max(starts, default=0)


def _last(text: str, separators: str, width: int) -> int:
    return max(text.rfind(sep, 0, width) for sep in separators)


IDENTIFIERS = frozenset({INPUT_IDS, *TOKEN_KEYS})


def _spread(key: KeySummary, stats: TensorStats, value: float) -> float | None:
    """A key's mean or std as the table shows it: none for ids and positions (token ids,
    sequence numbers), whose mean means nothing (`Dump.stats` has none for them either)."""
    return None if not stats.count or key.info.key in IDENTIFIERS else value


def _summary_columns(keys: Sequence[KeySummary], sparklines: bool) -> list[_Column]:
    stats = [item.stats for item in keys]
    pairs = list(zip(keys, stats, strict=True))
    count = counted(len(keys), "tensor")
    columns = [
        _Column("key", [Text(printable(k.info.key)) for k in keys], footer=count),
        _Column("module", [Text(printable(k.info.module_type)) for k in keys]),
        _Column("shape", [Text(format_shape(k.shape)) for k in keys]),
        _Column("dtype", [Text(k.dtype) for k in keys]),
        _Column(
            "size",
            [Text(format_bytes(k.nbytes)) for k in keys],
            "right",
            format_bytes(sum(k.nbytes for k in keys)),
        ),
        _Column("mean", [Text(format_number(_spread(k, s, s.mean))) for k, s in pairs], "right"),
        _Column("std", [Text(format_number(_spread(k, s, s.std))) for k, s in pairs], "right"),
        _Column("min", [Text(format_number(s.min if s.count else None)) for s in stats], "right"),
        _Column("max", [Text(format_number(s.max if s.count else None)) for s in stats], "right"),
        _Column(
            "nan/inf",
            [Text(f"{s.nan}/{s.inf}", style="bold red" if s.nan + s.inf else "dim") for s in stats],
            "right",
        ),
    ]
    if sparklines:
        columns.append(
            _Column("distribution", [Text(sparkline(s.hist), style="cyan") for s in stats])
        )
    return columns


def _fitted(columns: list[_Column], width: int) -> list[_Column]:
    """`columns` less those dropped first, until the table fits in `width` (each column
    takes its width and a space either side) or nothing more may go."""

    def needed(chosen: list[_Column]) -> int:  # a key wider than FOLDED_KEY may fold
        return sum(min(c.width, FOLDED_KEY) if c.name == "key" else c.width for c in chosen) + (
            2 * len(chosen)
        )

    for name in DROPPED_FIRST:
        if needed(columns) <= width:
            break
        column = next((c for c in columns if c.name == name), None)
        if column is None or (name == "nan/inf" and any(c.plain != "0/0" for c in column.cells)):
            continue
        columns = [c for c in columns if c is not column]
    return columns


def can_draw_sparklines(console: Console) -> bool:
    """Block characters need a Unicode console (not a legacy Windows or ASCII one)."""
    return (
        console.encoding.lower().replace("-", "").startswith("utf") and not console.legacy_windows
    )


def run_footer(result: RunResult) -> str:
    """The line under the table: samples, time, and where the dump went."""
    where = f"dump: {result.out}" if result.out else "not saved (pass --out DIR to keep it)"
    listed = result.manifest["shards"] if result.manifest else []
    files = f" ({counted(len(listed), 'shard')} + manifest.json{_why_shards(listed)})"
    files = files if listed else ""
    rows = (
        f"{counted(result.num_samples, 'token')} from {counted(result.num_sequences, 'sequence')}"
        if result.num_sequences is not None
        else counted(result.num_samples, "sample")
    )
    if result.real_tokens is not None:
        rows += f" ({result.real_tokens:.0%} of the positions computed were real tokens)"
    line = f"{rows} in {result.wall_time:.2f} s; {where}{files}"
    if result.out and result.estimated_bytes is not None:
        line += f", estimated {format_bytes(result.estimated_bytes)} before writing"
    if result.skipped:
        names = [printable(str(item.get("key"))) for item in result.skipped]
        more = f" and {len(names) - 3} more" if len(names) > 3 else ""
        line += (
            f"; skipped, not tensors or without a batch dim (the manifest says why): "
            f"{', '.join(names[:3])}{more}"
        )
    return line


def _why_shards(listed: list[dict[str, Any]]) -> str:
    """Why a small dump has a small first shard: the first batch streams into a shard of its
    own (its size not known before), the later ones are gathered to --shard-size."""
    rows = [int(shard["stop"]) - int(shard["start"]) for shard in listed[:2]]
    if len(listed) == 2 and 0 < 2 * rows[0] < rows[1]:
        return "; the first batch in a shard of its own, then the rest in one"
    return ""


def print_summary(result: RunResult, console: Console) -> None:
    """The table of a run and its footer line."""
    _print_summary_table(result.keys, console)
    console.print(run_footer(result), markup=False, highlight=False)


def _expert_line(key: str, counts: list[int]) -> str:
    """An MoE block's load: the most and least chosen experts, as shares of every choice."""
    total = sum(counts) or 1
    order = sorted(range(len(counts)), key=lambda e: (-counts[e], e))

    def shares(experts: list[int]) -> str:
        return ", ".join(f"#{e} {counts[e] / total:.0%}" for e in experts)  # #5: an expert

    module = printable(key.rsplit(":", 1)[0])
    least = shares(sorted(order[-2:], key=lambda e: (counts[e], e))) if len(order) > 3 else ""
    least = f"; least {least}" if least else ""
    return f"experts of {module}: most {shares(order[:3])}{least} (of {len(counts)})"


def print_inspection(found: Inspection, console: Console) -> None:
    """The table of a dump on disk, then whether it is complete and what is missing."""
    _print_summary_table(found.keys, console)
    if found.kind != "dump":
        console.print(_lone_file(found), markup=False, highlight=False)
        return
    model = found.manifest.get("model", {}).get("spec")
    source = f" of {model}" if model else ""
    shards = counted(found.shards, "shard")
    state = "complete" if found.complete else "DAMAGED" if found.damaged else "INCOMPLETE"
    rows = counted(found.num_samples, "sample")
    if found.manifest.get("rows") == "tokens":
        sequences = int(found.manifest.get("num_sequences") or 0)
        rows = f"{counted(found.num_samples, 'token')} from {counted(sequences, 'sequence')}"
    console.print(
        f"{found.path}: dump{source}, {rows} in {shards}, {state}",
        markup=False,
        highlight=False,
    )
    if found.features:
        first, brief = next(iter(found.features.items()))
        console.print(
            f"per-feature statistics of {counted(len(found.features), 'key')} "
            f"(Dump.stats(key)); {printable(first)}: {brief['features']} features, mean row "
            f"norm {brief['norm_mean']:.4g}, std {brief['std_min']:.3g} to {brief['std_max']:.3g}",
            markup=False,
            highlight=False,
        )
    if found.consumed:
        who = sorted({name for name in found.consumed.values() if name != "?"})
        by = f" by {', '.join(repr(w) for w in who)}" if who else ""
        listed = found.shards + len(found.consumed)
        console.print(
            f"consumed: {counted(len(found.consumed), 'shard')} of {listed}{by} "
            "(hookdump.follow consume=True): their rows are gone, the rest read as usual",
            markup=False,
            highlight=False,
        )
    if found.generation is not None:
        for line in _generation_lines(found.generation):
            console.print(line, markup=False, highlight=False)
    if found.checked is not None:
        console.print(f"checked: {found.checked.said}", markup=False, highlight=False)
    for key, counts in found.experts.items():
        console.print(_expert_line(key, counts), markup=False, highlight=False)
    for problem in found.problems:
        console.print(f"  - {for_cli(problem)}", markup=False, highlight=False, style="red")


SHOWN_TEXT = 60  # characters of a prompt or response shown


def _generation_lines(generation: dict[str, Any]) -> list[str]:
    """How a generated dump was made, why its sequences stopped, and its first one's text."""
    how = "sampled" if generation.get("do_sample") else "greedy"
    if generation.get("do_sample"):
        settings = [
            f"{name} {generation[name]}"
            for name in ("temperature", "top_p", "top_k")
            if generation.get(name) is not None
        ]
        how += f" (seed {generation.get('seed')}{''.join(', ' + s for s in settings)})"
    stops = generation.get("stops", {})
    said = ", ".join(
        f"{count} at {'EOS' if stop == 'eos' else 'the length'}"
        for stop, count in sorted(stops.items())
    )
    lines = [
        f"generated: up to {generation.get('max_new_tokens')} new tokens, {how}, "
        f"{generation.get('capture')}{'; ' + said if said else ''}"
    ]
    first = generation.get("first")
    if first:
        lines.append(
            f"  {printable(str(first['sequence']))}: {_shown(first['prompt'])!r} -> "
            f"{_shown(first['response'])!r}"
        )
    return lines


def _shown(text: str) -> str:
    return text if len(text) <= SHOWN_TEXT else text[: SHOWN_TEXT - 3] + "..."


def _lone_file(found: Inspection) -> str:
    """What a lone .safetensors file is, with no samples or completeness to claim."""
    tensors = f"{counted(len(found.keys), 'tensor')}, {format_bytes(found.total_bytes)}"
    if found.kind == "shard":
        return (
            f"{found.path}: one shard of a hookdump dump ({tensors}, "
            f"{counted(found.num_samples, 'row')}); inspect its folder for the whole dump"
        )
    return (
        f"{found.path}: a safetensors file, not a hookdump dump ({tensors}, shapes whole); "
        "show and diff read its tensors' first dimension as rows"
    )


def layers_table(rows: Sequence[LayerRow], width: int | None = None, indent: bool = False) -> Table:
    """One row per selected module: name, class, parameters, output shape, calls (`indent`:
    names indented by their depth in the tree, whole, to paste). At a narrow console `width`
    the names, classes, shapes and ops fold; numbers never do."""
    names = [("  " * (row.depth - 1) if indent else "") + row.name for row in rows]
    columns = [
        _Column("name", [Text(printable(name)) for name in names]),
        _Column(
            "class",
            [Text(printable(row.shown_class)) for row in rows],
        ),
        _Column("params", [Text(f"{row.params:,}") for row in rows], "right"),
        _Column("output (per sample)", [Text(printable(format_outputs(row))) for row in rows]),
        _Column("calls", [Text(str(row.calls)) for row in rows], "right"),
    ]
    if any(row.ops is not None for row in rows):
        ops = [Text(printable(", ".join(row.ops or []) or "-")) for row in rows]
        columns.append(_Column("ops (its own forward's)", ops))
    folding = ("name", "class", "output (per sample)", "ops (its own forward's)")
    return _table(columns, width, folding)


def tree_footer(rows: Sequence[LayerRow], params: int, trainable: int) -> str:
    """Under `layers --tree`: the model's parameters, and how many modules are shown."""
    frozen = f", {params - trainable:,} frozen" if trainable != params else ""
    return (
        f"{counted(len(rows), 'module')} shown; the model has {params:,} parameters "
        f"({trainable:,} trainable{frozen}); a container's count includes its children's"
    )


def format_outputs(row: LayerRow) -> str:
    """A module's output shapes: '64x56x56', or 'logits: 10, 0: 4' for structured ones."""
    if not row.outputs:
        return "-"
    parts = []
    every = all(part in row.unbatched for part in row.outputs)  # said once, at the end
    for part, shape in row.outputs.items():
        text = format_shape(shape) if part == "" else f"{part}: {format_shape(shape)}"
        parts.append(f"{text} (no batch dim)" if part in row.unbatched and not every else text)
    shown = ", ".join(parts[:4]) + (f", … ({len(parts)} parts)" if len(parts) > 4 else "")
    return f"{shown} (no batch dim)" if every else shown


def print_diff(result: DiffResult, console: Console, show_all: bool = False) -> None:
    """The failing keys (or all) in forward order, then the verdict naming the first failure."""
    rows = result.keys if show_all else result.failures
    # B holding every key in another dtype (a --save-dtype run) is said once, not per row
    changes = {item.dtypes for item in result.keys if item.numel > 0}
    common = next(iter(changes)) if len(changes) == 1 else ""
    if rows:
        columns = _diff_columns(rows, common)
        console.print(_table(columns, console.width, ("key", "status")), crop=False)
    if common:
        said = f"B holds every key in another dtype ({common}): compared by value"
        console.print(said, markup=False, highlight=False)
    for problem in result.problems:
        console.print(f"- {problem}", markup=False, highlight=False, style="red")
    for routing in result.routing:
        console.print(_agreement(routing), markup=False, highlight=False)
    tolerance = f"atol={result.atol:g}, rtol={result.rtol:g}"
    failures = result.failures
    if failures:
        first = failures[0]
        console.print(
            f"{len(failures)} of {counted(len(result.keys), 'key')} "
            f"{'differs' if len(failures) == 1 else 'differ'} ({tolerance}); first diverging: "
            f"{first.key} (module {first.module})",
            markup=False,
            highlight=False,
        )
    elif result.problems:
        console.print(f"{_all_match(len(result.keys))} ({tolerance}), but see above", markup=False)
    else:
        console.print(f"{_all_match(len(result.keys))} ({tolerance})", markup=False)


def _agreement(routing: Agreement) -> str:
    """A MoE block's routing in one line: the share of tokens that choose the same experts."""
    block = routing.key.removesuffix(":topk_ids")
    said = (
        f"routing of {block}: {routing.share:.1%} of {counted(routing.tokens, 'token')} choose "
        "the same experts"
    )
    if routing.first >= 0:
        said += f"; the first that does not: row {routing.first:,}"
        said += f" ({routing.where})" if routing.where else ""
    return said


def _diff_columns(rows: Sequence[KeyDiff], common: str = "") -> list[_Column]:
    """Each key's verdict and figures; keys and verdicts wrap at a narrow console, numbers
    never. `common`: the dtype change every key shares, said under the table instead."""

    def figure(item: KeyDiff, value: float | None) -> Text:
        return Text(format_number(value) if item.numel > 0 and value is not None else "-")

    return [
        _Column("key", [Text(printable(item.key)) for item in rows]),
        _Column(
            "status",
            [
                Text(
                    printable(f"{item.status} {item.detail}".strip() + _dtypes(item, common)),
                    style="green" if item.ok else "bold red",
                )
                for item in rows
            ],
        ),
        _Column("max abs", [figure(item, item.max_abs) for item in rows], "right"),
        _Column("max rel", [figure(item, item.max_rel) for item in rows], "right"),
        # 1 - cos: a cosine of 0.99998 would print as 1 beside "differ"
        _Column(
            "1 - cos",
            [figure(item, None if item.cosine is None else 1 - item.cosine) for item in rows],
            "right",
        ),
        _Column(
            "mismatched",
            [Text(f"{item.mismatched}/{item.numel}" if item.numel > 0 else "-") for item in rows],
            "right",
        ),
    ]


def _dtypes(item: KeyDiff, common: str = "") -> str:
    """A key B holds in another dtype, compared by value: the change, beside its verdict
    (unless every key shares it: `common`, said once)."""
    shown = item.dtypes and item.status != "dtype" and item.dtypes != common
    return f" ({item.dtypes})" if shown else ""


def _all_match(keys: int) -> str:
    return "the 1 key matches" if keys == 1 else f"all {keys} keys match"
