"""`hookdump.dump`: the Python door onto the engine the CLI's `run` uses. A live module (or a
MODEL string) and the caller's own batches go through the same runner, sink and writer, with
the same guarantees: the lock, atomic shards, the old dump kept until the new one's first
shard is safe, the disk check, resume, hooks removed and the module's device and mode
restored on every exit."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
from torch import nn

from hookdump.choices import ChecksumKind, Reduction, parse_checksum
from hookdump.engine.options import RunOptions, parse_size
from hookdump.engine.progress import Progress
from hookdump.engine.runner import run
from hookdump.errors import ArgumentTypeError, HookdumpError, keywords_checked, opt
from hookdump.format.values import is_integer
from hookdump.hooks.gradients import parse_grad_target
from hookdump.hooks.options import CaptureOptions
from hookdump.hooks.tokens import TokenOptions, parse_positions
from hookdump.hooks.values import parse_capture
from hookdump.inputs.generation import Generation, as_generation
from hookdump.inputs.python import PythonData
from hookdump.inputs.samples import Ends, InputOptions
from hookdump.model.loading import class_path
from hookdump.model.prepare import ModelOptions, resolve_device, resolve_dtype
from hookdump.model.zoo import load_tokenizer
from hookdump.store.location import destination_of
from hookdump.store.read.dump import Dump
from hookdump.store.write.writer import DumpOptions


@keywords_checked
def dump(
    model: nn.Module | str,
    data: Any,
    out: str | os.PathLike[str],
    *,
    layers: str | Sequence[str] = (),
    exclude: str | Sequence[str] = (),
    types: str | Sequence[str] = (),
    capture: str | Sequence[str] = ("output",),
    ops: str | Sequence[str] = (),
    repeat_kv_heads: bool = False,
    reduce: Reduction = "none",
    forward: Callable[[Any, Any], Any] | None = None,
    ids: Callable[[Any], Iterable[Any]] | Iterable[Any] | None = None,
    per_token: bool = False,
    positions: str | slice | None = None,
    skip_special_tokens: bool = False,
    generate: int | Generation | None = None,
    tokenizer: Any = None,
    num_samples: int | None = None,
    save_dtype: torch.dtype | str | None = None,
    dtype: torch.dtype | str = torch.float32,
    device: torch.device | str | None = None,
    train: bool | None = None,
    shard_size: int | str = "1GiB",
    max_disk: int | str | None = None,
    checksum: ChecksumKind = "crc32c",
    overwrite: bool = False,
    resume: bool = False,
    early_stop: bool = True,
    grad_target: str | int = "sum",
    weights: str = "none",
    model_args: dict[str, Any] | None = None,
    seed: int = 0,
    progress: bool = False,
    storage_options: dict[str, str] | None = None,
    spool: str | os.PathLike[str] | None = None,
) -> Dump:
    """Stream what the selected modules of `model` produce for `data` into a dump in `out`.

    Args:
        model: an `nn.Module`, used as it is (its device, dtype and mode are its own unless
            `device`/`train` say otherwise, and are put back afterwards), or a MODEL string as
            the CLI takes it (then built with `weights`, `model_args`, `seed`).
        data: an iterable of batches (a `DataLoader`, a list, a generator), or one `Tensor`
            (one batch). A `Tensor` batch is called as `model(t)`, a tuple or list as
            `model(*b)`, a dict as `model(**b)`. A batch's rows are the first dimension of
            its first tensor; batches may differ in size. Tensors are moved to the model's
            device.
        out: the dump folder (new or empty, or see `overwrite` and `resume`), or a URL
            (`s3://bucket/prefix`, the s3 extra; any fsspec URL).
        layers, exclude, types: which modules (globs over qualified names, class names).
        capture: any of `output`, `input`, `grad`, `ops` (the results of the ops each
            module's own forward calls, `M:op.add`), and for attention modules `pattern`,
            `scores`, `q`, `k`, `v`, `z`, `q_pre_rope`, `k_pre_rope`, and for
            mixture-of-experts blocks `routing` (`M:router_logits`, `M:topk_ids`,
            `M:topk_weights`); `ops`: globs of the op names kept.
        repeat_kv_heads: with `capture` `k`, `v` or `k_pre_rope` of grouped-query
            attention, each key-value head repeated for the query heads that share it
            (`[T, heads, head_dim]`, as the scores use them).
        reduce: `none`, `mean`, `max`, `first`, `last` or `flatten`.
        forward: `forward(model, batch)` runs the model on a batch instead (e.g.
            `lambda m, b: m(b[0])` for `(image, label)` pairs).
        ids: a callable `batch -> ids` (one per row), or an iterable of ids; recorded as
            the manifest's sample ids. Default: the row numbers.
        per_token: batches are dicts holding `input_ids` and `attention_mask` (the other
            keys go to the model too); each real token is a row, with `__token_ids__`,
            `__sample__` and `__position__` beside, as with `--text ... --per-token`.
        positions: with `per_token`, `START:STOP` of each sample's real tokens.
        skip_special_tokens: with `per_token`, drop the rows of `tokenizer`'s special
            tokens (`tokenizer`: a tokenizer object or a folder holding one).
        generate: each batch's rows are prompts (dicts of `input_ids` and `attention_mask`,
            padded on either side): generate up to this many new tokens for each (or as
            `hookdump.Generation(...)` says: sampling, `capture="decode"`) and dump prompt +
            response as token rows, `__response__` beside (`per_token` is implied; the EOS
            and pad tokens are `tokenizer`'s, else the model's generation config's).
        num_samples: stop after this many rows of data (samples).
        save_dtype: the dtype written (default: as captured). dtype: the forward's
            precision (autocast for float16 or bfloat16).
        shard_size: bytes per shard file (an int, or `"512MiB"`).
        max_disk: the most bytes of shards kept in `out` at once (an int, or `"8GiB"`): the
            run waits while a follower (`hookdump.follow(..., consume=True)`) has not
            consumed them.
        checksum: what the manifest records of each shard: `"crc32c"` (taken as it is
            written) or `"sha256"` (a content address, read back).
        overwrite: replace a dump in `out`. resume: finish an interrupted dump in `out`:
            `data` is skipped up to the samples already dumped, which needs the same data
            in the same order; given `ids`, the skipped ones must equal the dump's (without
            them that is assumed). The model's state dict and class source must be the same.
        early_stop: end each forward once the selected modules have all run.
        grad_target: the objective of `capture="grad"`: `sum` or an index into dim 1.
        progress: a progress bar on stderr.
        storage_options: fsspec's options for a URL `out` (never recorded or printed).
        spool: with a URL `out`, where shards are finished before they go up (default:
            the system's temporary folder).

    Returns:
        The complete dump, opened (`Dump`): `d["layer4"]` is every row of that key.

    Raises:
        HookdumpError: a bad option or batch (naming it), a forward that raised (naming the
            module it was in); the hooks are gone and `out` is as it was, or, past the first
            shard, resumable.
        Interrupted: (a KeyboardInterrupt, not an Exception) after Ctrl-C or SIGTERM,
            once the finished shards are committed.

    Example:
        >>> loader = DataLoader(dataset, batch_size=64)          # (image, label) pairs
        >>> d = hookdump.dump(model, loader, "acts/", layers=["layer4"], reduce="mean",
        ...                   forward=lambda m, b: m(b[0]))
        >>> d["layer4"].shape
        torch.Size([10000, 2048])
    """
    live = _live_module(model)
    options = run_options(
        model,
        live,
        out,
        layers=layers,
        exclude=exclude,
        types=types,
        capture=capture,
        ops=ops,
        repeat_kv_heads=repeat_kv_heads,
        reduce=reduce,
        per_token=per_token,
        positions=positions,
        skip_special_tokens=skip_special_tokens,
        generate=generate,
        num_samples=num_samples,
        save_dtype=save_dtype,
        dtype=dtype,
        train=train,
        shard_size=shard_size,
        max_disk=max_disk,
        checksum=checksum,
        overwrite=overwrite,
        resume=resume,
        early_stop=early_stop,
        grad_target=grad_target,
        weights=weights,
        model_args=model_args,
        seed=seed,
        progress=progress,
        storage_options=storage_options,
        spool=spool,
    )
    label = str(model) if live is None else ""
    if isinstance(tokenizer, str | Path) and (skip_special_tokens or options.generate):
        tokenizer, _ = load_tokenizer(tokenizer, label or str(tokenizer), given=True)
    special = _special_ids(tokenizer, skip_special_tokens)
    # generation pads and stops with the tokenizer's tokens, else the model's config's
    ends = Ends.of(tokenizer) if options.generate and tokenizer is not None else Ends()
    given = PythonData(data, forward, ids, options.tokens is not None, special, ends=ends)
    return dump_given(options, live, given, device=device, train=train, progress=progress)


def dump_given(
    options: RunOptions,
    live: nn.Module | None,
    given: PythonData,
    *,
    device: torch.device | str | None = None,
    train: bool | None = None,
    progress: bool = False,
) -> Dump:
    """The run of `options` over `given` (through `live`, on `device` and in `train` mode
    where asked, put back after), read back as a `Dump`."""
    with _as_asked(live, device, train) as (where, mode):
        chosen = dataclasses.replace(options.model, device=where, train=mode)
        options = dataclasses.replace(options, model=chosen)
        shown = Progress(progress, _stderr_console() if progress else None)
        with shown as on_batch:
            run(options, on_batch, model=live, data=given, on_notice=shown.notice)
    written = options.dump.out  # the dump's URL, or its folder
    assert written is not None  # `out` is required
    return Dump(written, storage_options=dict(options.dump.storage_options) or None)


def run_options(
    model: nn.Module | str,
    live: nn.Module | None,
    out: str | os.PathLike[str],
    *,
    layers: str | Sequence[str] = (),
    exclude: str | Sequence[str] = (),
    types: str | Sequence[str] = (),
    capture: str | Sequence[str] = ("output",),
    ops: str | Sequence[str] = (),
    repeat_kv_heads: bool = False,
    reduce: Reduction = "none",
    per_token: bool = False,
    positions: str | slice | None = None,
    skip_special_tokens: bool = False,
    generate: int | Generation | None = None,
    num_samples: int | None = None,
    save_dtype: torch.dtype | str | None = None,
    dtype: torch.dtype | str = torch.float32,
    train: bool | None = None,
    shard_size: int | str = "1GiB",
    max_disk: int | str | None = None,
    checksum: ChecksumKind = "crc32c",
    overwrite: bool = False,
    resume: bool = False,
    early_stop: bool = True,
    grad_target: str | int = "sum",
    weights: str = "none",
    model_args: dict[str, Any] | None = None,
    seed: int = 0,
    progress: bool = False,
    storage_options: dict[str, str] | None = None,
    spool: str | os.PathLike[str] | None = None,
) -> RunOptions:
    """The run `hookdump.dump`'s keywords describe (the model's device and mode as they
    are, `auto` and eval for a MODEL string), each keyword's type checked as Python would."""
    _check_types(
        {"layers": layers, "exclude": exclude, "types": types, "capture": capture, "ops": ops},
        {
            "per_token": per_token,
            "skip_special_tokens": skip_special_tokens,
            "overwrite": overwrite,
            "resume": resume,
            "early_stop": early_stop,
            "progress": progress,
            "train": train,
            "repeat_kv_heads": repeat_kv_heads,
        },
        {"num_samples": num_samples, "seed": seed},
    )
    if num_samples is not None and num_samples < 1:
        raise HookdumpError(f"{opt('num_samples')} {num_samples} must be at least 1")
    return RunOptions(
        model=ModelOptions(
            model=str(model) if live is None else class_path(live),
            weights=weights,
            model_args=dict(model_args or {}),
            seed=seed,
            device="auto",
            train=bool(train),
        ),
        capture=CaptureOptions(
            _names(layers),
            _names(exclude),
            _names(types),
            parse_capture(capture),
            _names(ops),
            reduce,
            _grad_target(grad_target),
            early_stop,
            repeat_kv_heads,
        ),
        input=InputOptions(num_samples=num_samples),
        tokens=TokenOptions(_positions(positions), skip_special_tokens)
        if per_token or generate is not None
        else None,
        generate=as_generation(generate),
        dump=_dump_options(
            out,
            storage_options,
            spool,
            overwrite,
            resume,
            shard_size,
            save_dtype,
            max_disk,
            checksum,
        ),
        dtype=_dtype(dtype, "dtype") or torch.float32,
    )


