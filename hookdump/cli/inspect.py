"""`hookdump inspect`: the summary of a dump on disk."""

from __future__ import annotations

from typing import Annotated

import typer

from hookdump.cli import _output
from hookdump.cli._errors import flag, for_cli
from hookdump.cli._options import JsonOpt, StorageOpt, storage_options
from hookdump.cli._progress import checking_bar


def inspect(
    path: Annotated[
        str,
        typer.Argument(
            metavar="PATH",
            help="A dump folder, one .safetensors file, or a dump's URL (s3://bucket/prefix).",
            show_default=False,
        ),
    ],
    check: Annotated[
        bool,
        typer.Option(
            "--check",
            help="Also read every shard against the size and checksum (CRC32C or SHA-256) its "
            "manifest records; "
            "exit 1 when the dump is incomplete, damaged or holds leftovers (for CI).",
        ),
    ] = False,
    json_output: JsonOpt = False,
    storage_option: StorageOpt = None,
) -> None:
    """Summarise an existing dump (or one .safetensors file) and say what is missing."""
    from hookdump.cli.render import print_inspection
    from hookdump.tools.inspect import inspect_dump

    with checking_bar(check) as progress:
        found = inspect_dump(path, storage_options(storage_option), check=check, progress=progress)
    if json_output:
        _output.print_json(found.as_dict(flag))
    else:
        print_inspection(found, _output.stdout())
    if not found.complete:
        problem = for_cli(found.problems[0])
        state = "a damaged" if found.damaged else "an incomplete"
        typer.echo(f"warning: {path} is {state} dump: {problem}", err=True)
        if check:
            raise typer.Exit(1)
