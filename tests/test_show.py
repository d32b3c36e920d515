"""`hookdump show KEY` of feature maps: a grid whose cells follow the data (the largest value
is the brightest cell where it lies, NaN is red), numbered tiles, a colour bar and a title;
`--scale`, `--channels` and `--top` do what they say; the format follows the extension."""

from __future__ import annotations

from pathlib import Path

import numpy
import pytest
import torch
from clitools import assert_usage_error, invoke
from picturetools import pixels_of, viridis
from PIL import Image
from safetensors.torch import save_file

from hookdump.tools.pictures import grids as maps
from hookdump.tools.pictures.canvas import Picture
from hookdump.tools.pictures.sample import draw_sample

pytest.importorskip("matplotlib")
pytestmark = pytest.mark.usefixtures("in_tests_dir")


@pytest.fixture
def convdump(tmp_path: Path) -> Path:
    out = tmp_path / "d"
    result = invoke("run", "tiny_models:ConvNet", "--input-shape", "3,8,8", "-n", "3", "-q",
                    "-l", "features.0", "-l", "head", "-o", str(out))  # fmt: skip
    assert result.exit_code == 0, result.stderr
    return out


def _lone(tmp_path: Path, sample: torch.Tensor, name: str = "maps") -> Path:
    """A lone .safetensors file holding one sample of key `maps`."""
    path = tmp_path / f"{name}.safetensors"
    save_file({"maps": sample[None].contiguous()}, path)
    return path


def _close(pixel: numpy.ndarray, colour: numpy.ndarray | tuple[int, ...]) -> bool:
    return bool(numpy.abs(pixel - numpy.asarray(colour)).sum() < 12)


def _cell(
    drawn: Picture, tile: int, y: float, x: float, height: int, width: int
) -> tuple[int, int]:
    """The pixel (row, column) at the middle of cell (y, x) of tile number `tile` (in drawing
    order) of a grid of `height` x `width` maps."""
    assert drawn.box is not None
    left, top, right, bottom = drawn.box
    row, col = divmod(tile, drawn.cols)
    across = (col * width + x + 0.5) / (drawn.cols * width)
    down = (row * height + y + 0.5) / (drawn.rows * height)
    return round(top + down * (bottom - top)), round(left + across * (right - left))


def test_the_largest_value_is_the_brightest_cell_of_its_tile(tmp_path: Path) -> None:
    values = torch.linspace(-1, 1, 6 * 8 * 8).reshape(6, 8, 8)
    values[4, 2, 5] = 9.0  # far above the rest: the top of the shared scale
    values[1, 6, 1] = float("nan")
    out = tmp_path / "grid.png"
    drawn = draw_sample(_lone(tmp_path, values), "maps", out)
    assert (drawn.rows, drawn.cols, drawn.tiles) == (2, 3, 6)
    pixels = pixels_of(out)
    assert pixels.shape[:2] == (drawn.height, drawn.width) == (900, 1000)
    assert _close(pixels[_cell(drawn, 4, 2, 5, 8, 8)], viridis(1.0))
    assert not _close(pixels[_cell(drawn, 4, 2, 4, 8, 8)], viridis(1.0))
    assert _close(pixels[_cell(drawn, 1, 6, 1, 8, 8)], maps.NAN_COLOUR[:3])
    # everything else is near the bottom of a scale from -1 to 9
    assert _close(pixels[_cell(drawn, 0, 4, 4, 8, 8)], viridis(float((values[0, 4, 4] + 1) / 10)))


def test_per_channel_stretches_every_tile_over_the_whole_scale(tmp_path: Path) -> None:
    values = torch.zeros(4, 6, 6)
    for channel in range(4):  # each tile's max at its own place, the ranges far apart
        values[channel, channel, 5 - channel] = 10.0**channel
    out = tmp_path / "each.png"
    drawn = draw_sample(
        _lone(tmp_path, values), "maps", out, tiling=maps.Tiling(scale="per-channel")
    )
    pixels = pixels_of(out)
    for channel in range(4):
        assert _close(pixels[_cell(drawn, channel, channel, 5 - channel, 6, 6)], viridis(1.0))
        assert _close(pixels[_cell(drawn, channel, 5 - channel, channel, 6, 6)], viridis(0.0))
    shared = draw_sample(_lone(tmp_path, values), "maps", tmp_path / "shared.png")
    dim = pixels_of(tmp_path / "shared.png")[_cell(shared, 2, 2, 3, 6, 6)]  # 100 of 1000
    assert _close(dim, viridis(0.1))


