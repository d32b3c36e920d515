"""The request files of one import as a resumable feed (`inputs.python.Resumable`): in the
order of their paths, after the requests a resumed dump holds (never read again), a file the
engine is still writing left for a later import, a bad file one line (or, with `skip_bad`,
left out and listed), and where each row came from: every file read, with its size, for the
manifest's `input`."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hookdump.errors import HookdumpError, opt, printable
from hookdump.inputs import engine_files, trtllm_files
from hookdump.inputs.engine_files import BadEngineFile, Layout, Request, being_written


@dataclass(frozen=True)
class Format:
    """How an engine's files are found and read: their `suffixes`; `read(path, layers)`,
    the requests a file holds; `named(path)`, the one request a file's name says it holds
    (None: read it to know)."""

    suffixes: tuple[str, ...]
    read: Callable[[Path, int], list[Request]]
    named: Callable[[Path], str] | None = None


FORMATS = {
    "vllm": Format(
        engine_files.SUFFIXES,
        lambda path, _: [engine_files.read_request(path)],
        engine_files.request_id,
    ),
    "trtllm": Format(trtllm_files.SUFFIXES, trtllm_files.read_requests),
}


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
    """The requests of the files `paths` under `source`, read as the import goes, each
    `layers` deep."""

    def __init__(
        self, source: Path, paths: Sequence[Path], how: Format, *, layers: int, skip_bad: bool,
        before: Before,
    ) -> None:  # fmt: skip
        self.source, self.paths, self.how, self.layers = source, list(paths), how, layers
        self.skip_bad, self.before = skip_bad, before
        self.waiting: list[Path] = []  # being written: left for a later import
        self.skipped: list[dict[str, str]] = []  # {"path", "error"}, as they are met
        # {"id", "path", "bytes"} of every row's file (until `after` is asked: as before)
        self.files: list[dict[str, Any]] = list(before.files.values())
        if how.named is not None:
            _one_file_each(self.paths, how.named)

    def after(self, done_ids: Sequence[Any]) -> Iterator[Request]:
        """Every request not among `done_ids` (those a resumed dump holds) nor left out by
        the import before, checked and alike in layout, in the order of their paths."""
        done = {str(i) for i in done_ids}
        named = self.how.named
        by_id = {named(path): path for path in self.paths} if named is not None else {}
        self.files = [self._entry(str(i), by_id.get(str(i))) for i in done_ids]
        seen: dict[str, Path] = {}
        layout = Layout()
        for path in self.paths:
            if named is not None and named(path) in done:
                continue  # never read again
            if os.path.abspath(path) in self.before.skipped:
                continue
            if being_written(path):
                self.waiting.append(path)
                continue
            for request in self._read(path, layout):
                if request.id not in done:
                    _once(seen, request)
                    self.files.append(self._entry(request.id, path))
                    yield request

    def _read(self, path: Path, layout: Layout) -> list[Request]:
        """The requests of `path`, checked and alike in layout (none: skipped as bad)."""
        try:
            requests = self.how.read(path, self.layers)
            for request in requests:
                layout.check(request)
        except BadEngineFile as exc:
            if not self.skip_bad:
                raise
            self.skipped.append({"path": os.path.abspath(path), "error": exc.problem})
            return []
        return requests

    def about(self) -> dict[str, Any]:
        """The manifest's account of the source: its folder and every request's file."""
        return {"source": os.path.abspath(self.source), "files": list(self.files)}

    def _entry(self, rid: str, path: Path | None) -> dict[str, Any]:
        """Request `rid`'s file: as the dump recorded it before, else as found now."""
        if rid in self.before.files:  # as it was when its rows were written
            return self.before.files[rid]
        if path is None or not path.exists():
            return {"id": rid, "path": None, "bytes": None}
        where = path.relative_to(self.source) if path != self.source else Path(path.name)
        return {"id": rid, "path": where.as_posix(), "bytes": path.stat().st_size}


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


def _once(seen: dict[str, Path], request: Request) -> None:
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
