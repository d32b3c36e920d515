"""One writer per dump at a URL, on a store with no lock: a lock object under the prefix,
made with a conditional put (`If-None-Match: *`, which S3 honours) so that of two runs
only one makes it. It names its holder (run id, host, process, start time) and is rewritten
every LOCK_BEAT seconds while the run lives; the run removes it when it ends, however it
ends, short of being killed.

A lock left by a killed run is taken over only by `--resume` or `--overwrite`, and only
once it is stale: its process is gone (same host), or it has not been rewritten for
LOCK_STALE seconds (another host). A lock whose last rewrite lies ahead of this host's
clock (the hosts' clocks disagree) is judged by what this run sees instead: taken over
if it is not rewritten while watched for LOCK_WATCH beats."""

from __future__ import annotations

import contextlib
import json
import os
import socket
import threading
import time
import uuid
from dataclasses import asdict, dataclass

from hookdump.errors import HookdumpError, opt
from hookdump.format.names import URL_LOCK
from hookdump.store.folder import process_alive
from hookdump.store.location import StorageError
from hookdump.store.media import Medium

LOCK_BEAT = 60.0  # seconds between rewrites of a live run's lock
LOCK_STALE = 600.0  # a lock not rewritten for this long is a killed run's (other hosts)
LOCK_WATCH = 2.5  # beats a lock from a host whose clock disagrees is watched for a rewrite
_LATEST = 1e11  # seconds since 1970 past any lock's time (the year 5138)


@dataclass(frozen=True)
class Holder:
    """Who holds a dump's lock."""

    run_id: str
    host: str
    pid: int
    started: float
    beat: float  # when the holder last rewrote the lock

    @classmethod
    def parse(cls, raw: bytes) -> Holder | None:
        """The holder a lock object names (None: unreadable, as a killed write leaves it)."""
        try:
            data = json.loads(raw)
            holder = cls(
                str(data["run_id"])[:64],
                str(data["host"])[:100],
                int(data["pid"]),
                float(data["started"]),
                float(data["beat"]),
            )
        except (ValueError, KeyError, TypeError, OverflowError, RecursionError):
            return None
        # numbers no run writes (1e308, a pid past any system's) are a damaged lock
        if not (0 < holder.pid < 1 << 32 and 0 <= holder.started < _LATEST):
            return None
        return holder if 0 <= holder.beat < _LATEST else None

    def encode(self) -> bytes:
        return json.dumps(asdict(self)).encode()

    def alive(self, now: float) -> bool | None:
        """Whether the run may still be writing: its process exists (this host), or its
        lock was rewritten less than LOCK_STALE seconds ago (another host). None: the lock
        says it was rewritten later than now, so the two hosts' clocks disagree and its
        time tells nothing (`UrlLock` then watches it)."""
        if self.host == socket.gethostname():
            return process_alive(self.pid)
        if self.beat > now + LOCK_BEAT:
            return None
        return now - self.beat < LOCK_STALE

    def describe(self) -> str:
        since = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(self.started))
        host = "".join(c if c.isprintable() else "?" for c in self.host)
        run = "".join(c if c.isalnum() else "?" for c in self.run_id)
        return f"run {run} on {host} (pid {self.pid}) since {since}"


class UrlLock:
    """The lock entry of the dump on `medium` (one with no lock of its own: an object
    store's prefix), taken by `take` and given back by `release`. Its run id is the run's."""

    def __init__(self, medium: Medium) -> None:
        self.medium = medium
        self.url = medium.root
        now = time.time()
        self.holder = Holder(uuid.uuid4().hex, socket.gethostname(), os.getpid(), now, now)
        self._held = False
        self._stop = threading.Event()
        self._beat: threading.Thread | None = None

    def take(self, take_over: bool, resumable: bool = True) -> None:
        """Make the lock object, or refuse in one line naming the run that holds it; with
        `take_over` (`--resume`, `--overwrite`), a stale lock is replaced (`resumable`:
        whether the refusal may offer `--resume`: the Ray path has none)."""
        self.medium.refuse_weak_lock("a run")
        if not self._create():
            found = self._read()
            if found is not None and self._alive(found, take_over):
                raise HookdumpError(self._busy(found, take_over))
            if not take_over:
                who = found.describe() if found else "a run whose lock cannot be read"
                finish = f"{opt('resume', True)} to finish its dump, or " if resumable else ""
                raise HookdumpError(
                    f"{opt('out')} {self.url} is locked by {who}, which is gone; pass "
                    f"{finish}{opt('overwrite', True)} to replace it"
                )
            self.medium.delete(URL_LOCK)
            if not self._create():  # another run took it over meanwhile
                again = self._read()
                raise HookdumpError(self._busy(again, take_over) if again else "lost the lock")
        self._held = True
        self._beat = threading.Thread(target=self._keep_alive, name="hookdump-lock", daemon=True)
        self._beat.start()

    def _alive(self, found: Holder, take_over: bool) -> bool:
        """Whether the lock's holder may still be writing. Where its time cannot tell (the
        clocks disagree), and the lock would be taken over: whether the lock is rewritten
        while this run watches it for LOCK_WATCH beats (a live holder rewrites it every
        LOCK_BEAT seconds), its age as this run sees it."""
        alive = found.alive(time.time())
        if alive is not None or not take_over:
            return alive is not False
        until = time.monotonic() + LOCK_WATCH * LOCK_BEAT
        while time.monotonic() < until:
            time.sleep(LOCK_BEAT / 4)
            again = self._read()
            if again is None:
                return False  # released: taking it is a race the conditional put decides
            if again != found:
                return True
        return False

    def _busy(self, holder: Holder, take_over: bool) -> str:
        later = ""
        if take_over and holder.host != socket.gethostname():
            later = f" (a lock not rewritten for {LOCK_STALE:.0f} s is taken over)"
        return (
            f"{opt('out')} {self.url} is being written by {holder.describe()}; wait "
            f"for it to end{later}, or choose another prefix"
        )

    def _create(self) -> bool:
        try:
            return self.medium.put_if_absent(URL_LOCK, self.holder.encode())
        except StorageError as exc:
            raise HookdumpError(f"cannot lock {self.url}: {exc.reason}") from None

    def _read(self) -> Holder | None:
        return Holder.parse(self.medium.read(URL_LOCK, 4096) or b"")

    def _keep_alive(self) -> None:
        """Rewrite the lock every LOCK_BEAT seconds while it is this run's."""
        while not self._stop.wait(LOCK_BEAT):
            with contextlib.suppress(Exception):
                found = self._read()
                if found is None or found.run_id != self.holder.run_id:
                    return  # taken over: stop rewriting it
                # (a read, then a write: a takeover between the two is written over once;
                # the store offers no conditional overwrite through this client)
                beat = Holder(**{**asdict(self.holder), "beat": time.time()})
                self.medium.put(URL_LOCK, beat.encode())

    def release(self) -> None:
        """Remove the lock (the run is over); raises nothing: a lock left behind is taken
        over by the next `--resume` or `--overwrite`."""
        self._stop.set()
        if self._beat is not None:
            self._beat.join()
        if self._held:
            with contextlib.suppress(Exception):
                found = self._read()
                if found is not None and found.run_id == self.holder.run_id:
                    self.medium.delete(URL_LOCK)
            self._held = False
