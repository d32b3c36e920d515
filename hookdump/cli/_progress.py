"""What `run` shows while it works, and what it saves meanwhile: the progress bar on stderr
(`engine.progress`), and Python's garbage collector paused until the first batch is done."""

from __future__ import annotations

import gc

from hookdump.cli import _output
from hookdump.engine.progress import Progress, ProgressCallback


class GCPause:
    """Python's cyclic garbage collector, paused while torch, the model and the first batch
    load: importing torch makes hundreds of thousands of objects, and the collector walked
    them again and again, a good part of the import time. It runs again once the first
    batch is done."""

    def __init__(self) -> None:
        self.paused = gc.isenabled()
        gc.disable()

    def chain(self, then: ProgressCallback | None) -> ProgressCallback:
        def on_batch(done: int, total: int | None, nbytes: int) -> None:
            self.end()
            if then is not None:
                then(done, total, nbytes)

        return on_batch

    def end(self) -> None:
        if self.paused:
            self.paused = False
            gc.enable()


def progress_bar(enabled: bool, model: str) -> Progress:
    """`run`'s status line (`loading MODEL`) and progress bar on stderr, shown in a terminal
    only."""
    return Progress(enabled, _output.stderr(), loading=f"loading {model}")
