"""The capture engine: hooks that copy what the selected modules receive and return.

Correctness rules (where hand-written hooks usually go wrong):
- every call of a module is kept: the first under the plain key, the n-th extra as `key@n`;
- values are copied the moment the hook runs, so a later in-place op cannot change them;
- inputs are taken by a *pre*-hook, before the module (or an in-place one) touches them;
- structured values are flattened to dotted parts; non-tensor leaves are noted, not stored;
- gradients come from tensor hooks, registered before any in-place op can touch the tensor
  (module backward hooks refuse in-place ops), so they are taken w.r.t. the value captured;
- hooks are removed, and train/eval modes restored, on every exit path.

`Hooks` is the root, as TransformerLens' `HookedRootModule`: it selects the modules, makes
a `HookedModule` of each (`hooks.hooked`: its hooks, what is taken of it), attaches them
for its block with the taps that reach inside modules, and holds the engine's controls;
every value goes through one `Keeper` (`hooks.keep`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass

import torch
from torch import nn
from torch.utils.hooks import RemovableHandle

from hookdump.choices import (
    ATTENTION_KINDS,
    ROUTER_VALUES,
    CaptureKind,
    Reduction,
    parse_reduction,
)
from hookdump.errors import HookdumpError, keywords_checked, opt
from hookdump.format.keys import KeyInfo
from hookdump.hooks.attention import AttentionTap, check_selection
from hookdump.hooks.calls import Calls
from hookdump.hooks.hooked import hooked_modules
from hookdump.hooks.keep import Keeper
from hookdump.hooks.names import Side, Site, first_names
from hookdump.hooks.ops import OpRecorder, check_patterns
from hookdump.hooks.routing import RoutingTap
from hookdump.hooks.routing import check_selection as check_routing
from hookdump.hooks.selection import Selection, select
from hookdump.hooks.values import Receiver, Skipped, Tensors, parse_capture


class _Attached:
    """What `Hooks` attach to the model inside its block: the hooks, with `ops` the
    recorder of the modules' own ops, with attention kinds the tap, and the stack that
    takes them off again (and puts the modules' modes back)."""

    def __init__(self) -> None:
        self.handles: list[RemovableHandle] = []
        self.recorder: OpRecorder | None = None
        self.tap: AttentionTap | None = None
        self.routing: RoutingTap | None = None
        self.stack: contextlib.ExitStack | None = None

    def quiet(self) -> contextlib.AbstractContextManager[None]:
        """Inside, hookdump's own torch calls are not taken for the model's ops."""
        return self.recorder.paused() if self.recorder is not None else contextlib.nullcontext()

    def remove_handles(self) -> None:
        try:
            for handle in self.handles:
                handle.remove()
        finally:
            self.handles.clear()

    def detach(self) -> None:
        stack, self.stack = self.stack, None
        self.recorder = self.tap = self.routing = None
        if stack is not None:
            stack.close()


@dataclass(frozen=True)
class _Targets:
    """What the hooks go on: every hooked module, those picked by name, the standard names
    picked of each module, and the standard name of every value that has one."""

    modules: dict[str, nn.Module]
    named: dict[str, nn.Module]
    sites: dict[str, list[Site]]
    standard: dict[tuple[str, Side], str]

    @classmethod
    def of(cls, selection: Selection) -> _Targets:
        sites: dict[str, list[Site]] = {}
        for site in selection.sites.values():
            sites.setdefault(site.module, []).append(site)
        standard = first_names(selection.standard)
        return cls(selection.hooked, selection.modules, sites, standard)


@dataclass(frozen=True)
class _Inside:
    """Options of the kinds taken inside a module: which ops, whether grouped-query keys and
    values come with a head per query head."""

    ops: tuple[str, ...]
    repeat_kv_heads: bool


def _check_inside(inside: _Inside, kinds: Sequence[str]) -> None:
    if inside.repeat_kv_heads and not {"k", "v", "k_pre_rope"} & set(kinds):
        raise HookdumpError(
            f"{opt('repeat_kv_heads', True)} repeats the key-value heads of k, v and "
            f"k_pre_rope; add one of them to {opt('capture')}"
        )


def _restore_modes(modes: list[tuple[nn.Module, bool]]) -> None:
    for module, training in modes:
        module.training = training


class Hooks:
    """Hooks on the selected modules of `model`, active inside a `with` block: the engine's
    (a run's batch loop drives them with the controls below); a user gets a `Capture`.

    `tensors` maps each key to a copy of the captured tensor, in the order the hooks fired.
    Calls are counted from entering the block or the last `clear()`/`take()`: call the model
    once per block (or `take()` after each forward) so that `@n` means "the n-th extra call
    in one forward".

    Args:
        model: the model to hook.
        layers, exclude, types: which modules (see `hooks.selection.select_modules`).
        capture: any of `output`, `input`, `grad`, `ops` (a comma list or a sequence).
        train: set the model's mode inside the block (None: leave it), restored on exit.
        ops: with `ops`, globs of the op names kept (none: every op but views).
        reduce: `none`, `mean`, `max` or `flatten` (see `reduce_tensor`).
        receiver: where values go instead of `tensors` (a `Receiver`).
        repeat_kv_heads: `k`, `v`, `k_pre_rope` of grouped-query attention with a head per
            query head (see `hooks.attention`).
    """

    def __init__(
        self,
        model: nn.Module,
        layers: Sequence[str] = (),
        exclude: Sequence[str] = (),
        types: Sequence[str] = (),
        capture: str | Sequence[str] = ("output",),
        *,
        train: bool | None = None,
        reduce: Reduction = "none",
        receiver: Receiver | None = None,
        ops: Sequence[str] = (),
        repeat_kv_heads: bool = False,
    ) -> None:
        self.reduce = parse_reduction(reduce)
        self.model = model
        selection = select(model, _as_list(layers), _as_list(exclude), _as_list(types))
        self._targets = _Targets.of(selection)
        self.kinds = parse_capture(capture)
        _check_kinds(self.kinds, self.named, selection.sites)
        check_selection(model, self.named, self.kinds)
        check_routing(model, self.named, self.kinds)
        self.train = train
        self._inside = _Inside(tuple(ops), repeat_kv_heads)
        sides = [site.side for sites in self.sites.values() for site in sites]
        _check_inside(self._inside, [*self.kinds, *sides])
        _check_routing_reduce([*self.kinds, *sides], self.reduce)
        self._calls = Calls()
        self._keeper = Keeper(
            receiver or Tensors(), self.reduce, self._targets.standard, self._calls
        )
        self._attached = _Attached()
        self._hooked = hooked_modules(
            self.modules, self.named, self.kinds, self.sites, self._keeper, self._attached
        )

    @property
    def info(self) -> dict[str, KeyInfo]:
        """What the keeper noted of each key (`Capture.info`)."""
        return self._keeper.info

    @property
    def skipped(self) -> dict[str, Skipped]:
        """The non-tensor values the keeper met (`Capture.skipped`)."""
        return self._keeper.skipped

    @property
    def modules(self) -> dict[str, nn.Module]:
        """Every hooked module by name, in registration order."""
        return self._targets.modules

    @property
    def ops(self) -> tuple[str, ...]:
        """With `ops`: globs of the op names kept (none: every op but views)."""
        return self._inside.ops

    @property
    def named(self) -> dict[str, nn.Module]:
        """The modules selected by their own names: `kinds` are taken of these."""
        return self._targets.named

    @property
    def sites(self) -> dict[str, list[Site]]:
        """module -> the standard names selected of it (`hooks.names`)."""
        return self._targets.sites

    @property
    def calls(self) -> dict[str, int]:
        """module -> calls it made in this forward (since `clear`)."""
        return self._calls.counts

    @property
    def running(self) -> list[str]:
        """The hooked modules whose forward has begun and not returned, innermost last."""
        return self._calls.running

    @property
    def finished(self) -> list[str]:
        """The hooked modules that returned, in order."""
        return self._calls.finished

    @property
    def stop_after(self) -> dict[str, int] | None:
        """Early stop: the calls each module makes in one forward (None: not stopping)."""
        return self._calls.stop_after

    @property
    def tensors(self) -> dict[str, torch.Tensor]:
        """key -> captured copy, in the order the hooks fired (empty with a `receiver`)."""
        return self._keeper.tensors

    def __repr__(self) -> str:
        names = list(self.modules)
        shown = ", ".join(names[:4]) + (f", ... {len(names) - 4} more" if len(names) > 4 else "")
        active = "hooked" if self._attached.handles else "not hooked"
        return (
            f"Capture({type(self.model).__name__}: {len(names)} modules {active} [{shown}], "
            f"capture {','.join(self.kinds)}, reduce {self.reduce}, {len(self.tensors)} tensors "
            "kept)"
        )

    def check_ops(self) -> None:
        """After the first forward: every `ops` pattern matched an op that was called."""
        recorder = self._attached.recorder
        if recorder is not None and self.ops:
            check_patterns(self.ops, recorder.called)

    @property
    def keys_expected(self) -> list[str]:
        """The keys one forward makes: those seen so far, or before any forward an estimate
        from the selection's names (each module called twice per kind, with a part; 16 ops
        each), which sizes a shard's header room."""
        if self.info:
            return list(self.info)
        per_kind = {kind: 32 if kind == "ops" else 2 for kind in self.kinds}
        return [
            f"{name}:{kind}.part_{n:02d}@{n}"
            for name in self.named
            for kind, count in per_kind.items()
            for n in range(count)
        ] + [f"{site.name}@{n}" for sites in self.sites.values() for site in sites for n in (1, 2)]

    @contextlib.contextmanager
    def counting_only(self) -> Iterator[None]:
        """Inside: hooks count calls and note keys, but keep no values."""
        with self._calls.counting_only():
            yield

    @contextlib.contextmanager
    def detached(self) -> Iterator[None]:
        """Inside a `with` block: the model runs without the hooks (generating the tokens a
        forward under them then reads), which are put back after."""
        self.__exit__()
        try:
            yield
        finally:
            self.__enter__()

    def __enter__(self) -> Hooks:
        attached = self._attached
        with contextlib.ExitStack() as stack:  # what is entered here is undone in reverse
            if self.train is not None:
                stack.callback(_restore_modes, [(m, m.training) for m in self.model.modules()])
                self.model.train(self.train)
            stack.callback(attached.remove_handles)
            for hooked in self._hooked.values():
                attached.handles.extend(hooked.attach())
            if "ops" in self.kinds:
                recorder = OpRecorder(self.model, list(self.named), self.ops, self._record_op)
                stack.callback(recorder.remove)
                attached.recorder = stack.enter_context(recorder)
            inside = self._attention_kinds()
            if inside:
                rows = bool(getattr(self._keeper.receiver, "token_rows", False))
                repeat = self._inside.repeat_kv_heads
                tap = AttentionTap(self.modules, inside, self._record_inside, rows, repeat)
                attached.tap = stack.enter_context(tap)
            routed, probs = self._routed_modules()
            if routed:
                routing = RoutingTap(routed, self._record_routing, probs)
                attached.routing = stack.enter_context(routing)
            attached.stack = stack.pop_all()
        return self

    def __exit__(self, *exc: object) -> None:
        self._attached.detach()

    def _attention_kinds(self) -> dict[str, list[str]]:
        """module -> the attention kinds taken of it: those asked of the modules selected by
        name, and those of the standard names selected of it (`attn.hook_z`)."""
        asked: list[str] = [kind for kind in self.kinds if kind in ATTENTION_KINDS]
        kinds = {name: list(asked) for name in self.named} if asked else {}
        for name, sites in self.sites.items():
            for site in sites:
                if site.side in ATTENTION_KINDS and site.side not in kinds.get(name, []):
                    kinds.setdefault(name, []).append(site.side)
        return kinds

    def _routed_modules(self) -> tuple[dict[str, nn.Module], set[str]]:
        """The MoE blocks whose routing is taken: those selected by name for `routing`, and
        those of the standard names selected (`mlp.hook_expert_indices`); and the blocks
        whose router probabilities a standard name takes (`mlp.hook_expert_weights`)."""
        routed = dict(self.named) if "routing" in self.kinds else {}
        probs: set[str] = set()
        for name, sites in self.sites.items():
            if any(site.side in ROUTER_VALUES for site in sites):
                routed[name] = self.modules[name]
            if any(site.side == "router_probs" for site in sites):
                probs.add(name)
        return routed, probs

    def next_batch(self, token_mask: torch.Tensor | None) -> None:
        """The next batch's attention mask ([B, T], 1 for real tokens), when reductions are
        to take its real tokens only (None: every position counts)."""
        self._keeper.next_batch(token_mask)

    def clear(self) -> None:
        """Forget what was captured and start counting calls afresh."""
        self._keeper.clear()
        self._calls.clear()
        if self._attached.recorder is not None:
            self._attached.recorder.clear()

    def stop_early(self, calls: dict[str, int]) -> None:
        """From now on, end each forward once every module has made `calls[module]` calls."""
        self._calls.stop_early(calls)
        self.clear()

    def take(self) -> dict[str, torch.Tensor]:
        """The tensors captured since the last clear, then clear."""
        tensors = self.tensors
        self.clear()
        return tensors

    def _record_op(self, name: str, op: str, value: torch.Tensor) -> None:
        self._hooked[name].record_op(op, value)

    def _record_inside(self, name: str, kind: str, value: torch.Tensor) -> None:
        self._hooked[name].record_inside(kind, value)

    def _record_routing(self, name: str, kind: str, value: torch.Tensor) -> None:
        self._hooked[name].record_routing(kind, value)


def _check_kinds(
    kinds: tuple[CaptureKind, ...], named: Mapping[str, nn.Module], sites: Mapping[str, Site]
) -> None:
    """A selection of standard names alone takes their values: no other kind."""
    if sites and not named and kinds != ("output",):
        first = next(iter(sites))
        raise HookdumpError(
            f"{opt('capture')} {','.join(kinds)} is taken of modules selected by their own "
            f"names; {first!r} is a standard name, one value of module "
            f"{sites[first].module!r}: select that module by its name for more of it"
        )


def _check_routing_reduce(kinds: Sequence[str], reduce: Reduction) -> None:
    """Routing is kept per token: a mean or max of expert ids means nothing."""
    if {"routing", *ROUTER_VALUES} & set(kinds) and reduce != "none":
        raise HookdumpError(
            f"{opt('capture')} routing keeps each token's experts and weights as they are; "
            f"leave {opt('reduce')} {reduce} out (or dump routing in a run of its own)"
        )


@keywords_checked
class Capture:
    """What `hookdump.capture` gives: hooks on the selected modules for a `with` block, and
    what they kept (the engine's controls stay on its `Hooks`)."""

    def __init__(self, hooks: Hooks) -> None:
        self._hooks = hooks

    def __enter__(self) -> Capture:
        self._hooks.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self._hooks.__exit__(*exc)

    @property
    def model(self) -> nn.Module:
        return self._hooks.model

    @property
    def tensors(self) -> dict[str, torch.Tensor]:
        """key -> captured copy, in the order the hooks fired."""
        return self._hooks.tensors

    @property
    def info(self) -> dict[str, KeyInfo]:
        """key -> where its value came from (module, class, kind, call, part, shape)."""
        return self._hooks.info

    @property
    def skipped(self) -> dict[str, Skipped]:
        """key -> a non-tensor value met where a tensor could have been (not stored)."""
        return self._hooks.skipped

    @property
    def modules(self) -> dict[str, nn.Module]:
        """Every hooked module by name, in registration order."""
        return self._hooks.modules

    @property
    def calls(self) -> dict[str, int]:
        """module -> calls it made in this forward (since `clear`)."""
        return self._hooks.calls

    @property
    def running(self) -> list[str]:
        """The hooked modules whose forward has begun and not returned, innermost last (a
        forward that raised: where it was)."""
        return self._hooks.running

    @property
    def finished(self) -> list[str]:
        """The hooked modules that returned, in order."""
        return self._hooks.finished

    def clear(self) -> None:
        """Forget what was captured and start counting calls afresh."""
        self._hooks.clear()

    def take(self) -> dict[str, torch.Tensor]:
        """What was captured since the last `take` or `clear`, and forget it."""
        return self._hooks.take()

    def __repr__(self) -> str:
        return repr(self._hooks)


@keywords_checked
def capture(
    model: nn.Module,
    layers: str | Sequence[str] | None = None,
    exclude: str | Sequence[str] | None = None,
    types: str | Sequence[str] | None = None,
    capture: str | Sequence[str] = ("output",),
    *,
    train: bool | None = None,
    reduce: Reduction = "none",
    ops: str | Sequence[str] | None = None,
    repeat_kv_heads: bool = False,
) -> Capture:
    """Hook the selected modules of `model` for the `with` block; the hooks are removed on
    exit, also on an error or Ctrl-C, and the modules' train/eval modes restored.

    Args:
        model: any `torch.nn.Module`.
        layers: globs over qualified module names (`fnmatch`, case-sensitive, `*` also
            crosses dots; the root module is `__root__`). None: every leaf module.
        exclude: globs of modules to drop after `layers`.
        types: keep only modules whose class name is one of these (`Conv2d`).
        capture: any of `output`, `input`, `grad` (a comma list or a sequence), and `ops`:
            the results of the ops each module's own forward calls (`M:op.add`, see
            `hooks.ops`).
        train: set the mode inside the block (None: leave it as it is).
        reduce: `none`, `mean` or `max` over the spatial dims of `[B, C, H, W]` (and over
            tokens of `[B, T, D]`), or `flatten` to `[B, -1]`.
        ops: with `ops`, globs of the op names kept (none: every op but views).
        repeat_kv_heads: `k`, `v` and `k_pre_rope` of grouped-query attention with each
            key-value head repeated for the query heads that share it.

    Returns:
        A `Capture`: after a forward in the block, `cap.tensors` maps each key (`M`,
        `M:output.0`, `M:input.x`, `M:grad_output.0`, with `@n` for a module's n-th extra
        call) to a copy taken when the hook fired; `cap.info` says where each came from.

    Raises:
        HookdumpError: a pattern that matches nothing (naming the nearest real names), an
            unknown capture kind or reduction.

    Example:
        >>> model = torchvision.models.resnet18().eval()
        >>> with hookdump.capture(model, layers=["layer1.*"]) as cap:
        ...     model(torch.randn(2, 3, 224, 224))
        >>> cap.tensors["layer1.0.relu@1"].shape
        torch.Size([2, 64, 56, 56])
    """
    return Capture(
        Hooks(
            model,
            _as_list(layers),
            _as_list(exclude),
            _as_list(types),
            capture,
            train=train,
            reduce=reduce,
            ops=_as_list(ops),
            repeat_kv_heads=repeat_kv_heads,
        )
    )


def _as_list(value: str | Sequence[str] | None) -> list[str]:
    if value is None:
        return []
    return [value] if isinstance(value, str) else list(value)