def _dump_options(
    out: str | os.PathLike[str],
    storage_options: dict[str, str] | None,
    spool: str | os.PathLike[str] | None,
    overwrite: bool,
    resume: bool,
    shard_size: int | str,
    save_dtype: str | torch.dtype | None,
    max_disk: int | str | None = None,
    checksum: object = "crc32c",
) -> DumpOptions:
    return DumpOptions(
        destination_of(out),
        dict(storage_options or {}),
        None if spool is None else Path(spool),
        overwrite,
        resume,
        _size(shard_size),
        _dtype(save_dtype, "save_dtype"),
        max_disk=None if max_disk is None else _size(max_disk, "max_disk"),
        checksum=parse_checksum(checksum),
    )


def _live_module(model: object) -> nn.Module | None:
    """`model` if it is a module with values (None: a MODEL string)."""
    if isinstance(model, str):
        return None
    if not isinstance(model, nn.Module):
        raise HookdumpError(
            f"model must be a torch.nn.Module or a MODEL string, not {type(model).__name__}"
        )
    if any(t.is_meta for t in [*model.parameters(), *model.buffers()]):
        raise HookdumpError(
            "the model's parameters are on the meta device, with no values: load its weights "
            "first (model.to_empty(device=...) and load_state_dict)"
        )
    return model


