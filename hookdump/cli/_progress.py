"""What `run` shows while it works, and what it saves meanwhile: the progress bar on stderr
(`engine.progress`), and Python's garbage collector paused until the first batch is done."""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Callable, Iterator

from hookdump.cli import _output
from hookdump.cli._errors import for_cli
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
    return Progress(enabled, _output.stderr(), loading=f"loading {model}", render=for_cli)


BIG_CHECK = 256 << 20  # bytes to check from which `inspect --check` shows a bar


@contextlib.contextmanager
def checking_bar(enabled: bool) -> Iterator[Callable[[int, int], None] | None]:
    """`inspect --check`'s bar on stderr (bytes checked of all), in a terminal only, for a
    dump of BIG_CHECK bytes or more; the callback to give it progress."""
    console = _output.stderr()
    if not enabled or not console.is_terminal:
        yield None
        return
    from rich import progress

    bar = progress.Progress(
        progress.TextColumn("checking"),
        progress.BarColumn(),
        progress.DownloadColumn(binary_units=True),
        progress.TransferSpeedColumn(),
        progress.TimeRemainingColumn(),
        console=console,
        transient=True,
    )
    task: list[progress.TaskID] = []

    def update(done: int, total: int) -> None:
        if not task and total >= BIG_CHECK:
            bar.start()
            task.append(bar.add_task("check", total=total))
        if task:
            bar.update(task[0], completed=done)

    try:
        yield update
    finally:
        if task:
            bar.stop()
