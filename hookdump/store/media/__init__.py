"""Where a dump's bytes live (`Medium`), and the one factory that decides the kind from what
the user gave, once, at the door: a URL is a prefix at it (`file://` of this host is the
folder), anything else a local folder."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from hookdump.errors import HookdumpError
from hookdump.store.location import Remote, UrlPath, is_url, local
from hookdump.store.media.base import Info, Medium
from hookdump.store.media.folder import FolderMedium
from hookdump.store.media.url import UrlMedium

__all__ = ["FolderMedium", "Info", "Medium", "UrlMedium", "medium_of", "open_medium"]


def open_medium(
    where: str | os.PathLike[str],
    storage_options: Mapping[str, Any] | None = None,
    strict: bool = True,
) -> Medium:
    """The medium `where` names (a folder or a URL; `storage_options`: a URL's client's,
    refused for a folder where `strict`, else left unused, as a run and `load` leave them)."""
    text = local(where)
    if is_url(text):
        return UrlMedium(Remote(text, storage_options))
    if storage_options and strict:
        raise HookdumpError(
            f"storage_options are for a dump at a URL; {text} is a folder: leave them out"
        )
    return FolderMedium(Path(text))


def medium_of(root: Path | UrlPath, remote: Remote | None) -> Medium:
    """The medium of a dump already opened (a reader's root and client)."""
    return UrlMedium(remote) if remote is not None else FolderMedium(Path(root))
