"""Consoles: data on stdout, everything else (progress, warnings) on stderr."""

from __future__ import annotations

import contextlib
import json
import os
import sys
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rich.console import Console


def stdout() -> Console:
    """A console on stdout (built per call, so tests that swap sys.stdout see the output)."""
    from rich.console import Console

    # Piped or captured output gets room for a whole row instead of rich's 80 columns.
    wide = not sys.stdout.isatty() and "COLUMNS" not in os.environ
    return Console(file=sys.stdout, highlight=False, width=200 if wide else None)


def stderr() -> Console:
    """A console on stderr, for progress and warnings."""
    from rich.console import Console

    return Console(file=sys.stderr, highlight=False)


def print_json(data: Any) -> None:
    """Machine-readable output: one JSON document on stdout."""
    sys.stdout.write(json.dumps(data, indent=2) + "\n")


@contextlib.contextmanager
def no_stdin() -> Iterator[None]:
    """Standard input reads as empty inside: hookdump reads it only for `--input -` and
    `--text -`, so nothing else (a library's "run this code? [y/N]" prompt) can take an
    answer from it."""
    saved = sys.stdin
    with open(os.devnull) as empty:
        sys.stdin = empty
        try:
            yield
        finally:
            sys.stdin = saved
