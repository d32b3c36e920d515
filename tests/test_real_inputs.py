"""Inputs from files: images of every mode in nested folders, lists, stdin, tensor files."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from clitools import assert_usage_error, invoke
from PIL import Image
from safetensors.torch import save_file

import hookdump

MEAN = torch.tensor([0.485, 0.456, 0.406])
STD = torch.tensor([0.229, 0.224, 0.225])
# resnet18 at a 32 px crop, keeping only the preprocessed input the model received
ARGS = ["resnet18", "--image-size", "32", "-l", "__root__", "--capture", "input", "-q"]


def normalised(value_0_255: float) -> torch.Tensor:
    """A uniform grey image's pixel after ToTensor and ImageNet normalisation, by hand."""
    return (value_0_255 / 255 - MEAN) / STD


@pytest.fixture
def image_tree(tmp_path: Path) -> Path:
    """Uniform images of different sizes and modes in nested folders (values known)."""
    root = tmp_path / "images"
    (root / "b" / "deep").mkdir(parents=True)
    (root / "a").mkdir()
    Image.new("RGBA", (40, 30), (200, 200, 200, 90)).save(root / "b" / "deep" / "rgba.png")
    Image.new("L", (50, 70), 128).save(root / "a" / "grey.jpg", quality=100)
    sixteen = np.full((33, 35), 16384, dtype=np.uint16)  # a quarter of 65535
    Image.fromarray(sixteen).save(root / "b" / "sixteen.png")
    Image.new("P", (36, 36), 0).save(root / "palette.gif")
    (root / "notes.txt").write_text("not an image, not listed")
    return root


def test_a_folder_of_mixed_images_in_sorted_path_order(image_tree: Path, tmp_path: Path) -> None:
    out = tmp_path / "d"
    result = invoke("run", *ARGS, "--input", str(image_tree), "-b", "3", "-o", str(out))
    assert result.exit_code == 0, result.stderr
    manifest = json.loads((out / "manifest.json").read_text())
    expected = sorted(str(p) for p in image_tree.rglob("*") if p.suffix != ".txt" and p.is_file())
    assert manifest["sample_ids"] == expected
    assert manifest["num_samples"] == 4
    rows = hookdump.load(out)["__root__:input.0"]
    assert rows.shape == (4, 3, 32, 32)
    by_name = {Path(p).name: rows[i] for i, p in enumerate(expected)}
    grey = by_name["grey.jpg"]  # greyscale -> 3 equal channels
    torch.testing.assert_close(grey[:, 16, 16], normalised(128), atol=2e-2, rtol=0)
    torch.testing.assert_close(by_name["rgba.png"][:, 5, 5], normalised(200), atol=1e-5, rtol=0)
    torch.testing.assert_close(by_name["sixteen.png"][:, 5, 5], normalised(64), atol=1e-5, rtol=0)
    torch.testing.assert_close(by_name["palette.gif"][:, 0, 0], normalised(0), atol=1e-5, rtol=0)


def test_exif_rotation_is_applied(tmp_path: Path) -> None:
    # left half black, right half white, stored sideways: orientation 6 means "rotate 90° cw
    # to display", so upright the black half is on top
    pixels = np.zeros((40, 80, 3), dtype=np.uint8)
    pixels[:, 40:] = 255
    exif = Image.Exif()
    exif[0x0112] = 6
    path = tmp_path / "sideways.jpg"
    Image.fromarray(pixels).save(path, exif=exif, quality=100)
    out = tmp_path / "d"
    assert invoke("run", *ARGS, "--input", str(path), "-o", str(out)).exit_code == 0
    image = hookdump.load(out)["__root__:input.0"][0, 0]
    assert image[2].mean() < image[-3].mean() - 1  # dark top, bright bottom
    assert abs(float(image[:, 2].mean() - image[:, -3].mean())) < 0.1  # not left/right


