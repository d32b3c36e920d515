"""`hookdump run`: dump the selected modules' tensors for an input."""

from __future__ import annotations

import contextlib
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from hookdump.cli import _output
from hookdump.cli._config import ConfigOpt
from hookdump.cli._errors import for_cli
from hookdump.cli._options import (
    CaptureOpt,
    DeviceOpt,
    ExcludeOpt,
    InputShapeOpt,
    JsonOpt,
    LayersOpt,
    MaxDiskOpt,
    ModelArg,
    ModelArgsOpt,
    NoStrictOpt,
    OverwriteOpt,
    QuietOpt,
    SeedOpt,
    ShardSizeOpt,
    SpoolOpt,
    StorageOpt,
    TrainOpt,
    TypesOpt,
    UnsafePickleOpt,
    WeightsOpt,
    as_list,
    model_options,
    storage_options,
)
from hookdump.cli._progress import GCPause, progress_bar
from hookdump.errors import CheckFailed, HookdumpError, opt
from hookdump.store.location import destination_of

if TYPE_CHECKING:
    from hookdump.engine.options import RunResult
    from hookdump.hooks.options import CaptureOptions
    from hookdump.hooks.tokens import TokenOptions
    from hookdump.inputs.generation import Generation
    from hookdump.inputs.text import TextOptions
    from hookdump.store.write.writer import DumpOptions


