"""`--capture ops`: the results of the ops a selected module's own forward calls, checked
against the values the forward itself computes, plain hooks that clone, and transformers'
hidden states; torchvision's FX extractor shows what an in-place op after the add does to
a reference that is not copied when it is made."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import torchvision
from clitools import assert_usage_error, invoke

import hookdump
from hookdump.format.keys import parse_key


def _block_reference(x: torch.Tensor) -> dict[str, torch.Tensor]:
    from tiny_models import OpsBlock

    with torch.no_grad():
        shifted, _, weights, mixed, _, after_first, total = OpsBlock()(x)
    return {
        "__root__:op.add": shifted,
        "__root__:op.softmax": weights,
        "__root__:op.mul": mixed,
        "__root__:op.clone": mixed,
        "__root__:op.add_": after_first,
        "__root__:op.clone@1": after_first,
        "__root__:op.add_@1": total,
    }


@pytest.mark.usefixtures("in_tests_dir")
def test_a_modules_own_ops_are_kept_with_repeats_and_without_its_childs_or_views() -> None:
    from tiny_models import OpsBlock

    x = torch.randn(3, 4)
    model = OpsBlock()
    with hookdump.capture(model, layers=["__root__"], capture="ops") as cap, torch.no_grad():
        model(x)
    expected = _block_reference(x)
    assert list(cap.tensors) == list(expected)  # in the order they ran; no linear, no view
    for key, value in expected.items():
        torch.testing.assert_close(cap.tensors[key], value, rtol=0, atol=0)
    info = cap.info["__root__:op.add_@1"]
    assert (info.kind, info.part, info.call, info.module_type) == ("op", "add_", 1, "OpsBlock")
    assert parse_key("__root__:op.add_@1") == ("__root__", "op", "add_", 1)
    assert not torch._C._is_torch_function_mode_enabled()  # the recorder is gone
    with hookdump.capture(model, layers=["proj"], capture="ops") as cap, torch.no_grad():
        model(x)
    assert list(cap.tensors) == ["proj:op.linear"]  # the child's own op is the child's


def test_a_residual_add_is_the_value_before_the_in_place_relu_after_it() -> None:
    """resnet18's BasicBlock: `out += identity; out = relu(out)` with an in-place ReLU. The
    add's value is bn2's output plus the block's input (plain hooks that clone), and what
    torchvision's FX extractor returns when the add is the last node it runs; asked for the
    ReLU too, FX returns for the add the tensor the ReLU has since overwritten."""
    from torchvision.models.feature_extraction import create_feature_extractor

    model = torchvision.models.resnet18().eval()
    x = torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(0))
    seen: dict[str, torch.Tensor] = {}
    block = model.layer1[0]
    handles = [
        block.bn2.register_forward_hook(lambda m, i, o: seen.update(bn2=o.detach().clone())),
        block.register_forward_pre_hook(lambda m, i: seen.update(block=i[0].detach().clone())),
    ]
    with torch.no_grad():
        model(x)
    for handle in handles:
        handle.remove()
    with hookdump.capture(model, layers=["layer1.0"], capture="ops") as cap, torch.no_grad():
        model(x)
    added = cap.tensors["layer1.0:op.add_"]
    torch.testing.assert_close(added, seen["bn2"] + seen["block"], rtol=0, atol=0)
    assert added.min() < 0  # before the ReLU
    with torch.no_grad():
        alone = create_feature_extractor(model, {"layer1.0.add": "add"})(x)["add"]
        nodes = {"layer1.0.add": "add", "layer1.0.relu_1": "relu"}
        both = create_feature_extractor(model, nodes)(x)["add"]
    torch.testing.assert_close(added, alone, rtol=0, atol=0)
    assert torch.equal(both, added.relu())  # FX's "add", overwritten by the in-place ReLU


@pytest.mark.usefixtures("in_tests_dir")
def test_the_cli_dumps_ops_filtered_by_name(tmp_path: Path) -> None:
    from safetensors.torch import save_file

    x = torch.randn(5, 4, generator=torch.Generator().manual_seed(1))
    save_file({"x": x}, tmp_path / "x.safetensors")
    out = tmp_path / "d"
    args = ["run", "tiny_models:OpsBlock", "--input", str(tmp_path / "x.safetensors"), "-q",
            "-l", "__root__", "-c", "ops", "--ops", "add*", "-b", "2", "-o", str(out)]  # fmt: skip
    result = invoke(*args)
    assert result.exit_code == 0, result.stderr
    dump = hookdump.load(out)
    expected = {k: v for k, v in _block_reference(x).items() if ":op.add" in k}
    assert dump.keys() == list(expected)
    for key, value in expected.items():
        torch.testing.assert_close(dump[key], value, rtol=0, atol=0)
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["tensors"]["__root__:op.add_@1"]["kind"] == "op"
    assert manifest["recipe"]["ops"] == ["add*"] and manifest["capture"] == ["ops"]
    line = assert_usage_error(invoke("run", "tiny_models:OpsBlock", "-c", "opz"), "'opz'")
    assert "is not a capture kind; use any of output,input,grad,ops" in line


def test_token_rows_of_a_blocks_residual_adds(tmp_path: Path, gpt2: Path) -> None:
    """GPT-2's block adds the attention's output, then the MLP's, to the residual stream:
    its second add is the block's output, hidden_states[1], row for row."""
    import transformers

    model = transformers.AutoModel.from_pretrained(gpt2).eval()
    ids = torch.randint(0, 30, (2, 6), generator=torch.Generator().manual_seed(0))
    mask = torch.ones_like(ids)
    mask[1, 4:] = 0
    batch = {"input_ids": ids, "attention_mask": mask}
    d = hookdump.dump(model, [batch], tmp_path / "d", layers=["h.0"], capture="ops",
                      ops=["add"], per_token=True)  # fmt: skip
    with torch.no_grad():
        hidden = model(**batch, output_hidden_states=True).hidden_states[1]
    assert [k for k in d if not k.startswith("__")] == ["h.0:op.add", "h.0:op.add@1"]
    torch.testing.assert_close(d["h.0:op.add@1"], hidden[mask.bool()])


