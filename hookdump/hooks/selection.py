"""Selecting modules by qualified name (`--layers`, `--exclude`) and class name (`--type`), and
standard names (`blocks.5.hook_resid_post`, see `hooks.names`)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from fnmatch import fnmatchcase
from typing import TYPE_CHECKING

from hookdump.errors import HookdumpError, nearest, opt
from hookdump.format.keys import ROOT, module_type_name
from hookdump.hooks.names import (
    FAMILIES,
    Site,
    looks_standard,
    short_names,
    spelled_out,
    standard_sites,
)

if TYPE_CHECKING:
    from torch import nn

__all__ = ["ROOT", "Selection", "is_leaf", "module_type_name", "named_modules", "select_modules"]


def named_modules(model: nn.Module) -> dict[str, nn.Module]:
    """Every module by qualified name, in registration order, the root as `__root__`."""
    return {(name or ROOT): module for name, module in model.named_modules()}


def is_leaf(module: nn.Module) -> bool:
    """True for a module with no child modules."""
    return next(iter(module.children()), None) is None


@dataclass(frozen=True)
class Selection:
    """What the hooks take: `modules`, picked by their own names (or classes), and `sites`,
    picked by standard names (`hooks.names`), each one value of a module; `every`: the
    model's modules, and `standard`: every standard name the model has."""

    modules: dict[str, nn.Module]
    sites: dict[str, Site]
    every: dict[str, nn.Module]
    standard: dict[str, Site]

    @property
    def hooked(self) -> dict[str, nn.Module]:
        """Every module a hook goes on, in registration order."""
        wanted = set(self.modules) | {site.module for site in self.sites.values()}
        return {name: m for name, m in self.every.items() if name in wanted}


def select(
    model: nn.Module,
    layers: Sequence[str] = (),
    exclude: Sequence[str] = (),
    types: Sequence[str] = (),
) -> Selection:
    """The selected modules and standard names.

    No `layers`: every leaf module, plus, when `types` is given, every module of those types
    (so `--type Bottleneck` finds containers too). Then `exclude` removes, then `types` keeps.
    A pattern that matches no module but standard names (`blocks.*.hook_resid_post`,
    `resid_post.5`) picks those. A pattern or type that matches nothing is an error naming
    the nearest real names.
    """
    modules = named_modules(model)
    names = list(modules)
    sites = standard_sites(modules)
    _check_patterns(layers, exclude, names, list(sites))
    present_types = {module_type_name(m) for m in modules.values()}
    for type_name in types:
        if type_name not in present_types:
            raise HookdumpError(
                _no_match(f"{opt('types')} {type_name!r}", type_name, present_types)
            )

    by_name = [p for p in layers if _matched(p, names)]
    if by_name:
        chosen = [n for n in names if _matches(n, by_name)]
    elif not layers:
        chosen = [n for n in names if types or is_leaf(modules[n])]
    else:  # standard names only
        chosen = []
    chosen = [n for n in chosen if not _matches(n, exclude)]
    if types:
        chosen = [n for n in chosen if module_type_name(modules[n]) in types]
    wanted = [spelled_out(p) for p in layers if p not in by_name and looks_standard(p)]
    unwanted = [spelled_out(p) for p in exclude if looks_standard(p)]
    picked = {
        name: site
        for name, site in sites.items()
        if _matches(name, wanted) and not _matches(name, unwanted)
    }
    if not chosen and not picked:
        raise HookdumpError(
            "the selection is empty: every module matched by the includes was removed by "
            f"{opt('exclude')} or {opt('types')}; loosen them (`hookdump layers MODEL` lists the "
            "names)"
        )
    return Selection({n: modules[n] for n in chosen}, picked, modules, sites)


def select_modules(
    model: nn.Module,
    layers: Sequence[str] = (),
    exclude: Sequence[str] = (),
    types: Sequence[str] = (),
) -> dict[str, nn.Module]:
    """The modules `select` picks by their own names, in registration order."""
    return select(model, layers, exclude, types).modules


def _matches(name: str, patterns: Sequence[str]) -> bool:
    """Whether `name` matches any of `patterns`."""
    return any(fnmatchcase(name, pattern) for pattern in patterns)


def _matched(pattern: str, names: Sequence[str]) -> bool:
    """Whether `pattern` matches any of `names`."""
    return any(fnmatchcase(name, pattern) for name in names)


def _check_patterns(
    layers: Sequence[str], exclude: Sequence[str], names: list[str], sites: list[str]
) -> None:
    """Every pattern matches a module, or else (looking like one) a standard name."""
    for pattern in [*layers, *exclude]:
        if _matched(pattern, names):
            continue
        standard = looks_standard(pattern)
        if standard and _matched(spelled_out(pattern), sites):
            continue
        flag = opt("layers") if pattern in layers else opt("exclude")
        if not standard:  # a module's name mistyped, or a standard one (`resid_pots.5`)
            candidates = [*names, *short_names(sites)]
            raise HookdumpError(_no_match(f"{flag} {pattern!r}", pattern, candidates))
        if not sites:
            raise HookdumpError(
                f"{flag} {pattern!r} is a standard name, but this model has no block of a "
                f"family hookdump names ({FAMILIES}); select modules by their own names "
                "(`hookdump layers MODEL` lists them)"
            )
        hint = nearest(spelled_out(pattern), sites)
        suggestion = f"; nearest: {', '.join(hint)}" if hint else ""
        raise HookdumpError(
            f"{flag} {pattern!r} matches no standard name of this model{suggestion} "
            f"(blocks 0 to {_last_block(sites)}, each {', '.join(_hooks(sites))})"
        )


def _last_block(sites: list[str]) -> int:
    return max(int(name.split(".")[1]) for name in sites)


def _hooks(sites: list[str]) -> list[str]:
    """The names under a block (`hook_resid_post`, `attn.hook_z`), in the model's order."""
    return list(dict.fromkeys(name.split(".", 2)[2] for name in sites))


def _no_match(what: str, word: str, candidates: Sequence[str] | set[str]) -> str:
    hint = nearest(word, sorted(candidates))
    suggestion = f"; nearest: {', '.join(hint)}" if hint else ""
    return (
        f"{what} matches no module of this model{suggestion} "
        "(`hookdump layers MODEL` lists them all)"
    )
