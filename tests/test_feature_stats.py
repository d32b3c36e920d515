"""Per-feature statistics made while writing (issue 36, part 1): each floating key's count,
mean, variance, min, max and mean row norm per feature, in the dump's `stats.safetensors`,
read with `Dump.stats` and shown by `inspect`; checked against torch's own reductions over
the whole key (`stattools`). Across ranks: `test_torchrun`; across a resume: `test_resume`;
at a URL: `test_url_write`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from clitools import invoke
from stattools import assert_stats_match
from torch import nn

import hookdump
from hookdump.format.names import STATS_FILE


class _Offset(nn.Module):
    """A conv ([C, H, W] rows: channels are the features) far from zero (mean >> std,
    where E[x^2] - E[x]^2 would cancel), then a linear layer ([D] rows)."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3)
        self.linear = nn.Linear(4 * 6 * 6, 5)
        with torch.no_grad():
            self.conv.bias += 1000.0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear(self.conv(x).flatten(1))


class _Holes(nn.Module):
    """Rows with NaN in feature 1 and +inf in feature 2 for some samples."""

    def __init__(self) -> None:
        super().__init__()
        self.out = nn.Identity()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.clone()
        x[::3, 1] = torch.nan
        x[1::4, 2] = torch.inf
        return self.out(x)


def test_statistics_equal_torchs_over_the_whole_key(tmp_path: Path) -> None:
    torch.manual_seed(0)
    data = [torch.randn(n, 3, 8, 8) for n in (5, 1, 7, 4)]  # batches of different sizes
    dump = hookdump.dump(_Offset(), data, tmp_path / "d", layers=["conv", "linear"],
                          shard_size=1)  # fmt: skip
    assert dump.keys() == ["conv", "linear"]
    for key in dump:
        assert_stats_match(dump, key)
    conv = dump.stats("conv")
    assert list(conv) == ["count", "mean", "var", "std", "min", "max", "norm_mean", "rows"]
    assert conv["mean"].shape == (4,) and conv["mean"].dtype == torch.float64
    assert int(conv["rows"]) == 17 * 36  # a row per pixel of each sample
    assert torch.all(conv["mean"] > 900)  # the conv's bias
    entry = dump.manifest["feature_stats"]
    assert entry["file"] == STATS_FILE
    assert (tmp_path / "d" / STATS_FILE).stat().st_size == entry["bytes"]


def test_nonfinite_values_are_left_out_feature_by_feature(tmp_path: Path) -> None:
    torch.manual_seed(1)
    data = list(torch.randn(12, 4).split(5))  # batches of 5, 5 and 2
    dump = hookdump.dump(_Holes(), data, tmp_path / "d", layers="out")
    assert_stats_match(dump, "out")
    stats = dump.stats("out")
    # NaN in rows 0 and 3 of each batch (5 in all), +inf in row 1 of each (3)
    assert stats["count"].tolist() == [12, 12 - 5, 12 - 3, 12]
    assert int(stats["rows"]) == 2 + 2 + 0  # rows wholly finite: 2, 4 of the first two


class _NoFeatures(nn.Module):
    """An output of no features (`[B, 0]`): rows without values."""

    def __init__(self) -> None:
        super().__init__()
        self.out = nn.Identity()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(x[:, :0])


def test_rows_of_no_features_are_counted(tmp_path: Path) -> None:
    """A key of shape [0] (it made the statistics' reshape fail, and the run with it)."""
    dump = hookdump.dump(_NoFeatures(), [torch.randn(3, 4), torch.randn(2, 4)], tmp_path / "d",
                         layers="out")  # fmt: skip
    assert dump["out"].shape == (5, 0)
    stats = dump.stats("out")
    assert stats["mean"].shape == (0,) and int(stats["rows"]) == 5
    assert float(stats["norm_mean"]) == 0.0  # each row's norm: 0
    # read back (as a resumed run reads its kept shards), such a key is not read at all: its
    # rows would go uncounted, so it has no statistics rather than a short count
    from hookdump.store.read.summary import summarize

    summary = summarize(dump.reader)["out"]
    assert summary.features is None and summary.features_lost


