"""`hookdump models`: the torchvision model names that MODEL accepts."""

from __future__ import annotations

from typing import Annotated

import typer

from hookdump.cli import _output
from hookdump.cli._options import JsonOpt


def models(
    pattern: Annotated[
        str | None,
        typer.Argument(
            metavar="[GLOB]", help="Glob over model names, e.g. 'resnet*'.", show_default=False
        ),
    ] = None,
    json_output: JsonOpt = False,
) -> None:
    """List the torchvision model names that MODEL accepts, one a line."""
    from hookdump.model.loading import list_models

    found = list_models(pattern)
    if json_output:
        _output.print_json([{"name": n, "family": f} for n, f in found.items()])
    else:
        for name in found:
            print(name)
