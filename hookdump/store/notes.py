"""What a run says of itself beside its dump (`running.json`: its run id, pid, host, start,
whether it overwrites), as followers and `inspect` read it: rules over any medium."""

from __future__ import annotations

import json
import socket
from collections.abc import Mapping
from typing import Any

from hookdump.errors import InvalidDump
from hookdump.format.names import RUNNING
from hookdump.store.folder import process_alive, valid_pid
from hookdump.store.media import Medium


def running_note(where: Medium) -> dict[str, Any] | None:
    """What the run writing the dump says of itself (`running.json`: its run id, pid, host,
    start, whether it overwrites), if anything readable: a note that is not what a run
    writes (a pid that is no process's, a host that is not a short line, a huge or deep
    file) is a damaged one, and None."""
    try:
        raw = where.read(RUNNING, _NOTE_BYTES + 1) or b"null"
    except InvalidDump:  # not a file (a FIFO, a folder)
        return None
    if len(raw) > _NOTE_BYTES:
        return None
    try:
        note = json.loads(raw)
    except (ValueError, RecursionError):
        return None
    if not isinstance(note, dict):
        return None
    pid, host = note.get("pid"), note.get("host")
    if not valid_pid(pid):
        return None
    if not (isinstance(host, str) and 0 < len(host) <= 255 and host.isprintable()):
        return None
    return note


def note_alive(note: Mapping[str, Any]) -> bool:
    """Whether the run that wrote `note` (one `running_note` read) is still going (another
    host's: assumed)."""
    pid = note.get("pid")
    if note.get("host") != socket.gethostname() or not isinstance(pid, int):
        return True
    return process_alive(pid)


_NOTE_BYTES = 64 << 10  # a run's note is a few hundred bytes
