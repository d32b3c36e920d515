"""The `hookdump` command: a thin layer that parses options, calls the library and renders.

Nothing here imports torch at import time, so `hookdump --help` stays instant.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import sys
import threading
from collections.abc import MutableMapping
from typing import Annotated, NoReturn

import typer

from hookdump._version import __version__
from hookdump.cli import diff, export, import_, inspect, layers, models, run, show
from hookdump.cli._errors import EXIT_INTERRUPTED, HookdumpGroup
from hookdump.cli._output import printable
from hookdump.engine.signals import ignore_from_now, interrupts_once

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


def _print_version(value: bool) -> None:
    if value:
        typer.echo(f"hookdump {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: Annotated[
        bool,
        typer.Option(
            "--version",
            callback=_print_version,
            is_eager=True,
            help="Print hookdump's version and exit.",
        ),
    ] = False,
) -> None:
    """Dump what happens inside a PyTorch model: hook modules, capture tensors, save them."""


# short_help: the line `hookdump --help` lists, whole (Click cuts a docstring's at 45)
app.command("run", short_help="Capture what MODEL's modules compute, to a dump.")(run.run)
app.command("layers", short_help="List the modules a selection picks.")(layers.layers)
app.command("models", short_help="List the model names MODEL accepts.")(models.models)
app.command("inspect", short_help="Summarise a dump; say what it misses.")(inspect.inspect)
app.command("diff", short_help="Compare two dumps; exit 1 if they differ.")(diff.diff)
app.command("show", short_help="Draw one captured tensor, or every key in forward order.")(
    show.show
)
app.command("export", short_help="Write a dump for datasets, SAELens or numpy.")(export.export)
app.command("import", short_help="Make a serving engine's hidden states a dump.")(import_.import_)


def main() -> None:
    """Console-script entry point: the first Ctrl-C or SIGTERM stops the command, and any
    later one is ignored (see `engine.signals`) until the process is gone."""
    wait_passively(os.environ)
    try:
        with interrupts_once(process_ends=True):
            app(prog_name="hookdump")
    except SystemExit as exc:
        if exc.code in EXIT_INTERRUPTED:
            # a second signal while the interpreter shuts down (joining worker processes and
            # threads) would print a traceback from an atexit callback: the first one counts
            ignore_from_now()
        _exit(exc.code)
    _exit(0)


def wait_passively(environ: MutableMapping[str, str]) -> None:
    """The forward's OpenMP threads wait for each other asleep, not spinning (set before torch
    loads OpenMP, which reads it once; any setting of the user's own is kept). Spinning, each
    waited on a core that hookdump's writer threads needed: the resnet50 job spent 3.6 of its
    12.4 CPU s so; the bare forward is as fast within its spread (benchmarks/README.md)."""
    if not any(name in environ for name in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "KMP_BLOCKTIME")):
        environ["OMP_WAIT_POLICY"] = "PASSIVE"


def _exit(code: object) -> NoReturn:
    """End the process without the interpreter's teardown, which frees torch's modules and
    objects one by one: most of a second of every run. What the
    teardown would wait for still runs first: other threads, then the atexit callbacks
    (DataLoader workers, torch.distributed); the dump itself is synced before this."""
    if isinstance(code, str):
        print(printable(code), file=sys.stderr)
    for thread in threading.enumerate():
        if thread is not threading.main_thread() and not thread.daemon:
            thread.join()
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):  # a closed pipe, say
            stream.flush()
    os._exit(code if isinstance(code, int) else 0 if code is None else 1)
