"""Where a dump's bytes live (`Medium`), and the one factory that decides the kind from what
the user gave, once, at the door: a URL is a prefix at it (`file://` of this host is the
folder; `mem://NAME` this process's memory, for tests), anything else a local folder."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from hookdump.errors import HookdumpError
from hookdump.store.location import Remote, is_url, local
from hookdump.store.media.base import Info, Medium
from hookdump.store.media.folder import FolderMedium
from hookdump.store.media.memory import MemoryMedium
from hookdump.store.media.url import UrlMedium

__all__ = ["FolderMedium", "Info", "Medium", "MemoryMedium", "UrlMedium", "open_medium"]


def open_medium(
    where: str | os.PathLike[str],
    storage_options: Mapping[str, Any] | None = None,
    strict: bool = True,
) -> Medium:
    """The medium `where` names (a folder or a URL; `storage_options`: a URL's client's,
    refused for a folder where `strict`, else left unused, as a run and `load` leave them)."""
    text = local(where)
    if text.startswith(MemoryMedium.scheme):
        return MemoryMedium(text.removeprefix(MemoryMedium.scheme))
    if is_url(text):
        return UrlMedium(Remote(text, storage_options))
    if storage_options and strict:
        raise HookdumpError(
            f"storage_options are for a dump at a URL; {text} is a folder: leave them out"
        )
    return FolderMedium(Path(text))