def test_list_file_stdin_and_glob_keep_their_order(
    image_tree: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(image_tree)
    listed = ["palette.gif", "a/grey.jpg", "b/sixteen.png"]  # not sorted: order is kept
    (tmp_path / "list.txt").write_text("\n".join(listed) + "\n")
    for source, stdin in ((str(tmp_path / "list.txt"), None), ("-", "\n".join(listed))):
        out = tmp_path / f"d{source == '-'}"
        result = invoke("run", *ARGS, "--input", source, "-o", str(out), input=stdin)
        assert result.exit_code == 0, result.stderr
        assert json.loads((out / "manifest.json").read_text())["sample_ids"] == listed
    out = tmp_path / "glob"
    assert invoke("run", *ARGS, "--input", "**/*.png", "-o", str(out)).exit_code == 0
    ids = json.loads((out / "manifest.json").read_text())["sample_ids"]
    assert ids == ["b/deep/rgba.png", "b/sixteen.png"]


def test_an_undecodable_image_is_named_or_skipped(image_tree: Path, tmp_path: Path) -> None:
    bad = image_tree / "a" / "broken.jpg"
    bad.write_bytes(b"\xff\xd8 this is no jpeg")
    result = invoke("run", *ARGS, "--input", str(image_tree), "-o", str(tmp_path / "d"))
    assert_usage_error(result, f"cannot decode {bad}", "--skip-bad-inputs")
    out = tmp_path / "skipped"
    result = invoke("run", *ARGS, "--input", str(image_tree), "--skip-bad-inputs", "-o", str(out))
    assert result.exit_code == 0, result.stderr
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["num_samples"] == 4
    assert str(bad) not in manifest["sample_ids"]
    assert [s["path"] for s in manifest["skipped_inputs"]] == [str(bad)]
    # one after the last image that decodes: listed too, though no batch follows it
    last = image_tree / "zz-broken.png"
    last.write_bytes(b"\x89PNG no more")
    out = tmp_path / "skipped-last"
    result = invoke("run", *ARGS, "--input", str(image_tree), "--skip-bad-inputs", "-b", "1",
                    "-o", str(out))  # fmt: skip
    assert result.exit_code == 0, result.stderr
    manifest = json.loads((out / "manifest.json").read_text())
    assert [s["path"] for s in manifest["skipped_inputs"]] == [str(bad), str(last)]


def test_many_images_stream_through_workers(tmp_path: Path) -> None:
    folder = tmp_path / "many"
    folder.mkdir()
    for i in range(7):
        Image.new("L", (20 + i, 24), 10 * i).save(folder / f"{i:02d}.png")
    out = tmp_path / "d"
    result = invoke("run", *ARGS, "--input", str(folder), "-b", "2", "--workers", "2",
                    "--shard-size", "1", "-o", str(out))  # fmt: skip
    assert result.exit_code == 0, result.stderr
    rows = hookdump.load(out)["__root__:input.0"]
    for i in range(7):
        torch.testing.assert_close(rows[i, :, 3, 3], normalised(10 * i), atol=1e-5, rtol=0)


@pytest.mark.usefixtures("in_tests_dir")
def test_a_multi_tensor_safetensors_file_feeds_keyword_arguments(tmp_path: Path) -> None:
    a = torch.arange(20.0).reshape(5, 4)
    b = torch.tensor([[1.0, 2.0]] * 5)
    save_file({"a": a, "b": b}, tmp_path / "inputs.safetensors")
    out = tmp_path / "d"
    source = str(tmp_path / "inputs.safetensors")
    capture = ["--capture", "input,output", "-l", "__root__", "-q"]
    result = invoke("run", "tiny_models:TwoInputs", "--input", source, "-b", "2", *capture,
                    "-o", str(out))  # fmt: skip
    assert result.exit_code == 0, result.stderr
    dump = hookdump.load(out)
    assert dump.num_samples == 5
    torch.testing.assert_close(dump["__root__:input.a"], a)
    # by hand: fc has all-one weights and bias, so fc(a) = sum(a) + 1 on both units, times b
    expected = (a.sum(1, keepdim=True) + 1) * b
    torch.testing.assert_close(dump["__root__"], expected)
    manifest = json.loads((out / "manifest.json").read_text())
    assert "sample_ids" not in manifest  # row numbers
    assert dump.sample_ids == [0, 1, 2, 3, 4]


@pytest.mark.usefixtures("in_tests_dir")
@pytest.mark.parametrize("suffix", [".pt", ".npy"])
def test_pt_and_npy_tensor_files(tmp_path: Path, suffix: str) -> None:
    x = np.linspace(-1, 1, 12).reshape(6, 2)  # float64, as numpy makes it
    path = tmp_path / f"x{suffix}"
    if suffix == ".npy":
        np.save(path, x)
    else:
        torch.save(torch.from_numpy(x), path)
    out = tmp_path / "d"
    result = invoke("run", "tiny_models:TwoLinear", "--input", str(path), "-n", "4", "-q",
                    "--capture", "input,output", "-o", str(out))  # fmt: skip
    assert result.exit_code == 0, result.stderr
    dump = hookdump.load(out)
    assert dump.num_samples == 4  # --num-samples takes the first rows
    torch.testing.assert_close(dump["linear_1:input.0"], torch.from_numpy(x[:4]).float())


@pytest.mark.usefixtures("in_tests_dir")
def test_tensor_file_errors(tmp_path: Path) -> None:
    save_file({"a": torch.zeros(3, 4), "b": torch.zeros(2, 2)}, tmp_path / "ragged.safetensors")
    assert_usage_error(
        invoke("run", "tiny_models:TwoInputs", "--input", str(tmp_path / "ragged.safetensors")),
        "same number of rows",
    )
    assert_usage_error(invoke("run", *ARGS, "--input", str(tmp_path / "none.npy")), "no such file")
    (tmp_path / "empty").mkdir()
    assert_usage_error(invoke("run", *ARGS, "--input", str(tmp_path / "empty")), "no images")
    assert_usage_error(invoke("run", *ARGS, "--input", "nothing*.png"), "matches no file")


def test_images_for_a_video_model_are_refused(image_tree: Path) -> None:
    assert_usage_error(invoke("run", "r3d_18", "--input", str(image_tree)), "[3, H, W] images")
