"""Every file in configs/ runs; the command line overrides a config; the CI recipe works."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path

import pytest
from clitools import assert_usage_error, invoke
from PIL import Image

import hookdump

CONFIGS = sorted((Path(__file__).parents[1] / "configs").glob("*.toml"))
HEAVY = {"resnet50"}


def _param(config: Path) -> object:
    heavy = tomllib.loads(config.read_text())["model"] in HEAVY
    return pytest.param(config, id=config.stem, marks=[pytest.mark.slow] if heavy else [])


@pytest.mark.parametrize("config", [_param(c) for c in CONFIGS])
def test_every_config_runs(config: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # configs name paths relative to where they run: give them an images/ folder there
    monkeypatch.chdir(tmp_path)
    (tmp_path / "images" / "cats").mkdir(parents=True)
    for i, size in enumerate([(300, 200), (64, 64), (500, 375)]):
        Image.new("RGB", size, (40 * i, 90, 160)).save(tmp_path / "images" / "cats" / f"{i}.jpg")
    out = tmp_path / "out"
    result = invoke("run", "--config", str(config), "--out", str(out))
    assert result.exit_code == 0, result.stderr
    table = tomllib.loads(config.read_text())
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["complete"]
    assert manifest["model"]["spec"] == table["model"]
    assert manifest["selection"]["layers"] == table["layers"]


def test_configs_exist() -> None:
    assert len(CONFIGS) >= 2


def test_command_line_replaces_config_values_and_lists(tmp_path: Path) -> None:
    config = tmp_path / "c.toml"
    config.write_text('model = "resnet18"\nlayers = ["layer1.*", "fc"]\ninput_shape = "3,32,32"\n'
                      "batch_size = 2\nquiet = true\n")  # fmt: skip
    result = invoke("run", "--config", str(config), "-l", "conv1", "-b", "3", "--json")
    assert result.exit_code == 0, result.stderr
    data = json.loads(result.stdout)
    assert [t["key"] for t in data["tensors"]] == ["conv1"]  # replaced, not merged
    assert data["num_samples"] == 3


def test_the_ci_recipe_from_the_readme(tmp_path: Path) -> None:
    config = str(CONFIGS[[c.stem for c in CONFIGS].index("ci-regression")])
    golden, candidate = tmp_path / "golden", tmp_path / "candidate"
    assert invoke("run", "--config", config, "--out", str(golden)).exit_code == 0
    assert invoke("run", "--config", config, "--out", str(candidate)).exit_code == 0
    assert invoke("diff", str(golden), str(candidate)).exit_code == 0
    # a changed model fails the check and names the first diverging key
    changed = tmp_path / "changed"
    assert invoke("run", "--config", config, "--seed", "1", "--out", str(changed)).exit_code == 0
    result = invoke("diff", str(golden), str(changed), "--json")
    assert result.exit_code == 1
    assert json.loads(result.stdout)["first_diverging"]["key"] == hookdump.load(golden).keys()[0]


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ('layerz = ["x"]\n', "'layerz' is not an option of `hookdump run` (did you mean layers?)"),
        ("layers = [\n", "is not valid TOML"),
    ],
)
def test_bad_configs(tmp_path: Path, text: str, fragment: str) -> None:
    config = tmp_path / "c.toml"
    config.write_text(text)
    assert_usage_error(invoke("run", "resnet18", "--config", str(config)), fragment)
    assert_usage_error(
        invoke("run", "resnet18", "--config", str(tmp_path / "none.toml")), "--config"
    )
