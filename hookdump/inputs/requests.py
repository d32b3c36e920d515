"""The request files of one import as a resumable feed (`inputs.python.Resumable`): in the
order of their paths, after the requests a resumed dump holds (never read again), a file the
engine is still writing left for a later import, a bad file one line (or, with `skip_bad`,
left out and listed), and where each row came from: every file read, with its size, for the
manifest's `input`."""

from __future__ import annotations

import functools
import os
from collections import deque
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import torch

from hookdump.errors import HookdumpError, opt, printable
from hookdump.inputs import engine_files, sample_files, trtllm_files
from hookdump.inputs.engine_files import BadEngineFile, Layout, being_written, will_need
from hookdump.inputs.sample_files import Keys


class Item(Protocol):
    """One sample an engine's file holds: its id, its file, its token ids (None: a sample's
    values, not token rows) and its values, each `[tokens, ...]` (or the sample's own)."""

    @property
    def id(self) -> str: ...

    @property
    def path(self) -> Path: ...

    @property
    def token_ids(self) -> torch.Tensor | None: ...

    def values(self) -> list[torch.Tensor]: ...


@dataclass(frozen=True)
class Format:
    """How an engine's files are found and read: their `suffixes`; `read(path)`, the items
    a file holds, each checked; `alike()`, a fresh check that each item is laid out as the
    first; `named(path)`, the one item a file's name says it holds (None: read it to know)."""

    suffixes: tuple[str, ...]
    read: Callable[[Path], Sequence[Item]]
    alike: Callable[[], Callable[[Any], None]] = lambda: Layout().check
    named: Callable[[Path], str] | None = None
    token_rows: bool = True  # the items' rows are tokens (else: one row an item)


def engine_format(kind: str, layers: int) -> Format:
    """The format of an engine's files (`vllm`, `trtllm`) of `layers` layers each."""
    if kind == "vllm":
        return Format(
            engine_files.SUFFIXES,
            lambda path: [engine_files.read_request(path, layers)],
            named=engine_files.request_id,
        )
    return Format(trtllm_files.SUFFIXES, lambda path: trtllm_files.read_requests(path, layers))


def files_format(keys: Keys, tokens: Mapping[str, torch.Tensor] | None) -> Format:
    """The format of a folder of per-sample safetensors: `keys` of each, and the samples'
    token ids in `tokens` (else in the files, if `keys` names them; else none)."""
    return Format(
        sample_files.SUFFIXES,
        lambda path: [sample_files.read_sample(path, keys, tokens)],
        lambda: sample_files.SampleLayout(keys.names).check,
        engine_files.request_id,
        token_rows=tokens is not None or keys.token_ids is not None,
    )


READ_AHEAD = 4  # files read at once, ahead of the one being kept
READERS = min(4, os.cpu_count() or 1)  # threads that read (decompress, check) them


@dataclass(frozen=True)
class Before:
    """What a resumed dump's manifest says of the import that began it: each request's file
    by id (`input.files`) and the files it left out (`skipped_inputs`), as absolute paths.
    The manifest is untrusted: an entry of any other shape is passed over."""

    files: Mapping[str, dict[str, Any]]
    skipped: frozenset[str]

    @classmethod
    def of(cls, manifest: Mapping[str, Any] | None) -> Before:
        if manifest is None:
            return cls({}, frozenset())
        about = manifest.get("input")
        listed = about.get("files") if isinstance(about, Mapping) else None
        files = {
            entry["id"]: dict(entry)
            for entry in (listed if isinstance(listed, list) else [])
            if isinstance(entry, Mapping)
            and isinstance(entry.get("id"), str)
            and isinstance(entry.get("path"), str)
            and isinstance(entry.get("bytes"), int)
        }
        left = manifest.get("skipped_inputs")
        skipped = frozenset(
            entry["path"]
            for entry in (left if isinstance(left, list) else [])
            if isinstance(entry, Mapping) and isinstance(entry.get("path"), str)
        )
        return cls(files, skipped)


