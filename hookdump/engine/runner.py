"""A whole dump run, in phases: check the options, open the destination, load the model,
feed it batches under hooks, finish the dump.

    run(options)
      _checked(options)          cheap checks, before anything is touched
      locked(out)                one run at a time on --out (dump.folder)
      Destination.open           what --out holds (a dump to resume?), refusals
      prepare                    the model on its device (model.prepare)
      open_feed                  the input's batches (inputs.feed)
      Destination.start          the writer, with the manifest's fields
      _BatchLoop.run             forward under the hooks, values to the writer thread
      Destination.finish         the complete manifest (torchrun: rank 0 merges)
"""

from __future__ import annotations

import dataclasses
import functools
import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch
from torch import nn

from hookdump.engine.destination import Destination
from hookdump.engine.distributed import Ranks, RankShare, from_environment, rank_device
from hookdump.engine.generate import Generator, check_generates
from hookdump.engine.loop import BatchLoop, ForwardOptions
from hookdump.engine.manifest import manifest_fields
from hookdump.engine.options import RunOptions, RunResult
from hookdump.engine.place import held
from hookdump.engine.progress import Notice, ProgressCallback
from hookdump.engine.resume import sources
from hookdump.engine.signals import interrupts_once
from hookdump.errors import HookdumpError, opt, to_stderr
from hookdump.format.values import format_bytes
from hookdump.hooks.capture import Hooks
from hookdump.hooks.forward import out_of_memory
from hookdump.hooks.options import CaptureOptions
from hookdump.hooks.steps import DecodeSteps
from hookdump.hooks.tokens import TokenRows, positions_text
from hookdump.hooks.values import Receiver
from hookdump.inputs.feed import Place, Source, open_feed
from hookdump.inputs.files import MAX_IMAGE_SIZE
from hookdump.inputs.python import PythonData
from hookdump.inputs.samples import Batch, Feed, SampleForm, sample_form
from hookdump.inputs.token_ids import is_token_file
from hookdump.model.loading import LoadedModel, is_model_file, live_model
from hookdump.model.prepare import prepare
from hookdump.model.weights import is_checkpoint_path
from hookdump.store.features import warm_up
from hookdump.store.folder import refuse_reads_inside
from hookdump.store.write.place import DumpPlace
from hookdump.store.write.room import DiskBudget
from hookdump.store.write.sink import BatchSink

PYTHON = "python"  # the input a run fed by Python data records (`"input"` in the recipe)


