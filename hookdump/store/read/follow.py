"""`hookdump.follow`: a dump read while it is written, shard by shard as each is committed:
the dump is the queue between a run and a trainer.

The follower reads the manifest (rewritten by the run after every commit; under torchrun,
each rank's own until rank 0 joins them), in a folder or at a URL, takes the
shards it has not finished, a group of whole shards at a time within `buffer_bytes`, and
gives their rows out in batches as `Dump.batches` does; with `shuffle`, the rows of the
shards in the buffer are mixed (not the whole dump's: what is not written yet cannot be).
It ends when the manifest is complete and every listed shard is done; a run that failed
ends it with the run's error.

Its progress is kept beside the manifest (`store.read.progress`): the shards finished, and
the rows given out of the ones it was inside. A follower started again with the same name goes
on from there: the shards it had finished are not read again, those it was inside are read
again whole (it says how many rows come again). With `consume`, a shard is deleted once
every row of it was given out, which frees room for a run under `--max-disk`; the run's
manifest then lists it as consumed, and reading it is a one-line error.
"""

from __future__ import annotations

import time
import zlib
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from hookdump.errors import HookdumpError, InvalidDump, keywords_checked, opt, to_stderr
from hookdump.format.manifest import ShardEntry
from hookdump.format.names import (
    MANIFEST,
    RANK_MANIFEST,
    SHARD_FILE,
    WAITING_FILE,
    follow_lock,
    inside_file,
)
from hookdump.store.location import UrlPath
from hookdump.store.media import Medium, open_medium
from hookdump.store.notes import note_alive, running_note
from hookdump.store.read.batches import (
    BUFFER_BYTES,
    ROW,
    PassOptions,
    as_keys,
    check,
    check_numbers,
)
from hookdump.store.read.dataset import DumpDataset
from hookdump.store.read.manifest import manifest_at
from hookdump.store.read.progress import Progress, follow_file
from hookdump.store.read.reader import ShardReader

WAIT_NOTICE_S = 5.0  # with no dump there this long, a follower says what it waits for


@keywords_checked
def follow(
    path: str | Path,
    keys: list[str] | str,
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
    timeout: float | None = None,
) -> Iterator[dict[str, torch.Tensor]]:
    """Batches of `keys` from the dump in `path` while it is written (see the module's
    docstring), ending when the run's complete manifest has no shard left.

    Args:
        path: the dump's folder or URL (`s3://bucket/prefix`, any fsspec protocol).
        keys, batch_size, with_index, drop_last: as `Dump.batches` takes them.
        shuffle, seed: mix the rows of the shards in the buffer, in an order fixed by
            `seed`.
        buffer_bytes: the most bytes of rows held (at least one shard).
        consume: delete each shard once all its rows were given out.
        name: the follower's name: its progress is kept under it; two followers of
            different names each get every row.
        storage_options: fsspec options for a URL (as `hookdump.load` takes them).
        notice: called with a line for the person (default: written to stderr); among
            them, after WAIT_NOTICE_S seconds with no dump there, what it waits for.
        timeout: stop with a one-line error after this many seconds with no new shard
            (None: wait as long as the run takes).

    Example:
        >>> key = "blocks.5.hook_resid_post"  # --layers resid_post.5
        >>> for batch in hookdump.follow("acts/", [key], 4096, shuffle=True, consume=True):
        ...     train_step(batch[key])
    """
    source = _FollowPass(
        open_medium(path, storage_options),
        as_keys(keys),
        consume,
        name,
        notice or to_stderr,
        timeout,
    )
    options = PassOptions(
        batch_size, shuffle, seed, with_index, drop_last, buffer_bytes=buffer_bytes
    )
    source.check(options)  # now, not at the first batch
    return source.batches(options)


