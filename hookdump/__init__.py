"""hookdump: dump what happens inside a PyTorch model.

Everything but `dump` is imported lazily (see `__getattr__`) so that `import hookdump` (and
the CLI's `--help`) never pays for importing torch.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"
__all__ = [
    "Capture",
    "CaptureOptions",
    "Dump",
    "DumpOptions",
    "HookdumpError",
    "InputOptions",
    "Interrupted",
    "InvalidDump",
    "KeyInfo",
    "ModelOptions",
    "RunOptions",
    "RunResult",
    "TextOptions",
    "TokenOptions",
    "__version__",
    "capture",
    "dump",
    "load",
    "run",
]

if TYPE_CHECKING:
    from hookdump.engine.options import RunOptions, RunResult
    from hookdump.engine.runner import run
    from hookdump.engine.tokens import TokenOptions
    from hookdump.errors import HookdumpError, Interrupted, InvalidDump
    from hookdump.format import KeyInfo
    from hookdump.hooks.capture import Capture, capture
    from hookdump.hooks.options import CaptureOptions
    from hookdump.inputs.samples import InputOptions
    from hookdump.inputs.text import TextOptions
    from hookdump.model.prepare import ModelOptions
    from hookdump.store.reader import Dump, load
    from hookdump.store.writer import DumpOptions

_LAZY = {
    "capture": "hookdump.hooks.capture",
    "Capture": "hookdump.hooks.capture",
    "load": "hookdump.store.reader",
    "Dump": "hookdump.store.reader",
    "KeyInfo": "hookdump.format",
    "HookdumpError": "hookdump.errors",
    "InvalidDump": "hookdump.errors",
    "Interrupted": "hookdump.errors",
    "RunOptions": "hookdump.engine.options",
    "ModelOptions": "hookdump.model.prepare",
    "CaptureOptions": "hookdump.hooks.options",
    "InputOptions": "hookdump.inputs.samples",
    "TextOptions": "hookdump.inputs.text",
    "TokenOptions": "hookdump.engine.tokens",
    "DumpOptions": "hookdump.store.writer",
    "RunResult": "hookdump.engine.options",
    "run": "hookdump.engine.runner",
}


def dump(model: Any, data: Any, out: str | os.PathLike[str], **options: Any) -> Dump:
    """Stream what the selected modules of `model` (an `nn.Module`, or a MODEL string)
    produce for `data` (an iterable of batches, or one Tensor) into a dump in `out`, and
    return it opened. Options: `layers`, `exclude`, `types`, `capture`, `reduce`, `forward`,
    `ids`, `per_token`, `positions`, `skip_special_tokens`, `tokenizer`, `num_samples`,
    `save_dtype`, `dtype`, `device`, `train`, `shard_size`, `overwrite`, `resume`,
    `early_stop`, `grad_target`, `progress` (each explained in `hookdump.engine.live.dump`).

    Example:
        >>> d = hookdump.dump(model, loader, "acts/", layers=["layer4"], reduce="mean",
        ...                   forward=lambda m, batch: m(batch[0]))
        >>> d["layer4"].shape
        torch.Size([10000, 2048])
    """
    from hookdump.engine.live import dump as dump_live

    return dump_live(model, data, out, **options)


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'hookdump' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__} - {"_LAZY"})