def run(
    options: RunOptions,
    on_batch: ProgressCallback | None = None,
    *,
    model: nn.Module | None = None,
    data: PythonData | Any = None,
    on_notice: Notice | None = None,
    on_wait: Notice | None = None,
) -> RunResult:
    """Dump what the selected modules produce for the input, as `options` say.

    Args:
        options: the run (see `RunOptions`).
        on_batch: called after each batch with (samples done, samples in all, bytes
            captured so far), for a progress bar.
        model: a live module, used as it is, instead of loading `options.model`.
        data: batches from Python (see `PythonData`; an iterable of batches or one tensor
            is taken as `PythonData(data)`), instead of `options.input` or `options.text`.
        on_notice: called with a line for the person running it: at a URL, after the first
            batch, the bytes the dump will upload.
        on_wait: called with a line when the run starts waiting for room under
            `max_disk` (default: `on_notice`, else written to stderr: a wait is never
            silent).

    Returns:
        A `RunResult`: per-key statistics, the sample count, what was skipped, the
        manifest written (None without `options.out`) and the phases' timings.

    Raises:
        HookdumpError: bad options or input (the message names the argument); `out` is
            locked for the whole run (under torchrun, by rank 0 for all), and a run that
            fails leaves it as it found it, or, past its first shard, resumable.
        Interrupted: Ctrl-C or SIGTERM; the message says what was kept. The finished
            shards are committed first, and a second signal meanwhile is ignored.

    Example:
        >>> result = run(RunOptions(ModelOptions("resnet18"), CaptureOptions(layers=("layer1.*",))))
        >>> [k.info.key for k in result.keys][:2]
        ['layer1.0.conv1', 'layer1.0.bn1']
    """
    started = time.perf_counter()
    warm_up()
    if data is not None:
        data = data if isinstance(data, PythonData) else PythonData(data)
        if options.input.source not in ("random", PYTHON) or options.text is not None:
            raise HookdumpError(
                "give the input once: data, or options.input.source / options.text, not both"
            )
        options = dataclasses.replace(
            options, input=dataclasses.replace(options.input, source=PYTHON)
        )
    _check(options, python=data is not None)
    given_out = options.dump.out  # reported as given
    if options.dump.folder is not None:  # a link is followed once, here: entries never are
        dump = dataclasses.replace(options.dump, out=options.dump.folder.resolve())
        options = dataclasses.replace(options, dump=dump)
    if data is not None and int(os.environ.get("WORLD_SIZE", "1")) > 1:
        raise HookdumpError(
            f"hookdump.dump does not split data over torchrun's {os.environ['WORLD_SIZE']} "
            "processes (each would dump all of its data as a rank's part); run it in one process"
        )
    ranks = from_environment(options.model.device)  # set when run under torchrun
    # a part's process writes into a dump another process has locked and finishes
    main = (ranks is None or ranks.main) and options.dump.part is None
    shown = (on_batch, on_notice, on_wait or on_notice or to_stderr)
    with interrupts_once(), held(options, main) as place:
        try:
            made = _run(options, ranks, started, shown, model, data, place)
            return dataclasses.replace(made, out=given_out)
        except Exception as exc:
            if out_of_memory(exc):
                raise _out_of_memory(options) from exc
            raise


def _announcing(
    shown: tuple[ProgressCallback | None, Notice | None, Notice],
    sink: BatchSink,
    place: DumpPlace | None,
) -> ProgressCallback | None:
    """`on_batch`, which first says what the place has to say of the dump's size once the
    first batch has made the estimate (at a URL: how many bytes it will upload)."""
    on_batch, on_notice, _ = shown
    if on_notice is None or place is None:
        return on_batch
    said = False

    def announce(done: int, total: int | None, nbytes: int) -> None:
        nonlocal said
        if not said and sink.estimated_bytes is not None:
            said = True
            notice = place.estimate_notice(sink.estimated_bytes)
            if notice is not None:
                on_notice(notice)
        if on_batch is not None:
            on_batch(done, total, nbytes)

    return announce


def _check(options: RunOptions, python: bool = False) -> None:
    """What the options' types do not say, checked before `--out` is touched."""
    feed = options.input
    if feed.batch_size < 1:
        raise HookdumpError(f"{opt('batch_size')} {feed.batch_size} must be at least 1")
    if feed.num_samples is not None and feed.num_samples < 1:
        raise HookdumpError(f"{opt('num_samples')} {feed.num_samples} must be at least 1")
    if options.generate is not None:  # first: it implies token rows, which need text
        _check_generate(options, python)
    if not python:
        _check_text(options)
    elif options.tokens is not None:  # Python data: token rows come from dicts of ids and masks
        _check_token_rows(options)
    _check_budget(options)
    if feed.image_size is not None and not 1 <= feed.image_size <= MAX_IMAGE_SIZE:
        raise HookdumpError(
            f"{opt('image_size')} {feed.image_size} must be from 1 to {MAX_IMAGE_SIZE} "
            "(pixels of the square crop)"
        )
    model = options.model
    hf_folder = model.model.removeprefix("hf:")
    text = options.text
    named = {
        "text": text.source if text is not None and text.source != "-" else None,
        "tokenizer": text.tokenizer if text is not None else None,
        "model": model.model if is_model_file(model.model) else None,
        "model_folder": hf_folder if Path(hf_folder).is_dir() else None,
        "weights": model.weights if is_checkpoint_path(model.weights) else None,
        "input": feed.source if feed.source not in ("random", "-") and not python else None,
        "config": options.config,
    }
    for name, path in named.items():
        if path is not None:
            what = opt("model") if name == "model_folder" else opt(name)
            refuse_reads_inside(options.dump.folder, what, [Path(path)])