@keywords_checked
def follow_dataset(
    path: str | Path,
    keys: list[str] | str,
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
    rank: int | None = None,
    world_size: int | None = None,
    timeout: float | None = None,
) -> DumpDataset:
    """`follow` as a `torch.utils.data.IterableDataset` for DataLoader workers and
    torch.distributed ranks (give the DataLoader `batch_size=None`): each of the `workers x
    ranks` readers follows every n-th shard, so each row goes to one of them; each keeps its
    progress under `NAME.I-of-N`. `rank` and `world_size` default to torch.distributed's."""
    source = _FollowPass(
        open_medium(path, storage_options), as_keys(keys), consume, name, to_stderr, timeout
    )
    options = PassOptions(
        batch_size, shuffle, seed, with_index, drop_last, buffer_bytes=buffer_bytes
    )
    return DumpDataset(source, options, rank, world_size)


@dataclass(frozen=True)
class _FollowPass:
    """What a follower reads (a `dataset.Pass`): `follow`'s whole pass, or one DataLoader
    worker's or rank's share (`PassOptions.split`), its progress under a name of its own."""

    where: Medium
    keys: list[str]
    consume: bool
    name: str
    say: Callable[[str], None]
    timeout: float | None = None

    def check(self, options: PassOptions) -> None:
        """What can be checked before the run lists a shard (the keys are checked against
        each manifest read, as `Dump.batches` checks them)."""
        follow_file(self.name)
        check_numbers(options)
        timeout = self.timeout
        if timeout is not None and (
            isinstance(timeout, bool) or not isinstance(timeout, int | float) or not timeout > 0
        ):
            raise HookdumpError(
                f"timeout={timeout!r} must be a number of seconds above 0, "
                "or None to wait as long as the run takes"
            )
        if isinstance(self.where.root, Path) and self.where.root.is_file():
            raise HookdumpError(
                f"{self.where.root} is a file, not a dump's folder; "
                "give the folder a run writes (--out)"
            )

    def batches(self, options: PassOptions) -> Iterator[dict[str, torch.Tensor]]:
        index, count = options.split
        name = self.name if count == 1 else f"{self.name}.{index}-of-{count}"
        return _Follower(self, name, options).batches()


@dataclass(frozen=True)
class _Listing:
    """The shards the run has listed so far, each with the reader of its manifest (one
    manifest, or a torchrun rank's each until rank 0 joins them)."""

    shards: list[tuple[ShardEntry, ShardReader]]
    complete: bool
    failed: str | None
    run_id: str | None
    processes: int  # torchrun's, 1 without
    joined: bool  # the dump's own manifest (not the torchrun ranks' yet)

    def row_bytes(self, keys: list[str]) -> int:
        return max([1] + [reader.row_bytes(keys) for _, reader in self.shards[:1]])


