"""A whole dump run: load the model, feed it batches under hooks, keep stats, write the dump."""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import platform
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import torch

import hookdump
from hookdump.dump.folder import check_out_dir, locked, refuse_reads_inside
from hookdump.dump.reader import Dump
from hookdump.dump.sink import BatchSink
from hookdump.dump.stats import KeySummary
from hookdump.dump.writer import DEFAULT_SHARD_BYTES, DumpWriter
from hookdump.errors import HookdumpError, Interrupted
from hookdump.hooks.capture import Capture, StopForward
from hookdump.hooks.gradients import backward, inputs_requiring_grad, parse_grad_target
from hookdump.inputs.files import FileInput, open_input
from hookdump.inputs.spec import Batch, InputSpec, input_spec, parse_shape, random_batches
from hookdump.model.loading import LoadedModel, is_model_file, load_model, parse_model_args
from hookdump.model.weights import is_checkpoint_path
from hookdump.run.distributed import (
    Ranks,
    drop_rank_manifests,
    from_environment,
    merge_ranks,
    rank_device,
    rank_names,
    rank_writer,
)
from hookdump.run.resume import check_sources, previous_dump, recipe, sources
from hookdump.tools.inspect import summarize

DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


@dataclass
class RunOptions:
    """Everything `hookdump run` takes; the CLI fills it in, a script may too."""

    model: str
    layers: list[str] = field(default_factory=list)
    exclude: list[str] = field(default_factory=list)
    types: list[str] = field(default_factory=list)
    capture: str = "output"
    reduce: str = "none"
    grad_target: str = "sum"
    weights: str = "none"
    strict: bool = True
    unsafe_pickle: bool = False
    model_args: list[str] = field(default_factory=list)
    input: str = "random"
    input_shape: str | None = None
    image_size: int | None = None
    skip_bad_inputs: bool = False
    workers: int = 2
    batch_size: int = 8
    num_samples: int | None = None
    seed: int = 0
    device: str = "auto"
    dtype: str = "float32"
    save_dtype: str | None = None
    out: Path | None = None
    overwrite: bool = False
    resume: bool = False
    train: bool = False
    early_stop: bool = True
    shard_bytes: int = DEFAULT_SHARD_BYTES
    command: list[str] = field(default_factory=lambda: list(sys.argv))
    config: Path | None = None  # the file the options came from: never read from --out


@dataclass
class RunResult:
    """What a run captured and where it went."""

    model: str
    out: Path | None
    num_samples: int
    keys: list[KeySummary]
    skipped: list[dict[str, str]]
    wall_time: float
    manifest: dict[str, Any] | None = None
    skipped_inputs: list[dict[str, str]] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    timings: dict[str, float] = field(default_factory=dict)  # seconds: load, loop, finish

    @property
    def total_bytes(self) -> int:
        return sum(k.nbytes for k in self.keys)

    def nonfinite(self) -> list[KeySummary]:
        """The keys holding NaN or Inf, in forward order (the first is where it started)."""
        return [k for k in self.keys if k.stats.nan or k.stats.inf]

    def as_dict(self) -> dict[str, Any]:
        bad = self.nonfinite()
        return {
            "model": self.model,
            "out": str(self.out) if self.out else None,
            "num_samples": self.num_samples,
            "wall_time_s": round(self.wall_time, 3),
            "total_bytes": self.total_bytes,
            "tensors": [k.as_dict() for k in self.keys],
            "skipped": self.skipped,
            "skipped_inputs": self.skipped_inputs,
            "first_nonfinite": bad[0].info.key if bad else None,
        }


@dataclass
class Prepared:
    """A model on its device: what `run` and `layers` both start from."""

    loaded: LoadedModel
    device: torch.device
    shape: tuple[int, ...] | None = None  # --input-shape

    @functools.cached_property
    def spec(self) -> InputSpec:
        """The random-input spec, worked out only when asked for: a model fed from a tensor
        file needs none, and may have no layer to guess one from."""
        return input_spec(self.loaded, self.shape)


