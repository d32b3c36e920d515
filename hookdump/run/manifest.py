"""What a run's manifest records beyond its shards and tensors: what reproduces the dump."""

from __future__ import annotations

import platform
from collections.abc import Callable
from datetime import UTC, datetime
from importlib.metadata import PackageNotFoundError, version
from typing import Any

import hookdump
from hookdump.inputs.samples import Feed, SampleForm
from hookdump.model.loading import LoadedModel
from hookdump.run.options import RunOptions


def manifest_fields(
    options: RunOptions,
    *,
    loaded: LoadedModel,
    feed: Feed,
    form: Callable[[], SampleForm],
    sources: dict[str, Any],
    modules: list[str],
    kinds: tuple[str, ...],
) -> dict[str, Any]:
    """Everything but the shards, the tensors and what grows as the run goes on (sample ids,
    skipped inputs): the model, the command, the recipe, the sources, the input, versions."""
    return {
        "model": loaded.manifest_entry(),
        "command": options.command,
        "recipe": options.recipe(),
        "sources": sources,
        "selection": {
            "layers": options.layers,
            "exclude": options.exclude,
            "types": options.types,
            "modules": modules,
        },
        "capture": list(kinds),
        "reduce": options.reduce,
        "grad_target": options.grad_target if "grad" in kinds else None,
        "seed": options.seed,
        "device": str(loaded.device),
        "dtype": options.dtype,
        "save_dtype": options.save_dtype,
        "train": options.train,
        "batch_size": options.batch_size,
        "input": _input(options, loaded, feed, form),
        "skipped": [],
        "versions": {
            name: _version(name) for name in ("hookdump", "torch", "torchvision", "safetensors")
        }
        | {"python": platform.python_version()},
        "created": datetime.now(UTC).isoformat(timespec="seconds"),
    }


def _input(
    options: RunOptions, loaded: LoadedModel, feed: Feed, form: Callable[[], SampleForm]
) -> dict[str, Any]:
    if feed.input_type == "python":  # batches handed over by hookdump.dump
        return {"source": "python", "layout": "tokens" if options.per_token else "batches"}
    if feed.input_type == "text":
        return {
            "source": options.text,
            "layout": "tokens",
            "mode": "packed" if options.context_size else "documents",
            "context_size": options.context_size,
            "bos": options.bos if options.context_size else None,
            "max_length": options.max_length,
            "tokenizer": options.tokenizer or loaded.about.get("folder"),
        }
    source: dict[str, Any] = {"source": options.input}
    if feed.input_type == "random":
        source.update(layout=form().layout, shape=list(form().shape))
    elif feed.input_type == "tensors":
        source["layout"] = "tensors"
    else:
        source["layout"] = form().layout
        source["image_size"] = options.image_size
        source["preprocessing"] = (
            "weights"
            if loaded.transforms and not options.image_size
            else "resize, centre crop, normalise"
        )
    return source


def _version(package: str) -> str | None:
    if package == "hookdump":
        return hookdump.__version__
    try:
        return version(package)
    except PackageNotFoundError:
        return None
