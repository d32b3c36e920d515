"""Selecting modules: globs over qualified names, exclusion, class names, helpful errors."""

from __future__ import annotations

import pytest
import torchvision
from tiny_models import ConvNet, TwoLinear

from hookdump.errors import HookdumpError
from hookdump.hooks.selection import select_modules


def test_default_is_every_leaf_in_registration_order() -> None:
    assert list(select_modules(TwoLinear())) == ["linear_1", "relu", "linear_2", "relu6"]


def test_star_crosses_dots_and_matches_containers_too() -> None:
    names = list(select_modules(ConvNet(), layers=["features*"]))
    assert names == ["features"] + [f"features.{i}" for i in range(6)]


def test_exclude_then_type() -> None:
    model = ConvNet()
    names = select_modules(model, layers=["*"], exclude=["features.3"], types=["Conv2d"])
    assert list(names) == ["features.0"]


def test_type_alone_finds_containers() -> None:
    model = torchvision.models.resnet18(weights=None)
    names = list(select_modules(model, types=["BasicBlock"]))
    assert names == [f"layer{i}.{j}" for i in range(1, 5) for j in range(2)]


def test_root_is_named_and_selectable() -> None:
    assert list(select_modules(TwoLinear(), layers=["__root__"])) == ["__root__"]


def test_patterns_are_case_sensitive() -> None:
    with pytest.raises(HookdumpError, match=r"'Linear_1' matches no module.*nearest: linear_1"):
        select_modules(TwoLinear(), layers=["Linear_1"])


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"layers": ["layer1.0.conv9"]}, r"layers 'layer1.0.conv9'.*nearest: .*layer1.0.conv1"),
        ({"exclude": ["layer9.*"]}, r"exclude 'layer9.\*' matches no module"),
        ({"types": ["Conv2D"]}, r"types 'Conv2D'.*nearest: Conv2d"),
        ({"layers": ["fc"], "exclude": ["f*"]}, r"the selection is empty"),
    ],
)
def test_errors_name_the_pattern_and_the_nearest_names(kwargs: dict, message: str) -> None:
    with pytest.raises(HookdumpError, match=message):
        select_modules(torchvision.models.resnet18(weights=None), **kwargs)
