"""`hookdump.follow`: a dump read while it is written, shard by shard as each is committed:
the dump is the queue between a run and a trainer.

The follower reads the manifest (rewritten by the run after every commit), takes the
shards it has not finished, a group of whole shards at a time within `buffer_bytes`, and
gives their rows out in batches as `Dump.batches` does; with `shuffle`, the rows of the
shards in the buffer are mixed (not the whole dump's: what is not written yet cannot be).
It ends when the manifest is complete and every listed shard is done; a run that failed
ends it with the run's error.

Its progress is kept beside the manifest, `follow-NAME.json`: the shards finished, and the
rows given out of the one it was inside. A follower started again with the same name goes
on from there: the shards it had finished are not read again, those it was inside are read
again whole (it says how many rows come again). With `consume`, a shard is deleted once
every row of it was given out, which frees room for a run under `--max-disk`; the run's
manifest then lists it as consumed, and reading it is a one-line error.
"""

from __future__ import annotations

import json
import socket
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from hookdump.errors import HookdumpError, InvalidDump
from hookdump.format.manifest import MANIFEST, RUNNING, ShardEntry
from hookdump.store.folder import process_alive, remove_entry
from hookdump.store.read.batches import BUFFER_BYTES, ROW, PassOptions, check, check_numbers
from hookdump.store.read.dataset import DumpDataset
from hookdump.store.read.dump import Dump
from hookdump.store.read.progress import Progress, follow_file

POLL_S = 0.2  # how often a follower looks for a new shard, or a run for room


def follow(
    path: str | Path,
    keys: list[str],
    batch_size: int,
    *,
    shuffle: bool = False,
    seed: int = 0,
    with_index: bool = False,
    drop_last: bool = False,
    buffer_bytes: int = BUFFER_BYTES,
    consume: bool = False,
    name: str = "default",
    storage_options: Mapping[str, Any] | None = None,
    notice: Callable[[str], None] | None = None,
) -> Iterator[dict[str, torch.Tensor]]:
    """Batches of `keys` from the dump in `path` while it is written (see the module's
    docstring), ending when the run's complete manifest has no shard left.

    Args:
        keys, batch_size, with_index, drop_last: as `Dump.batches` takes them.
        shuffle, seed: mix the rows of the shards in the buffer, in an order fixed by
            `seed`.
        buffer_bytes: the most bytes of rows held (at least one shard).
        consume: delete each shard once all its rows were given out.
        name: the follower's name: its progress is kept under it; two followers of
            different names each get every row.
        storage_options: reserved for dumps at a URL (not followed yet).
        notice: called with a line for the person (default: written to stderr).

    Example:
        >>> for batch in hookdump.follow("acts/", ["h.5"], 4096, shuffle=True, consume=True):
        ...     train_step(batch["h.5"])
    """
    source = _FollowPass(_folder(path, storage_options), keys, consume, name,
                         notice or _to_stderr)  # fmt: skip
    options = PassOptions(batch_size, shuffle, seed, with_index, drop_last,
                          buffer_bytes=buffer_bytes)  # fmt: skip
    source.check(options)  # now, not at the first batch
    return source.batches(options)


def follow_dataset(
    path: str | Path,
    keys: list[str],
    batch_size: int,
    *,
    shuffle: bool = False,
    seed: int = 0,
    with_index: bool = False,
    drop_last: bool = False,
    buffer_bytes: int = BUFFER_BYTES,
    consume: bool = False,
    name: str = "default",
    rank: int | None = None,
    world_size: int | None = None,
) -> DumpDataset:
    """`follow` as a `torch.utils.data.IterableDataset` for DataLoader workers and
    torch.distributed ranks (give the DataLoader `batch_size=None`): each of the `workers x
    ranks` readers follows every n-th shard, so each row goes to one of them; each keeps its
    progress under `NAME.I-of-N`. `rank` and `world_size` default to torch.distributed's."""
    source = _FollowPass(_folder(path, None), keys, consume, name, _to_stderr)
    options = PassOptions(batch_size, shuffle, seed, with_index, drop_last,
                          buffer_bytes=buffer_bytes)  # fmt: skip
    return DumpDataset(source, options, rank, world_size)


def _folder(path: str | Path, storage_options: Mapping[str, Any] | None) -> Path:
    if storage_options is not None or "://" in str(path):
        raise HookdumpError(
            f"hookdump.follow reads a dump in a folder; {path} is a URL, which it does not "
            "follow yet: read it with hookdump.load(...).batches once it is complete"
        )
    return Path(path)