def _check_text(options: RunOptions) -> None:
    text = options.text
    if text is None:
        if options.tokens is not None and not is_token_file(options.input.source):
            raise HookdumpError(
                f"{opt('per_token', True)} needs text input: {opt('text')}, or {opt('input')} "
                "FILE of token ids (.safetensors, .npy, .pt, .parquet, a datasets folder)"
            )
        return
    if options.tokens is not None:
        _check_token_rows(options)
    if options.input.source != "random":
        raise HookdumpError(
            f"give {opt('text')} or {opt('input')}, not both ({opt('text')} {text.source}, "
            f"{opt('input')} {options.input.source})"
        )
    smallest = 2 if text.starts_with_bos else 1
    for name, value, least in (
        ("context_size", text.context_size, smallest),
        ("max_length", text.max_length, 1),
        ("max_tokens", text.max_tokens, 1),
    ):
        if value is not None and value < least:
            raise HookdumpError(f"{opt(name)} {value} must be at least {least}")


def _check_budget(options: RunOptions) -> None:
    """`--max-disk`: room for one shard at least, per torchrun process (each keeps its share
    of the budget)."""
    dump = options.dump
    if dump.max_disk is None:
        return
    world = max(1, int(os.environ.get("WORLD_SIZE", "1")))
    if dump.max_disk // world < dump.shard_bytes:
        each = f", shared by {world} torchrun processes," if world > 1 else ""
        raise HookdumpError(
            f"{opt('max_disk')} {format_bytes(dump.max_disk)}{each} is less than one shard "
            f"({opt('shard_size')} {format_bytes(dump.shard_bytes)}) per process; give a "
            "larger budget or smaller shards"
        )