def test_top_k_draws_the_channels_of_highest_mean_first(tmp_path: Path) -> None:
    means = torch.tensor([3.0, 7.0, 1.0, 9.0, 5.0])
    values = means[:, None, None].expand(5, 4, 4).clone()
    result = invoke("show", str(_lone(tmp_path, values)), "maps", "--top", "3", "-o",
                    str(tmp_path / "top.png"))  # fmt: skip
    assert result.exit_code == 0, result.stderr
    assert "the 3 of 5 channels with the highest mean, highest first" in result.stdout
    drawn = draw_sample(_lone(tmp_path, values), "maps", tmp_path / "top.png",
                   tiling=maps.Tiling(top=3))  # fmt: skip
    pixels = pixels_of(tmp_path / "top.png")
    # channels 3, 1, 4 in that order, on a scale from 5 to 9
    for tile, fraction in enumerate((1.0, 0.5, 0.0)):
        assert _close(pixels[_cell(drawn, tile, 2, 2, 4, 4)], viridis(fraction)), tile


def test_channels_picks_tiles_in_the_order_given(tmp_path: Path) -> None:
    values = torch.arange(8.0)[:, None, None].expand(8, 4, 4).clone()
    out = tmp_path / "picked.png"
    drawn = draw_sample(_lone(tmp_path, values), "maps", out, tiling=maps.Tiling(channels="6-7,0"))
    assert drawn.tiles == 3 and drawn.which == "3 picked channels of 8"
    pixels = pixels_of(out)
    for tile, fraction in enumerate((6 / 7, 1.0, 0.0)):
        assert _close(pixels[_cell(drawn, tile, 2, 2, 4, 4)], viridis(fraction)), tile


