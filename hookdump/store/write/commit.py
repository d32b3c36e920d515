"""Committing shards in the background, in order: each finished shard is synced, then moved
into place and listed in the manifest, while the next shard is already being written. Done
in line, each sync held the next shard's writes back until the disk had caught up.

Shards are committed together, at most every COMMIT_EVERY seconds from the start of the run
and from the end of the last commit: every commit is a few syncs, and each sync (a cache
flush of the whole disk) slows the writes that overlap it (benchmarks/README.md has the
figures). A crash then loses at most the shards of the last COMMIT_EVERY seconds
(`--resume` writes them again); an error, Ctrl-C or the end of the run commits the
finished shards at once. Over an old dump (`--overwrite`) the first shard is committed at
once, as it is what moves the old dump aside: the disk holds both only until then.

A dump at a URL has no syncs to spare: each shard is uploaded as soon as it is finished,
and a new shard waits while SPOOL_SHARDS are in the spool (`store.write.area`).

Each shard's size and checksum (`store.checksum`) are taken as soon as it is finished, on
threads of their own: a CRC32C is known already (taken as the bytes were written), a
SHA-256 is read back, and taken when its group commits, the last group's would all be read
at the end of the run, one after the other."""

from __future__ import annotations

import contextlib
import threading
from concurrent.futures import Future, ThreadPoolExecutor

from hookdump.format.rows import Rows
from hookdump.store.checksum import Checksum
from hookdump.store.write.shards import PlannedShard, ShardFile
from hookdump.store.write.writer import DumpWriter
from hookdump.worker import Worker

COMMIT_EVERY = 30.0  # seconds between commits while shards come (see above)
# shards hashed at once: SHA-256 reads 1.9 GB/s a core at best, and a run that keeps the
# cores busy leaves a backlog to its end (benchmarks/README.md, issue 44)
HASHERS = 2
_Job = tuple[ShardFile | PlannedShard, Rows, "Future[Checksum]"]


def _drop(job: _Job) -> None:
    job[0].abort()


class Committer:
    """Commits the shards handed to it with `writer`, in order, a group at a time (see
    COMMIT_EVERY), on a worker thread, each once its checksum is taken (HASHERS threads).
    The first error stops it: later shards are dropped, as a gap in the dump would be."""

    def __init__(self, writer: DumpWriter, prompt: bool = False) -> None:
        """`prompt`: each shard committed as soon as it is checksummed, never held for a
        group (a follower reads them: `--max-disk`)."""
        self.writer = writer
        place = writer.place
        # the shards queued or being committed, at most (besides the one being written)
        self._room = threading.Semaphore(place.in_flight or 1 << 30)
        self._queued = _Count()  # the shards handed over and not listed (or dropped) yet
        self._hashing = ThreadPoolExecutor(HASHERS, thread_name_prefix="hookdump-checksum")
        self._worker: Worker[_Job] = Worker(
            "hookdump-commit",
            group=self._commit,
            hold=COMMIT_EVERY if place.groups_commits and not prompt else 0.0,
            hold_first=not writer.replaces_old_dump(),
            drop=self._drop,
        )

    def _commit(self, jobs: list[_Job]) -> None:
        try:
            try:
                for job in jobs:
                    job[2].result()
            except BaseException:
                for job in jobs:
                    _drop(job)
                raise
            # drops the shards of its group it did not list
            self.writer.commit_shards([(shard, rows) for shard, rows, _ in jobs])
        finally:
            self._queued.add(-len(jobs))
            self._room.release(len(jobs))

    def _drop(self, job: _Job) -> None:
        try:
            _drop(job)
        finally:
            self._queued.add(-1)
            self._room.release()

    def commit(self, shard: ShardFile | PlannedShard, rows: Rows) -> None:
        """Queue `shard`, holding `rows` (see `DumpWriter.commit_shards`), or drop it and
        raise the error of an earlier commit."""
        try:
            self.raise_if_failed()
            self.writer.fix_keys()  # the first shard's keys are the dump's from now on
            self._room.acquire()
            self._queued.add(1)
            try:
                taken = self._hashing.submit(shard.take_checksum, self.writer.checksum)
                self._worker.submit((shard, rows, taken))
            except BaseException:
                self._queued.add(-1)
                self._room.release()
                raise
        except BaseException:
            shard.abort()
            raise

    def wait(self) -> None:
        """Commit every queued shard now and wait for it; raises the first commit's error."""
        self._worker.wait()

    @property
    def queued(self) -> int:
        """The shards handed over and not yet listed: on disk, not in the manifest."""
        return self._queued.value

    def close(self) -> None:
        """Commit what is queued (or drop it, after an error) and stop, raising nothing."""
        with contextlib.suppress(BaseException):
            self._worker.close()
            self.writer.drop_room()
        self._hashing.shutdown(wait=True, cancel_futures=True)

    def raise_if_failed(self) -> None:
        """Raise the error of a commit that failed, if one did."""
        self._worker.raise_if_failed()


class _Count:
    """An integer two threads change."""

    def __init__(self) -> None:
        self.value = 0
        self._lock = threading.Lock()

    def add(self, delta: int) -> None:
        with self._lock:
            self.value += delta