@dataclass(frozen=True)
class _FollowPass:
    """What a follower reads (a `dataset.Pass`): `follow`'s whole pass, or one DataLoader
    worker's or rank's share (`PassOptions.split`), its progress under a name of its own."""

    folder: Path
    keys: list[str]
    consume: bool
    name: str
    say: Callable[[str], None]

    def check(self, options: PassOptions) -> None:
        """What can be checked before the run lists a shard (the keys are checked against
        each manifest read, as `Dump.batches` checks them)."""
        follow_file(self.name)
        check_numbers(options)

    def batches(self, options: PassOptions) -> Iterator[dict[str, torch.Tensor]]:
        index, count = options.split
        name = self.name if count == 1 else f"{self.name}.{index}-of-{count}"
        return _Follower(self, self.folder / follow_file(name), options).batches()


class _Follower:
    def __init__(self, source: _FollowPass, mine: Path, options: PassOptions) -> None:
        self.folder, self.keys, self.say = source.folder, source.keys, source.say
        self.consume, self.mine, self.options = source.consume, mine, options
        self.progress = Progress.read(mine)
        self._delete(self.progress.consumed)
        self._seen: tuple[tuple[int, int, int], Dump] | None = None  # the manifest read last

    def batches(self) -> Iterator[dict[str, torch.Tensor]]:
        how, size = self.options, self.options.batch_size
        again = sum(self.progress.inside.values())
        if again:
            self.say(
                f"follower {self.mine.stem.removeprefix('follow-')!r} goes on in "
                f"{self.folder}: {again} rows of the shards it was inside come again"
            )
        buffer = _Buffer(torch.Generator().manual_seed(how.seed))
        while True:
            dump = self._dump()
            group = self._next_group(dump, {s.file for s in buffer.shards})
            if not group:
                if dump.complete:
                    break
                yield from self._wait(dump, buffer)
                continue
            for shard in group:
                buffer.add(shard, dump.reader.read_shard(shard, self.keys), how.with_index)
            if how.shuffle:
                buffer.shuffle(buffer.rows % size)
            while buffer.rows >= size:
                batch, origin = buffer.take(size)
                yield batch
                self._given(origin, buffer)
        if buffer.rows:
            batch, origin = buffer.take(buffer.rows)
            if not how.drop_last:
                yield batch
            self._given(origin, buffer)

    def _dump(self) -> Dump:
        """The dump as its manifest lists it now (waiting for the first manifest); read
        again only once the run has written a new one (each is a new file, renamed in)."""
        while True:
            try:
                state = (self.folder / MANIFEST).stat()
            except FileNotFoundError:  # the run has not committed a shard yet
                time.sleep(POLL_S)
                continue
            seen = (state.st_ino, state.st_mtime_ns, state.st_size)
            if self._seen is not None and self._seen[0] == seen:
                return self._seen[1]
            try:
                dump = Dump(self.folder)
            except InvalidDump:
                if (self.folder / MANIFEST).exists():
                    raise
                time.sleep(POLL_S)  # replaced meanwhile (an old dump moved aside)
                continue
            run_id = dump.manifest.run_id
            _refuse_overwriting(self.folder, run_id)
            check(dump.reader, self.keys, self.options)  # the keys, as Dump.batches has them
            if not self.progress.follows(run_id):
                raise HookdumpError(
                    f"{self.folder} holds another run's dump than the one follower "
                    f"{self.mine.name} followed (it was overwritten); delete {self.mine} to "
                    "follow the new one from its start"
                )
            self._seen = (seen, dump)
            return dump

    def _next_group(self, dump: Dump, taken: set[str]) -> list[ShardEntry]:
        """The next shards not finished, as many whole ones as `budget` holds (one at least)."""
        done = set(self.progress.finished) | taken
        group: list[ShardEntry] = []
        nbytes = 0
        row = max(1, dump.reader.row_bytes(self.keys))
        reader, readers = self.options.split  # this reader follows every readers-th shard
        for index, shard in enumerate(dump.manifest.shards):
            if shard.file in done or index % readers != reader:
                continue
            size = shard.rows * row
            if group and nbytes + size > self.options.buffer_bytes:
                break
            group.append(shard)
            nbytes += size
        return group

    def _wait(self, dump: Dump, buffer: _Buffer) -> Iterator[dict[str, torch.Tensor]]:
        """No shard to read yet: end with the run's error if it failed; give out the rows
        held back (a short batch) if the run waits for room; then wait a little."""
        failed = dump.manifest.get("failed")
        if isinstance(failed, str):
            raise HookdumpError(f"the run writing {self.folder} failed: {failed[:500]}")
        if buffer.rows and (_running(self.folder) or {}).get("waiting") is True:
            batch, origin = buffer.take(buffer.rows)
            yield batch
            self._given(origin, buffer)
        time.sleep(POLL_S)

    def _given(self, rows: torch.Tensor, buffer: _Buffer) -> None:
        """`rows` (their shards' indices) were given out: note it, finish the shards that
        have none left (deleting them with `consume`), and keep the progress."""
        shards, left = buffer.shards, buffer.left
        indices, counts = torch.unique(rows, return_counts=True)  # the shards in the batch
        gone: list[str] = []
        for index, count in zip(indices.tolist(), counts.tolist(), strict=True):
            left[index] -= count
            shard = shards[index]
            if self.progress.gave(shard.file, shard.rows - left[index], shard.rows, self.consume):
                gone += [shard.file] if self.consume else []
        self.progress.write(self.mine)
        self._delete(gone)

    def _delete(self, files: list[str]) -> None:
        """Delete consumed shards (after the progress that says so is written: a follower
        killed between the two deletes them when it starts again)."""
        for file in files:
            remove_entry(self.folder / file)


