"""The one place where known errors become an `Error: ...` line and an exit code."""

from __future__ import annotations

from typing import Any

import typer
from typer.core import TyperGroup

from hookdump.cli._config import config_value_error
from hookdump.errors import HookdumpError, Interrupted

EXIT_INTERRUPTED = 130


class HookdumpGroup(TyperGroup):
    """Runs a command; `HookdumpError` -> one line on stderr and its exit code, no traceback."""

    def parse_args(self, ctx: typer.Context, args: list[str]) -> list[str]:
        # kept for the manifest: the command line as given, also when invoked in-process
        ctx.meta["hookdump.argv"] = ["hookdump", *args]
        return super().parse_args(ctx, args)

    def invoke(self, ctx: typer.Context) -> Any:
        try:
            return super().invoke(ctx)
        except HookdumpError as exc:
            typer.echo(f"Error: {exc}", err=True)
            raise typer.Exit(exc.exit_code) from None
        except typer.BadParameter as exc:
            message = config_value_error(exc)
            if message is None:
                raise  # a value typed on the command line: Click's own usage error
            typer.echo(f"Error: {message}", err=True)
            raise typer.Exit(2) from None
        except Interrupted as exc:
            typer.echo(f"Interrupted: {exc}", err=True)
            raise typer.Exit(EXIT_INTERRUPTED) from None
        except KeyboardInterrupt:
            typer.echo("Interrupted.", err=True)
            raise typer.Exit(EXIT_INTERRUPTED) from None
