"""Pictures of a whole dump: `show --depth` (statistics along the forward order, the first
non-finite key marked) and `diff --plot` (relative error per key, the first diverging key
marked). Content is checked, not only that a file exists: the size, a title that is drawn,
the red marks."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy
import pytest
from clitools import assert_usage_error, invoke
from picturetools import pixels_of

import hookdump

pytest.importorskip("matplotlib")
pytestmark = pytest.mark.usefixtures("in_tests_dir")
RED = (214, 39, 40)  # matplotlib's tab:red


def _run(out: Path, *args: str) -> Path:
    result = invoke("run", *args, "-q", "-o", str(out))
    assert result.exit_code == 0, result.stderr
    return out


def _red_columns(pixels: numpy.ndarray) -> set[int]:
    close = (numpy.abs(pixels - numpy.array(RED)).sum(axis=2) < 40).sum(axis=0)
    return {int(x) for x in numpy.nonzero(close > pixels.shape[0] // 3)[0]}  # tall red lines


def test_depth_marks_where_nan_starts(tmp_path: Path) -> None:
    dump = _run(tmp_path / "d", "tiny_models:MakesNaN", "-n", "4")
    png = tmp_path / "depth.png"
    result = invoke("show", str(dump), "--depth", "-o", str(png))
    assert result.exit_code == 0, result.stderr
    assert "statistics along the forward order of 3 keys; marked 'log'" in result.stdout
    pixels = pixels_of(png)
    assert pixels.shape == (600, 1200, 3)
    assert _red_columns(pixels)  # the NaN keys' lines


def test_the_title_is_drawn(tmp_path: Path) -> None:
    from hookdump.tools.inspect import inspect_dump
    from hookdump.tools.pictures.curves import depth_plot

    keys = inspect_dump(_run(tmp_path / "d", "tiny_models:TwoLinear", "-n", "4")).keys
    depth_plot(keys, tmp_path / "titled.png", "a title that is drawn")
    depth_plot(keys, tmp_path / "bare.png", "")
    titled, bare = pixels_of(tmp_path / "titled.png"), pixels_of(tmp_path / "bare.png")
    assert titled.shape == bare.shape
    top = (titled[:40] != bare[:40]).any(axis=2)
    assert top.sum() > 100  # the title's pixels, in the band above the plot


def test_diff_plot_marks_the_first_diverging_key(tmp_path: Path) -> None:
    a = _run(tmp_path / "a", "tiny_models:TwoLinear", "-n", "4", "--seed", "1")
    b = _run(tmp_path / "b", "tiny_models:TwoLinear", "-n", "4", "--seed", "2")
    png = tmp_path / "diff.png"
    result = invoke("diff", str(a), str(b), "--plot", str(png))
    assert result.exit_code == 1  # the check still fails, picture or not
    assert "errors (max relative, 1 - cos, mismatched) of 4 keys; marked 'linear_1'" in (
        result.stderr
    )
    pixels = pixels_of(png)
    assert pixels.shape == (600, 1200, 3)
    assert _red_columns(pixels)
    same = invoke("diff", str(a), str(a), "--plot", str(tmp_path / "same.svg"))
    assert same.exit_code == 0 and "marked" not in same.stderr
    assert "<svg" in (tmp_path / "same.svg").read_text()[:2000]
    pdf = invoke("show", str(a), "--depth", "-o", str(tmp_path / "depth.pdf"))
    assert pdf.exit_code == 0 and (tmp_path / "depth.pdf").read_bytes()[:5] == b"%PDF-"


def test_bad_picture_requests_are_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    dump = _run(tmp_path / "d", "tiny_models:TwoLinear", "-n", "2")
    assert_usage_error(invoke("diff", str(dump), str(dump), "--plot", str(tmp_path / "x.jpg")),
                       "--plot", ".jpg is not a picture format", ".png, .svg, .pdf")  # fmt: skip
    assert_usage_error(invoke("show", str(dump), "--depth", "-o", str(tmp_path / "x")),
                       "no extension is not a picture format")  # fmt: skip
    assert_usage_error(invoke("show", str(dump), "linear_1", "--depth", "-o",
                              str(tmp_path / "x.png")), "--depth draws every key")  # fmt: skip
    assert_usage_error(invoke("show", str(dump), "-o", str(tmp_path / "x.png")),
                       "give the KEY to draw, or --depth")  # fmt: skip
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # as if not installed
    assert_usage_error(invoke("show", str(dump), "--depth", "-o", str(tmp_path / "x.png")),
                       "pip install 'hookdump[plot]'")  # fmt: skip
    assert not list(tmp_path.glob("x*"))


def test_pictures_make_their_missing_folders(tmp_path: Path) -> None:
    """The contract (2026-11-25): every command that writes a file creates its parent
    folders; `show` and `diff --plot` did not."""
    dump = _run(tmp_path / "d", "tiny_models:TwoLinear", "-n", "2")
    key = hookdump.load(dump).keys()[0]
    for args, picture in (
        (["show", str(dump), key], tmp_path / "a" / "b" / "key.png"),
        (["show", str(dump), "--depth"], tmp_path / "c" / "depth.svg"),
        (["diff", str(dump), str(dump), "-q", "--plot"], tmp_path / "e" / "f" / "diff.pdf"),
    ):
        flag = [] if args[-1] == "--plot" else ["--out"]
        result = invoke(*args, *flag, str(picture))
        assert result.exit_code == 0, result.stderr
        assert picture.stat().st_size > 0


def test_depth_leaves_out_bookkeeping_and_keeps_the_band_within_the_values(
    tmp_path: Path,
) -> None:
    """A token-row dump: `__token_ids__`, `__sample__` and `__position__` are not drawn
    (`--bookkeeping` brings them back); a ReLU's mean ± std band never dips below its
    minimum of 0; the legend lies beside the plot, off the data; the title counts tokens
    and sequences (issue 35)."""
    import torch
    from torch import nn

    from hookdump.tools.inspect import inspect_dump
    from hookdump.tools.pictures.curves import depth_plot

    batch = {
        "input_ids": torch.arange(24).reshape(4, 6) % 7,
        "attention_mask": (torch.arange(6) < torch.tensor([[6], [4], [5], [2]])).long(),
    }
    net = nn.Sequential(nn.Embedding(7, 16), nn.ReLU())
    out = tmp_path / "t"
    hookdump.dump(net, [batch], out, per_token=True, forward=lambda m, b: m(b["input_ids"]))
    keys = inspect_dump(out).keys
    drawn = depth_plot(keys, tmp_path / "depth.png", "t")
    assert drawn.names == ["0", "1"] and drawn.legend_clear
    relu = drawn.names.index("1")
    assert drawn.series["min"][relu] == 0 and drawn.series["band low"][relu] >= 0
    assert all(lo <= b for lo, b in zip(drawn.series["min"], drawn.series["band low"], strict=True))
    assert all(
        b <= hi for b, hi in zip(drawn.series["band high"], drawn.series["max"], strict=True)
    )
    every = depth_plot(keys, tmp_path / "every.png", "t", bookkeeping=True)
    assert {"__token_ids__", "__sample__", "__position__"} <= set(every.names)
    result = invoke("show", str(out), "--depth", "-o", str(tmp_path / "cli.png"))
    assert result.exit_code == 0 and "of 2 keys" in result.stdout
    assert (
        "of 5 keys"
        in invoke(
            "show", str(out), "--depth", "--bookkeeping", "-o", str(tmp_path / "cli.png")
        ).stdout
    )


def test_diff_plot_draws_one_minus_cos_and_the_fraction_mismatched(tmp_path: Path) -> None:
    """Beside the max relative error (relative to the larger value: at most 2), `1 - cos` and
    the fraction of values mismatched, each as computed here from the two dumps."""
    import torch

    from hookdump.tools.diff import diff_dumps
    from hookdump.tools.pictures.curves import diff_plot

    a = _run(tmp_path / "a", "tiny_models:TwoLinear", "-n", "4", "--seed", "1")
    b = _run(tmp_path / "b", "tiny_models:TwoLinear", "-n", "4", "--seed", "2")
    drawn = diff_plot(diff_dumps(a, b), tmp_path / "d.png", "t")
    da, db = hookdump.load(a), hookdump.load(b)
    for n, key in enumerate(drawn.names):
        x, y = da[key].double().flatten(), db[key].double().flatten()
        cos = float(torch.dot(x, y) / (x.norm() * y.norm()))
        assert drawn.series["1 - cos"][n] == pytest.approx(max(1 - cos, 1e-12), rel=1e-6)
        off = float((~torch.isclose(x.float(), y.float(), rtol=1e-5, atol=1e-8)).double().mean())
        assert drawn.series["mismatched"][n] == pytest.approx(max(off, 1e-12))
    assert drawn.legend_clear
    # the legend's long labels wrapped: the plotted area keeps 0.73 of the width (it had 0.60)
    assert drawn.plotted >= 0.7, drawn.plotted
