"""Hugging Face and timm models as MODEL sources, offline, with their own preprocessing.

Every model is tiny and built here (`save_pretrained`, `pretrained=False`); every captured
value is compared with the same library run directly on the same inputs.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch
from clitools import assert_usage_error, invoke
from PIL import Image
from safetensors.torch import save_file
from tiny_text import tiny_bert, tiny_gpt2

import hookdump

transformers = pytest.importorskip("transformers")
timm = pytest.importorskip("timm")
pytestmark = pytest.mark.usefixtures("in_tests_dir")


@pytest.fixture(scope="module")
def gpt2(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny_gpt2(tmp_path_factory.mktemp("gpt2"), vocab_size=64, n_positions=48,
                     bos_token_id=0, eos_token_id=0)  # fmt: skip


@pytest.fixture(scope="module")
def bert(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny_bert(tmp_path_factory.mktemp("bert"), masked_lm=True, vocab_size=64,
                     max_position_embeddings=40)  # fmt: skip


@pytest.fixture(scope="module")
def vit(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("vit")
    torch.manual_seed(2)
    config = transformers.ViTConfig(image_size=32, patch_size=8, hidden_size=32,
                                    num_hidden_layers=2, num_attention_heads=2,
                                    intermediate_size=64)  # fmt: skip
    transformers.ViTModel(config).save_pretrained(folder)
    transformers.ViTImageProcessor(size={"height": 32, "width": 32}).save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def images(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Images of odd sizes and modes, so resizing and cropping matter."""
    folder = tmp_path_factory.mktemp("images")
    generator = torch.Generator().manual_seed(3)
    for i, (w, h) in enumerate([(37, 51), (80, 33), (64, 64), (45, 90)]):
        pixels = torch.randint(0, 256, (h, w, 3), generator=generator, dtype=torch.uint8)
        Image.fromarray(pixels.numpy()).save(folder / f"{i}.png")
    return folder


def _ids(tmp_path: Path, vocab: int, length: int) -> tuple[Path, torch.Tensor]:
    ids = torch.randint(0, vocab, (3, length), generator=torch.Generator().manual_seed(4))
    save_file({"input_ids": ids}, tmp_path / "ids.safetensors")
    return tmp_path / "ids.safetensors", ids


def _run(*args: str) -> None:
    result = invoke("run", *args)
    assert result.exit_code == 0, result.stderr
    assert "Loading weights" not in result.stderr  # transformers' own progress bars stay off


def test_gpt2_blocks_equal_its_hidden_states(gpt2: Path, tmp_path: Path) -> None:
    data, ids = _ids(tmp_path, 64, 20)
    out = tmp_path / "d"
    _run(f"hf:{gpt2}", "-l", "h.*", "-l", "ln_f", "-x", "h.*.*", "--input", str(data), "-q",
         "-o", str(out))  # fmt: skip
    dump = hookdump.load(out)
    model = transformers.GPT2Model.from_pretrained(gpt2).eval()
    with torch.no_grad():
        hidden = model(ids, output_hidden_states=True).hidden_states
    torch.testing.assert_close(dump["h.0"], hidden[1])  # block 0's output
    torch.testing.assert_close(dump["ln_f"], hidden[2])  # the last entry is after ln_f
    manifest = dump.manifest
    assert manifest["model"]["architecture"] == "GPT2Model"
    assert manifest["model"]["folder"] == str(gpt2)
    assert list(manifest["model"]["files_sha256"]) == [str(gpt2 / "model.safetensors")]


def test_random_token_ids_fit_the_model_and_layers_lists_its_modules(gpt2: Path) -> None:
    result = invoke("run", str(gpt2), "-t", "GPT2Block", "-n", "2", "--json")  # a bare folder
    assert result.exit_code == 0, result.stderr
    shapes = {t["key"]: t["shape"] for t in json.loads(result.stdout)["tensors"]}
    assert shapes == {"h.0": [48, 32], "h.1": [48, 32]}  # min(128, n_positions) tokens
    listed = invoke("layers", f"hf:{gpt2}", "-t", "GPT2Block", "--names")
    assert listed.exit_code == 0 and listed.stdout.split() == ["h.0", "h.1"]


def test_bert_saved_for_masked_lm_loads_as_that_class(bert: Path, tmp_path: Path) -> None:
    data, ids = _ids(tmp_path, 64, 16)
    out = tmp_path / "d"
    result = invoke("run", f"hf:{bert}", "-l", "bert.encoder.layer.0", "--input", str(data),
                    "-o", str(out))  # fmt: skip
    assert result.exit_code == 0, result.stderr
    assert "warning" not in result.stderr  # no missing or unexpected keys
    dump = hookdump.load(out)
    assert dump.manifest["model"]["class"].endswith("BertForMaskedLM")
    model = transformers.BertForMaskedLM.from_pretrained(bert).eval()
    with torch.no_grad():
        hidden = model(ids, output_hidden_states=True).hidden_states
    torch.testing.assert_close(dump["bert.encoder.layer.0"], hidden[1])


