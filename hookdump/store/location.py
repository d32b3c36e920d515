"""A dump at a URL: `s3://bucket/prefix` (the `s3` extra), or any fsspec protocol (`gs://`,
`az://`, `file://`, `memory://`), read with ranged requests through fsspec. A plain path
stays a local folder, handled by `store.folder` and the readers' own `pread`.

Credentials, region and endpoint come from the client's standard environment and config
files (`AWS_ACCESS_KEY_ID`, `AWS_PROFILE`, `AWS_ENDPOINT_URL`, ...); `storage_options` pass
fsspec options. Their values never reach a message: every error from the storage client is
one line with each option's value blanked out.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import Future
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import unquote, urlsplit

from hookdump.errors import HookdumpError, InvalidDump, printable

_URL = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://")
T = TypeVar("T")


def is_url(where: object) -> bool:
    """Whether `where` names a dump by URL (`scheme://...`) rather than a local path (a
    `file://` URL of this host is a local path: `local`)."""
    return isinstance(where, str) and bool(_URL.match(where)) and local(where) == where


def local(where: str | os.PathLike[str]) -> str:
    """`where` as a local path where it is one: `file:///data/d` (or `file://localhost/...`)
    is the folder `/data/d`, so that one place has one lock and one set of notes whichever
    way it is named; anything else as given."""
    text = os.fspath(where)
    if text[:7].lower() != "file://":
        return text
    parts = urlsplit(text)
    if parts.netloc not in ("", "localhost") or parts.query or parts.fragment:
        return text  # another host's, or not a plain path: fsspec's to refuse
    return unquote(parts.path) or "/"


def destination_of(out: str | os.PathLike[str] | None) -> Path | str | None:
    """What `--out` (or `out=`) names, one value from the door down: a local folder (a
    `Path`) or a URL (a `str`); None for no `--out`."""
    if out is None:
        return None
    text = local(out)
    return text if is_url(text) else Path(text)


class StorageError(HookdumpError):
    """A storage client's failure as one line; `reason` is the client's own words (blanked),
    for a caller that says what it was doing in its own terms."""

    def __init__(self, line: str, reason: str = "") -> None:
        super().__init__(line)
        self.reason = reason


class UrlPath(str):
    """A URL that joins like a path (`url / "manifest.json"`), for messages and listings."""

    def __truediv__(self, name: str) -> UrlPath:
        return UrlPath(f"{self.rstrip('/')}/{name}")

    @property
    def name(self) -> str:
        return self.rstrip("/").rsplit("/", 1)[-1]


def parse_storage_options(pairs: list[str] | None) -> dict[str, str]:
    """`--storage-option KEY=VALUE` (repeatable) as fsspec's keyword arguments."""
    options: dict[str, str] = {}
    for pair in pairs or []:
        key, equals, value = pair.partition("=")
        if not equals or not key.strip():
            raise HookdumpError(
                f"--storage-option {key.strip()[:40]!r} is not KEY=VALUE; give it as "
                "--storage-option endpoint_url=http://..."
            )
        options[key.strip()] = value
    return options


_BUCKETS = {"s3", "s3a", "gs", "gcs", "az", "abfs", "abfss"}  # a URL's host is the bucket


def secrets_of(storage_options: Mapping[str, Any], url: str | None) -> list[str]:
    """What is never printed or recorded: every storage option's value, at every depth, and
    the user and password of a URL that has them (longest first, so that one inside another
    is blanked whole)."""
    secrets = [value for value in _leaves(storage_options) if len(value) >= 4]
    parts = urlsplit(url or "")
    if parts.password:
        secrets.append(parts.password)
        if parts.username and len(parts.username) >= 4:
            secrets.append(parts.username)
    return sorted(set(secrets), key=len, reverse=True)


def _leaves(value: object) -> Iterator[str]:
    """Every value inside storage options, at every depth (`client_kwargs={...}`), as text."""
    if isinstance(value, Mapping):
        for inner in value.values():
            yield from _leaves(inner)
    elif isinstance(value, list | tuple | set | frozenset):
        for inner in value:
            yield from _leaves(inner)
    elif value is not None and not isinstance(value, bool):
        yield str(value)


def etag_of(info: Mapping[str, Any]) -> str:
    """An object's ETag as its store's listing gives it (quotes stripped; "" where the
    store gives none): what a manifest records to tell this version of a shard."""
    return str(info.get("ETag") or info.get("etag") or "").strip('"')[:200]


def version_of(info: Mapping[str, Any]) -> str:
    """What tells this version of an object from another: its ETag, else its time."""
    return etag_of(info) or str(info.get("LastModified") or info.get("mtime") or "")