def _check_types(
    globs: dict[str, object], flags: dict[str, object], counts: dict[str, object]
) -> None:
    """Arguments of the wrong type, named as Python names them (None: the default)."""
    for name, value in globs.items():
        if not isinstance(value, str) and not (
            isinstance(value, list | tuple) and all(isinstance(v, str) for v in value)
        ):
            raise ArgumentTypeError(
                f"{name} must be a string or a list of strings, not {_typename(value)}"
            )
    for name, value in flags.items():
        if not isinstance(value, bool) and not (name == "train" and value is None):
            raise ArgumentTypeError(f"{name} must be True or False, not {_typename(value)}")
    for name, value in counts.items():
        if value is not None and not is_integer(value):
            raise ArgumentTypeError(f"{name} must be an integer, not {_typename(value)}")


def _typename(value: object) -> str:
    return f"{type(value).__name__} {value!r}"[:80]


@contextmanager
def _as_asked(
    module: nn.Module | None, device: torch.device | str | None, train: bool | None
) -> Iterator[tuple[str, bool]]:
    """`module` on `device` and in `train` mode where asked, put back as it was after (every
    submodule's mode, and its device); yields the device and mode it runs in."""
    if module is None:
        yield str(device or "auto"), bool(train)
        return
    modes = [(m, m.training) for m in module.modules()]
    places = {t.device for t in [*module.parameters(), *module.buffers()]}
    if device is not None and len(places) > 1:
        raise HookdumpError(
            f"the model lies on {len(places)} devices ({', '.join(sorted(map(str, places)))}); "
            f"leave {opt('device')} out to run it where it is"
        )
    before = next(iter(places), torch.device("cpu"))
    try:
        where = resolve_device(str(device)) if device is not None else before
        if device is not None:
            module.to(where)
        if train is not None:
            module.train(train)
        yield str(where), module.training
    finally:
        for sub, training in modes:
            sub.training = training
        if device is not None:
            module.to(before)


