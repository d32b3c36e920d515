"""hookdump: dump what happens inside a PyTorch model.

The verbs:

- `dump(model, data, out, *, layers=..., ...)`: stream what the selected modules of a live
  `nn.Module` (or a MODEL string, as the CLI takes it) produce for your batches into a dump
  folder, and return it opened;
- `load(path)`: open a dump (a `Dump`, a read-only mapping of key -> every row; `batches`
  and `dataset` for training);
- `aligned({name: (dump, key), ...})`: keys of several dumps of the same samples read
  together;
- `follow(path, keys, batch_size, ...)`: batches of a dump while it is written (and
  `follow_dataset` for DataLoader workers and ranks);
- `capture(model, layers=...)`: a `with` block whose hooks keep the values in memory;
- `export(dump, out, *, to="hf" | "saelens" | "npy")`: write a dump in another format.

Example:
    >>> import hookdump
    >>> d = hookdump.dump(model, loader, "acts/", layers=["layer4"], reduce="mean",
    ...                   forward=lambda m, batch: m(batch[0]))
    >>> hookdump.load("acts/")["layer4"].shape
    torch.Size([10000, 2048])

Errors are `HookdumpError` (one line naming the argument and the fix; `InvalidDump` for a
dump that cannot be trusted); Ctrl-C or SIGTERM during `dump` raises `Interrupted` (a
`KeyboardInterrupt`) once the finished shards are safe. `run(RunOptions(...))` is the
engine the CLI drives, with its option groups in `hookdump.options`.

Every name is imported on first use (`__getattr__`), so `import hookdump` (and the CLI's
`--help`) never pays for importing torch.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from hookdump._version import __version__

__all__ = [
    "Capture",
    "Dump",
    "ExportResult",
    "Generation",
    "HookdumpError",
    "Interrupted",
    "InvalidDump",
    "KeyInfo",
    "__version__",
    "aligned",
    "capture",
    "dump",
    "export",
    "follow",
    "follow_dataset",
    "load",
    "options",
    "run",
]

if TYPE_CHECKING:
    from hookdump import options
    from hookdump.engine.live import dump
    from hookdump.engine.options import RunOptions as RunOptions
    from hookdump.engine.options import RunResult as RunResult
    from hookdump.engine.runner import run
    from hookdump.errors import HookdumpError, Interrupted, InvalidDump
    from hookdump.format.keys import KeyInfo
    from hookdump.hooks.capture import Capture, capture
    from hookdump.hooks.options import CaptureOptions as CaptureOptions
    from hookdump.hooks.tokens import TokenOptions as TokenOptions
    from hookdump.inputs.generation import Generation
    from hookdump.inputs.samples import InputOptions as InputOptions
    from hookdump.inputs.text import TextOptions as TextOptions
    from hookdump.model.prepare import ModelOptions as ModelOptions
    from hookdump.store.read.aligned import aligned
    from hookdump.store.read.dump import Dump, load
    from hookdump.store.read.follow import follow, follow_dataset
    from hookdump.store.write.writer import DumpOptions as DumpOptions
    from hookdump.tools.export import ExportResult, export

_LAZY = {
    "aligned": "hookdump.store.read.aligned",
    "dump": "hookdump.engine.live",
    "load": "hookdump.store.read.dump",
    "follow": "hookdump.store.read.follow",
    "follow_dataset": "hookdump.store.read.follow",
    "capture": "hookdump.hooks.capture",
    "export": "hookdump.tools.export",
    "run": "hookdump.engine.runner",
    "Capture": "hookdump.hooks.capture",
    "Generation": "hookdump.inputs.generation",
    "Dump": "hookdump.store.read.dump",
    "ExportResult": "hookdump.tools.export",
    "KeyInfo": "hookdump.format.keys",
    "HookdumpError": "hookdump.errors",
    "InvalidDump": "hookdump.errors",
    "Interrupted": "hookdump.errors",
    # the option groups, reachable here for scripts written before `hookdump.options`
    "RunOptions": "hookdump.engine.options",
    "RunResult": "hookdump.engine.options",
    "ModelOptions": "hookdump.model.prepare",
    "CaptureOptions": "hookdump.hooks.options",
    "InputOptions": "hookdump.inputs.samples",
    "TextOptions": "hookdump.inputs.text",
    "TokenOptions": "hookdump.hooks.tokens",
    "DumpOptions": "hookdump.store.write.writer",
}


def __getattr__(name: str) -> Any:
    if name == "options":
        return importlib.import_module("hookdump.options")
    if name in _LAZY:
        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value  # the next lookup is a plain attribute
        return value
    raise AttributeError(f"module 'hookdump' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(__all__)