def _budget(options: RunOptions, ranks: Ranks | None, notice: Notice | None) -> DiskBudget | None:
    """`--max-disk`, each torchrun process keeping its share."""
    limit = options.dump.max_disk
    if limit is None:
        return None
    return DiskBudget(limit // (ranks.world if ranks else 1), notice)


def _check_generate(options: RunOptions, python: bool) -> None:
    """`--generate`: prompts of text (or a Python caller's token batches), token rows, and
    values a forward gives (not gradients)."""
    text, generate = options.text, opt("generate")
    if text is None and not python:
        raise HookdumpError(
            f"{generate} writes a response to each document of {opt('text')}; give the "
            f"prompts as {opt('text')} FILE (one prompt per line, or a .jsonl field)"
        )
    if text is not None and text.context_size is not None:
        raise HookdumpError(
            f"{generate} takes each document as one prompt, and {opt('context_size')} packs "
            f"documents into windows; leave {opt('context_size')} out"
        )
    if options.tokens is None:
        raise HookdumpError(f"{generate} writes token rows; add {opt('per_token', True)}")
    if "grad" in options.capture.kinds:
        raise HookdumpError(
            f"{generate} runs the model without autograd, so {opt('capture')} grad has "
            "nothing to take; leave grad out"
        )


def _check_token_rows(options: RunOptions) -> None:
    reduce = options.capture.reduce
    if reduce != "none":
        raise HookdumpError(
            f"{opt('per_token', True)} keeps a row per token and {opt('reduce')} "
            f"{reduce} reduces the tokens away; give one of them"
        )


def _check_export_batch(options: RunOptions, loaded: LoadedModel) -> None:
    """An export archive traced with a static batch size takes batches of that size only."""
    fixed = loaded.about.get("export_batch")
    if fixed is None:
        return
    size, count = options.input.batch_size, options.input.num_samples
    if size != fixed or (count is not None and count % fixed):
        also = f" and {opt('num_samples')} a multiple of it" if count and count % fixed else ""
        raise HookdumpError(
            f"{opt('model')} {loaded.spec} was exported for batches of {fixed} (its batch "
            f"dimension is static); give {opt('batch_size')} {fixed}{also}, or export it with a "
            "dynamic batch dimension (dynamic_shapes with torch.export.Dim)"
        )


def _nothing_read(options: RunOptions, fed: bool) -> HookdumpError:
    """Why a run made no row, naming the option at fault."""
    tokens, text = options.tokens, options.text
    if fed and tokens is not None:  # samples went in, but token rows kept none of them
        skip = tokens.skip_special_tokens
        return HookdumpError(
            f"{opt('positions')} {positions_text(tokens.positions)}"
            f"{' with ' + opt('skip_special_tokens', True) if skip else ''}"
            " keeps no token of any sample; choose positions the samples have"
        )
    if text is not None:
        window = (
            f", or fewer tokens than one {opt('context_size')} {text.context_size} window"
            if text.context_size
            else ""
        )
        return HookdumpError(
            f"{opt('text')} {text.source}: no sample was made (the corpus has no document{window})"
        )
    if options.input.source == PYTHON:
        return HookdumpError("data held no batch; give an iterable of batches")
    return HookdumpError(f"{opt('input')} {options.input.source}: no sample could be read")


def _out_of_memory(options: RunOptions) -> HookdumpError:
    shape = options.input.shape
    now = f" or {opt('input_shape')} (now {','.join(map(str, shape))})" if shape else ""
    return HookdumpError(
        f"ran out of memory at {opt('batch_size')} {options.input.batch_size}; lower "
        f"{opt('batch_size')}{now}, or {opt('layers')} fewer modules"
    )


def _run(
    options: RunOptions,
    ranks: Ranks | None,
    started: float,
    shown: tuple[ProgressCallback | None, Notice | None, Notice],
    module: nn.Module | None,
    data: PythonData | None,
    place: DumpPlace | None,
) -> RunResult:
    destination = Destination.open(options, ranks, place)
    if module is not None:
        loaded = live_model(module)
    else:
        device = rank_device(options.model.device, ranks)
        loaded = prepare(dataclasses.replace(options.model, device=device))
        _check_export_batch(options, loaded)
    loaded_at = time.perf_counter()
    form = functools.cache(lambda: sample_form(loaded, options.input.shape))
    feed = _feed(options, loaded, form, destination, ranks, data)
    made_from = sources(loaded, feed)
    destination.check_sources(made_from)

    processes = ranks.world if ranks else None
    static = manifest_fields(
        options, loaded=loaded, feed=feed, form=form, sources=made_from, processes=processes
    )
    static["input"] = _input_now(static, data)
    destination.start(
        shard_bytes=options.dump.shard_bytes, fields=static, checksum=options.dump.checksum
    )
    destination.mark_running()
    sink = BatchSink(
        destination.writer,
        options.dump.save_dtype,
        None if options.tokens else feed.total,  # token rows: not known ahead
        expected=lambda: feed.total if feed.total is not None else feed.estimate(),
        copies=ranks.world if ranks else 1,
        summaries=destination.summaries_before(),  # resuming: the whole dump's statistics
        budget=_budget(options, ranks, shown[2]),
    )
    cap, loop = _loop(options, loaded, sink, feed)
    batches = _on_device(feed.batches(options.input.batch_size), loaded.device)
    # with one process, no row means nothing to keep: stop before the sink writes a shard
    alone = ranks is None and options.dump.part is None

    def nothing() -> HookdumpError:
        return _nothing_read(options, bool(loop.fed.ids))

    on_batch = _announcing(shown, sink, place)
    try:
        rows = loop.run(batches, destination, feed, on_batch, nothing if alone else None)
    except HookdumpError as exc:  # a follower ends with it (`hookdump.follow`)
        destination.failed(str(exc))
        raise
    looped_at = time.perf_counter()
    whole = destination.gather(_part(cap, sink, feed, destination, rows, loop))
    if whole.rows == 0 and options.dump.part is None:
        raise nothing()
    wall = round(time.perf_counter() - started, 3)
    manifest = destination.finish(whole, {"wall_time_s": wall, "input": _input_now(static, data)})
    timings = {
        "load": loaded_at - started,
        "loop": looped_at - loaded_at,
        "finish": time.perf_counter() - looped_at,
    }
    return _result(options, loaded, whole, manifest, timings, destination, feed, sink)


def _input_now(static: dict[str, Any], data: PythonData | None) -> Any:
    """The manifest's `input` as it stands: with what a Python caller's data says of where
    its batches come from (an import's files, as they are read)."""
    about = data.about if data is not None else None
    return static["input"] if about is None else {**static["input"], **about()}


def _loop(
    options: RunOptions, loaded: LoadedModel, sink: BatchSink, feed: Feed
) -> tuple[Hooks, BatchLoop]:
    """The hooks, and the batch loop that drives them: token rows between them and the
    sink with `--per-token`, and the passes that generate before those with decode."""
    capture = options.capture
    tokens = _token_rows(options, sink, feed) if options.tokens else None
    steps = None
    if options.generate is not None and options.generate.capture == "decode" and tokens:
        steps = DecodeSteps(tokens)
    cap = _hooks(capture, loaded, steps or tokens or sink)
    early = capture.early_stop and not loaded.module.training  # never while decoding
    how = ForwardOptions(options.dtype, capture.grad_target, early, options.model.model)
    generator = _generator(options, loaded, cap, feed, steps)
    return cap, BatchLoop(cap, loaded, sink, how, tokens, generator)


def _result(
    options: RunOptions,
    loaded: LoadedModel,
    whole: RankShare,
    manifest: dict[str, Any] | None,
    timings: dict[str, float],
    destination: Destination,
    feed: Feed,
    sink: BatchSink,
) -> RunResult:
    skips = whole.skipped_inputs[len(destination.skipped_inputs_before) :]
    return RunResult(
        model=options.model.model,
        out=options.dump.out,
        num_samples=whole.rows,
        keys=list(whole.summaries.values()),
        skipped=whole.skipped,
        manifest=manifest,
        skipped_inputs=whole.skipped_inputs,
        warnings=[
            *loaded.warnings,
            *(f"skipped {s['path']}: {s['error']}" for s in skips),
            *_cut_prompts(options, loaded, feed),
        ],
        timings=timings,
        num_sequences=len(whole.ids) if options.tokens is not None else None,
        estimated_bytes=sink.estimated_bytes,
        real_tokens=feed.tally.fraction if feed.tally is not None else None,
    )


def _cut_prompts(options: RunOptions, loaded: LoadedModel, feed: Feed) -> list[str]:
    """What `--generate` cut to fit the model's positions, in a line (none: nothing cut)."""
    cuts, generation = feed.tally, options.generate
    if cuts is None or not cuts.cut or generation is None:
        return []
    kept = "the last (the turn to answer)" if options.text and options.text.chat else "the first"
    why = f"{opt('max_length')} {cuts.length}"
    if options.text is not None and options.text.max_length is None and loaded.positions:
        why = (
            f"{loaded.spec} takes {loaded.positions} positions, and {opt('generate')} "
            f"{generation.max_new_tokens} leaves {cuts.length} for a prompt"
        )
    return [
        f"{cuts.cut} of {cuts.seen} prompts had more than {cuts.length} tokens and kept "
        f"{kept} {cuts.length} ({why}); give {opt('generate')} fewer new tokens, or shorter "
        "prompts"
    ]


def _hooks(capture: CaptureOptions, loaded: LoadedModel, receiver: Receiver) -> Hooks:
    """The selected modules' hooks, handing what they capture to `receiver`."""
    return Hooks(
        loaded.module,
        capture.layers,
        capture.exclude,
        capture.types,
        capture.kinds,
        reduce=capture.reduce,
        receiver=receiver,
        ops=capture.ops,
        repeat_kv_heads=capture.repeat_kv_heads,
    )


def _feed(
    options: RunOptions,
    loaded: LoadedModel,
    form: Callable[[], SampleForm],
    destination: Destination,
    ranks: Ranks | None,
    data: PythonData | None,
) -> Feed:
    tokens = options.tokens
    source = Source(
        options.input,
        options.text,
        per_token=tokens is not None,
        skip_special_tokens=tokens is not None and tokens.skip_special_tokens,
        data=data,
        generate=options.generate.max_new_tokens if options.generate else 0,
    )
    place = Place(options.model.seed, destination.done_ids, ranks.share if ranks else None)
    feed = open_feed(source, loaded, form, place)
    if data is None:
        what = opt("text") if options.text is not None else opt("input")
        refuse_reads_inside(options.dump.folder, what, feed.files)
    return feed


def _token_rows(options: RunOptions, sink: BatchSink, feed: Feed) -> TokenRows:
    tokens = options.tokens
    assert tokens is not None
    special = feed.special_ids if tokens.skip_special_tokens else []
    width = feed.width
    if width is not None and options.generate is not None:
        width += options.generate.max_new_tokens  # a prompt's tokens, then the response's
    return TokenRows(sink, tokens.positions, list(special), feed.first, key_width=width)


def _generator(
    options: RunOptions, loaded: LoadedModel, cap: Hooks, feed: Feed, steps: DecodeSteps | None
) -> Generator | None:
    """With `--generate`: what makes each batch's sequences, with the tokenizer's pad and
    EOS tokens, else the model's generation config's."""
    if options.generate is None:
        return None
    check_generates(loaded.module, options.model.model)
    config = getattr(loaded.module, "generation_config", None)
    eos = set(feed.ends.eos)
    if not eos and config is not None and config.eos_token_id is not None:
        given = config.eos_token_id
        eos = set(given) if isinstance(given, list) else {int(given)}
    pad = feed.ends.pad
    if pad is None and config is not None:
        pad = config.pad_token_id
    if pad is None:
        pad = min(eos) if eos else 0  # never read: the mask leaves it out
    return Generator(
        options.generate,
        loaded.module,
        cap,
        pad=int(pad),
        eos=eos,
        seed=options.model.seed,
        first_sample=feed.first,
        steps=steps,
    )


def _part(
    cap: Hooks,
    sink: BatchSink,
    feed: Feed,
    destination: Destination,
    rows: int,
    loop: BatchLoop,
) -> RankShare:
    """What this run (this rank) dumped, as values."""
    skipped = [{"key": s.key, "reason": f"not a tensor ({s.type})"} for s in cap.skipped.values()]
    skipped += list(sink.unbatched.values())
    if loop.tokens is not None:
        skipped += list(loop.tokens.skipped.values())
    fed = loop.sequences
    if destination.previous is not None:  # resuming: what the dump noted before
        seen = {item["key"] for item in skipped}
        before = destination.previous.get("skipped", [])
        skipped = [s for s in before if s["key"] not in seen] + skipped
    writer = destination.writer
    return RankShare(
        rows=rows,
        shards=list(writer.shards) if writer else [],
        tensors=dict(writer.tensors) if writer else {},
        summaries=dict(sink.summaries),
        ids=loop.fed.ids[:fed],  # a range where they are row numbers
        skipped=skipped,
        skipped_inputs=destination.skipped_inputs_before + loop.fed.skipped,
        generated=loop.fed.generated[:fed],
    )


def _on_device(batches: Iterator[Batch], device: torch.device) -> Iterator[Batch]:
    for batch in batches:
        yield batch if device.type == "cpu" else batch.to(device)
