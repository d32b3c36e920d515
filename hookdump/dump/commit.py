"""Committing shards in the background, in order: each finished shard is synced, then moved
into place and listed in the manifest, while the next shard is already being written. Done
in line, each sync held the next shard's writes back until the disk had caught up.

Shards are committed together, at most every COMMIT_EVERY seconds from the start of the run
and from the end of the last commit: every commit is a few syncs, and each sync (a cache
flush of the whole disk) slows the writes that overlap it (benchmarks/README.md has the
figures). A crash then loses at most the shards of the last COMMIT_EVERY seconds
(`--resume` writes them again); an error, Ctrl-C or the end of the run commits the
finished shards at once. Over an old dump (`--overwrite`) the first shard is committed at
once, as it is what moves the old dump aside: the disk holds both only until then."""

from __future__ import annotations

import contextlib
import math
import threading
import time

from hookdump.dump.shards import PlannedShard, ShardFile
from hookdump.dump.writer import DumpWriter

COMMIT_EVERY = 30.0  # seconds between commits while shards come (see above)
_Job = tuple[ShardFile | PlannedShard, int, int, int | None]


class Committer:
    """A thread that commits the shards handed to it with `writer`, in order, a group at a
    time (see COMMIT_EVERY). The first error stops it: later shards are dropped, as a gap in
    the dump would be."""

    def __init__(self, writer: DumpWriter) -> None:
        self.writer = writer
        self._changed = threading.Condition()
        self._queued: list[_Job] = []
        self._busy = False  # a group is being committed
        self._hurry = 0  # callers of `wait`: commit what is queued now
        self._stop = False
        self._error: BaseException | None = None
        self._first_at_once = writer.replaces_old_dump()
        self._thread = threading.Thread(target=self._run, name="hookdump-commit", daemon=True)
        self._thread.start()

    def commit(
        self, shard: ShardFile | PlannedShard, start: int, stop: int, sequences: int | None
    ) -> None:
        """Queue `shard` (rows `start:stop`; see `DumpWriter.commit_shards`), or drop it
        and raise the error of an earlier commit."""
        try:
            self.raise_if_failed()
        except BaseException:
            shard.abort()
            raise
        self.writer.fix_keys()  # the first shard's keys are the dump's from now on
        with self._changed:
            self._queued.append((shard, start, stop, sequences))
            self._changed.notify_all()

    def wait(self) -> None:
        """Commit every queued shard now and wait for it; raises the first commit's error."""
        with self._changed:
            self._hurry += 1
            self._changed.notify_all()
            try:
                while (self._queued or self._busy) and self._thread.is_alive():
                    self._changed.wait()
            finally:
                self._hurry -= 1
        self.raise_if_failed()

    def close(self) -> None:
        """Commit what is queued (or drop it, after an error) and stop, raising nothing."""
        with contextlib.suppress(BaseException):
            with self._changed:
                self._stop = True
                self._changed.notify_all()
            self._thread.join()
            self.writer.drop_room()

    def raise_if_failed(self) -> None:
        """Raise the error of a commit that failed, if one did."""
        if self._error is not None:
            raise self._error

    def _next_group(self, last: float) -> list[_Job] | None:
        """The shards to commit next, once it is time (None: stopped, nothing left)."""
        with self._changed:
            while True:
                due = last + COMMIT_EVERY - time.monotonic()
                if self._queued and (due <= 0 or self._hurry or self._stop):
                    group, self._queued = self._queued, []
                    self._busy = True
                    return group
                if self._stop:
                    return None
                self._changed.wait(due if self._queued else None)

    def _run(self) -> None:
        last = -math.inf if self._first_at_once else time.monotonic()
        while (group := self._next_group(last)) is not None:
            try:
                if self._error is None:
                    self.writer.commit_shards(group)
                else:
                    for shard, *_ in group:
                        shard.abort()
            except BaseException as exc:  # commit_shards dropped the shards it did not list
                self._error = exc
            finally:
                last = time.monotonic()
                with self._changed:
                    self._busy = False
                    self._changed.notify_all()
