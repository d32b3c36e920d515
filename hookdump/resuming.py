"""Resuming an interrupted dump: what it was made with, and where it stopped."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from hookdump.dump_reader import Dump
from hookdump.dump_writer import check_out_dir
from hookdump.errors import HookdumpError

if TYPE_CHECKING:
    from hookdump.runner import RunOptions

RECIPE = (
    "model", "weights", "model_args", "layers", "exclude", "types", "capture", "reduce",
    "grad_target", "input", "input_shape", "image_size", "num_samples", "batch_size", "seed",
    "dtype", "save_dtype", "train", "skip_bad_inputs",
)  # fmt: skip


def recipe(options: RunOptions) -> dict[str, Any]:
    """The options that shape a dump's contents: --resume must be given the same ones."""
    return {name: getattr(options, name) for name in RECIPE}


def previous_dump(options: RunOptions) -> dict[str, Any] | None:
    """The incomplete dump that --resume carries on (None: nothing there yet, start anew)."""
    if options.out is None:
        raise HookdumpError("--resume needs --out: the folder of the interrupted dump")
    if not (options.out / "manifest.json").is_file():
        if options.out.is_dir() and any(options.out.glob("shard-*")):
            check_out_dir(options.out, overwrite=True)  # only half-written shards: start anew
        return None
    manifest = Dump(options.out).manifest
    if manifest.get("complete"):
        raise HookdumpError(f"--resume: {options.out} is already complete; nothing to do")
    before = manifest.get("recipe", {})
    for name, value in recipe(options).items():
        if before.get(name) != value:
            flag = "MODEL" if name == "model" else f"--{name.replace('_', '-')}"
            raise HookdumpError(
                f"--resume: {flag} was {before.get(name)!r} for the dump in {options.out}, "
                f"now {value!r}; resume with the same options, or start anew with --overwrite"
            )
    return manifest
