"""`hookdump layers` and `hookdump models`."""

from __future__ import annotations

import json

import pytest
import torch
import torchvision
from clitools import assert_usage_error, invoke

SMALL = ["--input-shape", "3,32,32"]


def test_names_for_a_pipeline_are_exactly_the_selected_modules() -> None:
    result = invoke("layers", "resnet18", "--type", "Conv2d", "--names", *SMALL)
    assert result.exit_code == 0, result.stderr
    model = torchvision.models.resnet18(weights=None)
    expected = [n for n, m in model.named_modules() if isinstance(m, torch.nn.Conv2d)]
    assert result.stdout.splitlines() == expected
    assert result.stderr == ""


def test_json_has_class_params_calls_and_per_sample_shapes() -> None:
    result = invoke("layers", "resnet18", "-l", "layer1.0.*", "-l", "fc", "--json", *SMALL)
    assert result.exit_code == 0, result.stderr
    rows = {row["name"]: row for row in json.loads(result.stdout)}
    model = torchvision.models.resnet18(weights=None)
    assert rows["layer1.0.conv1"] == {
        "name": "layer1.0.conv1",
        "depth": 3,
        "class": "Conv2d",
        "params": sum(p.numel() for p in model.layer1[0].conv1.parameters()),
        "calls": 1,
        "outputs": {"": [64, 8, 8]},
        "unbatched": [],
    }
    assert rows["layer1.0.relu"]["calls"] == 2  # BasicBlock reuses its ReLU
    assert rows["fc"]["outputs"] == {"": [1000]}


def test_table_lists_calls_and_structured_outputs(in_tests_dir: object) -> None:
    result = invoke("layers", "tiny_models:Structured", "-l", "*", "--input-shape", "6,3")
    assert result.exit_code == 0, result.stderr
    lines = {line.split()[0]: line for line in result.stdout.splitlines()[1:]}
    assert "0: 6×5, 1.0: 1×2×5 (no batch dim), 1.1: 1×2×5 (no batch dim)" in lines["lstm"]
    assert "left: 6×5, right: 6×5" in lines["pair"]
    assert lines["lstm"].split()[2] == f"{4 * (3 * 5 + 5 * 5 + 5 + 5):,}"


def test_layers_errors_like_run() -> None:
    assert_usage_error(invoke("layers", "resnet18", "-l", "layer5*", *SMALL), "--layers 'layer5*'")


def test_models_lists_torchvision_names_with_a_glob() -> None:
    result = invoke("models", "resnet*")
    assert result.exit_code == 0
    names = result.stdout.splitlines()
    assert "resnet18" in names and "resnet50" in names
    assert all(n.startswith("resnet") for n in names)
    every = invoke("models").stdout.splitlines()
    assert set(every) == set(torchvision.models.list_models())


def test_models_json_has_families() -> None:
    data = json.loads(invoke("models", "r3d*", "--json").stdout)
    assert data == [{"name": "r3d_18", "family": "video"}]


def test_models_glob_matching_nothing_is_an_error() -> None:
    assert_usage_error(invoke("models", "resnett*"), "no model name matches 'resnett*'")


@pytest.mark.parametrize(
    ("model", "shape"),
    [
        ("inception_v3", [3, 299, 299]),
        ("vit_b_16", [3, 224, 224]),
        ("r3d_18", [3, 16, 112, 112]),
    ],
)
def test_default_input_shapes_follow_the_model(model: str, shape: list[int]) -> None:
    from hookdump.inputs.samples import sample_form
    from hookdump.model.loading import load_model

    assert list(sample_form(load_model(model)).shape) == shape


@pytest.mark.parametrize("model", ["lraspp_mobilenet_v3_large", "ssdlite320_mobilenet_v3_large"])
def test_models_with_backbones_build_without_downloading(
    model: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    import torchvision.models._api as api

    def no_download(url: str, *args: object, **kwargs: object) -> None:
        raise AssertionError(f"tried to download {url}")

    monkeypatch.setattr(api, "load_state_dict_from_url", no_download)
    from hookdump.model.loading import load_model

    assert load_model(model).family in ("segmentation", "detection")


@pytest.mark.parametrize("model", ["googlenet", "quantized_googlenet"])
def test_models_that_warn_of_their_init_build_quietly_with_the_same_weights(model: str) -> None:
    """torchvision's googlenet and inception_v3 print a FutureWarning about their default
    init; hookdump asks for that init outright, so the weights are the ones torchvision
    would make with the same seed."""
    import warnings

    from hookdump.model.loading import load_model

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        loaded = load_model(model)
    assert [str(w.message) for w in caught if w.category is FutureWarning] == []
    torch.manual_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        reference = torchvision.models.get_model(model)
    for name, value in reference.state_dict().items():
        torch.testing.assert_close(loaded.module.state_dict()[name], value, msg=name)


@pytest.mark.usefixtures("in_tests_dir")
def test_layers_tree_shows_the_module_tree_with_its_parameters() -> None:
    """`--depth N` and `--tree`, as torchinfo users expect them: every module to that depth
    (containers too), indented, its parameters counted with its children's, and the
    model's totals; the names stay whole, to paste into --layers (issue 35)."""
    from tiny_models import ConvNet

    net = ConvNet()
    result = invoke("layers", "tiny_models:ConvNet", "--input-shape", "3,8,8", "--depth", "1")
    assert result.exit_code == 0, result.stderr
    names = [line.split()[0] for line in result.stdout.splitlines()[1:-1]]
    assert names == ["features", "pool", "head"]  # the model's children, in order
    features = next(line for line in result.stdout.splitlines() if line.split()[0] == "features")
    assert f"{sum(p.numel() for p in net.features.parameters()):,}" in features.split()
    total = sum(p.numel() for p in net.parameters())
    assert " ".join(result.stdout.split()).endswith(
        f"3 modules shown; the model has {total:,} parameters ({total:,} trainable); a "
        "container's count includes its children's"
    )
    tree = invoke("layers", "tiny_models:ConvNet", "--input-shape", "3,8,8", "--tree")
    lines = tree.stdout.splitlines()
    assert any(line.startswith("   features.0 ") for line in lines)  # indented one level
    listed = invoke(
        "layers", "tiny_models:ConvNet", "--input-shape", "3,8,8", "--tree", "--names"
    ).stdout.split()
    assert listed == [name for name, _ in net.named_modules() if name]
    rows = json.loads(
        invoke("layers", "tiny_models:ConvNet", "--input-shape", "3,8,8", "--tree", "--json").stdout
    )
    assert {row["name"]: row["depth"] for row in rows}["features.3"] == 2
    assert_usage_error(
        invoke("layers", "tiny_models:ConvNet", "--depth", "0"), "--depth 0 must be at least 1"
    )
