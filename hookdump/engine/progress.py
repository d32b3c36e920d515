"""A progress bar on stderr while a run works (samples/s, MB/s captured, time left), for
both doors: the CLI gives it its printable console, `hookdump.dump(progress=True)` rich's."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from hookdump.errors import printable, render_message

ProgressCallback = Callable[[int, int | None, int], None]
Notice = Callable[[str], None]  # a line for the person running it, on stderr


class Progress:
    """A progress bar on stderr (samples/s, MB/s captured, ETA), once a run has more than
    one batch."""

    def __init__(
        self,
        enabled: bool,
        console: Any,
        loading: str | None = None,
        render: Callable[[str], str] = render_message,
    ) -> None:
        """`console`: a rich Console on stderr; the bar shows only where it is a terminal
        (or a notebook). `loading`: what a status line says until the first batch is done
        (`loading resnet50`), so the first seconds are not silent. `render`: how a line's
        options are named (the library's names; the CLI gives its flags)."""
        self.render = render
        self.enabled = enabled
        self.notices = enabled  # lines are printed in a log too, where no bar is shown
        self.console = console
        self.loading = loading
        self.status: Any = None
        self.bar: Any = None
        self.task: Any = None
        self.first: tuple[int, int, float] = (0, 0, 0.0)  # samples, bytes, time at batch 1

    def __enter__(self) -> ProgressCallback | None:
        if self.enabled and self.loading and self._shown():
            from rich.text import Text

            # as text, not markup, and escaped: a model's name cannot retitle the terminal
            line = Text(printable(f"{self.loading}, then the first batch"))
            self.status = self.console.status(line)
            self.status.start()
        return self.update if self.enabled else None

    def _shown(self) -> bool:
        return bool(self.console.is_terminal or self.console.is_jupyter)

    def _end_status(self) -> None:
        if self.status is not None:
            self.status.stop()
            self.status = None

    def update(self, done: int, total: int | None, nbytes: int) -> None:
        self._end_status()
        if not self.enabled:
            return
        if self.bar is None:
            if total is not None and done >= total:
                return
            from rich import progress

            console = self.console
            if not self._shown():  # a log: no bar
                self.enabled = False
                return
            self.bar = progress.Progress(
                progress.TextColumn("samples"),
                progress.BarColumn(),
                progress.MofNCompleteColumn(),
                progress.TextColumn("{task.fields[rate]}"),
                progress.TimeRemainingColumn(),
                progress.TextColumn("left"),
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

    def notice(self, line: str) -> None:
        """Print `line` on stderr (above the bar, where one is shown), made printable."""
        if self.notices:
            self.alert(line)

    def alert(self, line: str) -> None:
        """Print `line` on stderr even where notices are not shown (`-q`): a run that
        stops to wait says so."""
        self._end_status()
        self.console.print(printable(self.render(line)), markup=False, highlight=False)

    def __exit__(self, *exc: object) -> None:
        self._end_status()
        if self.bar is not None:
            self.bar.stop()
