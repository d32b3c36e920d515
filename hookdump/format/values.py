"""Sizes as people read them, and whole numbers as JSON gives them."""

from __future__ import annotations

from typing import TypeGuard


def format_bytes(n: float) -> str:
    """1536 -> '1.5 KiB': the one unit system of tables, reprs and errors."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")


def is_integer(value: object) -> TypeGuard[int]:
    """An `int` that is not a `bool` (which Python counts as one)."""
    return isinstance(value, int) and not isinstance(value, bool)