class _Buffer:
    """The rows read and not given out yet, each with the index of its shard."""

    def __init__(self, generator: torch.Generator) -> None:
        self.generator = generator
        self.values: dict[str, torch.Tensor] = {}
        self.origin = torch.empty(0, dtype=torch.long)
        self.shards: list[ShardEntry] = []  # every shard read (its rows given out, or held)
        self.left: list[int] = []  # each shard's rows not given out yet

    @property
    def rows(self) -> int:
        return len(self.origin)

    def add(self, shard: ShardEntry, rows: dict[str, torch.Tensor], with_index: bool) -> None:
        if with_index:
            rows[ROW] = torch.arange(shard.start, shard.stop)
        held = self.values
        self.values = {k: torch.cat([held[k], v]) if held else v for k, v in rows.items()}
        self.origin = torch.cat([self.origin, torch.full((shard.rows,), len(self.shards))])
        self.shards.append(shard)
        self.left.append(shard.rows)

    def shuffle(self, back: int) -> None:
        """Mix the rows, but for the last `back` read (held back for the next group: fewer
        than a batch, from the newest shard, so that every other shard can be finished)."""
        given = self.rows - back
        order = torch.cat([torch.randperm(given, generator=self.generator),
                           torch.arange(given, self.rows)])  # fmt: skip
        self.values = {k: v[order] for k, v in self.values.items()}
        self.origin = self.origin[order]

    def take(self, count: int) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
        """The first `count` rows, and their shards' indices."""
        taken = {k: v[:count] for k, v in self.values.items()}
        origin = self.origin[:count]
        self.values = {k: v[count:] for k, v in self.values.items()}
        self.origin = self.origin[count:]
        return taken, origin


def _running(folder: Path) -> dict[str, Any] | None:
    """What the run writing `folder` says of itself (`running.json`: under `--overwrite` or
    `--max-disk`), if anything."""
    try:
        running = json.loads((folder / RUNNING).read_text())
    except (OSError, ValueError):
        return None
    return running if isinstance(running, dict) else None


def _refuse_overwriting(folder: Path, run_id: str | None) -> None:
    """A run under way that will replace the dump in `folder` (`--overwrite`, its first
    shard not committed yet): following the old dump would end in its deletion."""
    running = _running(folder)
    if running is None or not running.get("overwrite"):
        return
    if running.get("run_id") == run_id or not _alive(running):
        return
    raise HookdumpError(
        f"{folder} is being overwritten by another run (pid {running.get('pid')}): the dump "
        "there now is about to be replaced; follow the new one once the run has written its "
        "first shard"
    )


def _alive(running: dict[str, Any]) -> bool:
    """Whether the run that wrote `running` is still going (another host's: assumed)."""
    pid = running.get("pid")
    if running.get("host") != socket.gethostname() or not isinstance(pid, int):
        return True
    return process_alive(pid)


def _to_stderr(line: str) -> None:
    print(line, file=sys.stderr)
