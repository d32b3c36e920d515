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


def test_text_rows_are_named_by_their_tokens_and_padding_is_left_out(
    gpt2: Path, corpus: Path, tmp_path: Path
) -> None:
    """The rows of a [T, D] sample and both axes of its attention heads are labelled with
    the tokens as the tokenizer writes them (its own decode of each id, here), whitespace
    drawn as `·`; padding positions are left out, or with `--padding` drawn as `[pad]`; a
    token row's title names its token, sequence and position (issue 35)."""
    out = tmp_path / "d"
    result = invoke("run", f"hf:{gpt2}", "--text", str(corpus), "--max-length", "9", "-l",
                    "h.0", "-l", "h.0.attn", "--capture", "output,pattern", "-q",
                    "-o", str(out))  # fmt: skip
    assert result.exit_code == 0, result.stderr
    from hookdump.tools.pictures.sample import draw_sample
    from hookdump.tools.pictures.tokens import visible

    dump = hookdump.load(out)
    masks = dump["__attention_mask__"]
    sample = next(i for i in range(len(masks)) if 0 < int(masks[i].sum()) < masks.shape[1])
    real = int(masks[sample].sum())
    tokenizer = transformers.AutoTokenizer.from_pretrained(gpt2)
    ids = dump["__input_ids__"][sample].tolist()
    words = [tokenizer.decode([i]).replace(" ", "·") or "∅" for i in ids]

    rows = draw_sample(out, "h.0", tmp_path / "rows.png", sample)
    assert (rows.rows, rows.labels) == (real, words[:real])  # read back from the figure
    assert f"{masks.shape[1] - real} padding positions left out" in rows.title
    padded = draw_sample(out, "h.0", tmp_path / "pad.png", sample, padding=True)
    assert padded.rows == masks.shape[1]
    assert padded.labels == words[:real] + [w + " [pad]" for w in words[real:]]

    shown = invoke("show", str(out), "h.0.attn:pattern", "-s", str(sample), "-o",
                   str(tmp_path / "heads.png"))  # fmt: skip
    assert shown.exit_code == 0, shown.stderr
    heads = draw_sample(out, "h.0.attn:pattern", tmp_path / "heads.png", sample)
    assert heads.labels == words[:real]  # the query tokens; the keys' are the same
    assert visible(" heads\n") == "·heads↵" and visible("") == "∅"

    per_token = tmp_path / "t"
    result = invoke("run", f"hf:{gpt2}", "--text", str(corpus), "--per-token", "-l", "h.0",
                    "-q", "-o", str(per_token))  # fmt: skip
    assert result.exit_code == 0, result.stderr
    rows_of = hookdump.load(per_token)
    row = 3
    token = tokenizer.decode([int(rows_of["__token_ids__"][row])]).replace(" ", "·")
    sequence = rows_of.sample_ids[int(rows_of["__sample__"][row])]
    position = int(rows_of["__position__"][row])
    titled = draw_sample(per_token, "h.0", tmp_path / "row.png", row)
    assert f"token {token!r} (sequence {sequence}, position {position})" in titled.title


def test_a_vision_transformer_row_sets_cls_apart_from_its_patches(tmp_path: Path) -> None:
    """A ViT's [1 + 16, D] sample: the CLS row apart, the 16 patches laid out 4x4 (issue
    35); the CLS norm said is the one computed here from the dump's own row."""
    from hookdump.tools.pictures.sample import draw_sample

    folder = tmp_path / "vit"
    config = transformers.ViTConfig(
        image_size=32, patch_size=8, hidden_size=16, num_hidden_layers=1,
        num_attention_heads=2, intermediate_size=32,
    )  # fmt: skip
    transformers.ViTModel(config).save_pretrained(folder)
    out = tmp_path / "d"
    result = invoke("run", f"hf:{folder}", "-l", "layers.0", "-n", "2", "-q", "-o", str(out))
    assert result.exit_code == 0, result.stderr
    row = hookdump.load(out).row("layers.0", 1)
    assert list(row.shape) == [17, 16]
    drawn = draw_sample(out, "layers.0", tmp_path / "vit.png", 1)
    assert drawn.chart == "CLS and patches"
    assert drawn.which == f"CLS norm {float(row[0].norm()):.4g}, patches as a 4x4 grid"


def test_a_sentencepiece_space_marker_is_drawn_as_a_space(tmp_path: Path) -> None:
    """SentencePiece-style tokens (`▁the`, a Metaspace tokenizer such as Llama's) are drawn
    `·the`, as GPT-2's `Ġthe` is: written alone, the tokenizer drops the marker."""
    from types import SimpleNamespace

    import transformers
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    from hookdump.tools.pictures.tokens import written

    vocab = {"<unk>": 0, "▁the": 1, "▁cat": 2, "s": 3}
    spm = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    spm.pre_tokenizer = pre_tokenizers.Metaspace()
    spm.decoder = decoders.Metaspace()
    folder = tmp_path / "spm"
    transformers.PreTrainedTokenizerFast(tokenizer_object=spm, unk_token="<unk>").save_pretrained(
        folder
    )

    dump = SimpleNamespace(manifest={"input": {"tokenizer": str(folder)}})  # what it reads
    assert written(dump, [1, 2, 3]) == ["·the", "·cat", "s"]


def test_a_vector_names_its_most_negative_units_too(tmp_path: Path) -> None:
    """A vector's picture names its largest units and its most negative ones (a row of
    an SAE or a probe direction matters as much below 0 as above)."""
    import torch

    from hookdump.tools.pictures.charts import _extreme_units, vector

    data = torch.tensor([0.5, -3.0, 2.0, -1.0, 4.0, 0.0, -0.2])
    assert _extreme_units(data) == ([4, 2, 0], [1, 3, 6])
    assert _extreme_units(torch.tensor([3.0, 1.0, 2.0])) == ([0, 2, 1], [])
    many = torch.linspace(-1, 1, 500)
    many[17], many[400] = -9.0, 9.0
    high, low = _extreme_units(many)
    assert high[0] == 400 and low[0] == 17 and len(high) == len(low) == 5
    vector(many, tmp_path / "v.png", "a direction")
    vector(data, tmp_path / "bars.png", "a short one")


def test_a_long_vectors_profile_is_drawn_from_few_points(tmp_path: Path) -> None:
    """A vector of millions of units (a 5M-wide row under `ulimit -v`) is drawn as its sorted
    profile at at most PROFILE_POINTS evenly spaced ranks: the highest and lowest values
    and every point on the profile numpy's own sort gives, at a fixed cost in memory."""
    from hookdump.tools.pictures.charts import PROFILE_POINTS, profile, vector

    torch.manual_seed(0)
    data = torch.randn(1_000_003)
    ranks, values = profile(data)
    assert len(ranks) == len(values) == PROFILE_POINTS
    reference = numpy.sort(data.numpy())[::-1]  # highest first
    assert int(ranks[0]) == 0 and int(ranks[-1]) == data.numel() - 1
    assert numpy.array_equal(values.numpy(), reference[ranks.numpy()])
    assert bool((ranks[1:] > ranks[:-1]).all())  # evenly spread, none twice
    assert int((ranks[1:] - ranks[:-1]).max()) <= data.numel() // (PROFILE_POINTS - 1) + 1
    short = torch.tensor([0.5, -3.0, 2.0])
    assert profile(short)[1].tolist() == [2.0, 0.5, -3.0]
    drawn = vector(data, tmp_path / "long.png", "a long row")
    assert drawn.chart == "sorted profile"
