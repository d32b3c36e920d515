"""`hookdump show`: one captured tensor as a PNG, or every key's statistics along the forward
order (`--depth`)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from hookdump.errors import HookdumpError, opt


def show(
    path: Annotated[
        Path, typer.Argument(metavar="PATH", help="A dump folder or .safetensors file.")
    ],
    key: Annotated[
        str | None,
        typer.Argument(
            metavar="[KEY]",
            help="The tensor's key, e.g. layer1.0.conv1 (none with --depth).",
            show_default=False,
        ),
    ] = None,
    out: Annotated[
        Path | None,
        typer.Option(
            "--out", "-o", metavar="FILE", help="Where to write the picture.", show_default=False
        ),
    ] = None,
    sample: Annotated[
        int, typer.Option("--sample", "-s", metavar="N", help="Which sample (row) to draw.")
    ] = 0,
    depth: Annotated[
        bool,
        typer.Option(
            "--depth",
            help="Every key's mean, std, min/max and NaN/Inf along the forward order (.png, "
            ".svg or .pdf): where values blow up.",
        ),
    ] = False,
) -> None:
    """Render one captured tensor as a PNG (a feature-map grid for [C,H,W], else a
    histogram), or with --depth every key's statistics along the forward order."""
    if out is None:
        raise HookdumpError(f"give {opt('out')} FILE: where to write the picture")
    if depth:
        if key is not None:
            raise HookdumpError(f"{opt('depth', True)} draws every key; give no KEY ({key!r})")
        from hookdump.tools.inspect import inspect_dump
        from hookdump.tools.plots import check_format, depth_plot

        check_format(out)
        found = inspect_dump(path)
        model = found.manifest.get("model", {}).get("spec")
        title = f"{found.path}{f' ({model})' if model else ''}: {found.num_samples} samples"
        print(depth_plot(found.keys, out, title).describe("statistics along the forward order"))
        return
    if key is None:
        raise HookdumpError(f"give the KEY to draw, or {opt('depth', True)} for every key")
    from hookdump.tools.image import render

    print(render(path, key, out, sample).describe(key, sample))
