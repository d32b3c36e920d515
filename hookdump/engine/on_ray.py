"""`hookdump.ray.dump`: a Ray Dataset in, a dump out, with Ray Data's own machinery.

The dataset's rows go, `part_size` at a time, to a pool of actors (`map_batches` with an
`ActorPoolStrategy`), each holding the model. Each actor writes its part of the dump with
the engine `hookdump.dump` drives (a run of its own: hooks, sink, shards, upload), named by
its samples' ids (`engine.parts`), and hands back what it wrote. This process has locked
and checked `out` first, and once every part is back it joins them in the dataset's order
into the one `manifest.json`. A task whose actor dies is run again by Ray: it writes the
same part again, after removing what the dead one left, so no row is lost or doubled.
"""

from __future__ import annotations

import dataclasses
import os
import pickle
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np
import torch
from torch import nn

from hookdump.choices import Reduction
from hookdump.engine.destination import Destination
from hookdump.engine.distributed import RankShare, join_shares
from hookdump.engine.live import run_options
from hookdump.engine.options import RunOptions
from hookdump.engine.parts import PartResult, drop_parts, part_name, share_of
from hookdump.engine.place import held
from hookdump.engine.runner import run
from hookdump.engine.signals import exit_code, interrupts_once
from hookdump.errors import HookdumpError, Interrupted, keywords_checked, opt
from hookdump.inputs.python import PythonData
from hookdump.store.read.dump import Dump
from hookdump.store.write.writer import Part

ModelMaker = Callable[[], nn.Module]


@keywords_checked
def dump(
    dataset: Any,
    model: nn.Module | ModelMaker,
    out: str | os.PathLike[str],
    *,
    id_column: str = "id",
    columns: str | Sequence[str] | None = None,
    forward: Callable[[Any, Any], Any] | None = None,
    layers: str | Sequence[str] = (),
    exclude: str | Sequence[str] = (),
    types: str | Sequence[str] = (),
    capture: str | Sequence[str] = ("output",),
    ops: str | Sequence[str] = (),
    repeat_kv_heads: bool = False,
    reduce: Reduction = "none",
    save_dtype: torch.dtype | str | None = None,
    dtype: torch.dtype | str = torch.float32,
    batch_size: int = 64,
    part_size: int = 1024,
    concurrency: int = 1,
    num_gpus: float = 0,
    shard_size: int | str = "1GiB",
    overwrite: bool = False,
    storage_options: dict[str, str] | None = None,
    spool: str | os.PathLike[str] | None = None,
) -> Dump:
    """Dump what the selected modules of `model` produce for the rows of a Ray Dataset.

    Args:
        dataset: a `ray.data.Dataset`, a row per sample: its id (`id_column`) and the
            model's input (`columns`: tensors of one shape per column, e.g. images as
            arrays, or `input_ids` and `attention_mask`; tokenize text with a
            `map_batches` of your own first).
        model: an `nn.Module` (sent to each actor), or a function that makes it (called once
            in each actor: weights are loaded where they are used).
        out: the dump's folder (one every node sees) or URL (`s3://bucket/prefix`).
        id_column: the column of sample ids: the manifest's ids, in the dataset's order.
        columns: the input columns (default: every other column). One column is called as
            `model(x)`, several as `model(**columns)` (`forward(model, batch)` otherwise).
        batch_size: rows per forward. part_size: rows per task, each written as a part of
            the dump (at least one shard; a task that fails is run again whole).
        concurrency: how many actors (each a model); num_gpus: GPUs per actor.
        layers, exclude, types, capture, ops, repeat_kv_heads, reduce, save_dtype, dtype,
            shard_size,
            overwrite, storage_options, spool: as in `hookdump.dump`. (Token rows,
            `per_token`, are not offered: a task does not know where its samples sit in the
            dataset, which their `__sample__` numbers are.)

    Returns:
        The complete dump, opened (`Dump`), which reads as `hookdump.dump`'s of the same
        rows, ids and model.
    """
    ray = _ray()
    if not isinstance(dataset, ray.data.Dataset):
        raise HookdumpError(f"dataset must be a ray.data.Dataset, not {type(dataset).__name__}")
    inputs = _input_columns(dataset, id_column, columns)
    for name, value in (("batch_size", batch_size), ("part_size", part_size)):
        if value < 1:
            raise HookdumpError(f"{opt(name)} {value} must be at least 1")
    if concurrency < 1 or num_gpus < 0:
        raise HookdumpError(
            f"{opt('concurrency')} {concurrency} must be at least 1 and {opt('num_gpus')} "
            f"{num_gpus} at least 0"
        )
    options = run_options(
        _label(model),
        None,
        out,
        layers=layers,
        exclude=exclude,
        types=types,
        capture=capture,
        ops=ops,
        repeat_kv_heads=repeat_kv_heads,
        reduce=reduce,
        save_dtype=save_dtype,
        dtype=dtype,
        shard_size=shard_size,
        overwrite=overwrite,
        storage_options=storage_options,
        spool=spool,
    )
    if options.dump.folder is not None:  # every actor writes into the same folder, from anywhere
        options = dataclasses.replace(
            options, dump=dataclasses.replace(options.dump, out=options.dump.folder.resolve())
        )
    task = _Task(options, "", id_column, inputs, forward, batch_size, "cuda" if num_gpus else "cpu")
    _write(ray, dataset, model, task, (part_size, concurrency, num_gpus))
    written = options.dump.out
    assert written is not None
    return Dump(written, storage_options=storage_options)


