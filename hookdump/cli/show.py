"""`hookdump show`: one sample of one key as a picture, or every key's statistics along the
forward order (`--depth`)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from hookdump.cli._options import StorageOpt, storage_options
from hookdump.errors import HookdumpError, opt


def show(
    path: Annotated[
        str,
        typer.Argument(metavar="PATH", help="A dump folder, a .safetensors file, or a dump's URL."),
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
        str,
        typer.Option(
            "--sample",
            "-s",
            metavar="N|ID",
            help="Which sample to draw: a row number, or a sample id as the manifest records "
            "it (a file path, an id given to hookdump.dump; with token rows, the sequence's "
            "first token).",
        ),
    ] = "0",
    channels: Annotated[
        str | None,
        typer.Option(
            "--channels",
            metavar="LIST",
            help="The feature maps (or attention heads) to draw, e.g. 0-15,32. Default: all, "
            "the first 1024 (16 heads).",
            show_default=False,
        ),
    ] = None,
    top: Annotated[
        int | None,
        typer.Option(
            "--top",
            metavar="K",
            help="Draw the K feature maps (or heads) of highest mean, highest first.",
            show_default=False,
        ),
    ] = None,
    scale: Annotated[
        str,
        typer.Option(
            "--scale",
            metavar="SCALE",
            help="Colour the tiles on one scale (shared: a colour is a value) or each over "
            "its own min..max (per-channel).",
        ),
    ] = "shared",
    depth: Annotated[
        bool,
        typer.Option(
            "--depth",
            help="Every key's mean, std, min/max and NaN/Inf along the forward order (.png, "
            ".svg or .pdf): where values blow up.",
        ),
    ] = False,
    padding: Annotated[
        bool,
        typer.Option(
            "--padding",
            help="Draw a text sample's padding positions too (labelled [pad], in grey); "
            "they are left out.",
        ),
    ] = False,
    bookkeeping: Annotated[
        bool,
        typer.Option(
            "--bookkeeping",
            help="With --depth: draw the keys kept beside token rows too (__token_ids__, "
            "__sample__, __position__, ...), which are left out.",
        ),
    ] = False,
    storage_option: StorageOpt = None,
) -> None:
    """Draw one sample of one key (a feature-map grid, a heatmap of token rows, attention
    heads, a vector's bars) or, with --depth, every key's statistics along the forward
    order. The format follows --out's extension: .png, .svg or .pdf."""
    from hookdump.tools.pictures.grids import Tiling

    if out is None:
        if key is not None and not depth:  # a KEY not there is said first: --out won't help
            from hookdump.tools.pictures.sample import known_key

            known_key(path, key, storage_options(storage_option))
        raise HookdumpError(f"give {opt('out')} FILE: where to write the picture")
    tiling = Tiling(channels=channels, top=top, scale=scale)
    if depth:
        if key is not None:
            raise HookdumpError(f"{opt('depth', True)} draws every key; give no KEY ({key!r})")
        if tiling.asked:
            raise HookdumpError(
                f"{opt('channels')}, {opt('top')} and {opt('scale')} are for one KEY's tiles; "
                f"{opt('depth', True)} draws every key"
            )
        from hookdump.cli.render import counted
        from hookdump.tools.inspect import inspect_dump
        from hookdump.tools.pictures.canvas import check_format
        from hookdump.tools.pictures.curves import depth_plot

        check_format(out)
        found = inspect_dump(path, storage_options(storage_option))
        model = found.manifest.get("model", {}).get("spec")
        rows = counted(found.num_samples, "sample")
        if found.manifest.get("rows") == "tokens":
            sequences = int(found.manifest.get("num_sequences") or 0)
            rows = f"{counted(found.num_samples, 'token')} from {counted(sequences, 'sequence')}"
        title = f"{found.path}{f' ({model})' if model else ''}: {rows}"
        curves = depth_plot(found.keys, out, title, bookkeeping)
        print(curves.describe("statistics along the forward order"))
        return
    if bookkeeping:
        raise HookdumpError(f"{opt('bookkeeping', True)} is for {opt('depth', True)}")
    if key is None:
        raise HookdumpError(f"give the KEY to draw, or {opt('depth', True)} for every key")
    from hookdump.tools.pictures.sample import draw_sample

    drawn = draw_sample(
        path, key, out, sample, tiling, storage_options(storage_option), padding=padding
    )
    print(drawn.describe(key, sample))
