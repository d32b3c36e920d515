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
from hookdump.format.names import MANIFEST
from hookdump.inputs.engine_files import request_files
from hookdump.inputs.python import PythonData, Resumable
from hookdump.inputs.requests import (
    Before,
    Format,
    Item,
    RequestFeed,
    engine_format,
    files_format,
    refuse_overlap,
)
from hookdump.inputs.sample_files import Keys, read_tokens
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
KINDS = (*KEYS, "files")


class HiddenStates(nn.Module):
    """An engine's hidden states as a model: `hidden_states`, a list of `[batch, tokens,
    ...]` (or a sample's `[batch, ...]`), value i handed to the module named `names[i]`
    (an identity)."""

    def __init__(self, names: Sequence[str]) -> None:
        super().__init__()
        self.names = list(names)
        for name in self.names:
            parent: nn.Module = self
            *path, last = name.split(".")
            try:
                for part in path:
                    if part not in parent._modules:
                        parent.add_module(part, nn.Module())
                    parent = parent.get_submodule(part)
                parent.add_module(last, nn.Identity())
            except (KeyError, AttributeError):
                raise HookdumpError(
                    f"{name!r} cannot be a key here (a part of it is taken); name it otherwise"
                ) from None

    def forward(
        self,
        hidden_states: list[torch.Tensor],
        input_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        request_id: str = "",
    ) -> list[torch.Tensor]:
        for name, value in zip(self.names, hidden_states, strict=True):
            self.get_submodule(name)(value)
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
    max_disk: int | str | None = None  # shard bytes kept under `out` until a follower takes them
    delete_source: bool = False  # each source file deleted once its rows' shards are listed


@dataclass
class Imported:
    """What an import wrote (`dump`), the files it left for a later one (`waiting`: the
    engine was still writing them) and those it left out as bad (`skipped`: `skip_bad`)."""

    dump: Dump
    waiting: list[Path] = field(default_factory=list)
    skipped: list[dict[str, str]] = field(default_factory=list)


@dataclass(frozen=True)
class Held:
    """What the files hold. `layer_ids` (vllm, trtllm): the model's layers, in their order
    (vLLM's `eagle_aux_hidden_state_layer_ids`, TensorRT-LLM's `layers_to_capture`).
    `key_map` (files): `NAME=KEY` pairs, the dump's key NAME from each file's tensor KEY
    (`__token_ids__=KEY`: its token ids); `tokens` (files): a JSON-lines file of each
    sample's token ids."""

    layer_ids: Sequence[int] = ()
    key_map: Sequence[str] = ()
    tokens: str | os.PathLike[str] | None = None


def import_engine(
    kind: str,
    source: str | os.PathLike[str],
    out: str | os.PathLike[str],
    held: Held,
    *,
    writing: Writing | None = None,
    skip_bad: bool = False,
    progress: bool = False,
) -> Imported:
    """Import the files of engine `kind` under `source`, holding `held`, into a dump at
    `out` (`writing`: how the dump is written; `skip_bad`: a bad file is left out and
    listed in the manifest's `skipped_inputs`, not an error)."""
    if kind not in KINDS:
        raise HookdumpError(f"cannot import {kind!r}: the kinds are {', '.join(KINDS)}")
    how = writing or Writing()
    where = destination_of(out)
    folder = where if isinstance(where, Path) else None
    refuse_overlap(Path(source), folder)
    tokens = None if held.tokens is None else Path(held.tokens)
    if tokens is not None:
        refuse_overlap(tokens, folder)
    form, names, told = _reading(kind, held.layer_ids, held.key_map, tokens)
    paths = request_files(Path(source), form.suffixes)
    if not paths:
        raise HookdumpError(
            f"{printable(str(source))} holds no {kind} file "
            f"({', '.join('*' + s for s in form.suffixes)})"
        )
    before = Before.of(_previous(out, how) if how.resume else None)
    listed = _listed(folder, out) if how.delete_source else None
    feed = RequestFeed(Path(source), paths, form, skip_bad=skip_bad, before=before, listed=listed)
    model = HiddenStates(names)
    options = _options(model, out, how, per_token=form.token_rows)
    about = {"engine": {"name": kind, "version": None}, **told}
    data = Resumable(
        lambda done: _batches(feed.after(done)), lambda: {**feed.about(), **about}, feed.skipped
    )
    given = PythonData(data, ids=lambda batch: [batch["request_id"]], per_token=form.token_rows)
    from hookdump.engine.live import dump_given

    written = dump_given(options, model, given, progress=progress)
    if how.delete_source:  # the rest: their rows are in the complete dump
        feed.delete_listed(written.manifest.samples_fed)
    return Imported(written, feed.waiting, feed.skipped)


