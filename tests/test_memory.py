"""What may be in flight beside the model (`dump/memory.py`): a release gives back once, and
the waits for room end at once when the worker fails (no polling). Threads are joined with
a generous timeout that only a hang would reach; no test waits on the clock otherwise."""

from __future__ import annotations

import threading

from hookdump.store.write.memory import Budget, Release, Slots

HANG = 60.0


def test_a_release_gives_back_once_and_only_when_not_lent() -> None:
    given: list[int] = []
    release = Release(lambda: given.append(1))
    release()
    release()
    release.unless_lent()
    assert given == [1]
    lent = Release(lambda: given.append(2))
    shard_side = lent.lend()
    lent.unless_lent()  # the owner is done: the shard still holds it
    assert given == [1]
    shard_side()  # the disk has read the bytes
    shard_side()
    assert given == [1, 2]


def _waiting(wait: object) -> tuple[threading.Thread, threading.Event]:
    done = threading.Event()

    def run() -> None:
        wait()  # type: ignore[operator]
        done.set()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, done


def test_a_full_budget_waits_until_bytes_come_back_or_it_is_cancelled() -> None:
    budget = Budget(limit=100)
    budget.take(80)
    thread, done = _waiting(lambda: budget.take(50))
    assert not done.wait(0.2)  # 130 > 100: it waits (a check, not a timing assumption)
    budget.give(80)
    thread.join(HANG)
    assert done.is_set() and budget.used == 50
    thread, done = _waiting(lambda: budget.take(60))  # 110 > 100: waits
    budget.cancel()
    thread.join(HANG)
    assert done.is_set()


def test_slots_wait_for_a_release_or_a_cancel() -> None:
    slots = Slots(1)
    slots.acquire()
    thread, done = _waiting(slots.acquire)
    slots.release()
    thread.join(HANG)
    assert done.is_set()
    thread, done = _waiting(slots.acquire)
    slots.cancel()
    thread.join(HANG)
    assert done.is_set()