def run(
    ctx: typer.Context,
    model: ModelArg,
    layers: LayersOpt = None,
    exclude: ExcludeOpt = None,
    types: TypesOpt = None,
    out: Annotated[
        str | None,
        typer.Option(
            "--out",
            "-o",
            metavar="DIR|URL",
            help="Folder for the dump (new or empty), or a URL (s3://bucket/prefix; the s3 "
            "extra). Without it nothing is saved.",
            show_default=False,
        ),
    ] = None,
    spool: SpoolOpt = None,
    storage_option: StorageOpt = None,
    overwrite: OverwriteOpt = False,
    resume: Annotated[
        bool,
        typer.Option(
            "--resume", help="Finish an interrupted dump in --out (give the same options)."
        ),
    ] = False,
    capture: CaptureOpt = "output",
    ops: Annotated[
        list[str] | None,
        typer.Option(
            "--ops",
            metavar="GLOB",
            help="With --capture ops: keep the ops whose name matches (repeatable; default: "
            "every op but views), e.g. add, 'add*', softmax.",
            show_default=False,
        ),
    ] = None,
    repeat_kv_heads: Annotated[
        bool,
        typer.Option(
            "--repeat-kv-heads",
            help="With --capture k, v or k_pre_rope of grouped-query attention: repeat each "
            "key-value head for the query heads that share it ([T, heads, head_dim]).",
        ),
    ] = False,
    reduce: Annotated[
        str,
        typer.Option(
            "--reduce",
            metavar="HOW",
            help="none, mean, max, first, last or flatten: mean/max take [B,C,H,W] (and "
            "[B,C,T,H,W]) over the spatial dims to [B,C], [B,T,D] over tokens to [B,D]; "
            "first/last take token 0 ([CLS]) or the last of [B,T,D]; flatten makes [B,-1].",
        ),
    ] = "none",
    grad_target: Annotated[
        str,
        typer.Option(
            "--grad-target",
            metavar="TARGET",
            help="Objective for --capture grad: sum (of the output) or N (sum of output[:, N]).",
        ),
    ] = "sum",
    weights: WeightsOpt = "none",
    no_strict: NoStrictOpt = False,
    unsafe_pickle: UnsafePickleOpt = False,
    model_arg: ModelArgsOpt = None,
    input: Annotated[
        str,
        typer.Option(
            "--input",
            "-i",
            metavar="SOURCE",
            help="random (seeded), an image, a folder of images, a glob, a text file of image "
            "paths, - (paths on stdin), or a tensor file (.safetensors, .pt, .npy); with "
            "--per-token, token ids: input_ids in a tensor file, a .parquet or a datasets "
            "folder.",
        ),
    ] = "random",
    text: Annotated[
        str | None,
        typer.Option(
            "--text",
            metavar="SOURCE",
            help="Text instead of --input: a .txt file (a document per line), a .jsonl file "
            "(either also .gz), a .parquet file, a folder of .txt files or parquet shards, a "
            "datasets folder (save_to_disk), or - (lines of stdin).",
            show_default=False,
        ),
    ] = None,
    text_field: Annotated[
        str, typer.Option("--text-field", metavar="NAME", help="The document's field in .jsonl.")
    ] = "text",
    tokenizer: Annotated[
        str | None,
        typer.Option(
            "--tokenizer",
            metavar="PATH",
            help="A folder holding a tokenizer (default: the hf: model's).",
            show_default=False,
        ),
    ] = None,
    context_size: Annotated[
        int | None,
        typer.Option(
            "--context-size",
            metavar="N",
            help="Pack documents into windows of N tokens, each starting with BOS (default: "
            "one document per sample, padded to --max-length).",
            show_default=False,
        ),
    ] = None,
    bos: Annotated[
        bool | None,
        typer.Option(
            "--bos/--no-bos",
            help="Samples start with the BOS token (default: packed windows do; documents "
            "keep the tokenizer's own special tokens).",
            show_default=False,
        ),
    ] = None,
    sort_by_length: Annotated[
        bool,
        typer.Option(
            "--sort-by-length",
            help="Batch documents of about one length together (less padding); sample ids "
            "keep each row's document.",
        ),
    ] = False,
    max_length: Annotated[
        int | None,
        typer.Option(
            "--max-length",
            metavar="N",
            help="Most tokens of a document sample (default: 128, or the model's positions); "
            "batches are padded to it, or under --per-token to their longest document.",
            show_default=False,
        ),
    ] = None,
    max_tokens: Annotated[
        int | None,
        typer.Option(
            "--max-tokens",
            metavar="N",
            help="Feed the most whole samples whose tokens add up to no more than N.",
            show_default=False,
        ),
    ] = None,
    per_token: Annotated[
        bool,
        typer.Option(
            "--per-token",
            help="With --text or token ids in --input: one row per real token of every "
            "[B,T,...] tensor, with "
            "__token_ids__, __sample__ and __position__ beside.",
        ),
    ] = False,
    positions: Annotated[
        str | None,
        typer.Option(
            "--positions",
            metavar="START:STOP",
            help="With --per-token: keep these positions of each sample's real tokens (a "
            "Python slice; 1: drops the BOS position).",
            show_default=False,
        ),
    ] = None,
    skip_special_tokens: Annotated[
        bool,
        typer.Option(
            "--skip-special-tokens",
            help="With --per-token: drop the tokenizer's special tokens (BOS, EOS, PAD, ...).",
        ),
    ] = False,
    generate: Annotated[
        int | None,
        typer.Option(
            "--generate",
            metavar="N",
            help="With --text: each document is a prompt; generate up to N new tokens (greedy "
            "unless --do-sample) and dump prompt + response as token rows, with __response__ "
            "(1 for the response's tokens) beside.",
            show_default=False,
        ),
    ] = None,
    generate_capture: Annotated[
        str,
        typer.Option(
            "--generate-capture",
            metavar="WHEN",
            help="prefill: generate, then one forward over prompt + response; decode: the "
            "values of the passes that generated the tokens.",
        ),
    ] = "prefill",
    do_sample: Annotated[
        bool,
        typer.Option(
            "--do-sample",
            help="With --generate: sample the tokens, each prompt seeded by --seed and its index.",
        ),
    ] = False,
    temperature: Annotated[
        float | None,
        typer.Option("--temperature", metavar="T", help="With --do-sample.", show_default=False),
    ] = None,
    top_p: Annotated[
        float | None,
        typer.Option("--top-p", metavar="P", help="With --do-sample.", show_default=False),
    ] = None,
    top_k: Annotated[
        int | None,
        typer.Option("--top-k", metavar="K", help="With --do-sample.", show_default=False),
    ] = None,
    chat: Annotated[
        bool,
        typer.Option(
            "--chat",
            help="With a .jsonl --text: each line's messages ([{role, content}], the field "
            "--text-field names, default messages) rendered with the tokenizer's chat "
            "template; __response__ marks the assistant's tokens (with --generate: the "
            "generated ones).",
        ),
    ] = False,
    input_shape: InputShapeOpt = None,
    image_size: Annotated[
        int | None,
        typer.Option(
            "--image-size",
            metavar="PX",
            help="Crop images to this size (default: the weights' or the model's own).",
            show_default=False,
        ),
    ] = None,
    skip_bad_inputs: Annotated[
        bool,
        typer.Option("--skip-bad-inputs", help="Skip undecodable images (listed in the manifest)."),
    ] = False,
    workers: Annotated[
        int, typer.Option("--workers", metavar="N", help="Image-decoding worker processes.")
    ] = 2,
    batch_size: Annotated[
        int, typer.Option("--batch-size", "-b", metavar="N", help="Samples per forward.")
    ] = 8,
    num_samples: Annotated[
        int | None,
        typer.Option(
            "--num-samples",
            "-n",
            metavar="N",
            help="Samples in all. Default: one batch of random input; every image, row of a "
            "tensor file or sample of --text.",
            show_default=False,
        ),
    ] = None,
    seed: SeedOpt = 0,
    device: DeviceOpt = "auto",
    dtype: Annotated[
        str,
        typer.Option(
            "--dtype", metavar="DTYPE", help="Forward precision: float32, float16, bfloat16."
        ),
    ] = "float32",
    save_dtype: Annotated[
        str | None,
        typer.Option(
            "--save-dtype",
            metavar="DTYPE",
            help="Dtype written to disk. Default: as captured.",
            show_default=False,
        ),
    ] = None,
    shard_size: ShardSizeOpt = "1GiB",
    checksum: Annotated[
        str,
        typer.Option(
            "--checksum",
            metavar="KIND",
            help="What the manifest records of each shard: crc32c (taken as it is written) "
            "or sha256 (a content address, read back).",
        ),
    ] = "crc32c",
    max_disk: MaxDiskOpt = None,
    train: TrainOpt = False,
    no_early_stop: Annotated[
        bool,
        typer.Option(
            "--no-early-stop",
            help="Always run the whole forward (by default it ends once the selected "
            "modules have run).",
        ),
    ] = False,
    fail_on_nonfinite: Annotated[
        bool,
        typer.Option(
            "--fail-on-nonfinite",
            help="Exit 1 if any captured tensor holds NaN or Inf, naming the first module.",
        ),
    ] = False,
    json_output: JsonOpt = False,
    quiet: QuietOpt = False,
    config: ConfigOpt = None,
) -> None:
    """Load MODEL, hook the selected modules, run input through it and write the dump."""
    pause = GCPause()  # first: the imports below bring torch in
    try:
        from hookdump.engine.options import RunOptions
        from hookdump.engine.runner import run as run_dump
        from hookdump.inputs.samples import InputOptions, parse_shape
        from hookdump.model.prepare import resolve_dtype

        # the strings of the command line become typed options here, and nowhere else
        corpus = (text_field, tokenizer, context_size, bos, max_length, max_tokens, sort_by_length)
        sampling = (do_sample, temperature, top_p, top_k, generate_capture)
        how_written = (shard_size, save_dtype, max_disk, checksum)  # of the shards
        options = RunOptions(
            model=model_options(
                model, weights, model_arg, seed, device, train, not no_strict, unsafe_pickle
            ),
            capture=_capture_options(
                layers,
                exclude,
                types,
                capture,
                ops,
                reduce,
                grad_target,
                not no_early_stop,
                repeat_kv_heads,
            ),
            input=InputOptions(
                source=input,
                num_samples=num_samples,
                batch_size=batch_size,
                shape=parse_shape(input_shape) if input_shape else None,
                image_size=image_size,
                skip_bad_inputs=skip_bad_inputs,
                workers=workers,
            ),
            text=_text_options(text, *corpus, chat),
            tokens=_token_options(
                per_token or generate is not None, positions, skip_special_tokens
            ),
            generate=_generation(generate, *sampling),
            dump=_dump_options(out, spool, storage_option, overwrite, resume, *how_written),
            dtype=resolve_dtype(dtype, "dtype"),
            command=tuple(ctx.meta.get("hookdump.argv", ["hookdump", *sys.argv[1:]])),
            config=config,
        )
        if int(os.environ.get("RANK", "0")) > 0:  # under torchrun, rank 0 alone reports
            quiet, json_output = True, False
        show_progress = not (quiet or json_output)
        reads_stdin = "-" in (input, text)
        bar = progress_bar(show_progress, options.model.model)
        with bar as progress, _stdin_unless(reads_stdin):
            result = run_dump(
                options, on_batch=pause.chain(progress), on_notice=bar.notice, on_wait=bar.alert
            )
        _report(result, quiet, json_output, fail_on_nonfinite)
    finally:
        pause.end()