def _reading(
    kind: str, layer_ids: Sequence[int], keys: Sequence[str], tokens: Path | None
) -> tuple[Format, list[str], dict[str, Any]]:
    """How `kind`'s files are read, the dump's keys, and what the manifest says of them."""
    if kind == "files":
        if layer_ids:
            raise HookdumpError(
                f"{opt('layer_ids')} is for vllm and trtllm; name the files' tensors with "
                f"{opt('key_map')} NAME=KEY"
            )
        mapped = Keys.parse(list(keys))
        if tokens is not None and mapped.token_ids is not None:
            raise HookdumpError(
                f"give the token ids once: {opt('tokens')} or {opt('key_map')} __token_ids__=KEY"
            )
        form = files_format(mapped, None if tokens is None else read_tokens(tokens))
        return (
            form,
            list(mapped.names),
            {"keys": dict(zip(mapped.names, mapped.tensors, strict=True))},
        )
    if keys or tokens is not None:
        raise HookdumpError(
            f"{opt('key_map')} and {opt('tokens')} are for files: {kind}'s files name their "
            f"tensors and hold their token ids (name their layers with {opt('layer_ids')})"
        )
    key, least = KEYS[kind]
    ids = _checked_ids(layer_ids, least)
    return engine_format(kind, len(ids)), [key(n) for n in ids], {"layer_ids": ids}


def _options(
    model: HiddenStates, out: str | os.PathLike[str], how: Writing, *, per_token: bool
) -> RunOptions:
    """The run that writes the dump: every key, a row per token (or per sample)."""
    from hookdump.engine.live import run_options

    options = run_options(
        model,
        model,
        out,
        layers=model.names,
        per_token=per_token,
        shard_size=how.shard_size,
        overwrite=how.overwrite,
        resume=how.resume,
        storage_options=how.storage_options,
        spool=how.spool,
        max_disk=how.max_disk,
    )
    # resuming goes on with a complete import too: the engine may have written more since
    return dataclasses.replace(options, dump=dataclasses.replace(options.dump, grows=True))


def _listed(folder: Path | None, out: str | os.PathLike[str]) -> Callable[[], int]:
    """How many samples the dump at `folder` lists now, in shards its manifest names (read
    again only when the manifest changes)."""
    if folder is None:
        raise HookdumpError(
            f"{opt('delete_source', True)} deletes a file once the dump's folder lists its "
            f"rows; give {opt('out')} a folder, not {printable(str(out))}"
        )
    seen: list[Any] = [None, 0]

    def listed() -> int:
        try:
            info = os.stat(folder / MANIFEST)
        except OSError:
            return int(seen[1])
        if (info.st_mtime_ns, info.st_size, info.st_ino) != seen[0]:
            seen[0] = (info.st_mtime_ns, info.st_size, info.st_ino)
            try:
                shards = Dump(folder).manifest.shards
            except HookdumpError:
                return int(seen[1])
            seen[1] = shards[-1].samples_fed if shards else 0
        return int(seen[1])

    return listed


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


def _batches(found: Iterable[Item]) -> Iterator[dict[str, Any]]:
    """One batch per item: its values and, for token rows, its tokens, all real."""
    for item in found:
        batch: dict[str, Any] = {
            "hidden_states": [value[None] for value in item.values()],
            "request_id": item.id,
        }
        if item.token_ids is not None:
            ids = item.token_ids[None]
            batch.update(input_ids=ids, attention_mask=torch.ones_like(ids))
        yield batch
