"""What followers of a dump (`hookdump.follow`) keep beside its manifest: each one's
progress, and so which shards are gone.

A follower named NAME keeps two files: `follow-NAME.json`, the run it follows and the
shards it finished and those it consumed, rewritten only when a shard is finished (before
a consumed one is deleted); and `follow-NAME.inside`, the rows it gave out of the shards it
is inside, rewritten after every batch and small (a buffer's shards): so a batch costs a
few bytes however long the dump, and only the count of rows that come again after a kill
rests on the second file."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from hookdump.errors import HookdumpError, printable
from hookdump.format import names
from hookdump.format.names import FOLLOWER_NAME, SHARD_FILE, follower_of, inside_file
from hookdump.store.media import Medium

_MOST_BYTES = 64 << 20  # a progress file's bytes: a shard name each, ~30 bytes


def follow_file(name: str) -> str:
    """The file a follower named `name` keeps its progress in, beside the manifest."""
    if not isinstance(name, str) or not FOLLOWER_NAME.match(name):
        raise HookdumpError(
            f"name={name!r}: a follower's name is 1 to 64 letters, digits, '_', '.' or '-'"
        )
    return names.follow_file(name)


@dataclass
class Progress:
    """A follower's progress: the run it follows, the shards it finished (and deleted, with
    `consume`), and the rows it gave out of the shards it is inside."""

    name: str
    run_id: str | None = None
    finished: list[str] = field(default_factory=list)
    consumed: list[str] = field(default_factory=list)
    inside: dict[str, int] = field(default_factory=dict)

    @classmethod
    def read(cls, where: Medium, name: str) -> Progress:
        """The progress kept under `name`; one that is not what a follower writes (a
        file received with a dump is untrusted: it names the shards deleted with
        `consume`) is a one-line error."""
        file = names.follow_file(name)
        data = _read(where, file)
        progress = cls(
            name,
            _run_id(data, where, file),
            _shards(data, "finished", where, file),
            _shards(data, "consumed", where, file),
        )
        file = inside_file(name)
        rows = _read(where, file)
        if not data:  # killed before it finished a shard
            progress.run_id = _run_id(rows, where, file)
        if rows.get("run_id") == progress.run_id:
            done = set(progress.finished)
            inside = rows.get("inside", {})
            if not isinstance(inside, dict) or not all(
                SHARD_FILE.match(k) and type(v) is int and 0 <= v < 1 << 53
                for k, v in inside.items()
            ):
                raise _damaged(where, file, "inside")
            progress.inside = {k: v for k, v in inside.items() if k not in done}
        return progress

    def follows(self, run_id: str | None) -> bool:
        """Whether the dump's run is the one followed (the first one seen is)."""
        if self.run_id is None:
            self.run_id = run_id
        return self.run_id == run_id

    def gave(self, shard: str, given: int, rows: int, consume: bool) -> bool:
        """`given` of `shard`'s `rows` were given out: whether it is finished (with
        `consume`, noted as consumed: the follower deletes it once this is written)."""
        if given < rows:
            self.inside[shard] = given
            return False
        self.inside.pop(shard, None)
        self.finished.append(shard)
        if consume:
            self.consumed.append(shard)
        return True

    def write(self, where: Medium, finished: bool) -> None:
        """Keep the rows given out, and (`finished`: a shard was) the shards finished."""
        if finished:
            whole = {"run_id": self.run_id, "finished": self.finished, "consumed": self.consumed}
            where.put(names.follow_file(self.name), json.dumps(whole).encode(), durable=False)
        rows = {"run_id": self.run_id, "inside": self.inside}
        where.put(inside_file(self.name), json.dumps(rows).encode(), durable=False)


def _read(where: Medium, file: str) -> dict[str, Any]:
    raw = where.read(file)
    if raw is None:
        return {}
    if len(raw) > _MOST_BYTES:
        raise _damaged(where, file, f"{len(raw)} bytes")
    try:
        data = json.loads(raw)
    except (ValueError, RecursionError) as exc:
        raise _damaged(where, file, str(exc)[:100]) from None
    if not isinstance(data, dict):
        raise _damaged(where, file, "not an object")
    return data


def _run_id(data: dict[str, Any], where: Medium, file: str) -> str | None:
    run_id = data.get("run_id")
    if run_id is not None and not (isinstance(run_id, str) and len(run_id) <= 64):
        raise _damaged(where, file, "run_id")
    return run_id


def _shards(data: dict[str, Any], field_name: str, where: Medium, file: str) -> list[str]:
    """A list of shard file names (a name of anything else is never deleted nor skipped)."""
    names = data.get(field_name, [])
    if not isinstance(names, list) or not all(
        isinstance(n, str) and SHARD_FILE.match(n) for n in names
    ):
        raise _damaged(where, file, field_name)
    return names


def _damaged(where: Medium, file: str, what: str) -> HookdumpError:
    what = printable(what)
    return HookdumpError(f"{where.root / file} is not a follower's progress ({what}); delete it")


def consumed_shards(where: Medium) -> dict[str, str]:
    """Shard file -> the follower that consumed it, from every follower's progress."""
    found: dict[str, str] = {}
    for file in where.names():
        name = follower_of(file)
        if name is None:
            continue
        try:  # the shards finished and consumed: not the rows of those it is inside
            consumed = _shards(_read(where, file), "consumed", where, file)
        except HookdumpError:
            continue
        for shard in consumed:
            found[shard] = name
    return found
