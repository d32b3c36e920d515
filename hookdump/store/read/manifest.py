"""A manifest read from disk: a regular file inside its folder, of sane size, checked into a
`Manifest` record before anything else reads it."""

from __future__ import annotations

import json
import os
import stat
from collections.abc import Callable
from pathlib import Path

from hookdump.errors import HookdumpError, InvalidDump
from hookdump.format.manifest import Manifest
from hookdump.format.names import MANIFEST
from hookdump.store.folder import resolved_inside
from hookdump.store.location import Remote, UrlPath

MAX_MANIFEST_BYTES = 1 << 30
# what parsing a manifest may build, whatever its bytes: JSON's small objects cost 20 to 70
# times their text, so the values (commas) and containers are counted before the parse
MAX_MANIFEST_VALUES = 32_000_000
MAX_MANIFEST_CONTAINERS = 4_000_000


def read_manifest(path: Path) -> Manifest:
    """Read and check a manifest: a regular file inside its folder (never a FIFO, a device
    or a link out of the folder), of sane size, holding a valid manifest."""
    resolved_inside(path, path.parent, "manifest")
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        raise InvalidDump(f"cannot read {path}: {exc.strerror or exc}") from None
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode):  # before fdopen, which refuses a folder on its own
        os.close(fd)
        raise InvalidDump(f"{path} is not a regular file; refused")
    with os.fdopen(fd, "rb") as file:
        if info.st_size > MAX_MANIFEST_BYTES:
            raise InvalidDump(f"{path} is {info.st_size} bytes, too large for a manifest")
        data = file.read(info.st_size + 1)  # never a buffer of the largest size allowed
    return parse_manifest(data, str(path))


def read_remote_manifest(
    remote: Remote, missing: Callable[[UrlPath], HookdumpError], name: str = MANIFEST
) -> Manifest:
    """The manifest under a URL (`name`: a torchrun rank's), read and checked as a local one
    is (`missing(url)`: the error where there is none)."""
    where = remote.url / name
    info = remote.info(name, missing=missing(remote.url))
    size = int(info.get("size") or 0)
    if info.get("type", "file") != "file":
        raise InvalidDump(f"{where} is not a file; refused")
    if size > MAX_MANIFEST_BYTES:
        raise InvalidDump(f"{where} is {size} bytes, too large for a manifest")
    return parse_manifest(remote.read(name, 0, size), str(where))


def manifest_at(
    root: Path | UrlPath,
    name: str,
    remote: Remote | None,
    missing: Callable[[UrlPath], HookdumpError],
) -> Manifest:
    """Manifest `name` of a dump in a folder, or under a URL (`remote`: its client)."""
    if remote is not None:
        return read_remote_manifest(remote, missing, name)
    assert isinstance(root, Path)
    return read_manifest(root / name)


def parse_manifest(data: bytes, path: str) -> Manifest:
    """A manifest's bytes (read from `path`), bounded before they are parsed, checked after."""
    values = data.count(b",") + 1
    containers = data.count(b"{") + data.count(b"[")
    if values > MAX_MANIFEST_VALUES or containers > MAX_MANIFEST_CONTAINERS:
        raise InvalidDump(
            f"{path} holds {values:,} values and {containers:,} objects and lists, more than "
            f"a manifest may ({MAX_MANIFEST_VALUES:,} and {MAX_MANIFEST_CONTAINERS:,}); refused"
        )
    try:
        parsed = json.loads(data)
    except (ValueError, RecursionError, MemoryError) as exc:
        reason = "out of memory" if isinstance(exc, MemoryError) else str(exc)[:200]
        raise InvalidDump(f"{path} is not readable JSON: {reason}") from None
    return Manifest.of(parsed, path)
