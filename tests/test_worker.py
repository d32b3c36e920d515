"""The one worker-thread pattern on its own: jobs handled in order, the first error raised on
the caller's side and later jobs dropped, waits that end when the other side fails or stops,
grouped jobs, and the prefetching iterator. No sleeps: every race is held by an event."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest

from hookdump.worker import Channel, Worker, prefetch


def test_jobs_are_handled_in_order_and_wait_returns_once_all_are() -> None:
    done: list[int] = []
    worker: Worker[int] = Worker("t", done.append)
    for i in range(100):
        worker.submit(i)
    worker.wait()
    assert done == list(range(100))
    worker.close()
    assert not worker.failed


def test_the_first_error_is_raised_on_the_callers_side_and_later_jobs_are_dropped() -> None:
    handled: list[int] = []
    dropped: list[int] = []
    errors: list[BaseException] = []
    gate = threading.Event()

    def handle(i: int) -> None:
        gate.wait()  # every job is queued before the first is handled
        if i == 1:
            raise ValueError("job 1")
        handled.append(i)

    worker: Worker[int] = Worker("t", handle, drop=dropped.append, on_error=errors.append)
    for i in range(4):
        worker.submit(i)
    gate.set()
    with pytest.raises(ValueError, match="job 1"):
        worker.wait()
    assert handled == [0] and dropped == [2, 3]
    assert [str(e) for e in errors] == ["job 1"]  # told once, on the worker's thread
    with pytest.raises(ValueError, match="job 1"):
        worker.submit(4)  # refused: the caller drops it
    worker.submit(5, raise_error=False)  # queued, then dropped by the worker
    worker.close()
    assert dropped == [2, 3, 5]
    with pytest.raises(ValueError, match="job 1"):
        worker.raise_if_failed()


def test_a_wait_ends_when_the_worker_fails_while_jobs_are_queued() -> None:
    """The caller blocked in `wait` is woken by the failure, not by a timeout."""
    started, release = threading.Event(), threading.Event()

    def handle(i: int) -> None:
        started.set()
        release.wait()
        raise RuntimeError(f"failed at {i}")

    worker: Worker[int] = Worker("t", handle)
    worker.submit(0)
    worker.submit(1)
    started.wait()
    waiter_done = threading.Event()
    caught: list[BaseException] = []

    def waiter() -> None:
        try:
            worker.wait()
        except RuntimeError as exc:
            caught.append(exc)
        waiter_done.set()

    thread = threading.Thread(target=waiter)
    thread.start()
    release.set()
    assert waiter_done.wait(timeout=60)
    thread.join()
    assert [str(e) for e in caught] == ["failed at 0"]
    worker.close()


def test_close_handles_what_is_queued_then_ends_the_thread_and_is_idempotent() -> None:
    done: list[int] = []
    gate = threading.Event()

    def handle(i: int) -> None:
        gate.wait()
        done.append(i)

    worker: Worker[int] = Worker("t", handle)
    for i in range(3):
        worker.submit(i)
    gate.set()
    worker.close()
    worker.close()
    assert done == [0, 1, 2]
    with pytest.raises(RuntimeError, match="closed"):
        worker.submit(3)


def test_grouped_jobs_are_held_until_someone_waits() -> None:
    """With a long hold, queued jobs wait; `wait` commits them at once, as one group."""
    groups: list[list[int]] = []
    worker: Worker[int] = Worker("t", group=groups.append, hold=3600.0)
    for i in range(3):
        worker.submit(i)
    assert groups == []  # (handled only once held long enough, or asked)
    worker.wait()
    assert groups == [[0, 1, 2]]
    worker.submit(3)
    worker.close()  # closing handles the rest at once too
    assert groups == [[0, 1, 2], [3]]


def test_grouped_jobs_go_at_once_without_a_hold_on_the_first() -> None:
    arrived = threading.Event()
    groups: list[list[int]] = []

    def group(jobs: list[int]) -> None:
        groups.append(jobs)
        arrived.set()

    worker: Worker[int] = Worker("t", group=group, hold=3600.0, hold_first=False)
    worker.submit(7)
    assert arrived.wait(timeout=60)  # nobody waited: the first group went unheld
    assert groups == [[7]]
    worker.close()


def test_a_worker_takes_one_kind_of_handler() -> None:
    with pytest.raises(TypeError):
        Worker("t", print, group=print, hold=1.0)  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        Worker("t", group=print)  # type: ignore[arg-type]


def test_a_channel_put_returns_false_once_the_reader_has_left() -> None:
    channel: Channel[int] = Channel(1)
    assert channel.put(1)
    blocked_result: list[bool] = []
    putting = threading.Thread(target=lambda: blocked_result.append(channel.put(2)))
    putting.start()  # waits: the channel is full
    channel.leave()
    putting.join()
    assert blocked_result == [False]
    channel.close()
    assert list(channel) == []


def test_prefetch_yields_every_item_in_order_then_raises_the_producers_error() -> None:
    def items() -> Iterator[int]:
        yield from range(10)
        raise OSError("the corpus went away")

    got: list[int] = []
    with pytest.raises(OSError, match="the corpus went away"):
        for item in prefetch(items(), 3, "t"):
            got.append(item)
    assert got == list(range(10))


def test_prefetch_stops_its_producer_when_the_consumer_stops_early() -> None:
    stopped = threading.Event()
    made: list[int] = []

    def items() -> Iterator[int]:
        try:
            for i in range(1_000_000):
                made.append(i)
                yield i
        finally:
            stopped.set()  # the producer's generator was closed (it ended)

    ahead = prefetch(items(), 2, "t")
    assert next(ahead) == 0
    ahead.close()  # the consumer stops: its producer is told at its next item
    assert stopped.wait(timeout=60)
    assert len(made) < 10
