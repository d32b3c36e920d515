"""A manifest read from its medium: a regular entry inside its folder or under its URL, of
sane size, checked into a `Manifest` record before anything else reads it."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

from hookdump.errors import HookdumpError, InvalidDump
from hookdump.format.manifest import Manifest
from hookdump.format.names import MANIFEST
from hookdump.store.location import UrlPath
from hookdump.store.media import Medium

MAX_MANIFEST_BYTES = 1 << 30
# what parsing a manifest may build, whatever its bytes: JSON's small objects cost 20 to 70
# times their text, so the values (commas) and containers are counted before the parse
MAX_MANIFEST_VALUES = 32_000_000
MAX_MANIFEST_CONTAINERS = 4_000_000


def manifest_at(
    medium: Medium,
    missing: Callable[[Path | UrlPath], HookdumpError],
    name: str = MANIFEST,
) -> Manifest:
    """Manifest `name` of the dump in `medium` (a torchrun rank's, say), read and checked:
    a regular entry (never a FIFO, a device or a link out of the folder) of sane size,
    holding a valid manifest (`missing(root)`: the error where there is none)."""
    data = medium.read(name, limit=MAX_MANIFEST_BYTES)
    if data is None:
        raise missing(medium.root)
    return parse_manifest(data, str(medium.root / name))


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
