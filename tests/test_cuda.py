"""CUDA: the same dump as on the CPU, through pinned asynchronous copies. Skipped without a GPU."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from clitools import invoke

import hookdump

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
ARGS = ["resnet18", "--input-shape", "3,64,64", "-n", "6", "-b", "4", "-q", "-l", "layer1.*"]


def test_cuda_dump_matches_the_cpu_dump(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # float32 on both sides: TF32 convolutions (on by default on Ampere and later) differ
    # from the CPU by more than the tolerance (seen on an H100: layer1.0.conv2)
    monkeypatch.setattr(torch.backends.cudnn, "allow_tf32", False)
    monkeypatch.setattr(torch.backends.cuda.matmul, "allow_tf32", False)
    for device in ("cpu", "cuda"):
        out = tmp_path / device
        result = invoke("run", *ARGS, "--device", device, "-o", str(out))
        assert result.exit_code == 0, result.stderr
    cpu, cuda = hookdump.load(tmp_path / "cpu"), hookdump.load(tmp_path / "cuda")
    assert cuda.manifest["device"].startswith("cuda")
    for key in cpu:
        torch.testing.assert_close(cuda[key], cpu[key], rtol=1e-3, atol=1e-3, msg=key)
    # the BatchNorm output before the in-place ReLU kept its negative values on the GPU too
    assert (cuda["layer1.0.bn1"] < 0).any()


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_autocast_dtypes(tmp_path: Path, dtype: str) -> None:
    out = tmp_path / dtype
    result = invoke("run", *ARGS, "--device", "cuda", "--dtype", dtype, "-o", str(out))
    assert result.exit_code == 0, result.stderr
    assert hookdump.load(out).manifest.tensors["layer1.0.conv1"]["dtype"] == dtype