def _text_options(
    text: str | None,
    field: str,
    tokenizer: str | None,
    context_size: int | None,
    bos: bool | None,
    max_length: int | None,
    max_tokens: int | None,
    sort_by_length: bool,
    chat: bool,
) -> TextOptions | None:
    """--text and the options of its corpus (None: no text)."""
    from hookdump.inputs.text import TextOptions

    if text is None:
        if chat:
            raise HookdumpError(
                f"{opt('chat', True)} reads conversations: give {opt('text')} FILE.jsonl"
            )
        return None
    if chat and field == "text":
        field = "messages"
    return TextOptions(
        text, field, tokenizer, context_size, bos, max_length, max_tokens, sort_by_length, chat
    )


def _generation(
    generate: int | None,
    do_sample: bool,
    temperature: float | None,
    top_p: float | None,
    top_k: int | None,
    capture: str,
) -> Generation | None:
    """--generate and its sampling settings (None: no generation)."""
    from hookdump.inputs.generation import Generation

    if generate is None:
        sampling = {
            "do_sample": do_sample,
            "temperature": temperature,
            "top_p": top_p,
            "top_k": top_k,
        }
        given = next((name for name, value in sampling.items() if value not in (None, False)), None)
        if given is not None or capture != "prefill":
            name = given or "generate_capture"
            raise HookdumpError(
                f"{opt(name)} sets how tokens are generated; add {opt('generate')} N"
            )
        return None
    return Generation(generate, do_sample, temperature, top_p, top_k, capture)  # type: ignore[arg-type]


