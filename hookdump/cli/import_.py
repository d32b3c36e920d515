"""`hookdump import`: a serving engine's hidden states, one file per request, made a dump."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from hookdump.cli import _output
from hookdump.cli._options import (
    MaxDiskOpt,
    OverwriteOpt,
    QuietOpt,
    ShardSizeOpt,
    SpoolOpt,
    StorageOpt,
    storage_options,
)
from hookdump.errors import HookdumpError, opt, printable


def import_(
    kind: Annotated[
        str,
        typer.Argument(
            metavar="KIND",
            help="The engine that wrote the files: vllm (its hidden-states connectors' "
            "<request>.safetensors, or .safetensors.zst: the zstd extra) or trtllm (the "
            "SaveHiddenStates mode's <prefix>_<n>.pt) or files (a folder of per-sample "
            "<id>.safetensors: --key).",
            show_default=False,
        ),
    ],
    source: Annotated[
        Path,
        typer.Argument(
            metavar="SOURCE",
            help="The engine's folder (searched down), or one file.",
            show_default=False,
        ),
    ],
    out: Annotated[
        str,
        typer.Option(
            "--out",
            "-o",
            metavar="DIR|URL",
            help="Folder for the dump (new or empty), or a URL (s3://bucket/prefix).",
            show_default=False,
        ),
    ],
    layer_ids: Annotated[
        str,
        typer.Option(
            "--layer-ids",
            metavar="N,N,...",
            help="The model's layers the files hold, in their order. vLLM's "
            "eagle_aux_hidden_state_layer_ids: layer N becomes blocks.N.hook_resid_pre, the "
            "residual stream entering decoder layer N. TensorRT-LLM's layers_to_capture, "
            "sorted, -1 last: blocks.N.hook_resid_post, leaving it, and -1 (the final "
            "norm's output) ln_final.hook_normalized.",
            show_default=False,
        ),
    ] = "",
    key: Annotated[
        list[str] | None,
        typer.Option(
            "--key",
            metavar="NAME=KEY",
            help="files: the dump's key NAME from each file's tensor KEY (repeatable); "
            "__token_ids__=KEY: the file's token ids, which make its rows token rows.",
            show_default=False,
        ),
    ] = None,
    tokens: Annotated[
        Path | None,
        typer.Option(
            "--tokens",
            metavar="FILE",
            help="files: each sample's token ids, one JSON line a sample: {\"id\": <the file's "
            'name>, "token_ids": [...]}.',
            show_default=False,
        ),
    ] = None,
    skip_bad: Annotated[
        bool,
        typer.Option(
            "--skip-bad",
            help="Import the other files when one is bad, and list it (in the manifest's "
            "skipped_inputs, and here).",
        ),
    ] = False,
    resume: Annotated[
        bool,
        typer.Option(
            "--resume",
            help="Go on with an import that stopped, adding the files that appeared since "
            "(give the same options).",
        ),
    ] = False,
    max_disk: MaxDiskOpt = None,
    delete_source: Annotated[
        bool,
        typer.Option(
            "--delete-source",
            help="Delete each source file once the dump's manifest lists every row of it "
            "(a dump larger than the disk, moved across; --out a folder).",
        ),
    ] = False,
    shard_size: ShardSizeOpt = "1GiB",
    overwrite: OverwriteOpt = False,
    spool: SpoolOpt = None,
    storage_option: StorageOpt = None,
    quiet: QuietOpt = False,
) -> None:
    """Import a serving engine's hidden states into a dump, checked row by row."""
    from hookdump.engine.importing import Held, Writing, import_engine
    from hookdump.engine.options import parse_size

    writing = Writing(
        shard_size,
        overwrite,
        storage_options(storage_option),
        spool,
        resume,
        parse_size(max_disk) if max_disk is not None else None,
        delete_source,
    )
    held = Held(_numbers(layer_ids), key or [], tokens)
    imported = import_engine(
        kind,
        source,
        out,
        held,
        writing=writing,
        skip_bad=skip_bad,
        progress=not quiet,
    )
    dump = imported.dump
    for entry in imported.skipped:
        _output.stderr().print(
            f"skipped {printable(entry['path'])}: {printable(entry['error'])}",
            soft_wrap=True,
        )
    if imported.waiting:
        first = printable(str(imported.waiting[0]))
        _output.stderr().print(
            f"warning: {len(imported.waiting):,} files the engine is still writing were left "
            f"for a later import (the first: {first})",
            soft_wrap=True,
        )
    if not quiet:
        keys = len([key for key in dump if not key.startswith("__")])
        unit, what = ("sample", "key") if kind == "files" else ("request", "layer")
        rows = f"{_many(dump.num_samples, 'token row')}, " if dump.manifest.token_rows else ""
        _output.stdout().print(
            f"imported {_many(dump.manifest.samples_fed, unit)} ({rows}{_many(keys, what)}) "
            f"into {dump.path}",
            soft_wrap=True,
        )


def _many(count: int, word: str) -> str:
    """`1 request`, `1,024 requests`."""
    return f"{count:,} {word}{'' if count == 1 else 's'}"


def _numbers(text: str) -> list[int]:
    """`--layer-ids 1,2,3` as numbers (one that is not: an error naming it)."""
    found = []
    for part in (p.strip() for p in text.split(",") if p.strip()):
        if not part.removeprefix("-").isdigit():
            raise HookdumpError(
                f"{opt('layer_ids')} {printable(part)!r} is not a layer's number; "
                "give them as 1,2,3"
            )
        found.append(int(part))
    return found
