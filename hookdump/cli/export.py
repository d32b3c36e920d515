"""`hookdump export`: a dump rewritten as a datasets folder, SAELens' cache, or .npy files."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from hookdump.cli import _output
from hookdump.cli._options import JsonOpt, KeysOpt, QuietOpt, StorageOpt, storage_options
from hookdump.errors import HookdumpError


def export(
    dump: Annotated[
        str,
        typer.Argument(metavar="DUMP", help="The dump (a folder or a URL).", show_default=False),
    ],
    to: Annotated[
        str,
        typer.Option(
            "--to",
            metavar="FORMAT",
            help="hf (a datasets.load_from_disk folder), saelens (SAELens' cached activations, "
            "from a packed --per-token dump), npy (a .npy per key) or routing (one file of each "
            "token's chosen experts, for routing replay).",
            show_default=False,
        ),
    ],
    out: Annotated[
        Path | None,
        typer.Argument(
            metavar="OUT", help="The folder (routing: the file) to write.", show_default=False
        ),
    ] = None,
    out_option: Annotated[
        Path | None,
        typer.Option("--out", "-o", metavar="OUT", help="OUT, named.", show_default=False),
    ] = None,
    completion_only: Annotated[
        bool,
        typer.Option(
            "--completion-only",
            help="routing: the prompt's tokens are -1, not replayed (a dump with --generate or "
            "--chat).",
        ),
    ] = False,
    keys: KeysOpt = None,
    hook_name: Annotated[
        str | None,
        typer.Option(
            "--hook-name",
            metavar="NAME",
            help="saelens: the activations' column, SAELens' hook_name (default: the key's "
            "standard name, blocks.N.hook_resid_post, where the dump records one; else the key).",
            show_default=False,
        ),
    ] = None,
    overwrite: Annotated[
        bool, typer.Option("--overwrite", help="Replace OUT when it holds a previous export.")
    ] = False,
    json_output: JsonOpt = False,
    quiet: QuietOpt = False,
    storage_option: StorageOpt = None,
) -> None:
    """Write a dump in another format, a chunk at a time, into a folder made whole first."""
    from hookdump.choices import parse_export_target
    from hookdump.tools.export import export as export_dump

    if (out is None) == (out_option is None):
        raise HookdumpError("give OUT once: as the argument, or as --out")
    result = export_dump(
        dump,
        out or out_option or Path(),
        to=parse_export_target(to),
        keys=list(keys or []) or None,
        hook_name=hook_name,
        completion_only=completion_only,
        overwrite=overwrite,
        storage_options=storage_options(storage_option),
    )
    if json_output:
        _output.print_json(
            {
                "out": str(result.out),
                "to": result.to,
                "rows": result.rows,
                "keys": result.keys,
                "notes": result.notes,
            }
        )
        return
    for note in result.notes:
        _output.stderr().print(f"note: {note}", markup=False, highlight=False)
    if not quiet:
        from hookdump.cli.render import counted

        per_sequence = result.to in ("saelens", "routing")
        rows = counted(result.rows, "sequence" if per_sequence else "row")
        _output.stdout().print(
            f"{rows} of {counted(len(result.keys), 'key')} -> {result.out} ({result.to})",
            markup=False,
            highlight=False,
        )
