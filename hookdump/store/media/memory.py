"""Entries in this process's memory: the third kind of medium, for tests (the rules above a
medium run on it unchanged). A store is a name; every `MemoryMedium` of one name sees the
same entries."""

from __future__ import annotations

import contextlib
import io
import itertools
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

from hookdump.errors import InvalidDump
from hookdump.store.location import UrlPath
from hookdump.store.media.base import Info, Medium, too_large
from hookdump.store.media.blob import Blob, BytesBlob

_STORES: dict[str, dict[str, tuple[int, bytes]]] = {}  # name -> entry -> (version, bytes)
_LOCK = threading.Lock()
_VERSIONS = itertools.count(1)


class MemoryMedium(Medium):
    atomic_create = True  # under the process's lock
    renames = False
    poll_s = 0.01
    scheme = "mem://"

    def __init__(self, name: str) -> None:
        self.name = name
        with _LOCK:
            self._entries = _STORES.setdefault(name, {})

    @property
    def root(self) -> UrlPath:
        return UrlPath(f"{self.scheme}{self.name}")

    def read(self, name: str, most: int | None = None, limit: int | None = None) -> bytes | None:
        found = self._entries.get(name)
        if found is not None and limit is not None and len(found[1]) > limit:
            raise too_large(self.root / name, len(found[1]), limit)
        return None if found is None else found[1][:most]

    def info(self, name: str) -> Info | None:
        found = self._entries.get(name)
        return None if found is None else Info(len(found[1]), found[0])

    def blob(self, name: str, what: str) -> Blob:
        found = self._entries.get(name)
        if found is None:
            raise InvalidDump(f"{self.root / name} does not exist")
        return BytesBlob(found[1], found)

    @contextlib.contextmanager
    def reading(self, name: str) -> Iterator[Callable[[int], bytes]]:
        found = self._entries.get(name)
        if found is None:
            raise FileNotFoundError(self.root / name)
        yield io.BytesIO(found[1]).read

    def names(self) -> list[str]:
        return sorted(self._entries)

    def put(self, name: str, raw: bytes, durable: bool = True) -> None:
        with _LOCK:
            self._entries[name] = (next(_VERSIONS), bytes(raw))

    def put_if_absent(self, name: str, raw: bytes) -> bool:
        with _LOCK:
            if name in self._entries:
                return False
            self._entries[name] = (next(_VERSIONS), bytes(raw))
            return True

    def put_file(self, local: Path, name: str, crc32c: str | None) -> Info:
        self.put(name, local.read_bytes())
        local.unlink()
        found = self.info(name)
        assert found is not None, "just put"
        return found

    def delete(self, name: str) -> None:
        with _LOCK:
            self._entries.pop(name, None)
