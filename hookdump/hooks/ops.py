"""`--capture ops`: the results of the tensor operations a selected module's *own* forward
calls (`torch.add`, `+`, `out += identity`, `F.softmax`, `@`), not those of its children.

A `TorchFunctionMode` sees every torch function the forward calls; pre- and post-hooks on
every module of the model keep the stack of modules running, so an op belongs to the
innermost one. hookdump's own work inside its hooks (copies, reductions) is not recorded:
the recorder is paused there. The value is handed over when the op returns (an in-place
op's value after it ran), and copied as every captured value is.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from fnmatch import fnmatchcase
from typing import Any

import torch
from torch import nn
from torch.overrides import TorchFunctionMode
from torch.utils.hooks import RemovableHandle

from hookdump.errors import HookdumpError, did_you_mean, opt

# ops that only look at a tensor, view it or lay it out anew (always excluded: nothing new;
# a `contiguous` of a transposed tensor is a copy, two keys more per GPT-2 attention call)
SKIPPED_OPS = frozenset(
    {"__get__", "__getitem__", "__setitem__", "__format__", "__repr__", "contiguous"}
)

OpSeen = Callable[[str, str, torch.Tensor], None]  # (module, op name, result)


def op_name(func: Any) -> str:
    """torch's name for the op (`add`, `add_`, `softmax`, `matmul`)."""
    return str(getattr(func, "__name__", func))


MAX_CALLED = 256  # op names remembered for the error of --ops matching none


def check_patterns(patterns: Sequence[str], called: set[str]) -> None:
    """After a forward: each `--ops` pattern names an op the selected modules called (a typo
    is an error, as a `--layers` one is)."""
    for pattern in patterns:
        if not any(fnmatchcase(name, pattern) for name in called):
            names = ", ".join(sorted(called)[:12]) or "no op"
            raise HookdumpError(
                f"{opt('ops')} {pattern!r} matches no op the selected modules call "
                f"(they call: {names}){did_you_mean(pattern, called)}"
            )


def _views(result: torch.Tensor, args: Sequence[Any], kwargs: dict[str, Any] | None) -> bool:
    """Whether `result` is a view of one of the op's tensors: it holds nothing new. Under
    `torch.inference_mode` (how a dump runs) `_is_view` is False for every tensor, so the
    memory the result lies in is compared with its inputs' too."""
    if result._is_view():
        return True
    inputs = [*args, *(kwargs or {}).values()]
    inputs += [item for arg in inputs if isinstance(arg, list | tuple) for item in arg]
    storage = result.untyped_storage().data_ptr()
    return any(  # an in-place op returns its input itself: its result is new values
        isinstance(t, torch.Tensor)
        and t is not result
        and t.untyped_storage().data_ptr() == storage
        for t in inputs
    )


class OpRecorder(TorchFunctionMode):
    """While active (a `with` block), calls `seen(module, op, result)` for each floating
    tensor an op of a module in `modules` returns from that module's own code, for op names
    matching one of `patterns` (none: every op but views)."""

    def __init__(
        self, model: nn.Module, modules: Sequence[str], patterns: Sequence[str], seen: OpSeen
    ) -> None:
        super().__init__()
        self._wanted = set(modules)
        self._patterns = tuple(patterns)
        self._seen = seen
        self._running: list[str] = []  # every module of the model now in its forward
        self._paused = 0
        self.called: set[str] = set()  # names of the ops the selected modules called
        self._handles = self._track(model)

    def _track(self, model: nn.Module) -> list[RemovableHandle]:
        handles = []
        try:
            for name, module in model.named_modules():
                label = name or "__root__"
                handles.append(module.register_forward_pre_hook(self._enter(label)))
                handles.append(module.register_forward_hook(self._leave(label)))
        except BaseException:
            for handle in handles:
                handle.remove()
            raise
        return handles

    def _enter(self, name: str) -> Callable[..., None]:
        def hook(module: nn.Module, args: Any) -> None:
            self._running.append(name)

        return hook

    def _leave(self, name: str) -> Callable[..., None]:
        def hook(module: nn.Module, args: Any, output: Any) -> None:
            if name in self._running:  # the innermost entry (recursion-safe)
                del self._running[len(self._running) - 1 - self._running[::-1].index(name)]

        return hook

    def remove(self) -> None:
        """Take the module-tracking hooks off the model."""
        for handle in self._handles:
            handle.remove()
        self._handles.clear()

    def clear(self) -> None:
        """A new forward: no module is running (an interrupted one may have left some)."""
        self._running.clear()

    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        """Inside, ops are not recorded (hookdump's own work in its hooks)."""
        self._paused += 1
        try:
            yield
        finally:
            self._paused -= 1

    def __torch_function__(
        self,
        func: Any,
        types: Any,
        args: Sequence[Any] = (),
        kwargs: dict[str, Any] | None = None,
    ) -> Any:
        result = func(*args, **(kwargs or {}))
        if self._paused or not self._running or self._running[-1] not in self._wanted:
            return result
        if not isinstance(result, torch.Tensor) or not result.is_floating_point():
            return result
        name = op_name(func)
        if name in SKIPPED_OPS or (_views(result, args, kwargs) and not name.endswith("_")):
            return result
        if len(self.called) < MAX_CALLED:
            self.called.add(name)
        if self._patterns and not any(fnmatchcase(name, p) for p in self._patterns):
            return result
        self._paused += 1  # what `seen` does (a copy) is not an op of the model
        try:
            self._seen(self._running[-1], name, result)
        finally:
            self._paused -= 1
        return result
