"""`hookdump models`: the model names that MODEL accepts, from torchvision or timm."""

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
    source: Annotated[
        str,
        typer.Option(
            "--source", metavar="ZOO", help="torchvision, or timm (names to give as timm:NAME)."
        ),
    ] = "torchvision",
    json_output: JsonOpt = False,
) -> None:
    """List the model names that MODEL accepts (torchvision's, or timm's), one a line."""
    from hookdump.model.loading import list_models

    found = list_models(pattern, source)
    if json_output:
        _output.print_json([{"name": n, "family": f} for n, f in found.items()])
    else:
        for name in found:
            print(name)