def test_vit_images_go_through_its_own_image_processor(
    vit: Path, images: Path, tmp_path: Path
) -> None:
    out = tmp_path / "d"
    # the model's own module names (transformers 5 calls ViT's blocks layers.N)
    block = next(n for n, _ in transformers.ViTModel.from_pretrained(vit).named_modules()
                 if n.endswith("layer.0") or n.endswith("layers.0"))  # fmt: skip
    _run(f"hf:{vit}", "-l", block, "--input", str(images), "-q", "-o", str(out))
    processor = transformers.AutoImageProcessor.from_pretrained(vit)
    files = sorted(images.glob("*.png"))
    pixels = processor(images=[Image.open(f).convert("RGB") for f in files],
                       return_tensors="pt")["pixel_values"]  # fmt: skip
    model = transformers.ViTModel.from_pretrained(vit).eval()
    with torch.no_grad():
        hidden = model(pixels, output_hidden_states=True).hidden_states
    torch.testing.assert_close(hookdump.load(out)[block], hidden[1])
    # random input is shaped from the config
    result = invoke("run", f"hf:{vit}", "-l", "embeddings", "-n", "2", "--json")
    assert json.loads(result.stdout)["tensors"][0]["shape"] == [17, 32]  # 16 patches + CLS


def test_timm_images_get_timms_preprocessing_and_the_checkpoint(
    images: Path, tmp_path: Path
) -> None:
    torch.manual_seed(5)
    model = timm.create_model("resnet18", pretrained=False, num_classes=7).eval()
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.add_(0.01 * torch.randn_like(parameter))
    save_file(model.state_dict(), tmp_path / "ckpt.safetensors")
    out = tmp_path / "d"
    _run("timm:resnet18", "--model-arg", "num_classes=7", "--weights",
         str(tmp_path / "ckpt.safetensors"), "-l", "layer1", "-l", "fc", "--input", str(images),
         "-q", "-o", str(out))  # fmt: skip
    transform = timm.data.create_transform(
        **timm.data.resolve_model_data_config(model), is_training=False
    )
    files = sorted(images.glob("*.png"))
    batch = torch.stack([transform(Image.open(f).convert("RGB")) for f in files])
    with torch.no_grad():
        logits = model(batch)
    dump = hookdump.load(out)
    torch.testing.assert_close(dump["fc"], logits)
    assert dump["layer1"].shape == (4, 64, 56, 56)  # timm's 224 crop of each odd-sized image
    listed = invoke("models", "--source", "timm", "resnet1*")
    assert listed.exit_code == 0 and "timm:resnet18" in listed.stdout.split()


def test_zoo_errors_are_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert_usage_error(invoke("run", f"hf:{tmp_path / 'nope'}"), "no such folder")
    monkeypatch.setenv("HOOKDUMP_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))
    import huggingface_hub.constants as hub_constants

    monkeypatch.setattr(hub_constants, "HF_HUB_CACHE", str(tmp_path / "hf-home" / "hub"))
    result = invoke("run", "hf:some-org/some-model")
    assert_usage_error(result, "not in the Hugging Face cache", "looked in", "downloads are off")
    odd = tmp_path / "odd"
    odd.mkdir()
    config = {"model_type": "gpt2", "architectures": ["GPT2NoSuchModel"]}
    (odd / "config.json").write_text(json.dumps(config))
    assert_usage_error(invoke("run", str(odd)), "names the class 'GPT2NoSuchModel'")
    assert_usage_error(invoke("run", "timm:resnet181"), "timm has no model 'resnet181'",
                       "did you mean resnet18")  # fmt: skip
    assert_usage_error(invoke("run", "timm:resnet18", "--weights", "pretrained"),
                       "--weights pretrained", "not in the local cache")  # fmt: skip
    monkeypatch.setitem(sys.modules, "transformers", None)  # the extra is not installed
    assert_usage_error(invoke("run", f"hf:{tmp_path}"), "pip install 'hookdump[hf]'")
    monkeypatch.setitem(sys.modules, "timm", None)
    assert_usage_error(invoke("run", "timm:resnet18"), "pip install 'hookdump[timm]'")


def test_an_org_name_comes_from_the_local_cache_offline(
    gpt2: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import shutil

    import huggingface_hub.constants as hub_constants

    # the layout huggingface_hub keeps: refs/main names the snapshot holding the files
    repo = tmp_path / "hub" / "models--tiny-org--tiny-gpt2"
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text("0" * 40)
    shutil.copytree(gpt2, repo / "snapshots" / ("0" * 40))
    monkeypatch.setattr(hub_constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setenv("HOOKDUMP_OFFLINE", "1")
    out = tmp_path / "d"
    _run("hf:tiny-org/tiny-gpt2", "-l", "h.0", "-n", "2", "-q", "-o", str(out))
    here = tmp_path / "local"
    _run(f"hf:{gpt2}", "-l", "h.0", "-n", "2", "-q", "-o", str(here))
    assert invoke("diff", str(here), str(out), "--atol", "0", "--rtol", "0").exit_code == 0


def test_reduce_first_and_last_take_a_token_of_an_image_transformer(
    vit: Path, tmp_path: Path
) -> None:
    data = torch.randn(3, 3, 32, 32, generator=torch.Generator().manual_seed(6))
    save_file({"pixel_values": data}, tmp_path / "x.safetensors")
    model = transformers.ViTModel.from_pretrained(vit).eval()
    block = next(n for n, _ in model.named_modules() if n.endswith(("layer.0", "layers.0")))
    with torch.no_grad():
        hidden = model(data, output_hidden_states=True).hidden_states[1]
    for how, token in (("first", 0), ("last", -1)):
        out = tmp_path / how
        _run(f"hf:{vit}", "-l", block, "--reduce", how, "--input",
             str(tmp_path / "x.safetensors"), "-q", "-o", str(out))  # fmt: skip
        torch.testing.assert_close(hookdump.load(out)[block], hidden[:, token])
    line = assert_usage_error(invoke("run", f"hf:{vit}", "-l", "*.projection",
                                     "--reduce", "first", "-n", "2"))  # fmt: skip
    assert "--reduce first takes a token of [batch, tokens, features] tensors" in line
