"""`hookdump import`: the hidden states a serving engine wrote, one file per request
(`inputs.engine_files`), made a dump as `run` writes one. The files are replayed as a model:
its forward hands each layer's rows to a module named for the standard name they are
(`blocks.N.hook_resid_pre`: the residual stream entering decoder layer N), and the one
engine (hooks, token rows with `__sample__`, `__position__` and `__token_ids__`, shards,
statistics, checksums, a folder or a URL) writes them as it writes any model's, so that the
import and `hookdump run` of the same tokens through the model compare key by key."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from hookdump.errors import HookdumpError, opt, printable
from hookdump.inputs.engine_files import Request, request_files
from hookdump.inputs.python import PythonData, Resumable
from hookdump.inputs.requests import Before, RequestFeed, refuse_overlap
from hookdump.store.location import destination_of
from hookdump.store.read.dump import Dump

KINDS = ("vllm",)  # the engines whose files are read


class _Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.hook_resid_pre = nn.Identity()


class VllmHiddenStates(nn.Module):
    """vLLM's hidden states as a model: `hidden_states` `[batch, tokens, layers, hidden]`,
    layer i of the file handed to `blocks.<layer_ids[i]>.hook_resid_pre`."""

    def __init__(self, layer_ids: Sequence[int]) -> None:
        super().__init__()
        self.blocks = nn.ModuleDict({str(n): _Block() for n in layer_ids})

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        hidden_states: torch.Tensor,
        request_id: str = "",
    ) -> torch.Tensor:
        for index, block in enumerate(self.blocks.values()):
            block.get_submodule("hook_resid_pre")(hidden_states[:, :, index])
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
    ids = _checked_ids(layer_ids)
    how = writing or Writing()
    where = destination_of(out)
    refuse_overlap(Path(source), where if isinstance(where, Path) else None)
    paths = request_files(Path(source))
    if not paths:
        raise HookdumpError(
            f"{printable(str(source))} holds no request file (*.safetensors, *.safetensors.zst)"
        )
    before = Before.of(_previous(out, how) if how.resume else None)
    feed = RequestFeed(Path(source), paths, skip_bad=skip_bad, before=before)
    from hookdump.engine.live import dump_given, run_options

    model = VllmHiddenStates(ids)
    options = run_options(
        model,
        model,
        out,
        layers=[f"blocks.{n}.hook_resid_pre" for n in ids],
        per_token=True,
        shard_size=how.shard_size,
        overwrite=how.overwrite,
        resume=how.resume,
        storage_options=how.storage_options,
        spool=how.spool,
    )
    # resuming goes on with a complete import too: the engine may have written more since
    options = dataclasses.replace(options, dump=dataclasses.replace(options.dump, grows=True))
    about = {"engine": {"name": kind, "version": None}, "layer_ids": ids}
    data = Resumable(
        lambda done: _batches(feed.after(done), len(ids)),
        lambda: {**feed.about(), **about},
        feed.skipped,
    )
    given = PythonData(data, ids=lambda batch: [batch["request_id"]], per_token=True)
    written = dump_given(options, model, given, progress=progress)
    return Imported(written, feed.waiting, feed.skipped)


def _previous(out: str | os.PathLike[str], how: Writing) -> Any:
    """The manifest of the dump an import resumes, as it stands (None: none readable; the
    run's own resume says why)."""
    try:
        return Dump(out, storage_options=how.storage_options).manifest
    except HookdumpError:
        return None


def _checked_ids(layer_ids: Sequence[int]) -> list[int]:
    ids = list(layer_ids)
    if not ids:
        raise HookdumpError(
            f"say which layers the files hold: {opt('layer_ids')} 1,2,3,4 (the engine's "
            "eagle_aux_hidden_state_layer_ids, in their order)"
        )
    if any(n < 0 for n in ids) or len(set(ids)) != len(ids):
        raise HookdumpError(
            f"{opt('layer_ids')} {','.join(map(str, ids))}: each a layer's number, 0 or more, once"
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
