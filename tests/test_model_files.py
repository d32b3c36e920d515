"""Models and weights from files: checkpoints, torchvision's cache, export archives, pickles."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import torchvision
from clitools import assert_usage_error, invoke
from safetensors.torch import save_file

import hookdump
from hookdump.model.weights import cached_weights_file

SMALL = ["--input-shape", "3,32,32", "-n", "2", "-q"]


def seeded_resnet18(seed: int) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torchvision.models.resnet18(weights=None).eval()


def reference_output(model: torch.nn.Module, dump_path: Path) -> None:
    """The dump's root output must be what `model` computes for the dump's own input."""
    dump = hookdump.load(dump_path)
    with torch.no_grad():
        expected = model(dump["__root__:input.0"])
    torch.testing.assert_close(dump["__root__"], expected)


def run_dump(out: Path, *args: str) -> Path:
    result = invoke("run", *args, *SMALL, "-l", "__root__", "-l", "layer1.0.conv1",
                    "--capture", "input,output", "-o", str(out))  # fmt: skip
    assert result.exit_code == 0, result.stderr
    return out


def test_nested_ddp_checkpoint_equals_the_same_weights_as_safetensors(tmp_path: Path) -> None:
    model = seeded_resnet18(123)
    state = model.state_dict()
    nested = tmp_path / "ckpt.pt"
    torch.save({"epoch": 7, "state_dict": {f"module.{k}": v for k, v in state.items()}}, nested)
    flat = tmp_path / "ckpt.safetensors"
    save_file({k: v.contiguous() for k, v in state.items()}, flat)
    compiled = tmp_path / "compiled.pth"
    torch.save({"model": {f"_orig_mod.{k}": v for k, v in state.items()}}, compiled)

    a = run_dump(tmp_path / "a", "resnet18", "--weights", str(nested))
    b = run_dump(tmp_path / "b", "resnet18", "--weights", str(flat))
    c = run_dump(tmp_path / "c", "resnet18", "--weights", str(compiled))
    assert invoke("diff", str(a), str(b), "--atol", "0", "--rtol", "0").exit_code == 0
    assert invoke("diff", str(a), str(c), "--atol", "0", "--rtol", "0").exit_code == 0
    reference_output(model, a)
    # and the weights did change something: the seeded default model differs
    plain = run_dump(tmp_path / "plain", "resnet18")
    assert invoke("diff", str(a), str(plain)).exit_code == 1
    manifest = json.loads((a / "manifest.json").read_text())
    assert manifest["model"]["weights_file"] == str(nested)
    assert len(manifest["model"]["weights_sha256"]) == 64


def test_keys_that_do_not_fit_are_listed_and_no_strict_loads_the_rest(tmp_path: Path) -> None:
    state = seeded_resnet18(1).state_dict()
    state["fc.weight"] = torch.zeros(10, 512)
    state["extra.weight"] = torch.zeros(3)
    del state["layer4.1.bn2.bias"]
    path = tmp_path / "bad.pt"
    torch.save(state, path)
    line = assert_usage_error(
        invoke("run", "resnet18", "--weights", str(path), *SMALL),
        "1 key missing (layer4.1.bn2.bias)",
        "1 key unexpected (extra.weight)",
        "fc.weight (checkpoint [10, 512], model [1000, 512])",
        "--no-strict",
    )
    assert str(path) in line
    loose = invoke("run", "resnet18", "--weights", str(path), "--no-strict", *SMALL[:-1])
    assert loose.exit_code == 0, loose.stderr
    assert "warning: --weights" in loose.stderr and "extra.weight" in loose.stderr


def test_a_head_for_other_classes_names_num_classes(tmp_path: Path) -> None:
    """A fine-tuned checkpoint (fc for 10 classes): the fix is --model-arg num_classes=10,
    and with it the checkpoint loads."""
    state = seeded_resnet18(1).state_dict()
    state["fc.weight"], state["fc.bias"] = torch.zeros(10, 512), torch.zeros(10)
    path = tmp_path / "finetuned.pt"
    torch.save(state, path)
    assert_usage_error(invoke("run", "resnet18", "--weights", str(path), *SMALL),
                       "--model-arg num_classes=10", "--no-strict")  # fmt: skip
    fixed = invoke("run", "resnet18", "--weights", str(path), "--model-arg", "num_classes=10",
                   *SMALL)  # fmt: skip
    assert fixed.exit_code == 0, fixed.stderr
    del state["layer4.1.bn2.bias"]  # not only the head: no num_classes hint
    torch.save(state, path)
    line = assert_usage_error(invoke("run", "resnet18", "--weights", str(path), *SMALL),
                              "fix the checkpoint")  # fmt: skip
    assert "num_classes" not in line


def test_a_malicious_pickle_runs_nothing(tmp_path: Path) -> None:
    marker = tmp_path / "pwned"

    class Evil:
        def __reduce__(self) -> tuple:
            return (open, (str(marker), "w"))

    evil = tmp_path / "evil.pt"
    torch.save({"weight": Evil()}, evil)
    assert_usage_error(
        invoke("run", "resnet18", "--weights", str(evil), *SMALL), "refused", "nothing in it"
    )
    assert_usage_error(invoke("run", str(evil), *SMALL), "refused")
    assert_usage_error(invoke("run", "resnet18", "--input", str(evil), *SMALL), "refused")
    assert not marker.exists()


@pytest.mark.usefixtures("in_tests_dir")
def test_pickled_module_needs_unsafe_pickle(tmp_path: Path) -> None:
    from tiny_models import TwoLinear

    path = tmp_path / "whole.pt"
    torch.save(TwoLinear(), path)
    line = assert_usage_error(invoke("run", str(path)), "refused", "nothing in it",
                              "pass --unsafe-pickle", "give it as --weights")  # fmt: skip
    assert "GLOBAL tiny_models.TwoLinear was not an allowed global by default)" in line
    result = invoke("run", str(path), "--unsafe-pickle", "--json")
    assert result.exit_code == 0, result.stderr
    assert json.loads(result.stdout)["tensors"][0]["key"] == "linear_1"
    state = tmp_path / "state.pt"
    torch.save(TwoLinear().state_dict(), state)
    assert_usage_error(invoke("run", str(state)), "not a model", "--weights")


def test_export_archive_gives_the_live_models_activations(tmp_path: Path) -> None:
    model = seeded_resnet18(5)
    archive = tmp_path / "r18.pt2"
    torch.export.save(torch.export.export(model, (torch.randn(2, 3, 32, 32),)), archive)
    exported = tmp_path / "exported"
    live = tmp_path / "live"
    # the archive's example input gives the shape; the exported batch is 2. --seed 5 builds
    # the live model as exported, and draws the same random input for both.
    for out, spec in ((exported, str(archive)), (live, "resnet18")):
        args = ["run", spec, "-b", "2", "-n", "4", "-q", "-l", "layer1.*", "--seed", "5"]
        shape = ["--input-shape", "3,32,32"] if spec == "resnet18" else []
        result = invoke(*args, *shape, "-o", str(out))
        assert result.exit_code == 0, result.stderr
    a, b = hookdump.load(exported), hookdump.load(live)
    assert a.keys() == b.keys()  # names, call counts (relu@1) and order all match
    for key in a:
        torch.testing.assert_close(a[key], b[key], rtol=1e-5, atol=1e-5)
    assert a.manifest.tensors["layer1.0.conv1"]["module_type"] == "Conv2d"  # the original class
    names = invoke("layers", str(archive), "--type", "BasicBlock", "--names")
    assert names.stdout.split() == ["layer1.0", "layer1.1", "layer2.0", "layer2.1", "layer3.0",
                                    "layer3.1", "layer4.0", "layer4.1"]  # fmt: skip
    # the batch was traced static: another size is one line naming --batch-size 2
    for sizes in (["-b", "3", "-n", "3"], ["-b", "2", "-n", "3"]):
        assert_usage_error(invoke("run", str(archive), *sizes, "-q"),
                           "was exported for batches of 2", "give --batch-size 2")  # fmt: skip
    assert a.manifest["model"]["export_batch"] == 2


def test_torchvision_weights_come_from_the_hub_cache(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TORCH_HOME", str(tmp_path / "torch"))
    monkeypatch.setenv("HOOKDUMP_OFFLINE", "1")
    enum = torchvision.models.ResNet18_Weights.IMAGENET1K_V1
    cached = cached_weights_file(enum)
    assert cached.parent == tmp_path / "torch" / "hub" / "checkpoints"

    assert_usage_error(
        invoke("run", "resnet18", "--weights", "IMAGENET1K_V1", *SMALL), str(cached), enum.url
    )
    model = seeded_resnet18(9)
    cached.parent.mkdir(parents=True)
    torch.save(model.state_dict(), cached)
    out = run_dump(tmp_path / "d", "resnet18", "--weights", "IMAGENET1K_V1")
    reference_output(model, out)
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["model"]["weights"] == "IMAGENET1K_V1"
    assert manifest["model"]["weights_file"] == str(cached)
    # DEFAULT is the same enum member for resnet18
    default = run_dump(tmp_path / "default", "resnet18", "--weights", "DEFAULT")
    assert invoke("diff", str(out), str(default)).exit_code == 0
    # images get the weights' own preprocessing: resize 256, centre crop 224
    from PIL import Image

    Image.new("RGB", (80, 60), (255, 0, 0)).save(tmp_path / "red.png")
    images = tmp_path / "images"
    result = invoke("run", "resnet18", "--weights", "DEFAULT", "--input", str(tmp_path / "red.png"),
                    "-l", "__root__", "--capture", "input", "-q", "-o", str(images))  # fmt: skip
    assert result.exit_code == 0, result.stderr
    pixels = hookdump.load(images)["__root__:input.0"]
    assert pixels.shape == (1, 3, 224, 224)
    red = (torch.tensor([1.0, 0.0, 0.0]) - torch.tensor([0.485, 0.456, 0.406])) / torch.tensor(
        [0.229, 0.224, 0.225]
    )
    torch.testing.assert_close(pixels[0, :, 100, 100], red, rtol=0, atol=1e-4)


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (["resnet18", "--weights", "IMAGENET1K_V9"], "not a weights name of resnet18"),
        (["resnet18", "--weights", "missing.pt"], "--weights missing.pt: no such file"),
        (["missing.pt2"], "MODEL missing.pt2: no such file"),
    ],
)
def test_weight_and_model_file_errors(args: list[str], fragment: str) -> None:
    assert_usage_error(invoke("run", *args, *SMALL), fragment)


def test_a_checkpoint_without_a_state_dict(tmp_path: Path) -> None:
    path = tmp_path / "odd.pt"
    torch.save({"epoch": 3, "optimizer": {"lr": 0.1}}, path)
    assert_usage_error(invoke("run", "resnet18", "--weights", str(path), *SMALL), "no state dict")