class RequestFeed:
    """The items of the files `paths` under `source`, read as the import goes."""

    def __init__(
        self,
        source: Path,
        paths: Sequence[Path],
        how: Format,
        *,
        skip_bad: bool,
        before: Before,
        listed: Callable[[], int] | None = None,
    ) -> None:
        """`listed`: how many samples the dump lists now, in durable shards: given, each
        file is deleted once all its samples are (`delete_source`)."""
        self.source, self.paths, self.how = source, list(paths), how
        self.skip_bad, self.before = skip_bad, before
        self.waiting: list[Path] = []  # being written: left for a later import
        self.skipped: list[dict[str, str]] = []  # {"path", "error"}, as they are met
        # {"id", "path", "bytes"} of every row's file (until `after` is asked: as before)
        self.files: list[dict[str, Any]] = list(before.files.values())
        self.listed = listed
        self._gone = 0  # the samples whose files were deleted (or kept by a later one)
        if how.named is not None:
            _one_file_each(self.paths, how.named)

    def after(self, done_ids: Sequence[Any]) -> Iterator[Item]:
        """Every request not among `done_ids` (those a resumed dump holds) nor left out by
        the import before, checked and alike in layout, in the order of their paths."""
        done_at = {str(i): index for index, i in enumerate(done_ids)}
        done = done_at.keys()
        named = self.how.named
        by_id = {named(path): path for path in self.paths} if named is not None else {}
        self.files = [self._entry(str(i), by_id.get(str(i))) for i in done_ids]
        seen: dict[str, Path] = {}
        alike = self.how.alike()
        wanted = [
            path
            for path in self.paths
            if not (named is not None and named(path) in done)  # never read again
            and os.path.abspath(path) not in self.before.skipped
        ]
        for path, read in _read_ahead(wanted, self.how.read):
            if read is None:  # the engine is writing it
                self.waiting.append(path)
                continue
            for request in self._checked(path, read, alike):
                if request.id in done:  # read again (a file of several): now its file is known
                    self._found(done_at[request.id], request.id, path)
                    continue
                _once(seen, request)
                self.files.append(self._entry(request.id, path))
                yield request
            if self.listed is not None:  # every request of this file is in `files` now
                self.delete_listed(self.listed())

    def _checked(
        self, path: Path, read: Future[Sequence[Item]], alike: Callable[[Any], None]
    ) -> Sequence[Item]:
        """The items read of `path`, alike in layout (none: skipped as bad)."""
        try:
            items = read.result()
            for item in items:
                alike(item)
        except BadEngineFile as exc:
            if not self.skip_bad:
                raise
            self.skipped.append({"path": os.path.abspath(path), "error": exc.problem})
            return []
        return items

    def delete_listed(self, listed: int) -> None:
        """Delete the source files every sample of which is among the first `listed`, in
        shards the manifest lists (a file of the source as listed, never another path the
        manifest before named)."""
        if listed <= self._gone:
            return
        known = self._by_relative
        later = {entry.get("path") for entry in self.files[listed:]}
        for entry in self.files[self._gone : listed]:
            found = known.get(entry.get("path") or "")
            if found is not None and entry.get("path") not in later:
                found.unlink(missing_ok=True)
        self._gone = listed

    @functools.cached_property
    def _by_relative(self) -> dict[str, Path]:
        """The source's files by their paths as the manifest records them."""
        return {self._relative(path): path for path in self.paths}

    def _found(self, index: int, rid: str, path: Path) -> None:
        """Done request `rid` (sample `index`) was read again from `path`: its file."""
        if self.files[index].get("path") is None:
            self.files[index] = self._entry(rid, path)

    def _relative(self, path: Path) -> str:
        return (
            path.relative_to(self.source) if path != self.source else Path(path.name)
        ).as_posix()

    def about(self) -> dict[str, Any]:
        """The manifest's account of the source: its folder and every request's file."""
        return {"source": os.path.abspath(self.source), "files": list(self.files)}

    def _entry(self, rid: str, path: Path | None) -> dict[str, Any]:
        """Request `rid`'s file: as the dump recorded it before, else as found now."""
        if rid in self.before.files:  # as it was when its rows were written
            return self.before.files[rid]
        if path is None or not path.exists():
            return {"id": rid, "path": None, "bytes": None}
        return {"id": rid, "path": self._relative(path), "bytes": path.stat().st_size}


def _read_ahead(
    paths: Sequence[Path], read: Callable[[Path], Sequence[Item]]
) -> Iterator[tuple[Path, Future[Sequence[Item]] | None]]:
    """Each path with its read (None: the engine is writing it), in order. A compressed
    file is decompressed and checked on a thread, READ_AHEAD at once, while the one before
    it is kept; a plain one is read here when its turn comes (threads only contend with the
    writer's for it: measured), the kernel asked to read it READ_AHEAD files ahead."""
    pool = ThreadPoolExecutor(READERS, thread_name_prefix="hookdump-read")
    pending: deque[tuple[Path, Future[Sequence[Item]] | None]] = deque()
    left = iter(paths)
    try:
        while True:
            while len(pending) < READ_AHEAD and (path := next(left, None)) is not None:
                # the lock is looked at first: a file being written is never read at all
                if being_written(path):
                    pending.append((path, None))
                elif path.name.endswith(".zst"):
                    pending.append((path, pool.submit(read, path)))
                else:
                    will_need(path)
                    pending.append((path, Future()))
            if not pending:
                return
            path, future = pending.popleft()
            if future is not None and not future.done() and not future.running():
                try:  # a plain file: read now, on this thread
                    future.set_result(read(path))
                except Exception as exc:
                    future.set_exception(exc)
            yield path, future
    finally:
        pool.shutdown(wait=False, cancel_futures=True)


def _one_file_each(paths: Sequence[Path], named: Callable[[Path], str]) -> None:
    """Files named for their request: two of one request (in two folders) are refused."""
    seen: dict[str, Path] = {}
    for path in paths:
        other = seen.setdefault(named(path), path)
        if other is not path:
            raise HookdumpError(
                f"{printable(str(other))} and {printable(str(path))} are both request "
                f"{printable(named(path))!r}; import their folders one at a time"
            )


def _once(seen: dict[str, Path], request: Item) -> None:
    """A request id names a sample: two requests may not share one."""
    if request.id in seen:
        raise HookdumpError(
            f"request {printable(request.id)!r} appears twice: in "
            f"{printable(str(seen[request.id]))} and in {printable(str(request.path))}; "
            "import such files one at a time"
        )
    seen[request.id] = request.path


def refuse_overlap(source: Path, out: Path | None) -> None:
    """An import never reads the dump it writes, nor writes among the files it reads."""
    if out is None:
        return
    a, b = Path(os.path.abspath(source)), Path(os.path.abspath(out))
    if a == b or a in b.parents or b in a.parents:
        raise HookdumpError(
            f"{opt('out')} {printable(str(out))} and the source {printable(str(source))} overlap; "
            "write the dump outside the engine's folder"
        )
