"""`hookdump import`: the hidden states a serving engine wrote (`inputs.engine_files`,
`inputs.trtllm_files`), made a dump as `run` writes one. The files are replayed as a model:
its forward hands each layer's rows to a module named for the standard name they are
(vLLM's layer N: `blocks.N.hook_resid_pre`, the residual stream entering decoder layer N;
TensorRT-LLM's: `blocks.N.hook_resid_post`, leaving it, and -1, the final norm's output,
`ln_final.hook_normalized`), and the one engine (hooks, token rows with `__sample__`,
`__position__` and `__token_ids__`, shards, statistics, checksums, a folder or a URL)
writes them as it writes any model's, so that the import and `hookdump run` of the same
tokens through the model compare key by key."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from hookdump.engine.options import RunOptions
from hookdump.errors import HookdumpError, opt, printable
from hookdump.inputs.engine_files import Request, request_files
from hookdump.inputs.python import PythonData, Resumable
from hookdump.inputs.requests import FORMATS, Before, RequestFeed, refuse_overlap
from hookdump.store.location import destination_of
from hookdump.store.read.dump import Dump


def _vllm_key(layer: int) -> str:
    return f"blocks.{layer}.hook_resid_pre"


def _trtllm_key(layer: int) -> str:
    return "ln_final.hook_normalized" if layer == -1 else f"blocks.{layer}.hook_resid_post"


# each engine's layer ids as standard names, and the least id it may name
KEYS: dict[str, tuple[Callable[[int], str], int]] = {
    "vllm": (_vllm_key, 0),
    "trtllm": (_trtllm_key, -1),
}
KINDS = tuple(KEYS)


class HiddenStates(nn.Module):
    """An engine's hidden states as a model: `hidden_states` `[batch, tokens, layers,
    hidden]`, layer i handed to the module named `keys[i]` (an identity)."""

    def __init__(self, keys: Sequence[str]) -> None:
        super().__init__()
        self.keys = list(keys)
        for key in self.keys:
            parent: nn.Module = self
            *path, last = key.split(".")
            for part in path:
                if not hasattr(parent, part):
                    parent.add_module(part, nn.Module())
                parent = parent.get_submodule(part)
            parent.add_module(last, nn.Identity())

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        hidden_states: torch.Tensor,
        request_id: str = "",
    ) -> torch.Tensor:
        for index, key in enumerate(self.keys):
            self.get_submodule(key)(hidden_states[:, :, index])
        return hidden_states


@dataclass(frozen=True)
class Writing:
    """How the dump is written, as `hookdump.dump` takes it (`resume`: go on with an import
    that stopped, adding the files that appeared since)."""

    shard_size: int | str = "1GiB"
    overwrite: bool = False
    storage_options: dict[str, str] | None = None
    spool: str | os.PathLike[str] | None = None
    resume: bool = False


@dataclass
class Imported:
    """What an import wrote (`dump`), the files it left for a later one (`waiting`: the
    engine was still writing them) and those it left out as bad (`skipped`: `skip_bad`)."""

    dump: Dump
    waiting: list[Path] = field(default_factory=list)
    skipped: list[dict[str, str]] = field(default_factory=list)


def import_engine(
    kind: str,
    source: str | os.PathLike[str],
    out: str | os.PathLike[str],
    *,
    layer_ids: Sequence[int],
    writing: Writing | None = None,
    skip_bad: bool = False,
    progress: bool = False,
) -> Imported:
    """Import the request files of engine `kind` under `source` into a dump at `out`
    (`layer_ids`: the model's layers the files hold, in their order: vLLM's
    `eagle_aux_hidden_state_layer_ids`; `writing`: how the dump is written; `skip_bad`: a
    bad file is left out and listed in the manifest's `skipped_inputs`, not an error)."""
    if kind not in KINDS:
        raise HookdumpError(f"cannot import {kind!r}: the kinds are {', '.join(KINDS)}")
    key, least = KEYS[kind]
    ids = _checked_ids(layer_ids, least)
    how = writing or Writing()
    where = destination_of(out)
    refuse_overlap(Path(source), where if isinstance(where, Path) else None)
    form = FORMATS[kind]
    paths = request_files(Path(source), form.suffixes)
    if not paths:
        raise HookdumpError(
            f"{printable(str(source))} holds no {kind} file "
            f"({', '.join('*' + s for s in form.suffixes)})"
        )
    before = Before.of(_previous(out, how) if how.resume else None)
    feed = RequestFeed(Path(source), paths, form, layers=len(ids), skip_bad=skip_bad, before=before)
    model = HiddenStates([key(n) for n in ids])
    options = _options(model, out, how)
    about = {"engine": {"name": kind, "version": None}, "layer_ids": ids}
    data = Resumable(
        lambda done: _batches(feed.after(done), len(ids)),
        lambda: {**feed.about(), **about},
        feed.skipped,
    )
    given = PythonData(data, ids=lambda batch: [batch["request_id"]], per_token=True)
    from hookdump.engine.live import dump_given

    written = dump_given(options, model, given, progress=progress)
    return Imported(written, feed.waiting, feed.skipped)


def _options(model: HiddenStates, out: str | os.PathLike[str], how: Writing) -> RunOptions:
    """The run that writes the dump: every layer, a row per token."""
    from hookdump.engine.live import run_options

    options = run_options(
        model,
        model,
        out,
        layers=model.keys,
        per_token=True,
        shard_size=how.shard_size,
        overwrite=how.overwrite,
        resume=how.resume,
        storage_options=how.storage_options,
        spool=how.spool,
    )
    # resuming goes on with a complete import too: the engine may have written more since
    return dataclasses.replace(options, dump=dataclasses.replace(options.dump, grows=True))


def _previous(out: str | os.PathLike[str], how: Writing) -> Any:
    """The manifest of the dump an import resumes, as it stands (None: none readable; the
    run's own resume says why)."""
    try:
        return Dump(out, storage_options=how.storage_options).manifest
    except HookdumpError:
        return None


def _checked_ids(layer_ids: Sequence[int], least: int) -> list[int]:
    ids = list(layer_ids)
    if not ids:
        raise HookdumpError(
            f"say which layers the files hold: {opt('layer_ids')} 1,2,3,4 (the engine's "
            "capture layers, in their order)"
        )
    if any(n < least for n in ids) or len(set(ids)) != len(ids):
        raise HookdumpError(
            f"{opt('layer_ids')} {','.join(map(str, ids))}: each a layer's number, "
            f"{least} or more, once"
        )
    return ids


def _batches(found: Iterable[Request], layers: int) -> Iterator[dict[str, Any]]:
    """One batch per request: its tokens, all real, and its hidden states."""
    for request in found:
        if request.hidden.shape[1] != layers:
            raise HookdumpError(
                f"{printable(str(request.path))} holds {request.hidden.shape[1]} layers, and "
                f"{opt('layer_ids')} names {layers}: give the ids of every layer it holds"
            )
        ids = request.token_ids[None]
        yield {
            "input_ids": ids,
            "attention_mask": torch.ones_like(ids),
            "hidden_states": request.hidden[None],
            "request_id": request.id,
        }
