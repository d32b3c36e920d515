"""One pattern for every background thread (the sink, the committer, the disk thread, the
tokenizer): a `Worker` handles the jobs handed to it in order, on a thread of its own. Its
first error is kept and raised on the caller's side; later jobs are dropped, not handled.
Every wait on either side is on a condition that the other side signals, never a poll."""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import math
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Generator, Iterator
from typing import Generic, TypeVar

J = TypeVar("J")
T = TypeVar("T")


def _ignore(_: object) -> None:
    pass


class Worker(Generic[J]):
    """A thread that handles the jobs `submit`ted to it, in order.

    Jobs are handled one at a time by `handle(job)`, or, given `group` and `hold`, together:
    `group(jobs)` gets every job queued, once `hold` seconds have passed since the last
    group was handled (and since the start, unless `hold_first` is False), or at once when
    someone `wait`s or `close`s. After the first error (kept, raised by `raise_if_failed`,
    and passed to `on_error` on the worker's thread) every later job goes to `drop`: a job
    given to the worker is handled or dropped, never forgotten."""

    def __init__(
        self,
        name: str,
        handle: Callable[[J], None] | None = None,
        *,
        group: Callable[[list[J]], None] | None = None,
        hold: float | None = None,
        hold_first: bool = True,
        drop: Callable[[J], None] = _ignore,
        on_error: Callable[[BaseException], None] = _ignore,
    ) -> None:
        if (handle is None) == (group is None) or (hold is None) != (group is None):
            raise TypeError("a Worker takes either `handle`, or `group` and `hold`")
        self._handle = group if group is not None else _one_at_a_time(handle)
        self._hold = hold
        self._drop = drop
        self._on_error = on_error
        self._changed = threading.Condition()
        self._jobs: deque[J] = deque()
        self._busy = False  # jobs taken and being handled
        self._hurry = 0  # callers of `wait`: handle what is queued now
        self._closing = False
        self._error: BaseException | None = None
        start = time.monotonic() if hold_first else -math.inf
        self._thread = threading.Thread(target=self._run, args=(start,), name=name, daemon=True)
        self._thread.start()

    @property
    def failed(self) -> bool:
        return self._error is not None

    @property
    def alive(self) -> bool:
        """Whether its thread has not yet ended."""
        return self._thread.is_alive()

    def submit(self, job: J, *, raise_error: bool = True) -> None:
        """Queue `job`; once the worker has failed, raises its error instead (the job is
        then the caller's to drop), or without `raise_error` queues it to be dropped."""
        with self._changed:
            if raise_error:
                self.raise_if_failed()
            if self._closing:
                raise RuntimeError("a job submitted to a closed worker")
            self._jobs.append(job)
            self._changed.notify_all()

    def wait(self) -> None:
        """Wait until every job submitted so far is handled (or dropped); raises the
        worker's error, if any."""
        with self._changed:
            self._hurry += 1
            self._changed.notify_all()
            try:
                while (self._jobs or self._busy) and self._thread.is_alive():
                    self._changed.wait()
            finally:
                self._hurry -= 1
        self.raise_if_failed()

    def close(self, join: bool = True, timeout: float | None = None) -> None:
        """Handle what is queued (or drop it, after an error), then end the thread; raises
        nothing. Without `join`, returns at once (the thread ends on its own); with
        `timeout`, waits that long at most."""
        with self._changed:
            self._closing = True
            self._changed.notify_all()
        if join:
            self._thread.join(timeout)

    def raise_if_failed(self) -> None:
        """Raise the worker's first error, if it had one."""
        if self._error is not None:
            raise self._error

    def _take(self, last: float) -> list[J] | None:
        """The next job (or group of jobs) once it is due; None: closed, nothing left."""
        with self._changed:
            while True:
                timeout = None
                if self._jobs and self._hold is None:
                    self._busy = True
                    return [self._jobs.popleft()]
                if self._jobs and self._hold is not None:
                    timeout = last + self._hold - time.monotonic()
                    if timeout <= 0 or self._hurry or self._closing or self._error is not None:
                        jobs, self._jobs = list(self._jobs), deque()
                        self._busy = True
                        return jobs
                elif self._closing:
                    return None
                self._changed.wait(timeout)

    def _run(self, last: float) -> None:
        one_torch_thread()
        while (jobs := self._take(last)) is not None:
            try:
                if self._error is None:
                    self._handle(jobs)
                else:
                    for job in jobs:
                        self._drop(job)
            except BaseException as exc:  # the handler answers for the jobs it was given
                if self._error is None:
                    self._error = exc
                    with contextlib.suppress(BaseException):
                        self._on_error(exc)
            finally:
                last = time.monotonic()
                with self._changed:
                    self._busy = False
                    self._changed.notify_all()