def test_tiles_are_numbered_and_a_colour_bar_and_title_are_drawn(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    values = torch.randn(9, 5, 5, generator=torch.Generator().manual_seed(0))
    path = _lone(tmp_path, values)
    drawn = draw_sample(path, "maps", tmp_path / "full.png")
    full = pixels_of(tmp_path / "full.png")
    monkeypatch.setattr(maps, "MIN_LABEL_PX", 10**6)  # tiles too small to number
    draw_sample(path, "maps", tmp_path / "bare.png")
    bare = pixels_of(tmp_path / "bare.png")
    assert drawn.box is not None
    left, top, right, bottom = (round(v) for v in drawn.box)
    tile = (right - left) // 3
    corner = (slice(top, top + tile // 4), slice(left, left + tile // 2))
    assert (full[corner] != bare[corner]).any(axis=2).sum() > 20  # "0" in the first tile
    # the colour bar: viridis from its top to its bottom, right of the grid
    strip = full[top:bottom, right + 10 :].reshape(-1, 3)
    for fraction in (0.0, 0.5, 1.0):
        assert (numpy.abs(strip - viridis(fraction)).sum(axis=1) < 12).sum() > 50, fraction
    # the title: the same picture titled by another key differs above the grid
    save_file({"other.key": values[None]}, tmp_path / "other.safetensors")
    draw_sample(tmp_path / "other.safetensors", "other.key", tmp_path / "other.png")
    other = pixels_of(tmp_path / "other.png")
    assert (other[:top] != bare[:top]).any(axis=2).sum() > 50


def test_a_run_of_feature_maps_says_what_it_drew(convdump: Path, tmp_path: Path) -> None:
    result = invoke("show", str(convdump), "features.0", "--out", str(tmp_path / "m.png"), "-s",
                    "2", "--scale", "per-channel")  # fmt: skip
    assert result.exit_code == 0, result.stderr
    assert result.stdout.strip().endswith("features.0 sample 2, 4 channels, as a 2x2 grid")
    assert result.stderr == ""


@pytest.mark.parametrize(("suffix", "magic"), [(".svg", b"<?xml"), (".pdf", b"%PDF")])
def test_the_format_follows_the_extension(
    convdump: Path, tmp_path: Path, suffix: str, magic: bytes
) -> None:
    for key in ("features.0", "head"):
        out = tmp_path / f"{key}{suffix}"
        result = invoke("show", str(convdump), key, "-o", str(out))
        assert result.exit_code == 0, result.stderr
        assert out.read_bytes().startswith(magic)


def test_a_short_vector_becomes_bars(convdump: Path, tmp_path: Path) -> None:
    png = tmp_path / "bars.png"
    result = invoke("show", str(convdump), "head", "-o", str(png))
    assert result.exit_code == 0, result.stderr
    assert "bars of head sample 0" in result.stdout
    assert pixels_of(png).shape == (600, 1000, 3)


@pytest.mark.parametrize(
    ("shape", "chart"),
    [
        ([], "the value 2.5"),
        ([1, 1], "the value 2.5"),
        ([4, 1, 6], "heatmap of 4x6"),
        ([1, 7], "bars"),
        ([2, 2, 3, 3], "histogram"),
        ([1, 5, 5], "1 channel, as a 1x1 grid"),
    ],
)
def test_each_shape_gets_its_picture(tmp_path: Path, shape: list[int], chart: str) -> None:
    values = torch.full(shape, 2.5) if shape else torch.tensor(2.5)
    if values.numel() > 1:
        values = torch.randn(shape, generator=torch.Generator().manual_seed(1))
    result = invoke("show", str(_lone(tmp_path, values)), "maps", "-o", str(tmp_path / "p.png"))
    assert result.exit_code == 0, result.stderr
    assert chart in result.stdout
    assert Image.open(tmp_path / "p.png").size[0] > 0


def test_a_histogram_counts_what_is_not_finite(tmp_path: Path) -> None:
    values = torch.randn(2, 2, 3, 3, generator=torch.Generator().manual_seed(2))
    clean = draw_sample(_lone(tmp_path, values, "clean"), "maps", tmp_path / "clean.png")
    values[0, 0, 0, 0] = float("nan")
    draw_sample(_lone(tmp_path, values, "nan"), "maps", tmp_path / "nan.png")
    red = numpy.array([214, 39, 40])  # tab:red, the NaN/Inf count's colour
    for name, expected in (("clean", False), ("nan", True)):
        pixels = pixels_of(tmp_path / f"{name}.png")
        assert ((numpy.abs(pixels - red).sum(axis=2) < 12).sum() > 30) == expected
    assert clean.chart == "histogram"


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (["features.9"], "KEY 'features.9' is not in"),
        (["features.0", "--sample", "3"], "--sample 3 is out of range"),
        (
            ["features.0", "--channels", "0-9"],
            "--channels '0-9': there are 4 channels (0 to 3), no 9",
        ),
        (["features.0", "--channels", "2-1"], "--channels '2-1': '2-1' is not a range"),
        (["features.0", "--channels", "a"], "'a' is not a number or a range; say e.g. 0-15,32"),
        (["features.0", "--top", "0"], "--top 0 must be from 1 to 1024"),
        (["features.0", "--scale", "log"], "--scale 'log' is not a colour scale"),
        (["head", "--top", "2"], "--channels, --top and --scale pick and colour the tiles"),
        (["features.0", "--depth"], "--depth draws every key; give no KEY"),
        (["--depth", "--top", "2"], "--channels, --top and --scale are for one KEY's tiles"),
    ],
)
def test_show_errors(convdump: Path, tmp_path: Path, args: list[str], fragment: str) -> None:
    result = invoke("show", str(convdump), *args, "--out", str(tmp_path / "x.png"))
    assert_usage_error(result, fragment)
    assert not (tmp_path / "x.png").exists()


def test_a_name_that_is_not_a_picture_format_is_refused(convdump: Path, tmp_path: Path) -> None:
    """`--out x.jpg` used to get PNG bytes under a JPEG name."""
    result = invoke("show", str(convdump), "features.0", "--out", str(tmp_path / "x.jpg"))
    assert_usage_error(result, ".jpg is not a picture format; end the name in .png, .svg, .pdf")
    assert not (tmp_path / "x.jpg").exists()


def test_sample_is_a_row_number_or_a_sample_id(tmp_path: Path) -> None:
    """The contract (2026-11-25): `--sample` takes a sample id as the manifest records it
    (a file path here) as well as a row number, and draws the same row; with token rows, an
    id draws its sequence whole, from its first token row (counted here from the mask)."""
    from tiny_models import ConvNet

    import hookdump

    ids = [f"photos/cats/cat_{i:02d}.jpg" for i in range(4)]
    images = torch.randn(4, 3, 8, 8, generator=torch.Generator().manual_seed(0))
    out = tmp_path / "d"
    hookdump.dump(ConvNet().eval(), [images[:2], images[2:]], out, layers="features.0", ids=ids)
    by_id, by_row = tmp_path / "id.png", tmp_path / "row.png"
    result = invoke("show", str(out), "features.0", "-s", ids[2], "-o", str(by_id))
    assert result.exit_code == 0, result.stderr
    assert f"features.0 sample {ids[2]}, 4 channels" in result.stdout
    assert invoke("show", str(out), "features.0", "-s", "2", "-o", str(by_row)).exit_code == 0
    assert by_id.read_bytes() == by_row.read_bytes()
    assert_usage_error(
        invoke("show", str(out), "features.0", "-s", "photos/cats/cat_9.jpg", "-o", str(by_id)),
        "--sample 'photos/cats/cat_9.jpg' is neither a row number nor a sample id",
    )

    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0], [1, 1, 1, 1]])
    tokens = {"input_ids": torch.arange(12).reshape(3, 4) % 5, "attention_mask": mask}
    words = tmp_path / "t"
    embed = torch.nn.Sequential(torch.nn.Embedding(5, 4))
    hookdump.dump(
        embed,
        [tokens],
        words,
        layers="0",
        per_token=True,
        ids=["a", "b", "c"],
        forward=lambda m, b: m(b["input_ids"]),
    )
    first_of_c = int(mask[:2].sum())  # the tokens of "a" and "b" come first
    # with token rows, an id draws its sequence whole (issue 57): its 4 rows, from the first
    from hookdump.tools.pictures.sample import draw_sample

    whole = draw_sample(words, "0", by_id, "c")
    assert (whole.chart, whole.rows) == ("heatmap", int(mask[2].sum()))
    assert "sequence c, 4 tokens" in whole.title
    assert invoke("show", str(words), "0", "-s", str(first_of_c), "-o", str(by_row)).exit_code == 0
    assert hookdump.load(words)["__sample__"][first_of_c] == 2
    assert repr(hookdump.load(words)).startswith(
        f"Dump({str(words)!r}, 4 keys, {int(mask.sum())} token rows from 3 sequences)"
    )
    plain = tmp_path / "plain"
    hookdump.dump(ConvNet().eval(), [images], plain, layers="features.0")
    assert_usage_error(
        invoke("show", str(plain), "features.0", "-s", "cat", "-o", str(by_id)),
        "have no ids but their row numbers",
    )


def test_a_key_not_there_is_said_before_the_missing_out(convdump: Path) -> None:
    """`show DUMP conv2` without -o: that conv2 is not a key comes first (--out would not
    help); a key that is there gets the --out line."""
    out = convdump
    assert_usage_error(invoke("show", str(out), "conv2"), "'conv2' is not in")
    assert_usage_error(invoke("show", str(out), "head"), "give --out FILE")


def test_a_misspelt_model_folder_gets_the_nearest(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`hf:./my-gtp2` beside a model folder `my-gpt2`: did you mean, as the path was written."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "my-gpt2").mkdir()
    (tmp_path / "my-gpt2" / "config.json").write_text("{}")
    result = invoke("run", "hf:./my-gtp2", "--text", "x.txt", "-o", str(tmp_path / "d"))
    assert_usage_error(result, "no such folder (did you mean hf:./my-gpt2?)")
    assert not (tmp_path / "d").exists()