def test_token_rows_take_real_tokens_only(gpt2: Path, tmp_path: Path) -> None:
    """--per-token dumps only real tokens; the statistics are over those rows (and the
    integer keys, token ids and positions, have none)."""
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("the cat sat\nthe dog sat on the mat today\nhello\n")
    out = tmp_path / "d"
    result = invoke("run", f"hf:{gpt2}", "--text", str(corpus), "--per-token", "-l", "h.0",
                    "-b", "3", "-q", "-o", str(out))  # fmt: skip
    assert result.exit_code == 0, result.stderr
    dump = hookdump.load(out)
    assert dump.num_samples == 3 + 7 + 1
    assert_stats_match(dump, "h.0")
    with pytest.raises(hookdump.HookdumpError, match=r"'__token_ids__' of .* only floating"):
        dump.stats("__token_ids__")


def test_inspect_shows_them_and_a_tampered_file_is_refused(tmp_path: Path) -> None:
    torch.manual_seed(2)
    out = tmp_path / "d"
    hookdump.dump(_Offset(), [torch.randn(3, 3, 8, 8)], out, layers=["conv", "linear"])
    result = invoke("inspect", str(out))
    assert result.exit_code == 0, result.stderr
    said = " ".join(result.stdout.split())  # as wrapped at the console's width
    assert "per-feature statistics of 2 keys (Dump.stats(key)); conv: 4 features" in said
    listed = json.loads(invoke("inspect", str(out), "--json").stdout)["tensors"]
    assert listed[0]["features"]["features"] == 4
    std = hookdump.load(out).stats("conv")["std"]
    assert listed[0]["features"]["std_max"] == pytest.approx(float(std.max()))

    raw = bytearray((out / STATS_FILE).read_bytes())
    raw[-1] ^= 1  # one bit of a value
    (out / STATS_FILE).write_bytes(bytes(raw))
    with pytest.raises(hookdump.InvalidDump, match="does not match the SHA-256"):
        hookdump.load(out).stats("conv")
    checked = invoke("inspect", str(out), "--check")
    assert checked.exit_code == 1
    assert "does not match the SHA-256 its manifest records" in checked.stderr
    assert hookdump.load(out)["conv"].shape == (3, 4, 6, 6)  # the rows read as before


def test_a_manifest_naming_another_file_is_refused(tmp_path: Path) -> None:
    out = tmp_path / "d"
    hookdump.dump(_Holes(), [torch.randn(2, 4)], out, layers="out")
    manifest = json.loads((out / "manifest.json").read_text())
    manifest["feature_stats"]["file"] = "../outside.safetensors"
    (out / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(hookdump.InvalidDump, match="'feature_stats' must be an object naming"):
        hookdump.load(out)


def test_a_dump_without_them_says_so(tmp_path: Path) -> None:
    out = tmp_path / "d"
    hookdump.dump(_Holes(), [torch.randn(2, 4)], out, layers="out")
    manifest = json.loads((out / "manifest.json").read_text())
    del manifest["feature_stats"]  # as a dump made before they were written
    (out / "manifest.json").write_text(json.dumps(manifest))
    (out / STATS_FILE).unlink()
    with pytest.raises(hookdump.HookdumpError, match="has no per-feature statistics"):
        hookdump.load(out).stats("out")
    with pytest.raises(KeyError, match="'outs' is not in"):
        hookdump.load(out).stats("outs")


@pytest.mark.parametrize("per_token", [False, True], ids=["samples", "token_rows"])
def test_per_head_keys_have_a_feature_per_head_and_dimension(
    gpt2: Path, tmp_path: Path, per_token: bool
) -> None:
    """Issue 44: `z` ([T, heads, head_dim], or [heads, head_dim] a token row) had its heads
    pooled (16 features, not 2 x 16) or, without token rows, its positions taken for the
    channels. Now heads x head_dim features, head-major, each equal to torch's reductions."""
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("the cat sat on the mat\nthe dog sat\n")
    out = tmp_path / "d"
    args = ["--per-token"] if per_token else ["--max-length", "6"]
    result = invoke("run", f"hf:{gpt2}", "--text", str(corpus), "-l", "h.0.attn", "-c", "z",
                    "-b", "2", "-q", "-o", str(out), *args)  # fmt: skip
    assert result.exit_code == 0, result.stderr
    dump = hookdump.load(out)
    key = "h.0.attn:z"
    assert dump.info(key).shape[-2:] == (2, 16)  # the fixture's 2 heads of 16
    assert dump.stats(key)["mean"].shape == (32,)
    assert_stats_match(dump, key)
    head_1 = dump[key][..., 1, :].reshape(-1, 16).double().mean(0)  # by hand: head 1 alone
    torch.testing.assert_close(dump.stats(key)["mean"].view(2, 16)[1], head_1)
