"""Consoles: data on stdout, everything else (progress, warnings) on stderr; and the one
place where what is printed for a person is made printable.

Dump keys, module and class names, file names and model specs come from dumps, model
folders and command lines that may be hostile. `printable` shows every control character
(C0 but newline and tab, DEL, C1, bidirectional overrides, line separators) as an escape
such as `\x1b`, so none reaches the terminal: rich consoles apply it to every string
before layout (their own styling escapes pass), and `printable_streams` wraps stdout and
stderr for everything else a command prints (Click's usage errors, warnings, plain
lines). `--json` output is JSON, which holds no raw control characters.
"""

from __future__ import annotations

import contextlib
import functools
import io
import json
import os
import sys
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, TextIO

from hookdump.errors import printable

if TYPE_CHECKING:
    from rich.console import Console

# what a console that cannot show a character gets instead (then `\xd7`-style escapes)
_PLAIN = str.maketrans(
    {
        "×": "x",
        "…": "...",
        "—": "-",
        "\u2013": "-",
        "→": "->",
        "≤": "<=",
        "≥": ">=",
        "≈": "~",
        "±": "+-",
        "µ": "u",
        "❱": ">",
        "│": "|",
        "─": "-",
        **{block: "#" for block in "▁▂▃▄▅▆▇█"},
    }
)


def encodable(text: str, encoding: str) -> str:
    """`text` as a console of `encoding` can show it: unchanged when it can, else with
    plain stand-ins (`x` for `×`) and escapes for the rest, never an encoding error."""
    try:
        text.encode(encoding)
        return text
    except (UnicodeEncodeError, LookupError):
        plain = text.translate(_PLAIN)
        try:
            return plain.encode(encoding, "backslashreplace").decode(encoding)
        except LookupError:
            return plain.encode("ascii", "backslashreplace").decode("ascii")


class _Encodable(io.TextIOBase):
    """A text stream that writes only what the stream it wraps can encode (`encodable`)."""

    def __init__(self, raw: TextIO) -> None:
        self.raw = raw

    def write(self, text: str) -> int:
        self.raw.write(encodable(text, self.encoding))
        return len(text)

    def flush(self) -> None:
        self.raw.flush()

    def isatty(self) -> bool:
        return self.raw.isatty()

    def fileno(self) -> int:
        return self.raw.fileno()

    @property
    def encoding(self) -> str:  # type: ignore[override]
        return getattr(self.raw, "encoding", None) or "utf-8"

    @property
    def errors(self) -> str | None:  # type: ignore[override]
        return getattr(self.raw, "errors", None)


class _Printable(_Encodable):
    """A text stream that writes `printable` text to the stream it wraps."""

    def write(self, text: str) -> int:
        super().write(printable(text))
        return len(text)


@contextlib.contextmanager
def printable_streams() -> Iterator[None]:
    """stdout and stderr print `printable` text inside."""
    saved = sys.stdout, sys.stderr
    sys.stdout, sys.stderr = _Printable(saved[0]), _Printable(saved[1])
    try:
        yield
    finally:
        sys.stdout, sys.stderr = saved


def _raw(stream: TextIO) -> TextIO:
    """The stream under `printable_streams`' wrapper (rich makes its own text printable and
    writes its styling escapes itself), made to write only what it can encode."""
    raw = stream.raw if isinstance(stream, _Printable) else stream
    return raw if isinstance(raw, _Encodable) else _Encodable(raw)  # type: ignore[return-value]


@functools.cache
def _console_class() -> type[Console]:
    """rich's Console, making every string printable before layout (made once, on first
    use: rich is imported only then)."""
    from rich.console import Console

    class PrintableConsole(Console):
        def render_str(self, text: str, **kwargs: Any) -> Any:
            return super().render_str(printable(text), **kwargs)

    return PrintableConsole


def _console(file: TextIO, **options: Any) -> Console:
    return _console_class()(file=_raw(file), highlight=False, markup=False, emoji=False, **options)


def stdout() -> Console:
    """A console on stdout (built per call, so tests that swap sys.stdout see the output)."""
    # Piped or captured output gets room for a whole row instead of rich's 80 columns.
    wide = not sys.stdout.isatty() and "COLUMNS" not in os.environ
    return _console(sys.stdout, width=200 if wide else None)


def stderr() -> Console:
    """A console on stderr, for progress and warnings."""
    return _console(sys.stderr)


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
