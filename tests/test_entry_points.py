"""The entry points that restate one keyword list agree on it (issue 44, part 5): the
names they share have the same defaults and annotations, so a default changed in one
place cannot drift from the others. `hookdump.dump`, the engine's `run_options`,
`hookdump.ray.dump` and the CLI's `run`; `Dump.batches`, `Aligned.batches` and the two
`dataset`s."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

import torch

import hookdump
import hookdump.ray
from hookdump.cli.run import run as cli_run
from hookdump.engine.live import run_options
from hookdump.store.read.aligned import Aligned
from hookdump.store.read.dump import Dump


def _keywords(function: Callable[..., Any]) -> dict[str, inspect.Parameter]:
    return {
        name: p
        for name, p in inspect.signature(function).parameters.items()
        if p.kind in (p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD) and name != "self"
    }


def _disagree(a: Callable[..., Any], b: Callable[..., Any], skip: set[str]) -> list[str]:
    one, two = _keywords(a), _keywords(b)
    shared = (set(one) & set(two)) - skip
    assert shared, (a, b)
    return sorted(
        f"{name}: {one[name].default!r} / {two[name].default!r}, "
        f"{one[name].annotation} / {two[name].annotation}"
        for name in shared
        if one[name].default != two[name].default or one[name].annotation != two[name].annotation
    )


def test_the_dump_doors_agree_on_their_shared_keywords() -> None:
    # `model`: a module or a spec in hookdump.dump, a module or its maker on Ray
    assert _disagree(hookdump.dump, hookdump.ray.dump, {"model"}) == []
    assert _disagree(hookdump.dump, run_options, set()) == []
    assert set(_keywords(run_options)) - set(_keywords(hookdump.dump)) == {"live"}


# the CLI's spelling of the same default (a flag gives text; Python gives values)
_AS_TEXT = {(): None, ("output",): "output", torch.float32: "float32"}
# the same name, another meaning: a live module stays on its device and in its mode
_LIVE_ONLY = {"device", "train", "out", "model"}


def test_the_cli_and_python_agree_on_defaults() -> None:
    cli, python = _keywords(cli_run), _keywords(hookdump.dump)
    differ = []
    for name in (set(cli) & set(python)) - _LIVE_ONLY:
        want = python[name].default
        if cli[name].default != _AS_TEXT.get(want, want):
            differ.append(f"{name}: --{name.replace('_', '-')} {cli[name].default!r}, {want!r}")
    assert differ == []


def test_the_readers_agree_on_their_shared_keywords() -> None:
    assert _disagree(Dump.batches, Aligned.batches, set()) == []
    assert _disagree(Dump.batches, hookdump.follow, set()) == []  # `keys`, `shuffle`, ...
    assert _disagree(Dump.dataset, hookdump.follow_dataset, set()) == []
    assert _disagree(hookdump.follow, hookdump.follow_dataset, set()) == []
    assert _disagree(Dump.batches, Dump.dataset, set()) == []
    assert _disagree(Dump.dataset, Aligned.dataset, set()) == []
    assert _disagree(Aligned.batches, Aligned.dataset, set()) == []
    order = [n for n in _keywords(Dump.batches) if n != "keys"]
    assert [n for n in _keywords(Aligned.batches)] == order
