"""What every picture shares: matplotlib on its file-only backend, the formats (by the
file's extension), text drawn as it is, a figure saved in one write, and `Picture`, what
was drawn, for the one-line report."""

from __future__ import annotations

import io
import textwrap
import warnings
import weakref
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hookdump.errors import HookdumpError, opt, printable

FORMATS = (".png", ".svg", ".pdf")
CMAP = "viridis"


def pyplot() -> Any:
    """matplotlib's pyplot on its file-only backend, or one line naming the extra."""
    try:
        import matplotlib
    except ImportError:
        raise HookdumpError("pictures need matplotlib: pip install 'hookdump[plot]'") from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def check_format(out: Path, option: str = "out") -> None:
    """A file name (given with `option`) whose extension is a format of the pictures."""
    if out.suffix.lower() not in FORMATS:
        raise HookdumpError(
            f"{opt(option)} {out}: {out.suffix or 'no extension'} is not a picture format; "
            f"end the name in {', '.join(FORMATS)}"
        )


def plain(text: str) -> str:
    """A key or a path drawn as it is: a `$` is not the start of mathtext, and a control
    character is shown as its escape (`\x1b`), as everywhere hookdump writes for a person."""
    return printable(text).replace("$", r"\$")


def fitted(title: str, figure: Any, points: float = 12.0) -> str:
    """`title` wrapped onto lines that fit `figure`'s width, in a font of `points`
    (matplotlib's title size is 12): about 100 / points characters an inch, which leaves
    the margins the axes take (a title is centred on its axes, not the figure). The title
    as given is what `saved` reports."""
    _TITLES[figure] = title
    width = max(30, int(figure.get_figwidth() * 100 / points))
    return "\n".join(textwrap.fill(line, width) for line in title.splitlines())


# each figure's title as given, before `fitted` wrapped it
_TITLES: weakref.WeakKeyDictionary[Any, str] = weakref.WeakKeyDictionary()


def save(figure: Any, out: Path, option: str = "out") -> None:
    """Write `figure` to `out` (given with `option`) in the format its extension names,
    laid out to fit. Drawn in memory first: the file is written in one go, and a write that
    fails (a full disk) is one error, the partial file removed, whatever the backend."""
    if figure.get_layout_engine() is None:  # a constrained layout lays itself out
        with warnings.catch_warnings():  # a layout that cannot be tightened stays as it is
            warnings.simplefilter("ignore")
            figure.tight_layout()
    drawn = io.BytesIO()
    figure.savefig(drawn, format=out.suffix.lower().lstrip("."))
    try:
        out.parent.mkdir(parents=True, exist_ok=True)  # as run and export make theirs
        with out.open("wb") as file:
            file.write(drawn.getbuffer())
    except OSError as exc:
        if out.is_file() and not out.is_symlink():
            out.unlink(missing_ok=True)
        reason = exc.strerror or str(exc)
        raise HookdumpError(f"{opt(option)} {out}: cannot write the picture ({reason})") from None


@dataclass
class Picture:
    """What was drawn, for the one-line report and the tests: the heatmap's cells' box in
    pixels (left, top, right, bottom) and how many rows and columns it has."""

    chart: str
    path: Path
    width: int
    height: int
    box: tuple[float, float, float, float] | None = None
    rows: int = 0
    cols: int = 0
    tiles: int = 0  # a grid's or heads' tiles, and which they are
    which: str = ""
    labels: list[str] = field(default_factory=list)  # the token labels drawn on the rows
    title: str = ""  # as drawn

    def describe(self, key: str, sample: int | str) -> str:
        if self.chart == "grid":
            return (
                f"wrote {self.path}: {key} sample {sample}, {self.which}, as a "
                f"{self.rows}x{self.cols} grid"
            )
        shown = f" of {self.rows}x{self.cols}" if self.rows else ""
        which = f" ({self.which})" if self.which else ""
        return f"wrote {self.path}: {self.chart}{shown}{which} of {key} sample {sample}"


def saved(
    figure: Any,
    axes: Any,
    out: Path,
    chart: str,
    shape: tuple[int, ...],
    tiles: int = 0,
    which: str = "",
) -> Picture:
    save(figure, out)
    first = axes if axes is not None else (figure.axes[0] if figure.axes else None)
    labels = [t.get_text() for t in first.get_yticklabels()] if first is not None else []
    title = _TITLES.get(figure) or figure.get_suptitle()
    title = title or (first.get_title() if first is not None else "")
    width, height = figure.canvas.get_width_height()
    box = None
    if axes is not None:  # the cells' box, in the saved picture's pixels (y from the top)
        x0, y0, x1, y1 = axes.get_window_extent().extents
        box = (x0, height - y1, x1, height - y0)
    rows, cols = (shape[0], shape[1]) if len(shape) == 2 else (0, 0)
    numbered = not labels or all(label.lstrip("\u2212-").isdigit() for label in labels)
    labels = [] if numbered else labels  # tick numbers are not labels
    return Picture(chart, out, width, height, box, rows, cols, tiles, which, labels, title)
