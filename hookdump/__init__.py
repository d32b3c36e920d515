"""hookdump: dump what happens inside a PyTorch model.

`capture` and `load` are imported lazily so that `import hookdump` (and the CLI's `--help`)
never pays for importing torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"
__all__ = ["Capture", "Dump", "HookdumpError", "InvalidDump", "__version__", "capture", "load"]

if TYPE_CHECKING:
    from hookdump.dump.reader import Dump, load
    from hookdump.errors import HookdumpError, InvalidDump
    from hookdump.hooks.capture import Capture, capture

_LAZY = {
    "capture": "hookdump.hooks.capture",
    "Capture": "hookdump.hooks.capture",
    "load": "hookdump.dump.reader",
    "Dump": "hookdump.dump.reader",
    "HookdumpError": "hookdump.errors",
    "InvalidDump": "hookdump.errors",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'hookdump' has no attribute {name!r}")
