"""The `hookdump` command: a thin layer that parses options, calls the library and renders.

Nothing here imports torch at import time, so `hookdump --help` stays instant.
"""

from __future__ import annotations

import typer

from hookdump.cli import diff, inspect, layers, models, run, show
from hookdump.cli._errors import HookdumpGroup

app = typer.Typer(
    cls=HookdumpGroup,
    name="hookdump",
    help="Dump what happens inside a PyTorch model: hook modules, capture tensors, save them.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_show_locals=False,
    rich_markup_mode=None,  # plain help: rich rendering alone took ~0.2 s
    context_settings={"help_option_names": ["-h", "--help"]},
)
app.command("run")(run.run)
app.command("layers")(layers.layers)
app.command("models")(models.models)
app.command("inspect")(inspect.inspect)
app.command("diff")(diff.diff)
app.command("show")(show.show)


def main() -> None:
    """Console-script entry point."""
    app(prog_name="hookdump")