def _ray() -> Any:
    try:
        import ray
        import ray.data
    except ImportError:
        raise HookdumpError("hookdump.ray needs Ray Data: pip install 'hookdump[ray]'") from None
    return ray


def _label(model: nn.Module | ModelMaker) -> str:
    """What the model is called in messages (the manifest records the module itself)."""
    if isinstance(model, nn.Module):
        return type(model).__qualname__
    if not callable(model):
        raise HookdumpError(
            f"model must be a torch.nn.Module or a function that makes one, not "
            f"{type(model).__name__}"
        )
    return f"{getattr(model, '__module__', '?')}:{getattr(model, '__qualname__', '?')}"


def _input_columns(dataset: Any, id_column: str, columns: str | Sequence[str] | None) -> list[str]:
    schema = dataset.schema()
    names = list(schema.names) if schema is not None else []
    if id_column not in names:
        raise HookdumpError(
            f"{opt('id_column')} {id_column!r} is not a column of the dataset (its columns: "
            f"{', '.join(names) or 'none'}); give each row its sample id in a column"
        )
    chosen = (
        [columns]
        if isinstance(columns, str)
        else list(columns or [n for n in names if n != id_column])
    )
    missing = [c for c in chosen if c not in names]
    if missing or not chosen:
        raise HookdumpError(
            f"{opt('columns')} {', '.join(missing) or 'none'}: the model's input must be "
            f"columns of the dataset ({', '.join(names)})"
        )
    return chosen


@dataclasses.dataclass(frozen=True)
class _Task:
    """What each actor needs to write a part (sent to it once)."""

    options: RunOptions
    run_id: str  # the dump's: every part's shards carry it
    id_column: str
    columns: list[str]
    forward: Callable[[Any, Any], Any] | None
    batch_size: int
    device: str

    def of_run(self, run_id: str) -> _Task:
        return dataclasses.replace(self, run_id=run_id)


def _write(
    ray: Any, dataset: Any, model: nn.Module | ModelMaker, task: _Task, pool: tuple[int, int, float]
) -> None:
    """Lock and check `out`, have the actors write the parts, join them (this process)."""
    part_size, concurrency, num_gpus = pool
    actor_cpus = _actor_cpus(ray, concurrency, num_gpus)
    started = time.perf_counter()
    with (
        interrupts_once(force=True),
        held(task.options, True, resumable=False) as place,
    ):
        assert place is not None  # `out` is checked first
        options = task.options
        destination = Destination.open(options, None, place)
        destination.start(
            shard_bytes=options.dump.shard_bytes, fields={}, checksum=options.dump.checksum
        )
        writer = destination.writer
        assert writer is not None and writer.run_id is not None
        writer.clear_old_dump(here=True)  # before any part is written
        mapped = dataset.map_batches(
            _PartWriter,
            fn_constructor_kwargs={"model": model, "task": task.of_run(writer.run_id)},
            batch_size=part_size,
            batch_format="numpy",
            zero_copy_batch=False,
            compute=ray.data.ActorPoolStrategy(size=concurrency),
            num_cpus=actor_cpus,
            num_gpus=num_gpus or None,
        )
        mapped.context.execution_options.preserve_order = True  # parts in the dataset's order
        try:
            parts = _collected(mapped)
            shares = [part.share for part in parts if part.share is not None]
            whole = _joined(shares, [part.name for part in parts])
        except HookdumpError:  # every task has ended: what the others wrote is of no use
            drop_parts(place, set())
            raise
        except KeyboardInterrupt as exc:  # Ctrl-C or SIGTERM: the parts are not joined
            raise Interrupted(
                f"the Ray job stopped before its parts were joined: nothing in {place.label} "
                f"is a dump yet; run it again with {opt('overwrite', True)}",
                exit_code(exc),
            ) from None
        fields = parts[0].fields
        fields["input"] = {**fields.get("input", {}), "source": "ray"}
        writer.take_over(whole.shards, whole.tensors, fields)
        destination.finish(whole, {"wall_time_s": round(time.perf_counter() - started, 3)})
        drop_parts(place, {shard.file for shard in whole.shards})


