"""What a run's manifest records beyond its shards and tensors: what reproduces the dump."""

from __future__ import annotations

import platform
from collections.abc import Callable
from datetime import UTC, datetime
from importlib.metadata import PackageNotFoundError, version
from typing import Any

import torch

from hookdump._version import __version__
from hookdump.engine.options import RunOptions
from hookdump.engine.resume import Sources
from hookdump.format.dtypes import dtype_name
from hookdump.hooks.selection import select
from hookdump.inputs.corpus import corpus_kind
from hookdump.inputs.samples import Feed, SampleForm
from hookdump.model.loading import LoadedModel
from hookdump.store.location import secrets_of

_COLUMNS = ("jsonl", "parquet", "datasets", "folder of parquet")  # read --text-field


def manifest_fields(
    options: RunOptions,
    *,
    loaded: LoadedModel,
    feed: Feed,
    form: Callable[[], SampleForm],
    sources: Sources,
    processes: int | None,
) -> dict[str, Any]:
    """Everything but the shards, the tensors and what grows as the run goes on (sample ids,
    skipped inputs): the model, the command, the recipe, the sources, the input, versions,
    the selection as the hooks will make it; `processes`: torchrun's (None: one), which
    `--resume` checks it goes on with."""
    capture = options.capture
    selection = select(loaded.module, capture.layers, capture.exclude, capture.types)
    fields = {
        "model": loaded.manifest_entry(),
        "command": _scrubbed(options),
        "recipe": options.recipe(),
        "sources": sources,
        "selection": {
            "layers": list(capture.layers),
            "exclude": list(capture.exclude),
            "types": list(capture.types),
            "modules": list(selection.modules),
            "standard_names": {name: site.module for name, site in selection.sites.items()},
        },
        "capture": list(capture.kinds),
        "reduce": capture.reduce,
        "grad_target": capture.grad_target if "grad" in capture.kinds else None,
        "seed": options.model.seed,
        "device": str(loaded.device),
        "dtype": _forward_dtype(options, loaded),
        "save_dtype": dtype_name(options.dump.save_dtype) if options.dump.save_dtype else None,
        "train": loaded.module.training,
        "batch_size": options.input.batch_size if feed.input_type != "python" else None,
        "input": _input(options, loaded, feed, form),
        "skipped": [],
        "versions": {
            name: _version(name) for name in ("hookdump", "torch", "torchvision", "safetensors")
        }
        | {"python": platform.python_version()},
        "created": datetime.now(UTC).isoformat(timespec="seconds"),
    }
    if processes is not None:
        fields["processes"] = processes
    if options.tokens is not None:
        fields["rows"] = "tokens"
    if options.generate is not None:  # each sequence's count and stop go in `generated`
        fields["generation"] = options.generate.as_json(options.model.seed)
    return fields


def _forward_dtype(options: RunOptions, loaded: LoadedModel) -> str:
    """The precision the forward ran in: the autocast dtype given, else the model's own
    (a live bfloat16 module runs in bfloat16 whatever the default says)."""
    if options.dtype != torch.float32:
        return dtype_name(options.dtype)
    floating = (p.dtype for p in loaded.module.parameters() if p.is_floating_point())
    return dtype_name(next(floating, torch.float32))


def _input(
    options: RunOptions, loaded: LoadedModel, feed: Feed, form: Callable[[], SampleForm]
) -> dict[str, Any]:
    if feed.input_type == "python":  # batches handed over by hookdump.dump
        return {"source": "python", "layout": "tokens" if options.tokens else "batches"}
    text = options.text
    if text is not None:
        kind = corpus_kind(text.source)
        return {
            "source": text.source,
            "kind": kind,
            "field": text.text_field if kind.split(".")[0] in _COLUMNS else None,
            "layout": "tokens",
            "mode": "packed" if text.context_size else "documents",
            "context_size": text.context_size,
            "bos": text.starts_with_bos,
            "max_length": feed.tally.length if feed.tally is not None else text.max_length,
            "padding": None if text.packed else ("longest" if options.tokens else "max_length"),
            "sort_by_length": text.sort_by_length,
            "tokenizer": text.tokenizer or loaded.about.get("folder"),
        }
    source: dict[str, Any] = {"source": options.input.source}
    if feed.input_type == "random":
        source.update(layout=form().layout, shape=list(form().shape))
    elif feed.input_type == "token ids":
        source.update(layout="tokens", kind=corpus_kind(options.input.source))
    elif feed.input_type == "tensors":
        source["layout"] = "tensors"
    else:
        source["layout"] = form().layout
        source["image_size"] = options.input.image_size
        source["preprocessing"] = (
            "weights"
            if loaded.transforms and not options.input.image_size
            else "resize, centre crop, normalise"
        )
    return source


def _version(package: str) -> str | None:
    if package == "hookdump":
        return __version__
    try:
        return version(package)
    except PackageNotFoundError:
        return None


def _scrubbed(options: RunOptions) -> list[str]:
    """The command line with every storage option's value, and a password in the URL,
    blanked: the manifest never holds a secret."""
    secrets = secrets_of(options.dump.storage_options, str(options.dump.out or ""))
    command, blank_next = [], False
    for arg in options.command:
        if arg.startswith("--storage-option="):
            arg = f"--storage-option={arg.split('=')[1]}=***"
        elif blank_next:
            key, equals, _ = arg.partition("=")
            arg = f"{key}=***" if equals else "***"
        blank_next = arg == "--storage-option"
        for secret in secrets:
            arg = arg.replace(secret, "***")
        command.append(arg)
    return command
