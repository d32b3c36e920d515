"""What followers of a dump (`hookdump.follow`) keep beside its manifest: each one's
progress, `follow-NAME.json` (the run it follows, the shards it finished and those it
consumed, the rows it gave out of the shards it is inside), and so which shards are gone."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path

from hookdump.errors import HookdumpError
from hookdump.store.folder import write_durably

FOLLOW_FILE = "follow-{}.json"
_NAME = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")


def is_progress(name: str) -> bool:
    """Whether `name` is a follower's progress file (never a run's to remove)."""
    return name.startswith("follow-") and name.endswith((".json", ".json.tmp"))


def follow_file(name: str) -> str:
    """The file a follower named `name` keeps its progress in, beside the manifest."""
    if not isinstance(name, str) or not _NAME.match(name):
        raise HookdumpError(
            f"name={name!r}: a follower's name is 1 to 64 letters, digits, '_', '.' or '-'"
        )
    return FOLLOW_FILE.format(name)


@dataclass
class Progress:
    """A follower's progress: the run it follows, the shards it finished (and deleted, with
    `consume`), and the rows it gave out of the shards it is inside."""

    run_id: str | None = None
    finished: list[str] = field(default_factory=list)
    consumed: list[str] = field(default_factory=list)
    inside: dict[str, int] = field(default_factory=dict)

    @classmethod
    def read(cls, path: Path) -> Progress:
        try:
            data = json.loads(path.read_text())
        except FileNotFoundError:
            return cls()
        except (OSError, ValueError) as exc:
            raise HookdumpError(f"{path} is not a follower's progress ({exc}); delete it") from None
        if not isinstance(data, dict):
            raise HookdumpError(f"{path} is not a follower's progress; delete it")
        return cls(
            data.get("run_id"),
            [str(s) for s in data.get("finished", [])],
            [str(s) for s in data.get("consumed", [])],
            {str(k): int(v) for k, v in dict(data.get("inside", {})).items()},
        )

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

    def write(self, path: Path) -> None:
        write_durably(path, json.dumps(self.__dict__).encode(), durable=False)


def consumed_shards(folder: Path) -> dict[str, str]:
    """Shard file -> the follower that consumed it, from every follower's progress."""
    found: dict[str, str] = {}
    try:
        names = [p.name for p in folder.iterdir() if p.name.startswith("follow-")]
    except OSError:
        return found
    for name in names:
        try:
            progress = Progress.read(folder / name)
        except HookdumpError:
            continue
        for shard in progress.consumed:
            found[shard] = name.removeprefix("follow-").removesuffix(".json")
    return found