class Remote:
    """A prefix at a URL and the fsspec file system that reaches it."""

    def __init__(self, url: str, storage_options: Mapping[str, Any] | None = None) -> None:
        self._given = url.rstrip("/")
        self._secrets = secrets_of(storage_options or {}, self._given)
        self.url = UrlPath(self.scrub(self._given))
        protocol = self.url.split("://", 1)[0].lower()
        if urlsplit(self._given).password and protocol in _BUCKETS:
            raise HookdumpError(
                f"{self.url}: credentials in a {protocol}:// URL would be taken for the "
                "bucket's name; give them through the client's environment "
                "(AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, a profile) or as storage "
                "options (--storage-option key=... --storage-option secret=...)"
            )
        # a fresh client that lists afresh: a dump may change between two opens
        fresh = {"skip_instance_cache": True, "use_listings_cache": False}
        self._options = fresh | dict(storage_options or {})
        self._fs, self.root = self._connect()
        self.root = self.root.rstrip("/")

    @property
    def fs(self) -> Any:
        """The file system client, made anew in a forked process (a DataLoader worker):
        the storage clients' connections and event loops do not survive a fork."""
        if self._pid != os.getpid():
            self._fs, _ = self._connect()
        return self._fs

    def _connect(self) -> tuple[Any, str]:
        protocol = self.url.split("://", 1)[0].lower()
        self._pid = os.getpid()
        try:
            import fsspec
            from fsspec.core import url_to_fs

            fs, root = url_to_fs(self._given, **self._options)
            return fs, str(root)
        except ImportError as exc:
            # fsspec names the package only in its message: 'requires "paramiko" to be ...'
            quoted = re.search(r'"([A-Za-z0-9_.-]{1,64})"', str(exc))
            package = exc.name or (quoted.group(1) if quoted else "its fsspec client")
            s3 = protocol in ("s3", "s3a")
            fix = "pip install 'hookdump[s3]'" if s3 else f"pip install {package}"
            if exc.name is None and quoted is None:
                fix = f"install it ({printable(str(exc))[:200]})"
            raise HookdumpError(f"{self.url}: {protocol}:// needs {package}: {fix}") from None
        except (ValueError, TypeError) as exc:
            known = ", ".join(sorted(fsspec.available_protocols())[:12])
            raise HookdumpError(
                f"{self.url}: {self.scrub(str(exc))[:200]} (protocols: {known}, ...)"
            ) from None

    def object(self, name: str) -> str:
        """The file system's path of entry `name` under the prefix."""
        return f"{self.root}/{name}"

    def scrub(self, text: str) -> str:
        """`text` with every storage option's value blanked out."""
        for secret in self._secrets:
            text = text.replace(secret, "***")
        return text

    @contextlib.contextmanager
    def failing(
        self,
        what: str,
        error: type[HookdumpError] = StorageError,
        then: str = "",
        passing: tuple[type[Exception], ...] = (),
    ) -> Iterator[None]:
        """The one place a storage client's failure becomes a line: within the block, any
        error but ours is raised as `error("cannot WHAT: REASON" + then)`, every option's
        value blanked out; `passing`: errors the caller handles itself (an entry not
        there)."""
        try:
            yield
        except HookdumpError:
            raise
        except passing:
            raise
        except Exception as exc:  # the clients' errors have no common base: botocore, aiohttp
            reason = self.reason(exc)
            line = f"cannot {what}: {reason}{then}"
            raise (StorageError(line, reason) if error is StorageError else error(line)) from None

    def call(self, what: str, action: Callable[[], T], missing: HookdumpError | None = None) -> T:
        """`action()`, a storage client's failure made one line naming `what` (an entry
        not there: `missing`, if given)."""
        try:
            with self.failing(f"read {what}", InvalidDump, passing=(FileNotFoundError,)):
                return action()
        except FileNotFoundError:
            raise missing or InvalidDump(f"{what} does not exist") from None

    def entries(self) -> list[str]:
        """The names directly under the prefix, sorted (a folder's with a trailing '/'):
        the one listing of a prefix, readers' and writers' alike."""
        try:
            with self.failing(f"list {self.url}", passing=(FileNotFoundError,)):
                listed = list(self.fs.ls(self.root, detail=True, refresh=True))
        except FileNotFoundError:
            return []
        found = []
        for entry in listed:
            path = str(entry.get("name", "")).rstrip("/")
            if path.startswith(self.root + "/"):  # not the prefix itself, as some stores list
                name = path[len(self.root) + 1 :]
                found.append(name + "/" if entry.get("type") == "directory" else name)
        return sorted(found)

    def reason(self, exc: BaseException) -> str:
        """A storage client's error as one short line (its lines joined: botocore's first is
        often only "Parameter validation failed:"), every option's value blanked out."""
        lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
        return self.scrub(" ".join(lines) or type(exc).__name__)[:300]

    def info(self, name: str, missing: HookdumpError | None = None) -> dict[str, Any]:
        """The object's size and what identifies this version of it (ETag, time)."""
        path = self.object(name)
        return self.call(self.url / name, lambda: dict(self.fs.info(path)), missing)

    def fetch(self, name: str, start: int, end: int) -> Future[bytes]:
        """Bytes `start:end` of entry `name`, asked for now and taken later (`take`): on an
        asynchronous client (s3fs, gcsfs, adlfs) the request runs on fsspec's own event
        loop beside the others in flight; on another, it is made here."""
        path = self.object(name)
        if getattr(self.fs, "async_impl", False) and getattr(self.fs, "loop", None):
            coroutine = self.fs._cat_file(path, start=start, end=end)
            return asyncio.run_coroutine_threadsafe(coroutine, self.fs.loop)
        done: Future[bytes] = Future()
        try:
            done.set_result(bytes(self.fs.cat_file(path, start=start, end=end)))
        except Exception as exc:
            done.set_exception(exc)
        return done

    def take(self, name: str, future: Future[bytes]) -> bytes:
        """What `fetch` asked for, a failure made one line naming the entry."""
        return self.call(self.url / name, lambda: bytes(future.result()))

    def read(self, name: str, start: int, end: int) -> bytes:
        """Bytes `start:end` of entry `name` (one ranged request), waited for."""
        return self.take(name, self.fetch(name, start, end))
