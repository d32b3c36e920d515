"""The option groups of `hookdump.run`, the engine the CLI drives (`hookdump.dump` builds
them from its keywords):

- `RunOptions`: one run, made of the groups below, and `RunResult`, what a run returns;
- `ModelOptions`: the model, its weights, device and mode;
- `CaptureOptions`: the modules selected and what is kept of each;
- `InputOptions`: random input, images or tensor files, and the batch size;
- `TextOptions`: a corpus, its tokenizer and windows; `TokenOptions`: a row per token;
- `DumpOptions`: the dump folder, `--overwrite`/`--resume`, shard size and dtype;
- `PythonData`: batches from Python for `run(options, data=...)`.

Example:
    >>> from hookdump.options import CaptureOptions, InputOptions, ModelOptions, RunOptions
    >>> hookdump.run(RunOptions(ModelOptions("resnet18"), CaptureOptions(layers=("layer1.*",)),
    ...                         InputOptions(num_samples=8)))
"""

from __future__ import annotations

from hookdump.engine.options import RunOptions, RunResult
from hookdump.hooks.options import CaptureOptions
from hookdump.hooks.tokens import TokenOptions
from hookdump.inputs.python import PythonData
from hookdump.inputs.samples import InputOptions
from hookdump.inputs.text import TextOptions
from hookdump.model.prepare import ModelOptions
from hookdump.store.write.writer import DumpOptions

__all__ = [
    "CaptureOptions",
    "DumpOptions",
    "InputOptions",
    "ModelOptions",
    "PythonData",
    "RunOptions",
    "RunResult",
    "TextOptions",
    "TokenOptions",
]
