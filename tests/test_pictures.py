"""`show KEY` of `[T, D]` rows, attention heads and vectors, drawn with matplotlib: the
largest value is the brightest cell where it lies, the title is drawn, a text sample's rows
are named by its tokens."""

from __future__ import annotations

from pathlib import Path

import numpy
import pytest
import torch
from clitools import invoke
from picturetools import pixels_of, viridis

import hookdump

pytest.importorskip("matplotlib")
transformers = pytest.importorskip("transformers")
pytestmark = pytest.mark.usefixtures("in_tests_dir")


def test_the_largest_value_is_the_brightest_cell(tmp_path: Path) -> None:
    from hookdump.tools.pictures.charts import heatmap

    values = torch.linspace(-1, 1, 12 * 20).reshape(12, 20)
    values[7, 13] = 5.0  # an outlier, far above the rest
    drawn = heatmap(values, tmp_path / "h.png", "a known tensor")
    pixels = pixels_of(tmp_path / "h.png")
    assert pixels.shape[:2] == (drawn.height, drawn.width) == (600, 1000)
    assert drawn.box is not None
    left, top, right, bottom = drawn.box
    x = round(left + (13.5 / 20) * (right - left))
    y = round(top + (7.5 / 12) * (bottom - top))
    assert numpy.abs(pixels[y, x] - viridis(1.0)).sum() < 10  # viridis' brightest
    x_other = round(left + (2.5 / 20) * (right - left))
    assert numpy.abs(pixels[y, x_other] - viridis(1.0)).sum() > 100  # its neighbours not


def test_the_title_is_drawn(tmp_path: Path) -> None:
    from hookdump.tools.pictures.charts import heatmap

    values = torch.randn(6, 8, generator=torch.Generator().manual_seed(0))
    heatmap(values, tmp_path / "titled.png", "the title of this picture")
    heatmap(values, tmp_path / "bare.png", "")
    titled, bare = pixels_of(tmp_path / "titled.png"), pixels_of(tmp_path / "bare.png")
    assert (titled[:40] != bare[:40]).any(axis=2).sum() > 100


def test_text_rows_are_named_by_their_tokens_and_heads_are_drawn(
    gpt2: Path, corpus: Path, tmp_path: Path
) -> None:
    out = tmp_path / "d"
    result = invoke("run", f"hf:{gpt2}", "--text", str(corpus), "--max-length", "6", "-l",
                    "h.0", "-l", "h.0.attn", "--capture", "output,pattern", "-q",
                    "-o", str(out))  # fmt: skip
    assert result.exit_code == 0, result.stderr
    from hookdump.tools.pictures.charts import token_strings
    from hookdump.tools.pictures.sample import draw_sample

    dump = hookdump.load(out)
    tokenizer = transformers.AutoTokenizer.from_pretrained(gpt2)
    expected = tokenizer.convert_ids_to_tokens(dump["__input_ids__"][1].tolist())
    assert token_strings(dump, 1, 6) == expected
    drawn = draw_sample(out, "h.0", tmp_path / "rows.png", 1)
    assert drawn.describe("h.0", 1).endswith("heatmap of 6x32 of h.0 sample 1")
    shown = invoke("show", str(out), "h.0.attn:pattern", "-o", str(tmp_path / "heads.png"))
    assert shown.exit_code == 0, shown.stderr
    assert "pattern per head" in shown.stdout
    assert pixels_of(tmp_path / "heads.png").shape == (600, 1000, 3)
