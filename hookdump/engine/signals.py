"""Ctrl-C and SIGTERM: the first stops the run where the main thread is, as KeyboardInterrupt
(SIGTERM as `Terminated`), so the finished shards are committed; any later one is ignored,
so that commit cannot be cut short.

SIGTERM is what `kill`, containers, batch schedulers and torchrun's agent send; unhandled,
it ends the process at once, as `kill -9` does. `timeout -s INT` sends two SIGINTs (to the
child, then to its group): the second used to land inside the first one's cleanup.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator
from types import FrameType

EXIT_SIGINT, EXIT_SIGTERM = 130, 143  # 128 + the signal's number, as shells report them


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised in the main thread as Ctrl-C raises KeyboardInterrupt."""


def exit_code(exc: BaseException) -> int:
    """The exit code for an interrupt: 143 for SIGTERM, 130 for Ctrl-C."""
    return EXIT_SIGTERM if isinstance(exc, Terminated) else EXIT_SIGINT


class _Handler:
    """The first signal raises; later ones are only counted."""

    def __init__(self) -> None:
        self.received: list[int] = []

    def __call__(self, signum: int, frame: FrameType | None) -> None:
        self.received.append(signum)
        if len(self.received) == 1:
            raise Terminated() if signum == signal.SIGTERM else KeyboardInterrupt()


_active: _Handler | None = None


@contextlib.contextmanager
def interrupts_once(process_ends: bool = False, force: bool = False) -> Iterator[None]:
    """Inside, SIGINT and SIGTERM act as the module says; the handlers before are put back
    after (`process_ends`, once a signal came: both stay ignored instead, as the process is
    ending, so that none lands between this block and the exit). Each signal is taken over
    only from Python's default: one the caller handles or ignores (SIGINT in a background
    job of a script, under nohup) is left as it is; with `force`, from any handler but
    SIG_IGN (Ray's driver: `ray.init`'s handlers exit at once from wherever the main thread
    waits). A no-op outside the main thread and inside another such block."""
    global _active
    if _active is not None or threading.current_thread() is not threading.main_thread():
        yield
        return
    defaults = {signal.SIGINT: signal.default_int_handler, signal.SIGTERM: signal.SIG_DFL}
    before = {sig: signal.getsignal(sig) for sig in defaults}
    handler = _Handler()
    taken = [
        sig
        for sig, default in defaults.items()
        if before[sig] is default or (force and before[sig] is not signal.SIG_IGN)
    ]
    for sig in taken:
        signal.signal(sig, handler)
    _active = handler
    try:
        yield
    finally:
        _active = None
        for sig in taken:
            again = signal.SIG_IGN if process_ends and handler.received else before[sig]
            signal.signal(sig, signal.SIG_DFL if again is None else again)


def ignore_from_now() -> None:
    """Ignore Ctrl-C and SIGTERM (the process is ending after an interrupt: its teardown
    joins threads and runs atexit callbacks, which a second signal would cut short)."""
    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, signal.SIG_IGN)
