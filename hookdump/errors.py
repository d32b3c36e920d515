"""The errors hookdump knows how to explain: each becomes one `Error: ...` line and an exit code."""

from __future__ import annotations

import difflib
from collections.abc import Iterable


class HookdumpError(Exception):
    """Bad usage or bad input: the message names the value and the fix; exit code 2."""

    exit_code = 2


class InvalidDump(HookdumpError):
    """A dump on disk that cannot be trusted: a malformed manifest, a shard that is missing,
    not a regular file, outside the dump folder, or unlike what the manifest says; exit 2."""


class CheckFailed(HookdumpError):
    """A check the user asked for failed (a diff mismatch, non-finite values); exit code 1."""

    exit_code = 1


class Interrupted(Exception):
    """Ctrl-C during a run: the message says what was kept and how to go on; exit code 130."""

    exit_code = 130


def nearest(word: str, candidates: Iterable[str], n: int = 3) -> list[str]:
    """The candidates closest to `word`, best first (for 'did you mean' hints)."""
    pool = list(candidates)
    found = difflib.get_close_matches(word, pool, n=n, cutoff=0.5)
    if not found:
        # A glob or a partial name: fall back to names that contain its literal pieces.
        stem = word.strip("*?[]")
        found = [c for c in pool if stem and stem in c][:n]
    return found


def did_you_mean(word: str, candidates: Iterable[str], n: int = 3) -> str:
    """A ' (did you mean a, b?)' suffix, or '' when nothing is close."""
    found = nearest(word, candidates, n)
    return f" (did you mean {', '.join(found)}?)" if found else ""
