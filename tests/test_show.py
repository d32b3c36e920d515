"""`hookdump show`: the PNG decodes, has one tile per channel, each normalised on its own."""

from __future__ import annotations

import math
from pathlib import Path

import numpy
import pytest
import torch
from clitools import assert_usage_error, invoke
from PIL import Image

from hookdump.tools.image import MIN_TILE, PAD, SEPARATOR

pytestmark = pytest.mark.usefixtures("in_tests_dir")


@pytest.fixture
def convdump(tmp_path: Path) -> Path:
    out = tmp_path / "d"
    result = invoke("run", "tiny_models:ConvNet", "--input-shape", "3,8,8", "-n", "3", "-q",
                    "-l", "features.0", "-l", "head", "-o", str(out))  # fmt: skip
    assert result.exit_code == 0, result.stderr
    return out


def test_feature_maps_become_one_tile_per_channel(convdump: Path, tmp_path: Path) -> None:
    png = tmp_path / "maps.png"
    result = invoke("show", str(convdump), "features.0", "--out", str(png), "--sample", "2")
    assert result.exit_code == 0, result.stderr
    assert "4 channels as a 2x2 grid" in result.stdout
    image = Image.open(png)
    image.load()
    tile = 8 * math.ceil(MIN_TILE / 8)  # 8x8 maps are enlarged to stay legible
    assert image.size == (2 * (tile + PAD) + PAD, 2 * (tile + PAD) + PAD)
    pixels = torch.from_numpy(numpy.asarray(image).astype("int64"))
    for row in range(2):
        for col in range(2):
            y, x = PAD + row * (tile + PAD), PAD + col * (tile + PAD)
            cell = pixels[y : y + tile, x : x + tile]
            # grey, and stretched over its own full range: per-channel normalisation
            assert torch.equal(cell[..., 0], cell[..., 1])
            assert int(cell.min()) == 0 and int(cell.max()) == 255
    assert tuple(pixels[0, 0].tolist()) == SEPARATOR


def test_a_short_vector_becomes_bars(convdump: Path, tmp_path: Path) -> None:
    png = tmp_path / "bars.png"
    result = invoke("show", str(convdump), "head", "-o", str(png))
    assert result.exit_code == 0, result.stderr
    assert "bars of head sample 0" in result.stdout
    image = Image.open(png)
    image.load()
    assert image.size == (1000, 600)
    assert image.getextrema() != ((255, 255), (255, 255), (255, 255))  # something was drawn


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (["features.9"], "KEY 'features.9' is not in"),
        (["features.0", "--sample", "3"], "--sample 3 is out of range"),
    ],
)
def test_show_errors(convdump: Path, tmp_path: Path, args: list[str], fragment: str) -> None:
    result = invoke("show", str(convdump), *args, "--out", str(tmp_path / "x.png"))
    assert_usage_error(result, fragment)
    assert not (tmp_path / "x.png").exists()


def test_a_name_that_is_not_png_is_refused(convdump: Path, tmp_path: Path) -> None:
    """`--out x.jpg` used to get PNG bytes under a JPEG name."""
    result = invoke("show", str(convdump), "features.0", "--out", str(tmp_path / "x.jpg"))
    assert_usage_error(result, "one tensor is drawn as a PNG; end the name in .png")
    assert not (tmp_path / "x.jpg").exists()