def resolve_device(name: str) -> torch.device:
    """`auto`, `cpu`, `cuda` or `cuda:N` to a device that exists here."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(name)
    except RuntimeError:
        raise HookdumpError(
            f"--device {name!r} is not a device; use auto, cpu, cuda or cuda:N"
        ) from None
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise HookdumpError(f"--device {name}: CUDA is not available here; use --device cpu")
        if device.index is not None and device.index >= torch.cuda.device_count():
            raise HookdumpError(
                f"--device {name}: this machine has {torch.cuda.device_count()} CUDA device(s)"
            )
    elif device.type != "cpu":
        raise HookdumpError(f"--device {name!r} is not supported; use auto, cpu, cuda or cuda:N")
    return device


def resolve_dtype(name: str, flag: str) -> torch.dtype:
    """A dtype name from `--dtype`/`--save-dtype` to a torch dtype."""
    if name not in DTYPES:
        raise HookdumpError(f"{flag} {name!r} is not one of {', '.join(DTYPES)}")
    return DTYPES[name]


def prepare(
    model: str,
    weights: str = "none",
    model_args: list[str] | None = None,
    input_shape: str | None = None,
    seed: int = 0,
    device: str = "auto",
    train: bool = False,
    strict: bool = True,
    unsafe_pickle: bool = False,
) -> Prepared:
    """Validate the cheap options, then load the model and move it to its device."""
    shape = parse_shape(input_shape) if input_shape else None
    kwargs = parse_model_args(model_args or [])
    target = resolve_device(device)
    loaded = load_model(model, weights, kwargs, seed, strict, unsafe_pickle)
    loaded.module.train(train)
    loaded.module.to(target)
    return Prepared(loaded, target, shape)


def forward(cap: Capture, module: torch.nn.Module, batch: Batch, label: str) -> Any:
    """Run one forward, turning a model's own failure into an error that says where it was."""
    try:
        return module(*batch.args, **batch.kwargs)
    except StopForward:
        return None
    except (KeyboardInterrupt, HookdumpError):
        raise
    except Exception as exc:
        if out_of_memory(exc):
            raise
        message = " ".join(str(exc).split()) or "(no message)"
        if len(message) > 300:
            message = message[:300] + "..."
        inside = f"inside {cap.running[-1]!r}; " if cap.running else ""
        done = cap.finished
        ran = (
            f"hooked modules that had run: {len(done)} (last: {', '.join(done[-3:])})"
            if done
            else "no hooked module had run"
        )
        raise HookdumpError(
            f"the forward pass of {label} raised {type(exc).__name__}: {message} "
            f"({inside}{ran}); check --input-shape and --model-arg"
        ) from None


def out_of_memory(exc: BaseException) -> bool:
    """Whether `exc` is an allocation that failed (on the CPU or the GPU)."""
    if isinstance(exc, MemoryError | torch.OutOfMemoryError):
        return True
    text = str(exc)
    return isinstance(exc, RuntimeError) and (
        "can't allocate memory" in text or "out of memory" in text
    )


def _out_of_memory_error(options: RunOptions) -> HookdumpError:
    shape = f" or --input-shape (now {options.input_shape})" if options.input_shape else ""
    return HookdumpError(
        f"ran out of memory at --batch-size {options.batch_size}; lower --batch-size{shape}, "
        "or --layers fewer modules"
    )


def _autocast(device: torch.device, dtype: torch.dtype) -> contextlib.AbstractContextManager[Any]:
    if dtype == torch.float32:
        return contextlib.nullcontext()
    return torch.autocast(device.type, dtype=dtype)


def run(options: RunOptions, on_batch: Callable[[int, int, int], None] | None = None) -> RunResult:
    """Dump what the selected modules produce for the input; `on_batch(samples done, total,
    bytes captured)` reports progress.

    `--out` is locked for the whole run (under torchrun, by rank 0 for all), before anything
    in it is looked at."""
    started = time.perf_counter()
    if options.batch_size < 1:
        raise HookdumpError(f"--batch-size {options.batch_size} must be at least 1")
    num_samples = options.num_samples if options.num_samples is not None else options.batch_size
    if num_samples < 1:
        raise HookdumpError(f"--num-samples {num_samples} must be at least 1")
    if options.image_size is not None and options.image_size < 1:
        raise HookdumpError(f"--image-size {options.image_size} must be at least 1")
    checked = _Checked(
        num_samples,
        resolve_dtype(options.dtype, "--dtype"),
        resolve_dtype(options.save_dtype, "--save-dtype") if options.save_dtype else None,
        parse_grad_target(options.grad_target),
    )
    _refuse_reading_the_output(options)
    if options.out is not None:  # a link is followed once, here: entries never are
        options = dataclasses.replace(options, out=options.out.resolve())
    ranks = from_environment(options.device)  # set when run under torchrun
    with locked(options.out if ranks is None or ranks.main else None):
        try:
            return _run(options, checked, ranks, started, on_batch)
        except Exception as exc:
            if out_of_memory(exc):
                raise _out_of_memory_error(options) from None
            raise


