"""Inputs that used to end in a traceback, or in an error that blamed the wrong option: each
is one `Error:` line, exit 2, naming the option really at fault (issue 20, classes 6 and 7).

Hugging Face folders are the tiny GPT-2 of `tiny_text`, each spoilt in one way."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from clitools import assert_usage_error, invoke
from PIL import Image
from safetensors.torch import save_file

import hookdump

transformers = pytest.importorskip("transformers")
pytestmark = pytest.mark.usefixtures("in_tests_dir")


def _config(change: Callable[[dict], None]) -> Callable[[Path], None]:
    def edit(folder: Path) -> None:
        config = json.loads((folder / "config.json").read_text())
        change(config)
        (folder / "config.json").write_text(json.dumps(config))

    return edit


def _pickled_module(folder: Path) -> None:
    (folder / "model.safetensors").unlink()
    torch.save({"h": torch.nn.Linear(2, 2)}, folder / "pytorch_model.bin")


SPOILT: dict[str, tuple[Callable[[Path], None], str]] = {
    "garbage config.json": (lambda f: (f / "config.json").write_text("{garbage"),
                            "config.json is not a readable JSON file"),
    "config.json nested 100000 deep": (
        lambda f: (f / "config.json").write_text("[" * 100_000 + "]" * 100_000),
        "config.json is not a readable JSON file"),
    "an unknown model_type": (_config(lambda c: c.update(model_type="nosuchmodel")),
                              "transformers cannot read its config.json"),
    "architectures naming a non-class": (_config(lambda c: c.update(architectures=["logging"])),
                                         "names the class 'logging'"),
    "architectures as a string": (_config(lambda c: c.update(architectures="GPT2Model")),
                                  "not a list of class names"),
    "a pickled .bin holding a module": (_pickled_module, "loading the weights failed"),
    "a huge n_positions": (_config(lambda c: c.update(n_positions=10**12)), "MODEL hf:"),
    # issue 32: a config that makes no model was blamed on the weights files
    "no attention heads": (_config(lambda c: c.update(n_head=0)),
                           "its config.json does not make a"),
    "flash attention asked for": (
        _config(lambda c: c.update(_attn_implementation="flash_attention_2",
                                   attn_implementation="flash_attention_2")),
        "needs a package that is not installed"),
}  # fmt: skip


@pytest.mark.parametrize("case", sorted(SPOILT))
def test_a_spoilt_model_folder_is_one_line(gpt2: Path, tmp_path: Path, case: str) -> None:
    folder = tmp_path / "m"
    shutil.copytree(gpt2, folder)
    spoil, fragment = SPOILT[case]
    spoil(folder)
    assert_usage_error(invoke("layers", f"hf:{folder}"), fragment)
    assert not (tmp_path / "d").exists()


@pytest.mark.parametrize("content", ['{"version": "1.0", "model": 5}', "garbage"])
def test_a_wrong_tokenizer_json_blames_the_model_folder_when_no_tokenizer_was_given(
    gpt2: Path, tmp_path: Path, corpus: Path, content: str
) -> None:
    folder = tmp_path / "m"
    shutil.copytree(gpt2, folder)
    (folder / "tokenizer.json").write_text(content)
    line = assert_usage_error(
        invoke("run", f"hf:{folder}", "--text", str(corpus), "-q", "-o", str(tmp_path / "d")),
        f"MODEL hf:{folder}: cannot load its tokenizer", "--tokenizer PATH",
    )  # fmt: skip
    assert not line.startswith("Error: --tokenizer")
    line = assert_usage_error(
        invoke("run", f"hf:{gpt2}", "--tokenizer", str(folder), "--text", str(corpus), "-q",
               "-o", str(tmp_path / "d")),
        f"--tokenizer {folder}: cannot load its tokenizer",
    )  # fmt: skip


def test_a_manifest_that_is_a_folder(tmp_path: Path) -> None:
    (tmp_path / "d" / "manifest.json").mkdir(parents=True)
    assert_usage_error(invoke("inspect", str(tmp_path / "d")), "is not a regular file")
    with pytest.raises(hookdump.InvalidDump, match="is not a regular file"):
        hookdump.load(tmp_path / "d")


def test_show_of_a_map_with_no_channels_draws_a_histogram(tmp_path: Path) -> None:
    save_file({"x": torch.zeros(2, 0, 4, 4)}, tmp_path / "z.safetensors")
    result = invoke("show", str(tmp_path / "z.safetensors"), "x", "-o", str(tmp_path / "z.png"))
    assert result.exit_code == 0, result.stderr
    assert "histogram of x" in result.stdout
    assert Image.open(tmp_path / "z.png").size[0] > 0


def test_lone_files_with_ragged_rows(tmp_path: Path) -> None:
    """A weights file: each key its own first dimension. inspect and diff take each key's
    own rows; show refuses a row a key lacks; batches refuses to align them."""
    a, b = tmp_path / "a.safetensors", tmp_path / "b.safetensors"
    save_file({"w": torch.ones(2, 3), "bias": torch.ones(5)}, a)
    save_file({"w": torch.ones(2, 3), "bias": torch.arange(5.0)}, b)
    data = json.loads(invoke("inspect", str(a), "--json").stdout)
    assert {t["key"]: t["bytes"] for t in data["tensors"]} == {"w": 24, "bias": 20}
    result = invoke("diff", str(a), str(b), "--json")
    assert result.exit_code == 1
    status = {k["key"]: (k["status"], k["numel"]) for k in json.loads(result.stdout)["keys"]}
    assert status == {"w": ("match", 6), "bias": ("differ", 5)}
    save_file({"w": torch.ones(3, 3), "bias": torch.ones(5)}, b)
    keys = json.loads(invoke("diff", str(a), str(b), "--json").stdout)["keys"]
    assert {k["key"]: k["status"] for k in keys}["w"] == "shape"
    assert_usage_error(invoke("show", str(a), "w", "-s", "3", "-o", str(tmp_path / "x.png")),
                       "--sample 3 is out of range", "'w' has 2 rows")  # fmt: skip
    with pytest.raises(hookdump.HookdumpError, match="different numbers of rows"):
        next(iter(hookdump.load(a).batches(["w"], 2)))


def test_a_toml_config_nested_5000_deep(tmp_path: Path) -> None:
    config = tmp_path / "deep.toml"
    config.write_text("layers = " + "[" * 5000 + "]" * 5000 + "\n")
    assert_usage_error(invoke("run", "tiny_models:TwoLinear", "--config", str(config)),
                       "--config", "nested too deeply")  # fmt: skip


@pytest.mark.parametrize("shape", ["99999999999,99999999999,99999999999", "3,9223372036854775807"])
def test_an_input_shape_whose_size_overflows(tmp_path: Path, shape: str) -> None:
    assert_usage_error(invoke("run", "tiny_models:TwoLinear", "--input-shape", shape,
                              "-o", str(tmp_path / "d")),
                       "--input-shape", "values per sample")  # fmt: skip


def test_a_huge_image_size_blames_image_size_not_the_image(tmp_path: Path) -> None:
    Image.new("RGB", (8, 8), "red").save(tmp_path / "a.png")
    assert_usage_error(invoke("run", "resnet18", "--input", str(tmp_path / "a.png"),
                              "--image-size", "100000000", "-o", str(tmp_path / "d")),
                       "--image-size 100000000 must be from 1 to")  # fmt: skip


@pytest.mark.parametrize(
    ("content", "extra", "fragment"),
    [
        ("", [], "the corpus has no document"),
        ("\n  \n", ["--context-size", "8"], "fewer tokens than one --context-size 8 window"),
        ("the cat\n", ["--per-token", "--positions", "50:"], "--positions 50: keeps no token"),
    ],
    ids=["empty", "blank lines, packed", "positions beyond every sample"],
)
def test_nothing_to_dump_names_the_option_at_fault(
    gpt2: Path, tmp_path: Path, content: str, extra: list[str], fragment: str
) -> None:
    corpus = tmp_path / "c.txt"
    corpus.write_text(content)
    out = tmp_path / "d"
    line = assert_usage_error(invoke("run", f"hf:{gpt2}", "--text", str(corpus), *extra, "-q",
                                     "-o", str(out)), fragment)  # fmt: skip
    assert "--input random" not in line
    assert not out.exists()  # nothing was written, and the folder it made is gone


@pytest.mark.parametrize("option", ["--context-size", "--max-length"])
def test_more_tokens_than_the_model_has_positions(
    gpt2: Path, corpus: Path, tmp_path: Path, option: str
) -> None:
    line = assert_usage_error(invoke("run", f"hf:{gpt2}", "--text", str(corpus), option, "65",
                                     "-o", str(tmp_path / "d")),
                              f"{option} 65 is more tokens than", "64 positions")  # fmt: skip
    assert "--input-shape" not in line


def test_a_text_run_whose_forward_fails_blames_the_config_not_input_shape(
    gpt2: Path, tmp_path: Path, corpus: Path
) -> None:
    """Issue 32 (AT18): a text run was told to check --input-shape, which it has not."""
    folder = tmp_path / "m"
    shutil.copytree(gpt2, folder)
    _config(lambda c: c.update(n_head=-2))(folder)
    result = invoke("run", f"hf:{folder}", "--text", str(corpus), "--context-size", "8",
                    "-n", "2", "-q")  # fmt: skip
    line = assert_usage_error(result, "raised", "check the model's config.json and --model-arg")
    assert "--input-shape" not in line


def test_a_timm_name_without_timm_and_text_for_an_image_model(tmp_path: Path) -> None:
    """A timm name given bare is pointed at timm:NAME, not at torchvision's names; --text
    for an image model blames the model, not a missing tokenizer (issue 35)."""
    pytest.importorskip("timm")
    assert_usage_error(
        invoke("run", "resnet10t", "-n", "1", "-q"),
        "unknown torchvision model 'resnet10t'; timm has one of that name: give timm:resnet10t",
    )
    corpus = tmp_path / "c.txt"
    corpus.write_text("a few words\n")
    assert_usage_error(
        invoke("run", "resnet18", "--text", str(corpus), "-n", "1", "-q"),
        "--text feeds text to a language model, and MODEL resnet18 is a torchvision "
        "classification model that takes images; give it --input images",
    )
