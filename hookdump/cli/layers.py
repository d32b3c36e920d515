"""`hookdump layers`: the modules a selection picks, with shapes and calls per forward."""

from __future__ import annotations

from typing import Annotated

import typer

from hookdump.cli import _output
from hookdump.cli._options import (
    CaptureOpt,
    DeviceOpt,
    ExcludeOpt,
    InputShapeOpt,
    JsonOpt,
    LayersOpt,
    ModelArg,
    ModelArgsOpt,
    NoStrictOpt,
    SeedOpt,
    TrainOpt,
    TypesOpt,
    UnsafePickleOpt,
    WeightsOpt,
    as_list,
    model_options,
)
from hookdump.errors import HookdumpError, opt


def layers(
    model: ModelArg,
    layers: LayersOpt = None,
    exclude: ExcludeOpt = None,
    types: TypesOpt = None,
    names: Annotated[
        bool, typer.Option("--names", help="Print bare names, one a line (for pipelines).")
    ] = False,
    tree: Annotated[
        bool,
        typer.Option(
            "--tree",
            help="The module tree as text: every module (containers too), indented by depth, "
            "each with its parameters, and the model's totals (no picture: pipe it to a file).",
        ),
    ] = False,
    depth: Annotated[
        int | None,
        typer.Option(
            "--depth",
            metavar="N",
            help="The module tree down to depth N (1: the model's children).",
            show_default=False,
        ),
    ] = None,
    weights: WeightsOpt = "none",
    no_strict: NoStrictOpt = False,
    unsafe_pickle: UnsafePickleOpt = False,
    model_arg: ModelArgsOpt = None,
    input_shape: InputShapeOpt = None,
    seed: SeedOpt = 0,
    device: DeviceOpt = "cpu",
    train: TrainOpt = False,
    capture: CaptureOpt = "output",
    json_output: JsonOpt = False,
) -> None:
    """List the modules that --layers/--exclude/--type select, as one forward sees them."""
    from hookdump.cli.render import layers_table, tree_footer
    from hookdump.hooks.values import parse_capture
    from hookdump.inputs.samples import parse_shape, sample_form
    from hookdump.model.prepare import prepare
    from hookdump.tools.layers import down_to, list_layers, parameter_totals

    if depth is not None and depth < 1:
        raise HookdumpError(f"{opt('depth')} {depth} must be at least 1 (the model's children)")
    as_tree = tree or depth is not None
    kinds = parse_capture(capture)
    if set(kinds) - {"output", "ops"}:
        raise HookdumpError(f"{opt('capture')} {capture!r}: layers lists output and ops only")
    shape = parse_shape(input_shape) if input_shape else None
    loaded = prepare(
        model_options(model, weights, model_arg, seed, device, train, not no_strict, unsafe_pickle)
    )
    rows = list_layers(
        loaded,
        sample_form(loaded, shape),
        layers=as_list(layers) or (["*"] if as_tree else []),
        exclude=as_list(exclude),
        types=as_list(types),
        seed=seed,
        ops="ops" in kinds,
    )
    if as_tree:
        rows = down_to(rows, depth)
    if json_output:
        _output.print_json([row.as_dict() for row in rows])
    elif names:
        for row in rows:
            print(row.name)
    else:
        console = _output.stdout()
        console.print(layers_table(rows, console.width, indent=as_tree), crop=False)
        if as_tree:
            console.print(tree_footer(rows, *parameter_totals(loaded.module)), markup=False)