class _Follower:
    def __init__(self, source: _FollowPass, name: str, options: PassOptions) -> None:
        self.where, self.keys, self.say = source.where, source.keys, source.say
        self.consume, self.name, self.options = source.consume, name, options
        self.timeout = source.timeout
        self.progress = Progress(name)  # read once the dump is there and this one holds it
        self._seen: tuple[object, _Listing] | None = None  # the manifests read last
        self._since = time.monotonic()  # of the last new shard (or the start)

    def batches(self) -> Iterator[dict[str, torch.Tensor]]:
        listing = self._listing()  # the dump is there: its progress and lock are beside it
        who = f"follower {self.name!r}"
        with self.where.hold(follow_lock(self.name), who):
            self.progress = Progress.read(self.where, self.name)
            self._check(listing)  # again, against the run the progress read follows
            rows = {shard.file: shard.rows for shard, _ in listing.shards}
            if any(given > rows.get(file, given) for file, given in self.progress.inside.items()):
                raise HookdumpError(
                    f"{self.where.root / inside_file(self.name)} is not a follower's "
                    "progress (more rows given out of a shard than it holds); delete it"
                )
            if self.consume:  # a follower killed after noting them, before deleting them
                listed = {shard.file for shard, _ in listing.shards}
                self._delete([f for f in self.progress.consumed if f in listed])
            yield from self._batches()

    def _batches(self) -> Iterator[dict[str, torch.Tensor]]:
        how, size = self.options, self.options.batch_size
        again = sum(self.progress.inside.values())
        if again:
            self.say(
                f"follower {self.name!r} goes on in {self.where.root}: {again} rows of the "
                "shards it was inside come again"
            )
        buffer = _Buffer(torch.Generator().manual_seed(how.seed))
        while True:
            listing = self._listing()
            group = self._next_group(listing, {s.file for s in buffer.shards})
            if not group:
                if listing.complete:
                    break
                yield from self._wait(listing, buffer)
                continue
            self._since = time.monotonic()
            for shard, reader in group:
                buffer.add(shard, reader.read_shard(shard, self.keys), how.with_index)
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

    def _listing(self) -> _Listing:
        """The shards as the run lists them now (waiting for its first manifest); read
        again only once the run has written a new manifest (each a new file or object)."""
        told = False
        while True:
            names, seen = self._versions()
            if not names:  # the run has not committed a shard yet
                waited = time.monotonic() - self._since
                if not told and waited >= WAIT_NOTICE_S:
                    told = True
                    self.say(
                        f"no dump at {self.where.root} yet; waiting for a run to write "
                        "its first shard there"
                    )
                self._give_up()
                time.sleep(self.where.poll_s)
                continue
            if self._seen is not None and self._seen[0] == seen:
                return self._seen[1]
            try:
                listing = self._read(names)
            except InvalidDump:
                if self._versions()[1] != seen:
                    continue  # replaced meanwhile (joined, or an old dump moved aside)
                raise
            self._check(listing)
            self._seen = (seen, listing)
            return listing

    def _versions(self) -> tuple[list[str], object]:
        """The manifests to read (the dump's, else the torchrun ranks'), and their versions."""
        version = self.where.version(MANIFEST)
        if version is not None:
            return [MANIFEST], version
        names = [n for n in self.where.names() if RANK_MANIFEST.match(n)]
        return names, tuple((n, self.where.version(n)) for n in names)

    def _read(self, names: list[str]) -> _Listing:
        def missing(url: Path | UrlPath) -> HookdumpError:
            return InvalidDump(f"{url} has no manifest")

        where = self.where
        readers = [ShardReader(where, manifest_at(where, missing, name)) for name in names]
        joined = names == [MANIFEST]
        first = readers[0].manifest
        failed = [r.manifest.get("failed") for r in readers if r.manifest.get("failed")]
        world = first.get("processes")
        world = world if isinstance(world, int) and world > 0 else 1
        return _Listing(
            shards=sorted(
                ((s, r) for r in readers for s in r.shards),
                key=lambda listed: _order(listed[0].file, world),
            ),
            complete=joined and first.complete,
            failed=str(failed[0]) if failed else None,
            run_id=first.run_id,
            processes=world,
            joined=joined,
        )

    def _check(self, listing: _Listing) -> None:
        """The run followed, and the keys as `Dump.batches` has them."""
        _refuse_overwriting(self.where, listing.run_id)
        if not self.progress.follows(listing.run_id):
            raise HookdumpError(
                f"{self.where.root} holds another run's dump than the one follower "
                f"{self.name!r} followed (it was overwritten); delete "
                f"{self.where.root / follow_file(self.name)} to follow the new one from its start"
            )
        for reader in {id(r): r for _, r in listing.shards}.values():
            check(reader, self.keys, self.options)
        if not listing.joined and self.options.with_index:
            raise HookdumpError(
                f"{self.where.root} is written by {listing.processes} torchrun processes, whose "
                f"rows are numbered when the run ends; follow it without "
                f"{opt('with_index', True)}, or read it with Dump.batches once it is complete"
            )

    def _next_group(
        self, listing: _Listing, taken: set[str]
    ) -> list[tuple[ShardEntry, ShardReader]]:
        """The next shards not finished, as many whole ones as `budget` holds (one at least)."""
        done = set(self.progress.finished) | taken
        group: list[tuple[ShardEntry, ShardReader]] = []
        nbytes = 0
        row = listing.row_bytes(self.keys)
        reader, readers = self.options.split  # this reader follows every readers-th shard
        for shard, opened in listing.shards:
            if shard.file in done or _share(shard.file, listing.processes) % readers != reader:
                continue
            size = shard.rows * row
            if group and nbytes + size > self.options.buffer_bytes:
                break
            group.append((shard, opened))
            nbytes += size
        return group

    def _wait(self, listing: _Listing, buffer: _Buffer) -> Iterator[dict[str, torch.Tensor]]:
        """No shard to read yet: end with the run's error if it failed; give out the rows
        held back (a short batch) if the run waits for room; then wait a little."""
        if listing.failed is not None:
            raise HookdumpError(f"the run writing {self.where.root} failed: {listing.failed[:500]}")
        if buffer.rows and any(WAITING_FILE.match(n) for n in self.where.names()):
            batch, origin = buffer.take(buffer.rows)
            yield batch
            self._given(origin, buffer)
        self._give_up()
        time.sleep(self.where.poll_s)

    def _give_up(self) -> None:
        """Stop once `timeout` seconds passed with no new shard."""
        if self.timeout is not None and time.monotonic() - self._since > self.timeout:
            what = "no dump there yet" if self._seen is None else "no new shard"
            raise HookdumpError(
                f"follower {self.name!r} of {self.where.root}: {what} for {self.timeout:g} s "
                "(timeout); is the run writing there still going?"
            )

    def _given(self, rows: torch.Tensor, buffer: _Buffer) -> None:
        """`rows` (their shards' indices) were given out: note it, finish the shards that
        have none left (deleting them with `consume`), and keep the progress."""
        shards, left = buffer.shards, buffer.left
        indices, counts = torch.unique(rows, return_counts=True)  # the shards in the batch
        finished: list[str] = []
        for index, count in zip(indices.tolist(), counts.tolist(), strict=True):
            left[index] -= count
            shard = shards[index]
            if self.progress.gave(shard.file, shard.rows - left[index], shard.rows, self.consume):
                finished.append(shard.file)
        self.progress.write(self.where, bool(finished))
        if self.consume:
            self._delete(finished)

    def _delete(self, files: list[str]) -> None:
        """Delete consumed shards (after the progress that says so is written: a follower
        killed between the two deletes them when it starts again)."""
        for file in files:
            self.where.delete(file)


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
        order = torch.cat(
            [torch.randperm(given, generator=self.generator), torch.arange(given, self.rows)]
        )
        self.values = {k: v[order] for k, v in self.values.items()}
        self.origin = self.origin[order]

    def take(self, count: int) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
        """The first `count` rows, and their shards' indices."""
        taken = {k: v[:count] for k, v in self.values.items()}
        origin = self.origin[:count]
        self.values = {k: v[count:] for k, v in self.values.items()}
        self.origin = self.origin[count:]
        return taken, origin


def _order(file: str, processes: int) -> tuple[int, str]:
    """Where a shard comes in a follower's pass: in the order the run wrote them (a torchrun
    rank's n-th after every rank's (n-1)-th), whichever manifests list them."""
    found = SHARD_FILE.match(file)
    if found is None or found["part"] is not None:
        return 1 << 62, file
    return int(found["index"]) * max(1, processes) + int(found["rank"] or 0), file


def _share(file: str, processes: int) -> int:
    """The number that says which reader of a split pass (`follow_dataset`) takes a shard:
    the same in every listing of it, a rank's part or the joined manifest."""
    number, _ = _order(file, processes)
    return number if number < 1 << 62 else zlib.crc32(file.encode())


def _refuse_overwriting(where: Medium, run_id: str | None) -> None:
    """A run under way that will replace the dump there (`--overwrite`, its first shard
    not committed yet): following the old dump would end in its deletion."""
    running = running_note(where)
    if running is None or not running.get("overwrite"):
        return
    if running.get("run_id") == run_id or not note_alive(running):
        return
    raise HookdumpError(
        f"{where.root} is being overwritten by another run (pid {running.get('pid')}): the "
        "dump there now is about to be replaced; follow the new one once the run has written "
        "its first shard"
    )
