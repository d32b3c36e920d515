"""Reading the pictures tests draw: their pixels, and the colours the scale gives values."""

from __future__ import annotations

from pathlib import Path

import numpy
from PIL import Image


def pixels_of(path: Path) -> numpy.ndarray:
    """The picture's RGB pixels, [height, width, 3], as ints."""
    image = Image.open(path)
    image.load()
    return numpy.asarray(image.convert("RGB")).astype(int)


def viridis(fraction: float) -> numpy.ndarray:
    """The RGB colour viridis gives `fraction` of the way up its scale (1.0: the brightest)."""
    import matplotlib

    return (numpy.array(matplotlib.colormaps["viridis"](fraction)[:3]) * 255).round()