def _refuse_reading_the_output(options: RunOptions) -> None:
    """Every file the options name that the run reads must lie outside `--out`."""
    named: list[tuple[str, str | Path | None]] = [
        ("MODEL", options.model if is_model_file(options.model) else None),
        ("--weights", options.weights if is_checkpoint_path(options.weights) else None),
        ("--input", options.input if options.input not in ("random", "-") else None),
        ("--config", options.config),
    ]
    for what, path in named:
        if path is not None:
            refuse_reads_inside(options.out, what, [Path(path)])


@dataclass(frozen=True)
class _Checked:
    """The options checked and turned into values before `--out` is touched."""

    num_samples: int
    forward_dtype: torch.dtype
    save_dtype: torch.dtype | None
    grad_target: str | int


def _run(
    options: RunOptions,
    checked: _Checked,
    ranks: Ranks | None,
    started: float,
    on_batch: Callable[[int, int, int], None] | None,
) -> RunResult:
    num_samples, forward_dtype = checked.num_samples, checked.forward_dtype
    save_dtype, grad_target = checked.save_dtype, checked.grad_target
    previous = previous_dump(options, ranks) if options.resume else None
    # --resume with nothing to carry on (or only a first shard cut short): start anew
    overwrite = options.overwrite or (options.resume and previous is None)
    if options.out is not None and previous is None:
        check_out_dir(options.out, overwrite)  # fail before the slow part

    prepared = prepare(
        options.model,
        options.weights,
        options.model_args,
        options.input_shape,
        options.seed,
        rank_device(options.device, ranks),
        options.train,
        options.strict,
        options.unsafe_pickle,
    )
    loaded_at = time.perf_counter()
    model = prepared.loaded.module
    cap = Capture(
        model, options.layers, options.exclude, options.types, options.capture,
        reduce=options.reduce,
    )  # fmt: skip
    done_ids: list[Any] = previous["sample_ids"][: previous["num_samples"]] if previous else []
    source: FileInput | None = None
    part = (ranks.rank, ranks.world) if ranks else None
    first, stop = ranks.span(num_samples) if ranks else (0, num_samples)
    if options.input == "random":
        batches = random_batches(
            prepared.spec, stop - first, options.batch_size, options.seed, len(done_ids), first
        )
    else:
        source = open_input(
            options.input,
            lambda: prepared.spec,
            prepared.loaded.transforms,
            options.image_size,
            options.skip_bad_inputs,
            options.workers,
            options.num_samples,
            done_ids,
            part,
        )
        refuse_reads_inside(options.out, "--input", source.files)
        batches = source.batches(options.batch_size)
    made_from = sources(prepared.loaded, source)
    if previous is not None:
        check_sources(options.out, previous.get("sources"), made_from)

    writer = None
    if previous is not None:  # previous_dump() made sure --out is given
        writer = DumpWriter.resume(options.out, previous, options.shard_bytes, **rank_names(ranks))
    elif options.out is not None and ranks is not None:
        writer = rank_writer(options.out, overwrite, options.shard_bytes, ranks)
    elif options.out is not None:
        writer = DumpWriter(options.out, overwrite, options.shard_bytes)
    sample_ids: Any = range(first, stop) if source is None else source.ids
    skipped_inputs = source.skipped if source else []
    skipped_before = len(previous.get("skipped_inputs", [])) if previous else 0
    if previous:
        skipped_inputs[:0] = previous.get("skipped_inputs", [])
    if writer:
        writer.fields = _manifest_fields(options, prepared, cap, sample_ids, source, made_from)
        writer.fields["skipped_inputs"] = skipped_inputs  # live: partial manifests keep it
        if ranks is not None:
            writer.fields["processes"] = ranks.world
    total = stop - first if source is None else source.total
    sink = BatchSink(writer, save_dtype, total)
    if previous is not None:
        sink.summaries = summarize(Dump.of_manifest(options.out, previous))  # the whole dump
    done = len(done_ids)  # samples already in the dump (when resuming)
    grads = "grad" in cap.kinds
    # gradients need autograd; everything else runs without it
    mode = torch.enable_grad() if grads else torch.inference_mode()
    early = options.early_stop and not grads and not options.train
    try:
        with cap, mode, _autocast(prepared.device, forward_dtype):
            for batch in _on_device(batches, prepared.device):
                if early and cap.stop_after is None:
                    early = _calibrate(cap, model, batch, options.model)
                sink.begin(batch.start, batch.stop, len(cap.info))
                cap.sink, cap.copy = sink.put, sink.pool.copy
                inputs = inputs_requiring_grad(batch.args, batch.kwargs) if grads else []
                output = forward(cap, model, batch, options.model)
                if grads:
                    backward(model, output, grad_target, inputs)
                del output
                cap.sink = None
                cap.clear()
                sink.end()
                done = batch.stop
                if on_batch:
                    on_batch(done, total, sink.bytes_done)
        sink.close()
    except KeyboardInterrupt:
        sink.abort()
        if writer and writer.shards:
            rows = writer.shards[-1]["stop"]
            raise Interrupted(
                f"{rows} samples are safe in {writer.out}; run the same command with --resume "
                "to finish the dump"
            ) from None
        raise Interrupted("nothing was written") from None
    except BaseException:
        sink.abort()
        raise
    looped_at = time.perf_counter()
    skipped = [{"key": s.key, "reason": f"not a tensor ({s.type})"} for s in cap.skipped.values()]
    skipped += list(sink.unbatched.values())
    if ranks is not None:
        done = merge_ranks(ranks, writer, sink, skipped, skipped_inputs, done)
    if done == 0:
        raise HookdumpError(f"--input {options.input}: no sample could be read")
    if previous is not None:
        seen = {item["key"] for item in skipped}
        skipped = [s for s in previous.get("skipped", []) if s["key"] not in seen] + skipped
    result = RunResult(
        options.model,
        options.out,
        done,
        list(sink.summaries.values()),
        skipped,
        time.perf_counter() - started,
    )
    result.skipped_inputs = skipped_inputs
    result.warnings = prepared.loaded.warnings + [
        f"skipped {s['path']}: {s['error']}" for s in skipped_inputs[skipped_before:]
    ]
    if writer and (ranks is None or ranks.main):
        writer.fields.update(skipped=skipped, wall_time_s=round(result.wall_time, 3))
        result.manifest = writer.finish()
        if ranks is not None:
            drop_rank_manifests(writer.out)
    if ranks is not None:
        ranks.close()
    result.timings = {
        "load": loaded_at - started,
        "loop": looped_at - loaded_at,
        "finish": time.perf_counter() - looped_at,
    }
    return result