def test_layers_lists_the_ops_each_modules_own_forward_calls() -> None:
    args = ["layers", "resnet18", "-l", "layer1.0*", "--input-shape", "3,32,32", "-c", "output,ops"]
    result = invoke(*args, "--json")
    assert result.exit_code == 0, result.stderr
    rows = {row["name"]: row for row in json.loads(result.stdout)}
    assert rows["layer1.0"]["ops"] == ["add_"]  # the residual add: its children's are theirs
    assert rows["layer1.0.relu"]["ops"] == ["relu", "relu@1"]  # called twice, in place
    assert rows["layer1.0.conv1"]["ops"] == ["conv2d"]
    plain = json.loads(invoke("layers", "resnet18", "-l", "layer1.0", "--input-shape", "3,32,32",
                              "--json").stdout)  # fmt: skip
    assert "ops" not in plain[0]
    table = invoke(*args[:-2], "-c", "output,ops").stdout
    assert "ops (its own forward's)" in table and "relu, relu@1" in table


@pytest.mark.usefixtures("in_tests_dir")
def test_an_ops_pattern_that_matches_no_op_is_one_line_naming_those_called(
    tmp_path: Path,
) -> None:
    """Issue 32: `--ops 'nosuchop*'` wrote a dump with no key and exited 0."""
    out = tmp_path / "d"
    result = invoke("run", "tiny_models:OpsBlock", "-l", "__root__", "-c", "ops", "--ops",
                    "add*", "--ops", "sofmax", "-n", "2", "-o", str(out))  # fmt: skip
    called = "(they call: add, add_, clone, mul, softmax"
    assert_usage_error(result, "--ops 'sofmax' matches no op the selected modules call",
                       called, "did you mean softmax")  # fmt: skip
    assert not out.exists()  # refused after the first forward, before any shard is listed


@pytest.mark.usefixtures("in_tests_dir")
def test_views_are_left_out_under_inference_mode_as_a_dump_runs(tmp_path: Path) -> None:
    """Issue 36: under `torch.inference_mode()` (how `run` and `hookdump.dump` run the
    forward) `_is_view` is False, and views (`op.view`, `op.transpose`) were kept. The
    dump holds the same ops as a capture under `no_grad`, with the forward's own values."""
    from tiny_models import OpsBlock

    x = torch.randn(3, 4)
    model = OpsBlock()
    with hookdump.capture(model, layers=["__root__"], capture="ops") as cap, torch.no_grad():
        model(x)
    with (
        hookdump.capture(model, layers=["__root__"], capture="ops") as inference,
        torch.inference_mode(),
    ):
        model(x)
    assert list(inference.tensors) == list(cap.tensors) == list(_block_reference(x))
    d = hookdump.dump(model, [x], tmp_path / "d", layers="__root__", capture="ops")
    assert list(d.keys()) == list(_block_reference(x))
    for key, value in _block_reference(x).items():
        torch.testing.assert_close(d[key], value, rtol=0, atol=0)


def test_contiguous_is_left_out_as_views_are() -> None:
    """`contiguous` of a transposed tensor copies the values it is given: nothing new
    (GPT-2's attention kept two such keys per call)."""

    class Copies(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x.transpose(0, 1).contiguous() * 2

    x = torch.randn(3, 4)
    model = Copies()
    with hookdump.capture(model, layers=["__root__"], capture="ops") as cap, torch.no_grad():
        model(x)
    assert list(cap.tensors) == ["__root__:op.mul"]  # no op.contiguous
    torch.testing.assert_close(cap.tensors["__root__:op.mul"], x.T * 2, rtol=0, atol=0)


def test_no_key_value_cache_is_built_for_a_dump(gpt2: Path, tmp_path: Path, corpus: Path) -> None:
    """Issue 36: the forward built a key-value cache it never read; its updates showed up as
    the attention module's own ops (`op.cat`) and cost time. The attention's values are the
    same as transformers' own forward with its cache."""
    transformers = pytest.importorskip("transformers")
    out = tmp_path / "d"
    result = invoke("run", f"hf:{gpt2}", "--text", str(corpus), "--max-length", "8", "-l",
                    "h.0.attn", "-c", "output,ops", "-q", "-o", str(out))  # fmt: skip
    assert result.exit_code == 0, result.stderr
    d = hookdump.load(out)
    assert not [k for k in d if ":op.cat" in k], d.keys()
    model = transformers.AutoModel.from_pretrained(gpt2).eval()
    batch = {"input_ids": d["__input_ids__"], "attention_mask": d["__attention_mask__"]}
    seen: list[torch.Tensor] = []
    handle = model.h[0].attn.register_forward_hook(lambda m, i, o: seen.append(o[0].clone()))
    try:
        with torch.no_grad():
            model(**batch, use_cache=True)  # transformers' own forward, cache and all
    finally:
        handle.remove()
    torch.testing.assert_close(d["h.0.attn:output.0"], seen[0], rtol=1e-5, atol=1e-6)
