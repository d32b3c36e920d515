"""`hookdump show`: one captured tensor as a PNG."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer


def show(
    path: Annotated[
        Path, typer.Argument(metavar="PATH", help="A dump folder or .safetensors file.")
    ],
    key: Annotated[
        str, typer.Argument(metavar="KEY", help="The tensor's key, e.g. layer1.0.conv1.")
    ],
    out: Annotated[
        Path,
        typer.Option("--out", "-o", metavar="FILE.png", help="Where to write the PNG."),
    ],
    sample: Annotated[
        int, typer.Option("--sample", "-s", metavar="N", help="Which sample (row) to draw.")
    ] = 0,
) -> None:
    """Render one captured tensor as a PNG: feature-map grid for [C,H,W], else a histogram."""
    from hookdump.tools.image import render

    print(render(path, key, out, sample).describe(key, sample))
