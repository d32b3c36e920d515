"""What `run` shows while it works, and what it saves meanwhile: the progress bar on stderr,
and Python's garbage collector paused until the first batch is done."""

from __future__ import annotations

import gc
import time
from collections.abc import Callable
from typing import Any

from hookdump.cli import _output


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


ProgressCallback = Callable[[int, int | None, int], None]


class Progress:
    """A progress bar on stderr (samples/s, MB/s captured, ETA), once a run has more than
    one batch."""

    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled
        self.bar: Any = None
        self.task: Any = None
        self.first: tuple[int, int, float] = (0, 0, 0.0)  # samples, bytes, time at batch 1

    def __enter__(self) -> Callable[[int, int | None, int], None] | None:
        return self.update if self.enabled else None

    def update(self, done: int, total: int | None, nbytes: int) -> None:
        if not self.enabled:
            return
        if self.bar is None:
            if total is not None and done >= total:
                return
            from rich import progress

            console = _output.stderr()
            if not console.is_terminal:  # a log gets no bar, only rich's closing blank line
                self.enabled = False
                return
            self.bar = progress.Progress(
                progress.TextColumn("samples"),
                progress.BarColumn(),
                progress.MofNCompleteColumn(),
                progress.TextColumn("{task.fields[rate]}"),
                progress.TimeRemainingColumn(),
                console=console,
                transient=True,
            )
            self.bar.start()
            self.task = self.bar.add_task("run", total=total, rate="")
            # rates count from the first batch on, not from loading the model
            self.first = (done, nbytes, time.perf_counter())
            self.bar.update(self.task, completed=done)
            return
        samples, captured, since = self.first
        elapsed = max(time.perf_counter() - since, 1e-9)
        speed = (done - samples) / elapsed
        rate = f"{speed:.3g} samples/s, {(nbytes - captured) / elapsed / 1e6:.3g} MB/s"
        self.bar.update(self.task, completed=done, rate=rate)

    def __exit__(self, *exc: object) -> None:
        if self.bar is not None:
            self.bar.stop()
