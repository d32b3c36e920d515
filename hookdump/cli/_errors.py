"""The one place where known errors become an `Error: ...` line and an exit code."""

from __future__ import annotations

import contextlib
import os
import traceback
from typing import Any

import typer
from typer.core import TyperGroup

from hookdump.cli._config import config_value_error
from hookdump.cli._output import no_stdin, printable_streams
from hookdump.engine.signals import EXIT_SIGINT, EXIT_SIGTERM, exit_code
from hookdump.errors import HookdumpError, Interrupted, render_message

EXIT_INTERRUPTED = (EXIT_SIGINT, EXIT_SIGTERM)


class HookdumpGroup(TyperGroup):
    """Runs a command; `HookdumpError` -> one line on stderr and its exit code, no traceback."""

    def main(self, *args: Any, **kwargs: Any) -> Any:
        # everything a command prints for a person, Click's own usage errors included
        with printable_streams():
            return super().main(*args, **kwargs)

    # typer.Context: what Typer passes, narrower than the Click context the base class names
    def parse_args(self, ctx: typer.Context, args: list[str]) -> list[str]:  # type: ignore[override]
        # kept for the manifest: the command line as given, also when invoked in-process
        ctx.meta["hookdump.argv"] = ["hookdump", *args]
        return super().parse_args(ctx, args)

    def invoke(self, ctx: typer.Context) -> Any:  # type: ignore[override]
        # `run` reads stdin for `--input -` or `--text -` alone, and closes it itself
        command = next((a for a in ctx.meta["hookdump.argv"][1:] if not a.startswith("-")), None)
        guard = contextlib.nullcontext() if command == "run" else no_stdin()
        try:
            with guard:
                return super().invoke(ctx)
        except Interrupted as exc:
            typer.echo(f"{_stopped(exc.exit_code)}: {exc.render(flag)}", err=True)
            raise typer.Exit(exc.exit_code) from None
        except HookdumpError as exc:
            typer.echo(f"Error: {exc.render(flag)}", err=True)
            if os.environ.get("HOOKDUMP_DEBUG") == "1" and exc.__cause__ is not None:
                cause = exc.__cause__
                typer.echo("".join(traceback.format_exception(cause)).rstrip(), err=True)
            raise typer.Exit(exc.exit_code) from None
        except typer.BadParameter as exc:
            message = config_value_error(exc)
            if message is None:
                raise  # a value typed on the command line: Click's own usage error
            typer.echo(f"Error: {message}", err=True)
            raise typer.Exit(2) from None
        except KeyboardInterrupt as exc:  # SIGTERM too (`Terminated`)
            typer.echo(f"{_stopped(exit_code(exc))}.", err=True)
            raise typer.Exit(exit_code(exc)) from None


def _stopped(code: int) -> str:
    """How a run that was stopped by a signal says so."""
    return "Terminated" if code == EXIT_SIGTERM else "Interrupted"


# library argument names whose flag is not `--` + the name with - for _
_FLAGS = {
    "model": "MODEL",
    "types": "--type",
    "model_args": "--model-arg",
    "shard_bytes": "--shard-size",
    "path": "PATH",
    "key": "KEY",
    "key_map": "--key",
}
_NEGATED = {"strict": "--no-strict", "early_stop": "--no-early-stop", "bos": "--no-bos"}


def flag(name: str, value: str | None) -> str:
    """The command-line flag for a library argument named in an error message."""
    if name in _NEGATED and value == "False":
        return _NEGATED[name]
    return _FLAGS.get(name, "--" + name.replace("_", "-"))


def for_cli(message: str) -> str:
    """A library message (a warning or problem) with its options named by their flags."""
    return render_message(message, flag)
