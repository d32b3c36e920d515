"""The errors hookdump knows how to explain: each becomes one `Error: ...` line and an exit code.

Messages name options with `opt(name)`: the library's own argument name (`batch_size`,
`overwrite=True`) when the error is printed as it is, the command line's flag
(`--batch-size`, `--overwrite`) when the CLI renders it (`HookdumpError.render`). One
message, two audiences, and the mapping lives at the edge, in the CLI.
"""

from __future__ import annotations

import difflib
import functools
import inspect
import re
import sys
from collections.abc import Callable, Iterable
from typing import Any, TypeVar, cast

_OPTION = re.compile("\x00([A-Za-z_]+)(?:\x01([^\x00]*))?\x00")


_UNPRINTABLE = re.compile(
    r"[\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028-\u202e\u2066-\u2069]"
)


def printable(text: str) -> str:
    """`text` with each control character shown as an escape (`\x1b`, `\u202e`)."""
    return _UNPRINTABLE.sub(_escape, text)


def to_stderr(line: str) -> None:
    """Write a line for the person on stderr, its options named as the library names them
    and control characters escaped (the default where a caller gives no notice of its
    own)."""
    print(printable(name_options(getattr(line, "raw", line))), file=sys.stderr)


def _escape(match: re.Match[str]) -> str:
    code = ord(match.group())
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def opt(name: str, value: object = None) -> str:
    """An option named in a message: `name` (or `name=value`) for the library's callers, the
    flag for the CLI's. `value` is what the library argument takes to mean the flag, as
    `opt("overwrite", True)` for `--overwrite`, `opt("strict", False)` for `--no-strict`."""
    return f"\x00{name}\x00" if value is None else f"\x00{name}\x01{value}\x00"


def library_name(name: str, value: str | None) -> str:
    """How the library names an option: its argument (with the value that sets it)."""
    return name if value is None else f"{name}={value}"


def name_options(message: str, name: Callable[[str, str | None], str] = library_name) -> str:
    """`message` with each option marked by `opt` named by `name(option, value)`."""
    return _OPTION.sub(lambda m: name(m.group(1), m.group(2)), message)


def render_message(message: str, name: Callable[[str, str | None], str] = library_name) -> str:
    """A library message (a `Message`, or any string) with its options named by `name`."""
    return name_options(getattr(message, "raw", message), name)


class Message(str):
    """A message that is not an error (a warning): reads with the library's names, and keeps
    the marked text (`raw`) for the CLI to render with flags."""

    raw: str

    def __new__(cls, raw: str) -> Message:
        message = super().__new__(cls, name_options(raw))
        message.raw = raw
        return message


class _Explained(BaseException):
    """An exception whose message marks its options with `opt`: `str()` names them as the
    library does, `render` as the caller asks (the CLI: flags)."""

    def __str__(self) -> str:
        return self.render(library_name)

    def render(self, name: Callable[[str, str | None], str]) -> str:
        """The message with each option named by `name(option, value)`, its control
        characters escaped (a name it quotes cannot retitle a terminal)."""
        return printable(name_options(super().__str__(), name))


class HookdumpError(_Explained, Exception):
    """Bad usage or bad input: the message names the value and the fix; exit code 2.

    With HOOKDUMP_DEBUG=1 the CLI also prints the traceback of the error's cause (a model's
    own exception, say), kept as `__cause__`.
    """

    exit_code = 2


class ArgumentTypeError(HookdumpError, TypeError):
    """A Python argument of the wrong type: a TypeError, as Python callers expect, and a
    HookdumpError, as hookdump's errors are."""


class InvalidDump(HookdumpError):
    """A dump on disk that cannot be trusted: a malformed manifest, a shard that is missing,
    not a regular file, outside the dump folder, or unlike what the manifest says; exit 2."""


class CheckFailed(HookdumpError):
    """A check the user asked for failed (a diff mismatch, non-finite values); exit code 1."""

    exit_code = 1


class Interrupted(_Explained, KeyboardInterrupt):
    """Ctrl-C (exit code 130) or SIGTERM (143) during a run, raised once the finished shards
    are committed: the message says what was kept and how to go on. A KeyboardInterrupt,
    not an Exception, so a loop's `except Exception` does not swallow the user's Ctrl-C or
    a scheduler's SIGTERM."""

    def __init__(self, message: str, exit_code: int = 130) -> None:
        super().__init__(message)
        self.exit_code = exit_code


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


_F = TypeVar("_F", bound=Callable[..., Any])


def keywords_checked(func: _F) -> _F:
    """`func` (a function, or a class: its `__init__`) with Python's own TypeError for an
    unknown keyword, with a did-you-mean (`hookdump.dump(..., layer=...)`: did you mean
    layers?), and an `ArgumentTypeError` for a flag that is not a bool or a text that is
    not a str (`consume="false"` is true to Python, and deletes). A class stays a class."""
    if isinstance(func, type):
        func.__init__ = keywords_checked(func.__init__)  # type: ignore[misc]
        return func
    signature = inspect.signature(func)
    parameters = signature.parameters.values()
    names = [p.name for p in parameters if p.kind in (p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD)]
    typed = {p.name: p.annotation for p in parameters if p.annotation in _PLAIN}
    shown = func.__qualname__.removesuffix(".__init__")

    @functools.wraps(func)
    def checked(*args: Any, **kwargs: Any) -> Any:
        for name in kwargs:
            if name not in names:
                raise TypeError(
                    f"{shown}() got an unexpected keyword argument {name!r}"
                    f"{did_you_mean(name, names)}"
                )
        if typed:
            bound = signature.bind_partial(*args, **kwargs).arguments
            for name, annotation in typed.items():
                if name in bound and not isinstance(bound[name], _PLAIN[annotation]):
                    raise ArgumentTypeError(
                        f"{shown}({name}={printable(repr(bound[name])[:80])}): {name} is "
                        f"{_WHAT[annotation]}, not a {type(bound[name]).__name__}"
                    )
        return func(*args, **kwargs)

    return cast(_F, checked)


# annotations as `from __future__ import annotations` keeps them: the plain ones checked
_PLAIN: dict[object, type] = {"bool": bool, bool: bool, "str": str, str: str}
_WHAT: dict[object, str] = {
    "bool": "True or False",
    bool: "True or False",
    "str": "a str",
    str: "a str",
}
