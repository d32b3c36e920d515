"""One hooked module, as TransformerLens' `HookPoint` is one hooked value: what is taken of
it (the kinds asked of it by its name, the standard names selected of it) and the hooks
that take it, a pre-hook for what it receives and a hook for what it returns. The root
(`hooks.capture.Hooks`) makes one per module and attaches them for its block."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from typing import Any, Protocol

import torch
from torch import nn
from torch.utils.hooks import RemovableHandle

from hookdump.choices import ROUTING_KINDS
from hookdump.format.keys import called, tensor_key
from hookdump.hooks.calls import StopForward
from hookdump.hooks.keep import Keeper, Origin
from hookdump.hooks.names import Site
from hookdump.hooks.reduce import channels_first
from hookdump.hooks.selection import module_type_name
from hookdump.hooks.values import flatten


class Attached(Protocol):
    """What the root attached for its block, as a hooked module asks it: whether the hooks
    are on (`handles`), and a block inside which hookdump's own torch calls are not taken
    for the model's ops (`quiet`)."""

    handles: list[RemovableHandle]

    def quiet(self) -> contextlib.AbstractContextManager[None]: ...


class HookedModule:
    """Module `name`'s hooks: `kinds` are taken of it where it was selected by its own name
    (none: only its `sites`, the standard names selected of it)."""

    def __init__(
        self,
        name: str,
        module: nn.Module,
        kinds: Sequence[str],
        sites: Sequence[Site],
        keeper: Keeper,
        attached: Attached,
    ) -> None:
        self.module = module
        self.origin = Origin(name, module_type_name(module), channels_first(module))
        self.kinds = tuple(kinds)
        self.sites = tuple(sites)
        self.keeper, self.calls, self.attached = keeper, keeper.calls, attached
        # its attention pattern, kept under its own key already, and held until its output
        # is seen (a freed pattern's memory may hold the output by then)
        self.pattern: torch.Tensor | None = None

    @property
    def name(self) -> str:
        return self.origin.name

    def attach(self) -> list[RemovableHandle]:
        """Its pre-hook and its hook, registered (the caller removes them)."""
        module = self.module
        before = module.register_forward_pre_hook(self._before(), with_kwargs=True)
        return [before, module.register_forward_hook(self._after())]

    def _before(self) -> Callable[..., None]:
        name, calls, attached = self.name, self.calls, self.attached
        inputs, grads = "input" in self.kinds, "grad" in self.kinds
        sites = [site for site in self.sites if site.side == "input"]

        def hook(module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
            call = calls.enter(name)
            if not (inputs or grads or sites):
                return
            given = [(str(i), arg) for i, arg in enumerate(args)] + list(kwargs.items())
            with attached.quiet():
                for part, arg in given:
                    if inputs:
                        self.keeper.record(self.origin, "input", part, arg, call)
                    if grads:
                        self._hook_grads("grad_input", part, arg, call)
                if sites:
                    first = given[0] if args else ("hidden_states", kwargs.get("hidden_states"))
                    self._keep_sites(sites, first, call)

        return hook

    def _after(self) -> Callable[..., None]:
        name, calls, attached = self.name, self.calls, self.attached
        outputs, grads = "output" in self.kinds, "grad" in self.kinds
        sites = [site for site in self.sites if site.side == "output"]

        def hook(module: nn.Module, args: tuple[Any, ...], output: Any) -> None:
            call = calls.leave(name)
            with attached.quiet():
                if outputs:  # an eager module's weights, kept as `pattern` already
                    kept, self.pattern = self.pattern, None
                    self.keeper.record(self.origin, "output", None, output, call, kept)
                if grads:
                    self._hook_grads("grad_output", None, output, call)
                if sites:
                    self._keep_sites(sites, next(flatten(output)), call)
            if calls.last_needed(name, call):
                raise StopForward

        return hook

    def _keep_sites(self, sites: list[Site], first: tuple[str | None, Any], call: int) -> None:
        """The value standard names take: a module's hidden states, or its output's first."""
        part, value = first
        for site in sites:
            key = called(site.name, call)
            if not isinstance(value, torch.Tensor):
                self.keeper.skip(key, value)
                continue
            self.keeper.keep(self.origin, key, site.side, call, part, value, site.name)

    def _hook_grads(self, kind: str, prefix: str | None, value: Any, call: int) -> None:
        for part, leaf in flatten(value, prefix):
            if isinstance(leaf, torch.Tensor) and leaf.requires_grad:
                key = tensor_key(self.name, kind, part or "0", call)
                leaf.register_hook(self._grad_hook(key, kind, part or "0", call))

    def _grad_hook(
        self, key: str, kind: str, part: str, call: int
    ) -> Callable[[torch.Tensor], None]:
        def hook(grad: torch.Tensor) -> None:
            if self.attached.handles:  # else the block was left before the backward pass
                self.keeper.keep(self.origin, key, kind, call, part, grad)

        return hook

    def record_op(self, op: str, value: torch.Tensor) -> None:
        """The result of an op its own forward called (see `hooks.ops`)."""
        call = self.calls.op_call(self.name, op)
        key = tensor_key(self.name, "op", op, call)
        self.keeper.keep(self.origin, key, "op", call, op, value)

    def record_inside(self, kind: str, value: torch.Tensor) -> None:
        """A value from inside it, an attention module (see `hooks.attention`)."""
        by_name = kind in self.kinds
        self._record_value(kind, value, by_name)
        if by_name and kind == "pattern":
            self.pattern = value

    def record_routing(self, kind: str, value: torch.Tensor) -> None:
        """What its router gave, an MoE block's (see `hooks.routing`)."""
        self._record_value(kind, value, "routing" in self.kinds and kind in ROUTING_KINDS)

    def _record_value(self, kind: str, value: torch.Tensor, by_name: bool) -> None:
        """A value other than its inputs and outputs, under its key where it was selected by
        name for it (`by_name`), and under its standard names."""
        call = self.calls.current(self.name)
        with self.attached.quiet():
            if by_name:
                key = tensor_key(self.name, kind, None, call)
                self.keeper.keep(self.origin, key, kind, call, None, value)
            for site in self.sites:
                if site.side == kind:
                    key = called(site.name, call)
                    self.keeper.keep(self.origin, key, kind, call, None, value, site.name)


def hooked_modules(
    modules: dict[str, nn.Module],
    named: dict[str, nn.Module],
    kinds: Sequence[str],
    sites: dict[str, list[Site]],
    keeper: Keeper,
    attached: Attached,
) -> dict[str, HookedModule]:
    """A `HookedModule` for each module, in registration order (`kinds` taken of those
    `named`)."""
    return {
        name: HookedModule(
            name, module, kinds if name in named else (), sites.get(name, ()), keeper, attached
        )
        for name, module in modules.items()
    }
