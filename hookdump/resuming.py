"""Resuming an interrupted dump: what it was made with, and where it stopped."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from hookdump.distributed import RANK_MANIFESTS, Ranks, rank_names
from hookdump.dump_reader import Dump
from hookdump.dump_writer import MANIFEST, check_out_dir
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


def previous_dump(options: RunOptions, ranks: Ranks | None = None) -> dict[str, Any] | None:
    """The incomplete dump that --resume carries on (None: nothing there yet, start anew).
    Under torchrun, this rank's own part of it (empty where the rank wrote nothing)."""
    out = options.out
    if out is None:
        raise HookdumpError("--resume needs --out: the folder of the interrupted dump")
    by_ranks = sorted(out.glob(RANK_MANIFESTS)) if out.is_dir() else []
    if (out / MANIFEST).is_file():
        manifest = Dump(out).manifest
        if manifest.get("complete"):
            raise HookdumpError(f"--resume: {out} is already complete; nothing to do")
        if ranks is not None:
            raise HookdumpError(
                f"--resume: the dump in {out} was started by one process; resume it without "
                "torchrun"
            )
    elif ranks is None and by_ranks:
        world = json.loads(by_ranks[0].read_text()).get("processes", "several")
        raise HookdumpError(
            f"--resume: the dump in {out} was started under torchrun; resume it with "
            f"torchrun --nproc-per-node {world}"
        )
    elif ranks is not None and out.is_dir():
        mine = out / rank_names(ranks)["manifest_name"]
        if not mine.is_file():  # this rank had finished no shard: it starts its part anew
            return {"tensors": {}, "shards": [], "sample_ids": [], "num_samples": 0}
        manifest = json.loads(mine.read_text())
        if manifest.get("processes") != ranks.world:
            raise HookdumpError(
                f"--resume: the dump in {out} was started by {manifest.get('processes')} "
                f"torchrun processes, now {ranks.world}; resume it with --nproc-per-node "
                f"{manifest.get('processes')}"
            )
    else:
        if out.is_dir() and any(out.glob("shard-*")):
            check_out_dir(out, overwrite=True)  # only half-written shards: start anew
        return None
    before = manifest.get("recipe", {})
    for name, value in recipe(options).items():
        if before.get(name) != value:
            flag = "MODEL" if name == "model" else f"--{name.replace('_', '-')}"
            raise HookdumpError(
                f"--resume: {flag} was {before.get(name)!r} for the dump in {out}, "
                f"now {value!r}; resume with the same options, or start anew with --overwrite"
            )
    return manifest
