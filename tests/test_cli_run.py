"""`hookdump run`: the dump layout, the table, --json/--quiet, --out safety and every error."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest
import torch
from clitools import assert_usage_error, independent_checksum, invoke
from safetensors.torch import load_file

import hookdump

pytestmark = pytest.mark.usefixtures("in_tests_dir")
GOLDEN = Path(__file__).parent / "golden"


def run_ok(*args: str) -> tuple[str, str]:
    result = invoke("run", *args)
    assert result.exit_code == 0, (result.stdout, result.stderr)
    return result.stdout, result.stderr


def test_dump_layout_and_values_match_a_hand_computation(tmp_path: Path) -> None:
    out = tmp_path / "acts"
    run_ok("tiny_models:TwoLinear", "--capture", "input,output", "-n", "5", "-o", str(out))
    assert sorted(p.name for p in out.iterdir()) == [
        "manifest.json",
        "shard-00000.safetensors",
        "stats.safetensors",
    ]
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["format"] == "hookdump/1"
    assert manifest["complete"] is True
    assert manifest["num_samples"] == 5
    assert manifest["model"] == {
        "spec": "tiny_models:TwoLinear",
        "weights": "none",
        "class": "tiny_models.TwoLinear",
    }
    shard = (out / "shard-00000.safetensors").read_bytes()
    assert manifest["shards"] == [
        {
            "file": "shard-00000.safetensors",
            "start": 0,
            "stop": 5,
            "bytes": len(shard),
            "crc32c": independent_checksum(shard),
            "inputs_skipped": 0,
        }
    ]
    assert manifest["tensors"]["linear_1"] == {
        "module": "linear_1",
        "module_type": "Linear",
        "kind": "output",
        "call": 0,
        "part": None,
        "shape": [2],
        "dtype": "float32",
    }
    assert manifest["tensors"]["relu6:input.0"]["kind"] == "input"
    assert "sample_ids" not in manifest  # the ids are the row numbers
    assert manifest["command"][:2] == ["hookdump", "run"]
    assert set(manifest["versions"]) >= {"hookdump", "torch", "torchvision"}

    # every shard is a plain safetensors file, dim 0 the sample
    shard = load_file(out / "shard-00000.safetensors")
    assert shard["linear_1"].shape == (5, 2)
    # by hand: all weights and biases are 1, so each unit is x0 + x1 + 1
    x = shard["linear_1:input.0"]
    expected = (x.sum(1, keepdim=True) + 1).expand(5, 2)
    torch.testing.assert_close(shard["linear_1"], expected)
    torch.testing.assert_close(shard["linear_2"], 2 * shard["relu"].sum(1, keepdim=True) / 2 + 1)
    torch.testing.assert_close(shard["relu6"], shard["linear_2"].clamp(0, 6))


def test_samples_span_shards_in_order_and_batch_size_does_not_matter(tmp_path: Path) -> None:
    sharded, whole = tmp_path / "sharded", tmp_path / "whole"
    run_ok("tiny_models:TwoLinear", "-n", "5", "-b", "2", "--shard-size", "1", "-o", str(sharded))
    run_ok("tiny_models:TwoLinear", "-n", "5", "-b", "5", "-o", str(whole))
    manifest = json.loads((sharded / "manifest.json").read_text())
    assert [(s["start"], s["stop"]) for s in manifest["shards"]] == [(0, 2), (2, 4), (4, 5)]
    a, b = hookdump.load(sharded), hookdump.load(whole)
    assert a.keys() == b.keys() == ["linear_1", "relu", "linear_2", "relu6"]
    for key in a:
        assert a[key].shape[0] == 5
        torch.testing.assert_close(a[key], b[key], rtol=0, atol=0)


def test_seed_changes_input_and_model(tmp_path: Path) -> None:
    run_ok(
        "resnet18", "-l", "conv1", "--input-shape", "3,32,32", "-n", "2", "-o", str(tmp_path / "a")
    )
    run_ok(
        "resnet18", "-l", "conv1", "--input-shape", "3,32,32", "-n", "2", "--seed", "1",
        "-o", str(tmp_path / "b"),
    )  # fmt: skip
    assert not torch.equal(
        hookdump.load(tmp_path / "a")["conv1"], hookdump.load(tmp_path / "b")["conv1"]
    )


def test_summary_table_matches_golden_file() -> None:
    stdout, stderr = run_ok(
        "tiny_models:Structured", "--layers", "*", "--input-shape", "6,3", "-b", "4"
    )
    assert stderr == ""
    text = re.sub(r"in \d+\.\d+ s", "in <time> s", stdout)
    golden = GOLDEN / "summary_structured.txt"
    if os.environ.get("UPDATE_GOLDEN"):
        golden.write_text(text)
    assert text == golden.read_text()


def test_json_is_the_only_thing_on_stdout(tmp_path: Path) -> None:
    stdout, stderr = run_ok("tiny_models:TwoLinear", "--json", "-n", "3", "-o", str(tmp_path / "d"))
    data = json.loads(stdout)
    assert stderr == ""
    assert data["num_samples"] == 3
    assert data["out"] == str(tmp_path / "d")
    assert [t["key"] for t in data["tensors"]] == ["linear_1", "relu", "linear_2", "relu6"]
    relu = data["tensors"][1]
    assert relu["min"] >= 0 and relu["nan"] == 0 and relu["shape"] == [2]
    assert relu["bytes"] == 3 * 2 * 4


def test_quiet_prints_nothing(tmp_path: Path) -> None:
    stdout, stderr = run_ok("tiny_models:TwoLinear", "-q", "-o", str(tmp_path / "d"))
    assert (stdout, stderr) == ("", "")
    assert hookdump.load(tmp_path / "d").complete


def test_model_args_reach_the_factory(tmp_path: Path) -> None:
    run_ok(
        "tiny_models:two_linear_factory", "--model-arg", "bias=0", "--capture", "input,output",
        "-o", str(tmp_path / "d"),
    )  # fmt: skip
    dump = hookdump.load(tmp_path / "d")
    x = dump["linear_1:input.0"]
    torch.testing.assert_close(dump["linear_1"], x.sum(1, keepdim=True).expand(-1, 2))


def test_unbatched_and_non_tensor_values_are_noted_in_the_manifest(tmp_path: Path) -> None:
    run_ok("tiny_models:Structured", "-l", "lstm", "-l", "__root__", "--input-shape", "6,3",
           "-b", "4", "-o", str(tmp_path / "d"))  # fmt: skip
    manifest = json.loads((tmp_path / "d" / "manifest.json").read_text())
    skipped = {s["key"]: s["reason"] for s in manifest["skipped"]}
    assert skipped["__root__:output.loss"] == "not a tensor (NoneType)"
    assert "no batch dim" in skipped["lstm:output.1.0"]  # LSTM's h is [layers, batch, hidden]
    assert list(manifest["tensors"]) == [
        "lstm:output.0", "__root__:output.logits", "__root__:output.hidden.0",
    ]  # fmt: skip


# --- --out safety -------------------------------------------------------------------------


def test_a_non_empty_out_is_refused_and_left_alone(tmp_path: Path) -> None:
    (tmp_path / "notes.txt").write_text("mine")
    result = invoke("run", "tiny_models:TwoLinear", "-o", str(tmp_path))
    # the first answer is the one that helps: --overwrite would be refused too
    line = assert_usage_error(result, f"--out {tmp_path} holds files that are not part of")
    assert "notes.txt" in line and "choose another folder" in line
    assert (tmp_path / "notes.txt").read_text() == "mine"
    dump = tmp_path / "d"
    run_ok("tiny_models:TwoLinear", "-n", "2", "-o", str(dump))
    result = invoke("run", "tiny_models:TwoLinear", "-o", str(dump))
    assert_usage_error(result, f"--out {dump} holds a dump already", "--overwrite")


def test_overwrite_replaces_a_dump_but_never_foreign_files(tmp_path: Path) -> None:
    out = tmp_path / "d"
    run_ok("tiny_models:TwoLinear", "-n", "4", "-b", "1", "--shard-size", "1", "-o", str(out))
    assert len(list(out.glob("shard-*"))) == 4
    run_ok("tiny_models:TwoLinear", "-n", "2", "-o", str(out), "--overwrite")
    assert sorted(p.name for p in out.iterdir()) == [
        "manifest.json",
        "shard-00000.safetensors",
        "stats.safetensors",
    ]
    assert hookdump.load(out).num_samples == 2

    (out / "notes.txt").write_text("mine")
    result = invoke("run", "tiny_models:TwoLinear", "-o", str(out), "--overwrite")
    assert_usage_error(result, "not part of a hookdump dump", "notes.txt")
    assert hookdump.load(out).num_samples == 2


def test_a_run_that_fails_keeps_the_old_dump(tmp_path: Path) -> None:
    out = tmp_path / "d"
    run_ok("tiny_models:TwoLinear", "-n", "3", "-o", str(out))
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    result = invoke("run", "tiny_models:FailsMidway", "-o", str(out), "--overwrite")
    assert result.exit_code == 2
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before


def test_out_that_is_a_file_is_refused(tmp_path: Path) -> None:
    target = tmp_path / "file"
    target.write_text("x")
    assert_usage_error(invoke("run", "tiny_models:TwoLinear", "-o", str(target)), "is a file")


# --- errors: one line, exit 2, no traceback -------------------------------------------------


@pytest.mark.parametrize(
    ("args", "fragments"),
    [
        (["resnt50"], ["unknown model 'resnt50'", "resnet50", "hookdump models"]),
        (["resnet18", "-l", "layer9.*"], ["--layers 'layer9.*' matches no module", "nearest"]),
        (["resnet18", "-t", "Conv"], ["--type 'Conv'", "Conv2d"]),
        (["resnet18", "--input-shape", "3,x,4"], ["--input-shape '3,x,4'", "e.g. 3,224,224"]),
        (["resnet18", "--input-shape", "3,0,4"], ["--input-shape '3,0,4'"]),
        (["tiny_models:TwoLinear", "-b", "0"], ["--batch-size 0"]),
        (["tiny_models:TwoLinear", "-n", "0"], ["--num-samples 0"]),
        (["tiny_models:TwoLinear", "--dtype", "float64"], ["--dtype 'float64'", "bfloat16"]),
        (["tiny_models:TwoLinear", "--save-dtype", "int8"], ["--save-dtype 'int8'"]),
        (["tiny_models:TwoLinear", "--shard-size", "big"], ["--shard-size 'big'", "2GB"]),
        (["tiny_models:TwoLinear", "--capture", "outputs"], ["--capture 'outputs'"]),
        (["tiny_models:TwoLinear", "--device", "tpu"], ["--device 'tpu'"]),
        (["tiny_models:TwoLinear", "--input", "photos/"], ["--input photos/: no such file"]),
        (["tiny_models:TwoLinear", "--weights", "DEFAULT"], ["--weights 'DEFAULT'"]),
        (["tiny_models:TwoLinear", "-m", "bias"], ["--model-arg 'bias' is not key=value"]),
        (["tiny_models:two_linear_factory", "-m", "nope=1"], ["building", "nope", "--model-arg"]),
        (["tiny_models:TwoLinearr"], ["has no attribute 'TwoLinearr'", "TwoLinear"]),
        (["no_such_module:Model"], ["cannot import 'no_such_module'", "PYTHONPATH"]),
        (["tiny_models:not_a_model"], ["returned a Tensor, not a torch.nn.Module"]),
        (["resnet18", "--input-shape", "3,4,4", "-m", "num_classes=x"], ["building 'resnet18'"]),
    ],
)
def test_bad_input_is_one_error_line_and_exit_2(args: list[str], fragments: list[str]) -> None:
    assert_usage_error(invoke("run", *args), *fragments)


def test_a_forward_that_raises_says_where(tmp_path: Path) -> None:
    result = invoke("run", "tiny_models:FailsMidway", "-o", str(tmp_path / "d"))
    line = assert_usage_error(
        result,
        "the forward pass of tiny_models:FailsMidway raised RuntimeError",
        "shapes do not line up second line",
        "inside 'broken'",
        "last: first, second",
    )
    assert "never" not in line
    assert not (tmp_path / "d").exists()


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA")
def test_cuda_without_a_gpu_is_a_usage_error() -> None:
    assert_usage_error(invoke("run", "tiny_models:TwoLinear", "--device", "cuda"), "--device cpu")


def test_ctrl_c_exits_130_without_a_manifest(tmp_path: Path) -> None:
    result = invoke("run", "tiny_models:Interrupts", "-o", str(tmp_path / "d"))
    assert result.exit_code == 130
    assert "Interrupted" in result.stderr
    assert not (tmp_path / "d" / "manifest.json").exists()


def test_the_garbage_collector_is_paused_while_the_model_loads_and_then_back_on(
    tmp_path: Path,
) -> None:
    import gc

    import tiny_models

    assert gc.isenabled()
    result = invoke("run", "tiny_models:NotesGC", "-n", "6", "-b", "2", "-q",
                    "-o", str(tmp_path / "d"))  # fmt: skip
    assert result.exit_code == 0, result.stderr
    # built and first batch: paused; later batches: on (the calibration forward comes first)
    assert tiny_models.NotesGC.seen[0] is False and tiny_models.NotesGC.seen[-2:] == [True, True]
    assert gc.isenabled()
    result = invoke("run", "tiny_models:NotesGC", "--layers", "nope", "-q")
    assert result.exit_code == 2 and gc.isenabled()  # also after an error


def test_the_summary_line_says_why_a_small_dump_has_two_shards(tmp_path: Path) -> None:
    """Far below --shard-size, 16 batches make two shards: the first batch streams into one
    of its own; the summary line says so. One batch, one shard: nothing to say."""
    several = invoke("run", "tiny_models:TwoLinear", "-n", "64", "-b", "4", "-o",
                     str(tmp_path / "a"))  # fmt: skip
    assert several.exit_code == 0, several.stderr
    shards = hookdump.load(tmp_path / "a").manifest.shards
    assert [s.rows for s in shards] == [4, 60]
    assert "2 shards + manifest.json; the first batch in a shard of its own" in several.stdout
    one = invoke("run", "tiny_models:TwoLinear", "-n", "8", "-b", "8", "-o", str(tmp_path / "b"))
    assert one.exit_code == 0 and "(1 shard + manifest.json)" in one.stdout
