"""The capture engine against independent references: hand-computed values, the forward's own
return values, torchvision's FX feature extractor, and recomputation."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torchvision
from clitools import assert_usage_error, invoke
from conftest import hook_state
from tiny_models import (
    ConvNet,
    FailsMidway,
    KwargsModel,
    SharedActivation,
    Structured,
    TwoLinear,
)
from torchvision.models.feature_extraction import create_feature_extractor

import hookdump
from hookdump.errors import HookdumpError


def test_two_linear_matches_hand_computed_values_and_forward_returns() -> None:
    model = TwoLinear()
    x = torch.full((3, 2), 0.1)
    with hookdump.capture(model) as cap:
        h1, a1, h2, a2 = model(x)
    assert list(cap.tensors) == ["linear_1", "relu", "linear_2", "relu6"]
    assert torch.allclose(cap.tensors["linear_1"], torch.full((3, 2), 1.2))
    assert torch.allclose(cap.tensors["linear_2"], torch.full((3, 1), 3.4))
    for key, returned in zip(cap.tensors, (h1, a1, h2, a2), strict=True):
        assert torch.equal(cap.tensors[key], returned)


def test_root_output_parts_are_keyed_by_index() -> None:
    model = TwoLinear()
    with hookdump.capture(model, layers="__root__") as cap:
        out = model(torch.full((1, 2), 0.1))
    assert list(cap.tensors) == [f"__root__:output.{i}" for i in range(4)]
    assert torch.equal(cap.tensors["__root__:output.3"], out[3])


def test_every_call_of_a_shared_module_is_kept_in_order() -> None:
    torch.manual_seed(0)
    model = SharedActivation()
    x = torch.randn(5, 4)
    with hookdump.capture(model, layers="act") as cap:
        out = model(x)
    assert list(cap.tensors) == ["act", "act@1", "act@2"]
    assert torch.equal(cap.tensors["act"], out["a"])
    assert torch.equal(cap.tensors["act@1"], out["b"])
    assert torch.equal(cap.tensors["act@2"], out["c"])
    assert cap.calls == {"act": 3}
    assert [cap.info[k].call for k in cap.tensors] == [0, 1, 2]


def test_resnet18_matches_torchvision_feature_extractor() -> None:
    torch.manual_seed(0)
    model = torchvision.models.resnet18(weights=None).eval()
    x = torch.randn(2, 3, 64, 64)
    # FX names each call of layer1.0.relu separately: relu (first), relu_1 (second)
    nodes = {
        "conv1": "conv1",
        "layer1.0.conv1": "layer1.0.conv1",
        "layer2.1.conv2": "layer2.1.conv2",
        "layer1.0.relu": "layer1.0.relu",
        "layer1.0.relu_1": "layer1.0.relu@1",
        "layer4.1.relu_1": "layer4.1.relu@1",
        "fc": "fc",
    }
    with torch.no_grad():
        reference = create_feature_extractor(model, return_nodes=list(nodes))(x)
        with hookdump.capture(model) as cap:
            model(x)
    for node, key in nodes.items():
        torch.testing.assert_close(cap.tensors[key], reference[node], rtol=0, atol=0)
    assert cap.calls["layer1.0.relu"] == 2


def test_batchnorm_before_inplace_relu_keeps_its_negative_values() -> None:
    # The in-place ReLU after bn1 overwrites bn1's output tensor. A copy taken when bn1's hook
    # fires must equal bn1 applied again to the captured conv1 output, negatives included.
    torch.manual_seed(0)
    model = torchvision.models.resnet18(weights=None).eval()
    with torch.no_grad(), hookdump.capture(model, layers=["layer1.0.conv1", "layer1.0.bn1"]) as cap:
        model(torch.randn(2, 3, 64, 64))
        recomputed = model.layer1[0].bn1(cap.tensors["layer1.0.conv1"])
    torch.testing.assert_close(cap.tensors["layer1.0.bn1"], recomputed)
    assert (cap.tensors["layer1.0.bn1"] < 0).any()


def test_captured_values_are_copies_not_views() -> None:
    model = TwoLinear()
    with hookdump.capture(model, layers="relu6") as cap:
        out = model(torch.full((1, 2), 0.1))
    out[3].zero_()
    assert torch.allclose(cap.tensors["relu6"], torch.full((1, 1), 3.4))


def test_structured_outputs_are_flattened_and_non_tensors_noted() -> None:
    torch.manual_seed(0)
    model = Structured()
    x = torch.randn(2, 6, 3)
    with torch.no_grad(), hookdump.capture(model, layers=["lstm", "pair", "__root__"]) as cap:
        out = model(x)
    assert list(cap.tensors) == [
        "lstm:output.0",
        "lstm:output.1.0",
        "lstm:output.1.1",
        "pair:output.left",
        "pair:output.right",
        "__root__:output.logits",
        "__root__:output.hidden.0",
        "__root__:output.hidden.1",
    ]
    assert torch.equal(cap.tensors["__root__:output.logits"], out.logits)
    assert torch.equal(cap.tensors["pair:output.right"], out.hidden[0])
    assert cap.info["pair:output.left"].part == "left"
    assert {s.key: s.type for s in cap.skipped.values()} == {
        "__root__:output.loss": "NoneType",
        "__root__:output.step": "int",
    }


def test_inputs_are_taken_before_an_inplace_module_changes_them() -> None:
    model = KwargsModel()
    x = torch.tensor([[1.0, -3.0]])
    with hookdump.capture(model, capture="input,output") as cap:
        out = model(x)
    assert list(cap.tensors) == [
        "scale:input.0",
        "scale:input.factor",
        "scale",
        "relu:input.0",
        "relu",
    ]
    assert torch.equal(cap.tensors["scale:input.factor"], torch.full((1, 2), -2.0))
    # relu's input, before the in-place ReLU zeroed its negative entry
    assert torch.equal(cap.tensors["relu:input.0"], torch.tensor([[-2.0, 6.0]]))
    assert torch.equal(cap.tensors["relu"], out)
    assert torch.equal(out, torch.tensor([[0.0, 6.0]]))


def test_a_forward_that_raises_leaves_no_hook_behind() -> None:
    model = FailsMidway()
    before = hook_state(model)
    with (
        pytest.raises(RuntimeError, match="shapes do not line up"),
        hookdump.capture(model, layers="*") as cap,
    ):
        assert hook_state(model) != before
        model(torch.ones(1, 4))
    assert hook_state(model) == before
    assert cap.finished == ["first", "second"]
    assert cap.running == ["__root__", "broken"]


def test_keyboard_interrupt_also_removes_hooks_and_restores_modes() -> None:
    model = ConvNet().train()
    model.head.eval()  # a mixed state must come back exactly
    modes = [m.training for m in model.modules()]
    before = hook_state(model)

    def interrupt(*_: object) -> None:
        raise KeyboardInterrupt

    model.pool.register_forward_hook(interrupt)
    before = hook_state(model)
    with pytest.raises(KeyboardInterrupt), hookdump.capture(model, train=False):
        assert not model.features[1].training
        model(torch.randn(2, 3, 8, 8))
    assert hook_state(model) == before
    assert [m.training for m in model.modules()] == modes


def test_take_clears_and_restarts_call_counting() -> None:
    model = SharedActivation()
    with hookdump.capture(model, layers="act") as cap:
        model(torch.randn(1, 4))
        first = cap.take()
        model(torch.randn(1, 4))
    assert list(first) == ["act", "act@1", "act@2"]
    assert list(cap.tensors) == ["act", "act@1", "act@2"]


def test_without_clearing_a_second_forward_never_overwrites_the_first() -> None:
    model = TwoLinear()
    with hookdump.capture(model, layers="relu6") as cap:
        model(torch.full((1, 2), 0.1))
        model(torch.zeros(1, 2))
    assert list(cap.tensors) == ["relu6", "relu6@1"]
    assert torch.allclose(cap.tensors["relu6"], torch.tensor([[3.4]]))
    assert torch.allclose(cap.tensors["relu6@1"], torch.tensor([[3.0]]))


def test_inference_mode_and_autograd_both_work() -> None:
    model = TwoLinear()
    x = torch.full((1, 2), 0.1, requires_grad=True)
    with hookdump.capture(model, layers="linear_2") as cap:
        out = model(x)
    out[3].sum().backward()  # the copies are detached: the graph is the model's own
    assert not cap.tensors["linear_2"].requires_grad
    assert x.grad is not None
    with torch.inference_mode(), hookdump.capture(model, layers="linear_2") as cap:
        model(torch.full((1, 2), 0.1))
    assert torch.allclose(cap.tensors["linear_2"], torch.tensor([[3.4]]))


@pytest.mark.parametrize("capture", ["grads", "outputs", ""])
def test_bad_capture_kinds_are_refused(capture: str) -> None:
    with pytest.raises(HookdumpError, match="capture"):
        hookdump.capture(TwoLinear(), capture=capture)


@pytest.mark.usefixtures("in_tests_dir")
@pytest.mark.parametrize(
    ("layers", "first", "second"),
    [
        ("x*", "the output of module 'x' (Linear, call 2)", "the output of module 'x@1' (Linear)"),
        (
            "t*",
            "the output 0 of module 't' (_TwoOutputs)",
            "the output of module 't:output.0' (Identity)",
        ),
    ],
    ids=["at", "colon"],
)
def test_a_module_name_that_would_repeat_a_key_is_refused_naming_both(
    tmp_path: Path, layers: str, first: str, second: str
) -> None:
    out = tmp_path / "d"
    result = invoke("run", "tiny_models:KeyClash", "-l", layers, "-o", str(out))
    line = assert_usage_error(result, "two tensors would be saved under the key", first, second)
    assert "--exclude" in line
    assert not out.exists()


def test_a_shard_never_takes_one_key_twice(tmp_path: Path) -> None:
    from hookdump.errors import HookdumpError
    from hookdump.store.write.shards import ShardFile

    shard = ShardFile(tmp_path / "s.safetensors", reserve=4096)
    shard.write("x", torch.zeros(2, 2))
    with pytest.raises(HookdumpError, match="'x' is in this shard already"):
        shard.write("x", torch.ones(2, 2))
    shard.abort()


def test_the_engines_controls_are_not_on_the_users_capture() -> None:
    """Issue 44: `hookdump.capture` gave the batch loop's controls (`next_batch`,
    `stop_early`, `counting_only`, ...) to the user's object; they stay on the engine's
    `Hooks`. The user's object has what a `with` block needs and what it kept."""
    model = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.ReLU())
    cap = hookdump.capture(model, layers=["0"])
    engine_only = ("next_batch", "stop_early", "counting_only", "check_ops", "keys_expected",
                   "stop_after", "named", "sites", "token_mask", "ops")  # fmt: skip
    assert [name for name in engine_only if hasattr(cap, name)] == []
    with cap, torch.no_grad():
        model(torch.ones(1, 2))
    assert list(cap.tensors) == ["0"] and cap.calls == {"0": 1} and cap.finished == ["0"]
    assert cap.take()["0"].shape == (1, 2) and cap.tensors == {}
