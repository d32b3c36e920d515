"""The request files of one import as a resumable feed (`inputs.python.Resumable`): in the
order of their paths, after the requests a resumed dump holds (never read again), a file the
engine is still writing left for a later import, a bad file one line (or, with `skip_bad`,
left out and listed), and where each row came from: every file read, with its size, for the
manifest's `input`."""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hookdump.errors import HookdumpError, opt, printable
from hookdump.inputs.engine_files import (
    BadEngineFile,
    Layout,
    Request,
    being_written,
    read_request,
    request_id,
)


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
    """The requests of the files `paths` under `source`, read as the import goes."""

    def __init__(
        self, source: Path, paths: Sequence[Path], *, skip_bad: bool, before: Before
    ) -> None:
        self.source, self.paths = source, list(paths)
        self.skip_bad, self.before = skip_bad, before
        self.waiting: list[Path] = []  # being written: left for a later import
        self.skipped: list[dict[str, str]] = []  # {"path", "error"}, as they are met
        # {"id", "path", "bytes"} of every row's file (until `after` is asked: as before)
        self.files: list[dict[str, Any]] = list(before.files.values())

    def after(self, done_ids: Sequence[Any]) -> Iterator[Request]:
        """Every request not among `done_ids` (those a resumed dump holds) nor left out by
        the import before, checked and alike in layout, in the order of their paths."""
        done = {str(i) for i in done_ids}
        by_id = {request_id(path): path for path in self.paths}
        self.files = [self._entry(str(i), by_id.get(str(i))) for i in done_ids]
        layout = Layout()
        for path in self.paths:
            if request_id(path) in done or os.path.abspath(path) in self.before.skipped:
                continue
            if being_written(path):
                self.waiting.append(path)
                continue
            try:
                request = read_request(path)
                layout.check(request)
            except BadEngineFile as exc:
                if not self.skip_bad:
                    raise
                self.skipped.append({"path": os.path.abspath(path), "error": exc.problem})
                continue
            self.files.append(self._entry(request.id, path))
            yield request

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
