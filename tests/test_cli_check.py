"""The CI tools: `diff`, `inspect`, `run --fail-on-nonfinite`."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from clitools import assert_usage_error, invoke

import hookdump

pytestmark = pytest.mark.usefixtures("in_tests_dir")


def dump(out: Path, *args: str) -> Path:
    result = invoke("run", "tiny_models:two_linear_factory", "-q", "-n", "5", "-o", str(out), *args)
    assert result.exit_code == 0, result.stderr
    return out


# --- diff ---------------------------------------------------------------------------------


def test_a_dump_matches_itself_and_a_reshard_of_itself(tmp_path: Path) -> None:
    a = dump(tmp_path / "a")
    b = dump(tmp_path / "b", "-b", "2", "--shard-size", "1")  # 3 shards against 1
    for other in (a, b):
        result = invoke("diff", str(a), str(other))
        assert result.exit_code == 0, result.stdout
        assert "all 4 keys match" in result.stdout


def test_different_weights_fail_and_name_the_first_diverging_key(tmp_path: Path) -> None:
    # only linear_2's bias differs: linear_1 and relu still match, so the first diverging key
    # is not simply the first key
    a = dump(tmp_path / "a")
    b = dump(tmp_path / "b", "-m", "bias_2=1.001")
    result = invoke("diff", str(a), str(b), "--json")
    assert result.exit_code == 1
    data = json.loads(result.stdout)
    assert data["match"] is False
    assert data["first_diverging"]["key"] == "linear_2"
    statuses = {k["key"]: k["status"] for k in data["keys"]}
    assert statuses == {
        "linear_1": "match",
        "relu": "match",
        "linear_2": "differ",
        "relu6": "differ",
    }
    # by hand: the bias moved by 0.001, so every linear_2 output moved by 0.001
    assert data["first_diverging"]["max_abs"] == pytest.approx(0.001, abs=1e-6)
    assert data["first_diverging"]["mismatched"] == 5

    text = invoke("diff", str(a), str(b))
    assert text.exit_code == 1
    assert "2 of 4 keys differ" in text.stdout and "first diverging: linear_2" in text.stdout
    assert "linear_1" not in text.stdout  # matching keys are listed only with --all


def test_a_tolerance_that_admits_the_difference_passes(tmp_path: Path) -> None:
    a = dump(tmp_path / "a")
    b = dump(tmp_path / "b", "-m", "bias_2=1.001")
    assert invoke("diff", str(a), str(b), "--atol", "0.002").exit_code == 0
    assert invoke("diff", str(a), str(b), "--rtol", "0.01").exit_code == 0
    assert invoke("diff", str(a), str(b), "--atol", "0.0005").exit_code == 1


def test_keys_glob_compares_a_subset(tmp_path: Path) -> None:
    a = dump(tmp_path / "a")
    b = dump(tmp_path / "b", "-m", "bias_2=1.001")
    assert invoke("diff", str(a), str(b), "--keys", "linear_1", "-k", "relu").exit_code == 0
    assert_usage_error(invoke("diff", str(a), str(b), "--keys", "conv*"), "--keys 'conv*'")


def test_missing_keys_are_failures(tmp_path: Path) -> None:
    a = dump(tmp_path / "a")
    fewer = dump(tmp_path / "fewer", "-l", "linear_1", "-l", "relu", "-l", "linear_2")
    data = json.loads(invoke("diff", str(a), str(fewer), "--json").stdout)
    assert data["first_diverging"]["key"] == "relu6"
    assert data["first_diverging"]["status"] == "only in A"


def test_another_dtype_is_compared_by_value_in_the_wider_one(tmp_path: Path) -> None:
    """float32 against bfloat16: the values B holds are A's rounded, so the differences are
    the rounding's (computed here from A's own values); within a tolerance that admits the
    rounding, the dumps match, the change noted; `--strict-dtype` makes it a failure."""
    a = dump(tmp_path / "a", "-m", "bias=0.3")  # 0.3 + ... is not a bfloat16 number
    half = dump(tmp_path / "half", "-m", "bias=0.3", "--save-dtype", "bfloat16")
    values = hookdump.load(a)["linear_1"]
    rounding = (values - values.bfloat16().float()).abs()
    assert rounding.max() > 0

    strict = invoke("diff", str(a), str(half), "--json")  # default tolerances: the rounding
    assert strict.exit_code == 1
    row = next(k for k in json.loads(strict.stdout)["keys"] if k["key"] == "linear_1")
    assert (row["status"], row["dtypes"]) == ("differ", "float32 vs bfloat16")
    assert row["max_abs"] == pytest.approx(float(rounding.max()), rel=1e-6)
    larger = torch.maximum(values.abs(), values.bfloat16().float().abs())
    rel = (rounding / larger).nan_to_num(nan=0.0)  # 0/0: equal zeros
    assert row["max_rel"] == pytest.approx(float(rel.max()), rel=1e-6)

    loose = invoke("diff", str(a), str(half), "--rtol", "0.01", "--all")
    assert loose.exit_code == 0, loose.stdout
    assert "all 4 keys match" in loose.stdout
    # every key changed alike: said once under the table, each row one line (issue 57)
    assert "B holds every key in another dtype (float32 vs bfloat16)" in loose.stdout
    assert "match (float32" not in loose.stdout
    ci = invoke("diff", str(a), str(half), "--rtol", "0.01", "--strict-dtype", "--json")
    assert ci.exit_code == 1
    first = json.loads(ci.stdout)["first_diverging"]
    assert (first["status"], first["detail"], first["mismatched"]) == (
        "dtype",
        "float32 vs bfloat16",
        0,
    )


def test_different_sample_counts_fail(tmp_path: Path) -> None:
    a = dump(tmp_path / "a")
    b = dump(tmp_path / "b", "-n", "3")
    result = invoke("diff", str(a), str(b))
    assert result.exit_code == 1
    assert "num_samples differ: A has 5, B has 3" in result.stdout


def test_nan_in_the_same_place_matches_itself(tmp_path: Path) -> None:
    out = tmp_path / "nan"
    assert invoke("run", "tiny_models:MakesNaN", "-q", "-o", str(out)).exit_code == 0
    assert invoke("diff", str(out), str(out)).exit_code == 0


def test_unreadable_dumps_are_usage_errors(tmp_path: Path) -> None:
    a = dump(tmp_path / "a")
    assert_usage_error(invoke("diff", str(a), str(tmp_path / "nope")), "does not exist")
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "manifest.json").write_text("{not json")
    assert_usage_error(invoke("diff", str(a), str(tmp_path / "bad")), "not readable JSON")


# --- inspect ------------------------------------------------------------------------------


def test_inspect_recomputes_the_run_summary_from_the_files(tmp_path: Path) -> None:
    run = invoke("run", "tiny_models:TwoLinear", "--json", "-n", "6", "-b", "4",
                 "--shard-size", "1", "-o", str(tmp_path / "d"))  # fmt: skip
    found = invoke("inspect", str(tmp_path / "d"), "--json")
    assert found.exit_code == 0
    ran, seen = json.loads(run.stdout), json.loads(found.stdout)
    assert seen["complete"] is True and seen["problems"] == [] and seen["shards"] == 2
    for r, s in zip(ran["tensors"], seen["tensors"], strict=True):
        assert (r["key"], r["module_type"], r["shape"], r["bytes"]) == (
            s["key"], s["module_type"], s["shape"], s["bytes"],
        )  # fmt: skip
        for stat in ("mean", "std", "min", "max"):
            assert s[stat] == pytest.approx(r[stat], rel=1e-6, abs=1e-7)


def test_inspect_reports_an_incomplete_dump_and_what_is_missing(tmp_path: Path) -> None:
    out = tmp_path / "d"
    invoke("run", "tiny_models:TwoLinear", "-q", "-n", "4", "-b", "2", "--shard-size", "1",
           "-o", str(out))  # fmt: skip
    (out / "shard-00001.safetensors").unlink()
    result = invoke("inspect", str(out))
    assert result.exit_code == 0
    assert "INCOMPLETE" in result.stdout
    assert "shard-00001.safetensors (samples 2:4) is missing" in result.stdout
    assert "incomplete dump" in result.stderr
    checked = invoke("inspect", str(out), "--check")
    assert checked.exit_code == 1 and "INCOMPLETE" in checked.stdout

    (out / "shard-00000.safetensors").unlink()
    result = invoke("inspect", str(out))
    assert "2 of 2 shards are missing, the first shard-00000.safetensors (samples 0:2)" in (
        result.stdout
    )
    assert "2 of 2" in result.stderr and len(result.stderr.splitlines()) == 1

    manifest = json.loads((out / "manifest.json").read_text())
    (out / "manifest.json").write_text(json.dumps({**manifest, "complete": False}))
    data = json.loads(invoke("inspect", str(out), "--json").stdout)
    assert data["complete"] is False
    assert any("manifest says incomplete" in p for p in data["problems"])


def test_inspect_check_passes_a_complete_dump(tmp_path: Path) -> None:
    result = invoke("inspect", str(dump(tmp_path / "d")), "--check")
    assert result.exit_code == 0 and "complete" in result.stdout and result.stderr == ""


def test_inspect_reads_a_lone_shard_file(tmp_path: Path) -> None:
    dump(tmp_path / "d", "--capture", "input,output")
    shard = tmp_path / "d" / "shard-00000.safetensors"
    data = json.loads(invoke("inspect", str(shard), "--json").stdout)
    keys = {t["key"]: t for t in data["tensors"]}
    assert keys["linear_1:input.0"]["kind"] == "input"
    assert keys["linear_1"]["shape"] == [2]
    assert hookdump.load(shard)["linear_1"].shape == (5, 2)


def test_inspect_of_something_that_is_no_dump(tmp_path: Path) -> None:
    assert_usage_error(invoke("inspect", str(tmp_path)), "has no manifest.json")
    (tmp_path / "x.safetensors").write_bytes(b"garbage")
    assert_usage_error(invoke("inspect", str(tmp_path / "x.safetensors")), "cannot read")


# --- --fail-on-nonfinite ------------------------------------------------------------------


def test_fail_on_nonfinite_names_the_module_where_nan_starts(tmp_path: Path) -> None:
    result = invoke("run", "tiny_models:MakesNaN", "--fail-on-nonfinite", "-o", str(tmp_path / "d"))
    assert result.exit_code == 1
    assert result.stderr.startswith("Error: non-finite values first appear in 'log' (Log)")
    assert "fc2" in result.stdout  # the table is still printed
    loaded = hookdump.load(tmp_path / "d")  # and the dump kept, to debug with
    assert torch.isnan(loaded["log"]).all() and not torch.isnan(loaded["fc1"]).any()
    data = json.loads(invoke("run", "tiny_models:MakesNaN", "--json").stdout)
    assert data["first_nonfinite"] == "log"


def test_fail_on_nonfinite_passes_a_finite_model() -> None:
    assert invoke("run", "tiny_models:TwoLinear", "-q", "--fail-on-nonfinite").exit_code == 0


def test_diff_shows_how_far_the_cosine_is_from_one(tmp_path: Path) -> None:
    """A cosine of 0.99998 printed as `1` beside "differs" read as a match: the table shows
    1 - cos instead, and counts in the singular where there is one key."""
    from safetensors.torch import save_file

    a = torch.ones(2, 1000)
    b = a.clone()
    b[:, :4] = -1  # cosine 0.992
    save_file({"x": a}, tmp_path / "a.safetensors")
    save_file({"x": b}, tmp_path / "b.safetensors")
    result = invoke("diff", str(tmp_path / "a.safetensors"), str(tmp_path / "b.safetensors"))
    assert result.exit_code == 1
    header, row = result.stdout.splitlines()[:2]
    assert "1 - cos" in header
    cosine = float(torch.nn.functional.cosine_similarity(a.flatten(), b.flatten(), dim=0))
    assert f"{1 - cosine:.4g}" in row and cosine > 0.99
    assert "1 of 1 key differs" in result.stdout


def test_a_cosine_past_one_by_rounding_is_one() -> None:
    """Rounding takes the sums of two equal vectors' cosine just past 1 (printed as a
    negative 1 - cos); a cosine is within [-1, 1]."""
    from hookdump.tools.diff import KeyDiff

    past = KeyDiff("x", None, "match", numel=3, _dot=3.0000000013, _norm_a=3.0, _norm_b=3.0)
    assert past.cosine == 1.0
    below = KeyDiff("x", None, "differ", numel=3, _dot=-3.0000001, _norm_a=3.0, _norm_b=3.0)
    assert below.cosine == -1.0
    inside = KeyDiff("x", None, "differ", numel=2, _dot=1.0, _norm_a=2.0, _norm_b=2.0)
    assert inside.cosine == 0.5


def test_what_is_not_a_dump_is_named_for_what_it_is(tmp_path: Path) -> None:
    """A model's weights file is not "a dump of 420 samples, complete"; a shard is one
    shard; an export folder is an export, with how to open it; two dumps with no key in
    common are said to be so, in one line before any table."""
    from safetensors.torch import save_file

    weights = tmp_path / "model.safetensors"
    save_file({"embed.weight": torch.randn(420, 8), "head.bias": torch.randn(3)}, weights)
    result = invoke("inspect", str(weights))
    assert result.exit_code == 0, result.stderr
    said = " ".join(result.stdout.split())  # the line wraps at 80 columns
    assert said.endswith(
        f"{weights}: a safetensors file, not a hookdump dump (2 tensors, 13.1 KiB, shapes "
        "whole); show and diff read its tensors' first dimension as rows"
    )
    assert "420×8" in result.stdout and "sample" not in result.stdout
    assert "complete" not in result.stdout
    assert json.loads(invoke("inspect", str(weights), "--json").stdout)["kind"] == "safetensors"

    a = dump(tmp_path / "a")
    shard = next(a.glob("shard-*.safetensors"))
    one = " ".join(invoke("inspect", str(shard)).stdout.split())
    assert one.endswith(
        "one shard of a hookdump dump (4 tensors, 120 B, 5 rows); inspect its folder for the "
        "whole dump"
    )

    exported = tmp_path / "npy"
    assert invoke("export", str(a), str(exported), "--to", "npy").exit_code == 0
    for command in (["inspect", str(exported)], ["diff", str(a), str(exported)]):
        assert_usage_error(
            invoke(*command),
            f"{exported} is an export of a dump to npy (it holds hookdump-export.json), not a "
            "dump; open it with numpy.load",
        )

    unrelated = invoke("diff", str(a), str(weights))
    assert unrelated.exit_code == 1 and unrelated.stdout == ""
    assert unrelated.stderr == (
        f"Error: A ({a}) and B ({weights}) share no key: 4 keys ('linear_1', 'relu', ...) "
        "against 2 keys ('embed.weight', 'head.bias'); they are dumps of different models or "
        "layers\n"
    )


class _Act(torch.nn.Module):
    def __init__(self, act: torch.nn.Module) -> None:
        super().__init__()
        self.act = act

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.act(x)


@pytest.mark.parametrize(
    ("act", "want"), [(torch.nn.ReLU(), 1.0), (_Act(torch.nn.Identity()), 0.0)]
)
def test_max_rel_is_relative_to_the_larger_value(tmp_path: Path, act: Any, want: float) -> None:
    """A ReLU's zero against the value it zeroed is a relative error of 1 (it was infinite,
    relative to B's zero); the same values, 0; opposite signs, 2 (by hand)."""
    x = torch.randn(6, 5, generator=torch.Generator().manual_seed(0)) - 0.2
    a = hookdump.dump(_Act(torch.nn.Identity()), [x], tmp_path / "a", layers=["act"])
    b = hookdump.dump(_Act(act), [x], tmp_path / "b", layers=["act"])
    c = hookdump.dump(_Act(torch.nn.Identity()), [-x], tmp_path / "c", layers=["act"])
    for other, expected in ((b, want), (c, 2.0)):
        result = invoke("diff", str(a.path), str(other.path), "--json")
        row = next(k for k in json.loads(result.stdout)["keys"] if k["key"] == "act")
        assert row["max_rel"] == pytest.approx(expected), row
