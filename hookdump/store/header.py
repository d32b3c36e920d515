"""A safetensors file's header, parsed and checked against the file's size: the one parser
that the readers (`store.read.shard_file`) and the statistics file (`store.features`) use."""

from __future__ import annotations

import json
import struct
from collections.abc import Callable
from typing import Any

MAX_HEADER = 100_000_000  # safetensors' own limit on a header's bytes


class SafetensorsError(OSError):
    """A file that is not a readable safetensors file (its header, or its rows)."""


def header_of(pread: Callable[[int, int], bytes], size: int) -> tuple[dict[str, Any], int]:
    """The parsed header of a file of `size` bytes read by `pread(nbytes, offset)`, and
    where its data starts."""
    head = pread(8, 0)
    length = struct.unpack("<Q", head)[0] if len(head) == 8 else -1
    if not 0 < length <= min(MAX_HEADER, size - 8):
        raise SafetensorsError(f"its header length {length} does not fit the file")
    try:
        header = json.loads(pread(length, 8))
    except (ValueError, RecursionError):
        raise SafetensorsError("its header is not JSON") from None
    if not isinstance(header, dict):
        raise SafetensorsError("its header is not a JSON object")
    return header, 8 + length
