"""The calls of one forward as the hooks see them: how many each module made, which run,
which returned, and with early stop when the last one the selection waits for is over
(`StopForward`)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator


class StopForward(BaseException):
    """Raised by a hook once every selected module has made all its calls (early stop).

    A BaseException, so that a model's own `except Exception` cannot swallow it.
    """


class Calls:
    """The calls of one forward: how many each module made, which are running (innermost
    last) and which finished, in order; and with early stop, how many are still to come."""

    def __init__(self) -> None:
        self.counts: dict[str, int] = {}
        self.running: list[str] = []
        self.finished: list[str] = []
        self.stop_after: dict[str, int] | None = None
        self._open: dict[str, list[int]] = {}  # each module's calls not yet returned
        self._to_come = 0
        self.storing = True  # off while only counting calls (see `Capture.counting_only`)
        self._ops: dict[tuple[str, str], int] = {}  # (module, op) -> calls in this forward

    @contextlib.contextmanager
    def counting_only(self) -> Iterator[None]:
        """Inside: calls are counted, no value is stored (`storing` is False)."""
        self.storing = False
        try:
            yield
        finally:
            self.storing = True

    def stop_early(self, calls: dict[str, int]) -> None:
        """From the next `clear` on, a forward ends once each module made `calls[module]`."""
        self.stop_after = {name: n for name, n in calls.items() if n}

    def op_call(self, module: str, op: str) -> int:
        """`module`'s own code called `op`: the call's number in this forward (0 first)."""
        call = self._ops.get((module, op), 0)
        self._ops[(module, op)] = call + 1
        return call

    def enter(self, name: str) -> int:
        """`name` is called: the call's number (0 for its first)."""
        call = self.counts.get(name, 0)
        self.counts[name] = call + 1
        self._open.setdefault(name, []).append(call)
        self.running.append(name)
        return call

    def leave(self, name: str) -> int:
        """`name` returns: the number of the call returning."""
        stack = self._open.get(name)
        call = stack.pop() if stack else self.counts.get(name, 1) - 1
        if name in self.running:
            # remove the innermost entry of this module (recursion-safe)
            del self.running[len(self.running) - 1 - self.running[::-1].index(name)]
        self.finished.append(name)
        return call

    def current(self, name: str) -> int:
        """The number of `name`'s call now running (its innermost)."""
        stack = self._open.get(name)
        return stack[-1] if stack else 0

    def last_needed(self, name: str, call: int) -> bool:
        """Early stop: whether this call was the last one the selection waits for."""
        if not self.stop_after or call >= self.stop_after.get(name, 0):
            return False
        self._to_come -= 1
        return self._to_come == 0

    def clear(self) -> None:
        self.counts.clear()
        self.finished.clear()
        self.running.clear()
        self._open.clear()
        self._ops.clear()
        self._to_come = sum(self.stop_after.values()) if self.stop_after else 0
