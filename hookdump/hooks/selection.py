"""Selecting modules by qualified name (`--layers`, `--exclude`) and class name (`--type`)."""

from __future__ import annotations

from collections.abc import Sequence
from fnmatch import fnmatchcase
from typing import TYPE_CHECKING

from hookdump.errors import HookdumpError, nearest, opt
from hookdump.format.keys import TYPE_ATTRIBUTE

if TYPE_CHECKING:
    from torch import nn

ROOT = "__root__"


def module_type_name(module: nn.Module) -> str:
    """The module's class name (the original one, for modules restored from an export)."""
    return getattr(module, TYPE_ATTRIBUTE, None) or type(module).__name__


def named_modules(model: nn.Module) -> dict[str, nn.Module]:
    """Every module by qualified name, in registration order, the root as `__root__`."""
    return {(name or ROOT): module for name, module in model.named_modules()}


def is_leaf(module: nn.Module) -> bool:
    """True for a module with no child modules."""
    return next(iter(module.children()), None) is None


def select_modules(
    model: nn.Module,
    layers: Sequence[str] = (),
    exclude: Sequence[str] = (),
    types: Sequence[str] = (),
) -> dict[str, nn.Module]:
    """The selected modules by name, in registration order.

    No `layers`: every leaf module, plus, when `types` is given, every module of those types
    (so `--type Bottleneck` finds containers too). Then `exclude` removes, then `types` keeps.
    A pattern or type that matches nothing is an error naming the nearest real names.
    """
    modules = named_modules(model)
    names = list(modules)

    for pattern in [*layers, *exclude]:
        if not any(fnmatchcase(name, pattern) for name in names):
            flag = opt("layers") if pattern in layers else opt("exclude")
            raise HookdumpError(_no_match(f"{flag} {pattern!r}", pattern, names))
    present_types = {module_type_name(m) for m in modules.values()}
    for type_name in types:
        if type_name not in present_types:
            raise HookdumpError(
                _no_match(f"{opt('types')} {type_name!r}", type_name, present_types)
            )

    if layers:
        chosen = [n for n in names if any(fnmatchcase(n, p) for p in layers)]
    elif types:
        chosen = list(names)
    else:
        chosen = [n for n in names if is_leaf(modules[n])]
    chosen = [n for n in chosen if not any(fnmatchcase(n, p) for p in exclude)]
    if types:
        chosen = [n for n in chosen if module_type_name(modules[n]) in types]
    if not chosen:
        raise HookdumpError(
            "the selection is empty: every module matched by the includes was removed by "
            f"{opt('exclude')} or {opt('types')}; loosen them (`hookdump layers MODEL` lists the "
            "names)"
        )
    return {n: modules[n] for n in chosen}


def _no_match(what: str, word: str, candidates: Sequence[str] | set[str]) -> str:
    hint = nearest(word, sorted(candidates))
    suggestion = f"; nearest: {', '.join(hint)}" if hint else ""
    return (
        f"{what} matches no module of this model{suggestion} "
        "(`hookdump layers MODEL` lists them all)"
    )
