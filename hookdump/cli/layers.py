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
    from hookdump.cli.render import layers_table
    from hookdump.hooks.capture import parse_capture
    from hookdump.inputs.samples import parse_shape, sample_form
    from hookdump.model.prepare import prepare
    from hookdump.tools.layers import list_layers

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
        layers=as_list(layers),
        exclude=as_list(exclude),
        types=as_list(types),
        seed=seed,
        ops="ops" in kinds,
    )
    if json_output:
        _output.print_json([row.as_dict() for row in rows])
    elif names:
        for row in rows:
            print(row.name)
    else:
        console = _output.stdout()
        console.print(layers_table(rows, console.width), crop=False)
