"""Gradients against `torch.autograd.grad` on an out-of-place copy of the same model."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch
from clitools import assert_usage_error, invoke
from tiny_models import ConvNet, TwoLinear

import hookdump
from hookdump.hooks.gradients import backward


def reference_grads(model: ConvNet, x: torch.Tensor, target: int | None) -> dict[str, torch.Tensor]:
    """The same maths with out-of-place ReLUs, differentiated by autograd directly."""
    ref = copy.deepcopy(model)
    f = ref.features
    x = x.clone().requires_grad_(True)
    c0 = f[0](x)
    b1 = f[1](c0)
    r2 = torch.relu(b1)
    c3 = f[3](r2)
    b4 = f[4](c3)
    r5 = torch.relu(b4)
    pooled = ref.pool(r5).flatten(1)
    out = ref.head(pooled)
    loss = out.sum() if target is None else out[:, target].sum()
    names = ["x", "c0", "b1", "r2", "c3", "b4", "r5", "pooled", "out"]
    values = [x, c0, b1, r2, c3, b4, r5, pooled, out]
    return dict(zip(names, torch.autograd.grad(loss, values), strict=True))


def test_library_grads_match_autograd_through_inplace_relus() -> None:
    torch.manual_seed(0)
    model = ConvNet().eval()
    x = torch.randn(2, 3, 8, 8)
    ref = reference_grads(model, x, None)
    with hookdump.capture(model, layers="*", capture="grad") as cap:
        xg = x.clone().requires_grad_(True)
        model(xg).sum().backward()
    g = cap.tensors
    assert all(":grad_" in key for key in g)
    expected = {
        "__root__:grad_input.0": ref["x"],
        "features.0:grad_output.0": ref["c0"],
        "features.1:grad_output.0": ref["b1"],  # BatchNorm output, before the in-place ReLU
        "features.2:grad_input.0": ref["b1"],
        "features.2:grad_output.0": ref["r2"],
        "features.4:grad_output.0": ref["b4"],
        "features.5:grad_output.0": ref["r5"],
        "head:grad_input.0": ref["pooled"],
        "head:grad_output.0": ref["out"],
        "__root__:grad_output.0": ref["out"],
    }
    for key, value in expected.items():
        torch.testing.assert_close(g[key], value, msg=key)


def test_backward_leaves_parameter_grads_alone() -> None:
    torch.manual_seed(0)
    model = ConvNet().eval()
    marker = [torch.full_like(p, 7.0) for p in model.parameters()]
    for p, m in zip(model.parameters(), marker, strict=True):
        p.grad = m.clone()
    x = torch.randn(2, 3, 8, 8, requires_grad=True)
    with hookdump.capture(model, layers="head", capture="grad") as cap:
        backward(model, model(x), 1, [x])
    assert torch.equal(cap.tensors["head:grad_output.0"][:, 1], torch.ones(2))
    assert torch.equal(cap.tensors["head:grad_output.0"][:, 0], torch.zeros(2))
    for p, m in zip(model.parameters(), marker, strict=True):
        assert torch.equal(p.grad, m)


@pytest.mark.usefixtures("in_tests_dir")
def test_cli_grad_target_matches_autograd(tmp_path: Path) -> None:
    out = tmp_path / "d"
    result = invoke(
        "run", "tiny_models:ConvNet", "--input-shape", "3,8,8", "-n", "3", "-q",
        "-l", "__root__", "-l", "features.1", "--capture", "input,grad", "--grad-target", "2",
        "-o", str(out),
    )  # fmt: skip
    assert result.exit_code == 0, result.stderr
    dump = hookdump.load(out)
    assert dump.manifest.tensors["features.1:grad_output.0"]["kind"] == "grad_output"
    torch.manual_seed(0)  # the loader seeds with --seed (0) before construction
    model = ConvNet().eval()
    ref = reference_grads(model, dump["__root__:input.0"], 2)
    torch.testing.assert_close(dump["__root__:grad_input.0"], ref["x"])
    torch.testing.assert_close(dump["features.1:grad_output.0"], ref["b1"])
    assert "features.1" not in dump  # --capture without output: no outputs


@pytest.mark.usefixtures("in_tests_dir")
@pytest.mark.parametrize(
    ("target", "fragment"), [("x", "--grad-target 'x'"), ("9", "--grad-target 9 is out of range")]
)
def test_bad_grad_targets(target: str, fragment: str) -> None:
    result = invoke("run", "tiny_models:ConvNet", "--input-shape", "3,8,8", "--capture", "grad",
                    "--grad-target", target)  # fmt: skip
    assert_usage_error(result, fragment)


def test_grads_of_a_tuple_output_use_its_first_tensor() -> None:
    model = TwoLinear()
    x = torch.full((1, 2), 0.1, requires_grad=True)
    with hookdump.capture(model, layers="linear_1", capture="grad") as cap:
        backward(model, model(x), "sum", [x])
    # objective = sum(linear_1 output): its gradient is all ones
    assert torch.equal(cap.tensors["linear_1:grad_output.0"], torch.ones(1, 2))
