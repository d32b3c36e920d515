"""--reduce: each rank reduced as documented, equal to reducing the full capture."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from clitools import assert_usage_error, invoke

import hookdump


def dump(out: Path, model: str, *args: str) -> hookdump.Dump:
    result = invoke("run", model, "-n", "3", "-q", "-o", str(out), *args)
    assert result.exit_code == 0, result.stderr
    return hookdump.load(out)


def test_feature_maps_reduce_over_their_spatial_dims(tmp_path: Path) -> None:
    args = ["--input-shape", "3,32,32", "-l", "layer1.0.conv1", "-l", "avgpool", "-l", "fc"]
    full = dump(tmp_path / "full", "resnet18", *args)
    conv = full["layer1.0.conv1"]  # [3, 64, 8, 8]
    for how, expected in (
        ("mean", conv.mean(dim=(2, 3))),
        ("max", conv.amax(dim=(2, 3))),
        ("flatten", conv.reshape(3, -1)),
    ):
        reduced = dump(tmp_path / how, "resnet18", *args, "--reduce", how)
        torch.testing.assert_close(reduced["layer1.0.conv1"], expected)
        assert reduced.manifest.tensors["layer1.0.conv1"]["shape"] == list(expected.shape[1:])
        assert torch.equal(reduced["fc"], full["fc"])  # rank 2: left alone
        assert reduced.manifest["reduce"] == how


@pytest.mark.usefixtures("in_tests_dir")
def test_tokens_reduce_over_tokens_and_1d_layers_over_length(tmp_path: Path) -> None:
    full = dump(tmp_path / "full", "tiny_models:Tokens", "--input-shape", "5,4")
    mean = dump(tmp_path / "mean", "tiny_models:Tokens", "--input-shape", "5,4", "--reduce", "mean")
    assert full["proj"].shape == (3, 5, 6) and full["conv"].shape == (3, 3, 5)
    torch.testing.assert_close(mean["proj"], full["proj"].mean(dim=1))  # [B, D]
    torch.testing.assert_close(mean["conv"], full["conv"].mean(dim=2))  # [B, C]


def test_bad_reduce() -> None:
    assert_usage_error(invoke("run", "resnet18", "--reduce", "median"), "--reduce 'median'")