def _actor_cpus(ray: Any, concurrency: int, num_gpus: float) -> float | None:
    """The CPUs each actor asks for: one, or less where the actors would take every CPU of
    the cluster, for Ray Data's own tasks (the dataset's reads and maps) each need a whole
    one beside them: without it the job waits for ever, "pending: 1 CPU". A pool whose GPUs
    the cluster does not have is refused in one line. (None: Ray's default, where Ray is
    not started yet.)"""
    have = ray.cluster_resources() if ray.is_initialized() else {}
    if not have:
        return None
    gpus = float(have.get("GPU", 0))
    if gpus < concurrency * num_gpus:
        raise HookdumpError(
            f"the Ray cluster has {gpus:g} GPUs: {concurrency} actors of {opt('num_gpus')} "
            f"{num_gpus:g} need {concurrency * num_gpus:g}; lower {opt('concurrency')} or "
            f"{opt('num_gpus')}"
        )
    spare = float(have.get("CPU", 0)) - 1  # one for Ray Data's tasks
    return max(0.0, min(1.0, spare / concurrency))


def _collected(mapped: Any) -> list[PartResult]:
    """Every part's name and what it wrote, in order; the first error of a task as one line."""
    try:
        rows = list(mapped.take_all())
    except Exception as exc:  # not a HookdumpError (those come back as rows): the last line
        lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
        raise HookdumpError(f"a Ray task failed: {(lines or [type(exc).__name__])[-1]}") from None
    parts: list[PartResult] = [pickle.loads(row["done"]) for row in rows]
    for part in parts:
        if part.error is not None:
            raise HookdumpError(part.error)
    return parts


def _joined(shares: list[RankShare], names: list[str]) -> RankShare:
    if not shares:
        raise HookdumpError("the dataset holds no row; give it the samples to dump")
    if len(set(names)) < len(names):
        raise HookdumpError(
            "two of the dataset's batches hold the same sample ids; give each row its own id "
            f"in {opt('id_column')}"
        )
    whole = join_shares(shares)
    if whole.rows == 0:
        raise HookdumpError("no row was captured: the selected modules did not run")
    return whole


class _PartWriter:
    """A Ray actor: the model, and each batch of the dataset written as a part."""

    def __init__(self, model: nn.Module | ModelMaker, task: _Task) -> None:
        module = model if isinstance(model, nn.Module) else model()
        if not isinstance(module, nn.Module):
            raise HookdumpError(f"model() made a {type(module).__name__}, not a torch.nn.Module")
        self.module = module.to(task.device)
        self.task = task

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        task = self.task
        name = ""
        try:
            ids = _ids(batch[task.id_column], task.id_column)
            name = part_name(ids)
            part = dataclasses.replace(task.options.dump, part=Part(name, task.run_id))
            options = dataclasses.replace(task.options, dump=part)
            inputs = {column: _tensor(batch[column], column) for column in task.columns}
            data = PythonData(list(_pieces(inputs, task.batch_size)), task.forward, ids)
            done = share_of(name, run(options, model=self.module, data=data))
        except HookdumpError as exc:  # Ray would keep only its traceback's text
            done = PartResult(name, error=exc.args[0] if exc.args else str(exc))  # for the CLI
        return {"part": np.array([name]), "done": np.array([pickle.dumps(done)], dtype=object)}


def _ids(values: np.ndarray, column: str) -> list[Any]:
    """A part's sample ids; a row without one (an integer column with a missing value
    arrives as floats and NaN, a string column's as None) is refused in one line."""
    if values.dtype.kind == "f":
        missing = np.isnan(values)
    elif values.dtype == object:
        missing = np.array([v is None or (isinstance(v, float) and v != v) for v in values])
    else:
        missing = np.zeros(len(values), dtype=bool)
    if missing.any():
        raise HookdumpError(
            f"{opt('id_column')} {column!r} has rows without an id ({int(missing.sum())} in "
            "one part); give every row its id, or drop those rows first (Dataset.filter)"
        )
    return list(values.tolist())


def _tensor(values: np.ndarray, column: str) -> torch.Tensor:
    if values.dtype == object or values.dtype.kind in "USO":
        raise HookdumpError(
            f"column {column!r} holds {values.dtype} values, not tensors of one shape: turn it "
            "into arrays first (a tokenizer or image decoder in a map_batches of your own)"
        )
    return torch.from_numpy(values)


def _pieces(inputs: dict[str, torch.Tensor], size: int) -> Iterator[Any]:
    """The part's rows in batches of `size`: a tensor (one column), or a dict of them."""
    rows = len(next(iter(inputs.values())))
    for start in range(0, rows, size):
        piece = {name: values[start : start + size] for name, values in inputs.items()}
        yield next(iter(piece.values())) if len(piece) == 1 else piece