def _special_ids(tokenizer: Any, skip: bool) -> tuple[int, ...]:
    if not skip:
        return ()
    if tokenizer is None:
        raise HookdumpError(
            f"{opt('skip_special_tokens')} needs {opt('tokenizer')}: a tokenizer, or a folder "
            "holding one, whose special tokens are dropped"
        )
    found = getattr(tokenizer, "all_special_ids", None)
    if found is None:
        raise HookdumpError(
            f"{opt('tokenizer')} {type(tokenizer).__name__} has no all_special_ids; give a "
            "transformers tokenizer or the folder of one"
        )
    return tuple(int(i) for i in found)


def _names(value: str | Sequence[str]) -> tuple[str, ...]:
    return (value,) if isinstance(value, str) else tuple(value)


def _dtype(value: torch.dtype | str | None, option: str) -> torch.dtype | None:
    """A dtype given as torch's or by name (`"bfloat16"`)."""
    if value is None or isinstance(value, torch.dtype):
        return value
    return resolve_dtype(value, option)


def _size(value: int | str, option: str = "shard_size") -> int:
    if isinstance(value, str):
        return parse_size(value)
    if value < 1:
        raise HookdumpError(f"{opt(option)} {value} must be at least one byte")
    return value


def _positions(value: str | slice | None) -> slice:
    return value if isinstance(value, slice) else parse_positions(value)


def _grad_target(value: str | int) -> str | int:
    return value if isinstance(value, int) else parse_grad_target(value)


def _stderr_console() -> Any:
    from rich.console import Console

    return Console(stderr=True)
