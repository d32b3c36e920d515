"""`hookdump diff`: compare two dumps tensor by tensor."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from hookdump.cli import _output
from hookdump.cli._options import JsonOpt, KeysOpt, QuietOpt, StorageOpt, storage_options


def diff(
    a: Annotated[str, typer.Argument(metavar="A", help="The reference dump.", show_default=False)],
    b: Annotated[str, typer.Argument(metavar="B", help="The dump to check.", show_default=False)],
    atol: Annotated[
        float, typer.Option("--atol", metavar="X", help="Absolute tolerance (as allclose).")
    ] = 1e-8,
    rtol: Annotated[
        float, typer.Option("--rtol", metavar="X", help="Relative tolerance (as allclose).")
    ] = 1e-5,
    keys: KeysOpt = None,
    strict_dtype: Annotated[
        bool,
        typer.Option(
            "--strict-dtype",
            help="A key saved in another dtype fails, whatever its values (for CI); without "
            "it, such keys are compared by value in the wider dtype.",
        ),
    ] = False,
    show_all: Annotated[
        bool, typer.Option("--all", help="List matching keys too, not only the failures.")
    ] = False,
    plot: Annotated[
        Path | None,
        typer.Option(
            "--plot",
            metavar="FILE",
            help="Draw each key's max relative error, 1 - cos and fraction mismatched along the "
            "forward order, with the tolerance (.png, .svg, .pdf).",
            show_default=False,
        ),
    ] = None,
    json_output: JsonOpt = False,
    quiet: QuietOpt = False,
    storage_option: StorageOpt = None,
) -> None:
    """Compare two dumps key by key; exit 1 if any key differs, naming the first."""
    from hookdump.cli.render import print_diff
    from hookdump.tools.diff import diff_dumps

    if plot is not None:
        from hookdump.tools.pictures.canvas import check_format

        check_format(plot, "plot")  # before the comparison, which may take a while
    result = diff_dumps(
        a, b, atol, rtol, list(keys or []), storage_options(storage_option), strict_dtype
    )
    if plot is not None:
        from hookdump.tools.pictures.curves import diff_plot

        drawn = diff_plot(result, plot, f"{a} against {b}: errors per key")
        if not json_output:
            typer.echo(drawn.describe("errors (max relative, 1 - cos, mismatched)"), err=True)
    if json_output:
        _output.print_json(result.as_dict())
    elif not quiet:
        print_diff(result, _output.stdout(), show_all)
    if not result.match:
        raise typer.Exit(1)
