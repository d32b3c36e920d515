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


def test_statistics_taken_on_the_gpu_are_the_dumped_values(tmp_path: Path) -> None:
    """On CUDA the per-feature statistics are taken on the device before the copy: they are
    those of the values the dump holds (float64 reference on the host)."""
    out = tmp_path / "cuda"
    result = invoke("run", *ARGS, "--device", "cuda", "-o", str(out))
    assert result.exit_code == 0, result.stderr
    dump = hookdump.load(out)
    for key in dump:
        rows = dump[key].double().movedim(1, -1).reshape(-1, dump[key].shape[1])
        stats = dump.stats(key)
        spread = rows.std(0, correction=0)
        assert bool(((stats["mean"] - rows.mean(0)).abs() <= 1e-6 * spread + 1e-12).all()), key
        torch.testing.assert_close(stats["var"], rows.var(0, correction=0), rtol=1e-6, atol=1e-12)
        assert torch.equal(stats["min"], rows.amin(0)) and torch.equal(stats["max"], rows.amax(0))