def _token_options(
    per_token: bool, positions: str | None, skip_special_tokens: bool
) -> TokenOptions | None:
    """--per-token, --positions and --skip-special-tokens (None: a row per sample)."""
    from hookdump.hooks.tokens import TokenOptions, parse_positions

    if not per_token:
        return None
    return TokenOptions(parse_positions(positions), skip_special_tokens)


def _capture_options(
    layers: list[str] | None,
    exclude: list[str] | None,
    types: list[str] | None,
    capture: str,
    ops: list[str] | None,
    reduce: str,
    grad_target: str,
    early_stop: bool,
    repeat_kv_heads: bool,
) -> CaptureOptions:
    """--layers ... --no-early-stop as the capture's option group."""
    from hookdump.choices import parse_reduction
    from hookdump.hooks.gradients import parse_grad_target
    from hookdump.hooks.options import CaptureOptions
    from hookdump.hooks.values import parse_capture

    return CaptureOptions(
        layers=tuple(as_list(layers)),
        exclude=tuple(as_list(exclude)),
        types=tuple(as_list(types)),
        kinds=parse_capture(capture),
        ops=tuple(as_list(ops)),
        reduce=parse_reduction(reduce),
        grad_target=parse_grad_target(grad_target),
        early_stop=early_stop,
        repeat_kv_heads=repeat_kv_heads,
    )


def _report(result: RunResult, quiet: bool, json_output: bool, fail_on_nonfinite: bool) -> None:
    """Warnings on stderr, the table (or JSON) on stdout, then `--fail-on-nonfinite`."""
    from hookdump.cli.render import print_summary

    if not quiet:
        for warning in result.warnings:
            typer.echo(f"warning: {for_cli(warning)}", err=True)
    if json_output:
        _output.print_json(result.as_dict())
    elif not quiet:
        print_summary(result, _output.stdout())
    bad = result.nonfinite()
    if fail_on_nonfinite and bad:
        first = bad[0]
        raise CheckFailed(
            f"non-finite values first appear in {first.info.key!r} ({first.info.module_type}): "
            f"{first.stats.nan} NaN, {first.stats.inf} Inf; {len(bad)} of "
            f"{len(result.keys)} tensors affected"
        )


def _stdin_unless(reads_stdin: bool) -> contextlib.AbstractContextManager[None]:
    return contextlib.nullcontext() if reads_stdin else _output.no_stdin()


def _dump_options(
    out: str | None,
    spool: Path | None,
    storage_option: list[str] | None,
    overwrite: bool,
    resume: bool,
    shard_size: str,
    save_dtype: str | None,
    max_disk: str | None,
    checksum: str = "crc32c",
) -> DumpOptions:
    from hookdump.choices import parse_checksum
    from hookdump.engine.options import parse_size
    from hookdump.model.prepare import resolve_dtype
    from hookdump.store.write.writer import DumpOptions

    return DumpOptions(
        out=destination_of(out),
        storage_options=storage_options(storage_option),
        spool=spool,
        overwrite=overwrite,
        resume=resume,
        shard_bytes=parse_size(shard_size),
        save_dtype=resolve_dtype(save_dtype, "save_dtype") if save_dtype else None,
        max_disk=parse_size(max_disk) if max_disk is not None else None,
        checksum=parse_checksum(checksum),
    )
