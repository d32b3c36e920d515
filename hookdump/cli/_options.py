"""Option types shared by several commands, as `Annotated` aliases."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

if TYPE_CHECKING:
    from hookdump.model.prepare import ModelOptions

ModelArg = Annotated[
    str,
    typer.Argument(
        help="A torchvision name (see `hookdump models`), hf:PATH or hf:ORG/NAME (a Hugging "
        "Face model), timm:NAME, package.module:attribute, or a model file.",
        show_default=False,
        metavar="MODEL",
    ),
]
CaptureOpt = Annotated[
    str,
    typer.Option(
        "--capture",
        "-c",
        metavar="KINDS",
        help="What to capture, a comma list: output, input, grad, ops (the results of the "
        "ops a module's own forward calls: M:op.add), and of attention modules pattern, "
        "scores, q, k, v, z (M:pattern, [heads, T, T] or [heads, T, head_dim] per sample), "
        "q_pre_rope, k_pre_rope (before the rotary embedding), and of mixture-of-experts "
        "blocks routing (M:router_logits, M:topk_ids, M:topk_weights per token). "
        "`layers` lists output and ops.",
    ),
]
LayersOpt = Annotated[
    list[str] | None,
    typer.Option(
        "--layers",
        "-l",
        metavar="GLOB",
        help="Glob over qualified module names ('*' crosses dots); repeatable. "
        "Default: every leaf module.",
        show_default=False,
    ),
]
ExcludeOpt = Annotated[
    list[str] | None,
    typer.Option(
        "--exclude",
        "-x",
        metavar="GLOB",
        help="Glob of modules to drop; repeatable.",
        show_default=False,
    ),
]
TypesOpt = Annotated[
    list[str] | None,
    typer.Option(
        "--type",
        "-t",
        metavar="CLASS",
        help="Keep modules of this class name (e.g. Conv2d); repeatable.",
        show_default=False,
    ),
]
WeightsOpt = Annotated[
    str,
    typer.Option(
        "--weights",
        "-w",
        metavar="WEIGHTS",
        help="none (as constructed, seeded), a torchvision weights name (DEFAULT, "
        "IMAGENET1K_V2) or a checkpoint file (.safetensors, .pt, .pth, .bin).",
    ),
]
ModelArgsOpt = Annotated[
    list[str] | None,
    typer.Option(
        "--model-arg",
        "-m",
        metavar="KEY=VALUE",
        help="key=value keyword argument for the model's constructor; repeatable.",
        show_default=False,
    ),
]
InputShapeOpt = Annotated[
    str | None,
    typer.Option(
        "--input-shape",
        metavar="SHAPE",
        help="Per-sample shape of random input, e.g. 3,224,224. Default: the model's own.",
        show_default=False,
    ),
]
SeedOpt = Annotated[
    int, typer.Option("--seed", metavar="INT", help="Seed for model construction and input.")
]
DeviceOpt = Annotated[
    str,
    typer.Option(
        "--device",
        "-d",
        metavar="DEVICE",
        help="auto, cpu, cuda or cuda:N (auto: CUDA if present).",
    ),
]
TrainOpt = Annotated[
    bool, typer.Option("--train", help="Run the model in train mode (default: eval).")
]
KeysOpt = Annotated[
    list[str] | None,
    typer.Option("--keys", "-k", metavar="GLOB", help="Only these keys (globs); repeatable."),
]
JsonOpt = Annotated[
    bool, typer.Option("--json", help="Print a machine-readable result on stdout, nothing else.")
]
OverwriteOpt = Annotated[
    bool, typer.Option("--overwrite", help="Replace an existing dump in --out.")
]
ShardSizeOpt = Annotated[
    str,
    typer.Option("--shard-size", metavar="SIZE", help="Bytes per shard file, e.g. 2GB, 512MiB."),
]
MaxDiskOpt = Annotated[
    str | None,
    typer.Option(
        "--max-disk",
        metavar="SIZE",
        help="Keep at most SIZE of shards under --out: the run waits while a follower "
        "(hookdump.follow(..., consume=True)) has not consumed them.",
        show_default=False,
    ),
]
SpoolOpt = Annotated[
    Path | None,
    typer.Option(
        "--spool",
        metavar="DIR",
        help="With --out URL: where shards are finished before they go up (at most 4 shards "
        "at a time; default: the system's temporary folder).",
        show_default=False,
    ),
]
QuietOpt = Annotated[bool, typer.Option("--quiet", "-q", help="No table, no progress.")]


StorageOpt = Annotated[
    list[str] | None,
    typer.Option(
        "--storage-option",
        metavar="KEY=VALUE",
        help="An fsspec option for a dump at a URL (repeatable), e.g. "
        "endpoint_url=http://127.0.0.1:9000; credentials otherwise come from the client's "
        "environment and config files.",
        show_default=False,
    ),
]


def storage_options(pairs: list[str] | None) -> dict[str, str]:
    """--storage-option KEY=VALUE pairs as fsspec's options."""
    from hookdump.store.location import parse_storage_options

    return parse_storage_options(pairs)


def as_list(values: list[str] | None) -> list[str]:
    """Typer gives None for a repeatable option never given."""
    return list(values or [])


NoStrictOpt = Annotated[
    bool,
    typer.Option("--no-strict", help="Load the checkpoint keys that fit; warn about the rest."),
]
UnsafePickleOpt = Annotated[
    bool,
    typer.Option(
        "--unsafe-pickle",
        help="Allow MODEL to be a pickled nn.Module (unpickling runs code from the file).",
    ),
]


def model_options(
    model: str,
    weights: str,
    model_arg: list[str] | None,
    seed: int,
    device: str,
    train: bool,
    strict: bool,
    unsafe_pickle: bool,
) -> ModelOptions:
    """MODEL, --weights ... --unsafe-pickle as the model's option group."""
    from hookdump.model.loading import parse_model_args
    from hookdump.model.prepare import ModelOptions

    return ModelOptions(
        model=model,
        weights=weights,
        model_args=parse_model_args(as_list(model_arg)),
        seed=seed,
        device=device,
        train=train,
        strict=strict,
        unsafe_pickle=unsafe_pickle,
    )