def _calibrate(cap: Capture, model: torch.nn.Module, batch: Batch, label: str) -> bool:
    """Count each selected module's calls in a forward of one sample, for early stop.

    False when the model cannot take one sample (an export with a fixed batch size, say):
    then every forward runs whole.
    """
    cap.store = False
    try:
        forward(cap, model, batch.first_row(), label)
    except HookdumpError:
        cap.clear()
        return False
    finally:
        cap.store = True
    cap.stop_early(dict(cap.calls))
    return True


def _on_device(batches: Iterator[Batch], device: torch.device) -> Iterator[Batch]:
    for batch in batches:
        yield batch if device.type == "cpu" else batch.to(device)


def _manifest_fields(
    options: RunOptions,
    prepared: Prepared,
    cap: Capture,
    sample_ids: Any,
    file_input: FileInput | None,
    made_from: dict[str, Any],
) -> dict[str, Any]:
    """Everything but the shards and tensors: what reproduces the dump. `sample_ids` is a
    range for random input, else the live list that file inputs fill batch by batch."""
    import safetensors
    import torchvision

    loaded = prepared.loaded
    source: dict[str, Any] = {"source": options.input}
    if file_input is None:
        source.update(layout=prepared.spec.layout, shape=list(prepared.spec.shape))
    elif file_input.kind == "tensors":
        source["layout"] = "tensors"
    else:
        source["layout"] = prepared.spec.layout
        source["image_size"] = options.image_size
        source["preprocessing"] = (
            "weights"
            if loaded.transforms and not options.image_size
            else ("resize, centre crop, normalise")
        )
    return {
        "model": loaded.describe(),
        "command": options.command,
        "recipe": recipe(options),
        "sources": made_from,
        "selection": {
            "layers": options.layers,
            "exclude": options.exclude,
            "types": options.types,
            "modules": list(cap.modules),
        },
        "capture": list(cap.kinds),
        "reduce": options.reduce,
        "grad_target": options.grad_target if "grad" in cap.kinds else None,
        "seed": options.seed,
        "device": str(prepared.device),
        "dtype": options.dtype,
        "save_dtype": options.save_dtype,
        "train": options.train,
        "batch_size": options.batch_size,
        "input": source,
        "sample_ids": sample_ids,
        "skipped": [],
        "versions": {
            "hookdump": hookdump.__version__,
            "torch": torch.__version__,
            "torchvision": torchvision.__version__,
            "safetensors": safetensors.__version__,
            "python": platform.python_version(),
        },
        "created": datetime.now(UTC).isoformat(timespec="seconds"),
    }