def _one_at_a_time(handle: Callable[[J], None] | None) -> Callable[[list[J]], None]:
    assert handle is not None

    def handle_one(jobs: list[J]) -> None:
        (job,) = jobs
        handle(job)

    return handle_one


def one_torch_thread() -> None:
    """torch's ops on the calling thread run on it alone, not on a team of OpenMP threads:
    a background thread's small ops (statistics of a piece, a reader's bookkeeping) each woke
    a team that then spun beside the forward's own, on cores the forward needs (issue 43:
    1.9 of a shuffled pass's 3.1 CPU s). Only this thread changes: OpenMP keeps a team size
    per thread, which torch sets on a thread's first ask, so it is asked first. Nothing
    where torch is not imported yet, or no OpenMP runtime is found."""
    torch = sys.modules.get("torch")
    if torch is None:
        return
    torch.get_num_threads()
    with contextlib.suppress(AttributeError, OSError):
        ctypes.CDLL(None).omp_set_num_threads(1)


class Channel(Generic[T]):
    """A bounded hand-over of items from one thread to another: `put` waits while `depth`
    items wait to be taken, and returns False (nothing to do any more) once the reader
    has `leave`n; the reader iterates until the writer `close`s."""

    def __init__(self, depth: int) -> None:
        self._depth = depth
        self._items: deque[T] = deque()
        self._changed = threading.Condition()
        self._closed = False
        self._left = False

    def put(self, item: T) -> bool:
        with self._changed:
            while len(self._items) >= self._depth and not self._left:
                self._changed.wait()
            if self._left:
                return False
            self._items.append(item)
            self._changed.notify_all()
            return True

    def close(self) -> None:
        """No more items: the reader stops once it has taken those waiting."""
        with self._changed:
            self._closed = True
            self._changed.notify_all()

    def leave(self) -> None:
        """The reader stops early: the items waiting are dropped, and `put` returns False."""
        with self._changed:
            self._left = True
            self._items.clear()
            self._changed.notify_all()

    def __iter__(self) -> Iterator[T]:
        while True:
            with self._changed:
                while not self._items and not self._closed:
                    self._changed.wait()
                if not self._items:
                    return
                item = self._items.popleft()
                self._changed.notify_all()
            yield item


# each prefetch's stop and worker, run at exit for those whose thread has not ended: a
# thread inside torch when the interpreter tears down (even freeing a tensor, as it clears
# its last frame) is ended inside a C++ frame that may not unwind, and the process aborts
# ("terminate called without an active exception", SIGABRT)
_running: dict[object, tuple[Callable[[], None], Worker[None]]] = {}
EXIT_JOIN = 30.0  # seconds a prefetch's thread is given to stop at exit


@atexit.register
def _stop_running() -> None:
    for stop, worker in list(_running.values()):
        if worker.alive:
            stop()


def prefetch(
    items: Iterator[T], depth: int, name: str, on_leave: Callable[[], None] = lambda: None
) -> Iterator[T]:
    """`items`, made on a worker thread up to `depth` ahead (off the consumer's path); an
    error there is raised here once the items made before it are taken. A consumer that
    stops early (`break`, an error, Ctrl-C, the iterator dropped) does not wait: the worker
    stops at its next item, and `on_leave` (called then) may stop it sooner. Until the
    thread has ended, the interpreter's exit waits for it (`_stop_running`)."""
    channel: Channel[T] = Channel(depth)

    def produce(_: None) -> None:
        try:
            for item in items:
                if not channel.put(item):
                    return
        finally:
            channel.close()
            if isinstance(items, Generator):  # its own cleanup runs now, on this thread
                items.close()

    worker: Worker[None] = Worker(name, produce)

    def stop(join: bool = True) -> None:
        channel.leave()
        on_leave()
        worker.close(join=join, timeout=EXIT_JOIN)

    running = _running  # a local: at teardown the module's globals may be gone first
    for token, (_, other) in list(running.items()):
        if not other.alive:  # ended: nothing to wait for at exit
            running.pop(token, None)
    token = object()
    running[token] = (stop, worker)
    worker.submit(None)
    finished = False
    try:
        yield from channel
        finished = True
    finally:
        stop(join=finished)
        if finished:
            running.pop(token, None)
    worker.raise_if_failed()
