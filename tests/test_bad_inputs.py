"""Bad input gets one `Error:` line and exit 2, never a traceback or a hang; and inputs
that are fine (a model with nothing to guess a shape from, fed by a file) just work."""

from __future__ import annotations

import json
import os
import struct
import subprocess
import sys
import zlib
from pathlib import Path

import numpy as np
import pytest
import torch
from clitools import assert_usage_error, invoke
from PIL import Image
from safetensors.torch import save_file

import hookdump

TESTS = Path(__file__).parent
pytestmark = pytest.mark.usefixtures("in_tests_dir")


@pytest.mark.parametrize(
    ("array", "dtype_name"),
    [
        (np.array([["a", "b"], ["c", "d"]]), "<U1"),
        (np.zeros(3, dtype=[("x", "f4"), ("y", "i4")]), "[('x', '<f4'), ('y', '<i4')]"),
        (np.array(["2024-01-01", "2025-01-01"], dtype="datetime64[D]"), "datetime64[D]"),
    ],
    ids=["strings", "structured", "datetime"],
)
def test_a_npy_of_non_numbers_is_one_line(
    tmp_path: Path, array: np.ndarray, dtype_name: str
) -> None:
    path = tmp_path / "x.npy"
    np.save(path, array)
    result = invoke("run", "tiny_models:TwoLinear", "--input", str(path), "-q")
    assert_usage_error(result, f"--input {path} holds {dtype_name} values")


def test_a_binary_config_is_one_line(tmp_path: Path) -> None:
    config = tmp_path / "c.toml"
    config.write_bytes(bytes(range(256)))
    assert_usage_error(
        invoke("run", "tiny_models:TwoLinear", "--config", str(config)),
        f"--config {config} is not a text file",
    )


@pytest.mark.parametrize(
    ("line", "fragment"),
    [
        ('batch_size = "eight"', "batch_size = 'eight' is not valid"),
        ("seed = 1.5", "seed = 1.5 is not valid"),
    ],
)
def test_a_config_value_of_the_wrong_type_is_one_line(
    tmp_path: Path, line: str, fragment: str
) -> None:
    config = tmp_path / "c.toml"
    config.write_text(line + "\n")
    assert_usage_error(
        invoke("run", "tiny_models:TwoLinear", "--config", str(config)),
        f"--config {config}: {fragment}",
    )
    # the same value typed on the command line is Click's own usage error, as before
    result = invoke("run", "tiny_models:TwoLinear", "--batch-size", "eight")
    assert result.exit_code == 2 and "Invalid value for '--batch-size'" in result.stderr


def test_an_input_too_large_to_allocate_is_one_line() -> None:
    # 2**31 values per sample, the most --input-shape takes, times 10000 samples: 80 TiB
    result = invoke("run", "tiny_models:TwoLinear", "--input-shape", "2,32768,32768", "-b",
                    "10000", "-q")  # fmt: skip
    assert_usage_error(result, "ran out of memory at --batch-size 10000", "lower --batch-size")


def _png_claiming(path: Path, width: int, height: int) -> None:
    """A tiny PNG whose header claims `width` x `height` pixels (a decompression bomb)."""
    Image.new("L", (1, 1)).save(path)
    data = bytearray(path.read_bytes())
    ihdr = data.index(b"IHDR")
    data[ihdr + 4 : ihdr + 12] = struct.pack(">II", width, height)
    crc = zlib.crc32(bytes(data[ihdr : ihdr + 17]))
    data[ihdr + 17 : ihdr + 21] = struct.pack(">I", crc)
    path.write_bytes(bytes(data))


def test_a_decompression_bomb_is_named_or_skipped(tmp_path: Path) -> None:
    folder = tmp_path / "images"
    folder.mkdir()
    for i in range(3):
        Image.new("RGB", (20, 20), (40 * i, 0, 0)).save(folder / f"{i}.png")
    _png_claiming(folder / "1.png", 30000, 30000)
    args = ["run", "tiny_models:ConvNet", "--input", str(folder), "--image-size", "16", "-q"]
    line = assert_usage_error(invoke(*args), f"cannot decode {folder / '1.png'}")
    assert "DecompressionBombError" in line and "--skip-bad-inputs" in line
    out = tmp_path / "d"
    result = invoke(*args, "--skip-bad-inputs", "-o", str(out))
    assert result.exit_code == 0, result.stderr
    manifest = json.loads((out / "manifest.json").read_text())
    assert [s["path"] for s in manifest["skipped_inputs"]] == [str(folder / "1.png")]
    assert manifest["sample_ids"] == [str(folder / "0.png"), str(folder / "2.png")]


# --- models with nothing to guess a random input from, fed by files ------------------------


def test_a_model_without_a_guessable_input_runs_on_a_tensor_file(tmp_path: Path) -> None:
    x = torch.randn(5, 3, 7)
    save_file({"x": x}, tmp_path / "x.safetensors")
    out = tmp_path / "d"
    result = invoke("run", "tiny_models:NoGuess", "--input", str(tmp_path / "x.safetensors"),
                    "-l", "act", "-q", "-o", str(out))  # fmt: skip
    assert result.exit_code == 0, result.stderr
    assert torch.allclose(hookdump.load(out)["act"], torch.tanh(2 * x))
    # random input still needs a shape, and says so
    assert_usage_error(invoke("run", "tiny_models:NoGuess", "-q"), "pass --input-shape")


def test_keyword_inputs_and_a_structured_output_without_a_guessable_input(tmp_path: Path) -> None:
    a, b = torch.randn(4, 3), torch.randn(4, 3)
    save_file({"a": a, "b": b}, tmp_path / "ab.safetensors")
    out = tmp_path / "d"
    result = invoke("run", "tiny_models:NoGuessPair", "--input", str(tmp_path / "ab.safetensors"),
                    "-l", "pair", "-q", "-o", str(out))  # fmt: skip
    assert result.exit_code == 0, result.stderr
    dump = hookdump.load(out)
    assert torch.allclose(dump["pair:output.left"], a - b + 1)
    assert torch.allclose(dump["pair:output.right"], (a - b) * 2)


def test_a_factory_with_model_args_without_a_guessable_input(tmp_path: Path) -> None:
    x = np.linspace(-1, 1, 12, dtype=np.float32).reshape(4, 3)
    np.save(tmp_path / "x.npy", x)
    out = tmp_path / "d"
    result = invoke("run", "tiny_models:no_guess_factory", "--model-arg", "scale=2",
                    "--input", str(tmp_path / "x.npy"), "-q", "-o", str(out))  # fmt: skip
    assert result.exit_code == 0, result.stderr
    assert torch.allclose(hookdump.load(out)["act"], torch.tanh(2 * torch.from_numpy(x)))


# --- stderr stays one line ----------------------------------------------------------------


def _python(code: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", code], cwd=cwd, capture_output=True, text=True, timeout=120,
        env={**os.environ, "PYTHONPATH": str(TESTS)},
    )  # fmt: skip


def test_a_refused_pickle_prints_no_torch_warnings(tmp_path: Path) -> None:
    import pickle

    with (tmp_path / "model.pt").open("wb") as f:
        pickle.dump(os.system, f, protocol=4)  # what torch warns about, and code to run
    result = subprocess.run(
        [sys.executable, "-m", "hookdump", "run", str(tmp_path / "model.pt")],
        cwd=TESTS, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: "), result.stderr
    assert "refused and nothing in it was executed" in lines[0]


def test_a_second_ctrl_c_while_exiting_prints_no_traceback(tmp_path: Path) -> None:
    # the atexit callback stands for a user pressing Ctrl-C again while hookdump exits
    code = (
        "import atexit, os, signal, sys, time\n"
        "def again():\n"
        "    os.kill(os.getpid(), signal.SIGINT)\n"
        "    time.sleep(0.5)\n"
        "atexit.register(again)\n"
        "sys.argv = ['hookdump', 'run', 'tiny_models:Interrupts', '-q']\n"
        "from hookdump.cli import main\n"
        "main()\n"
    )
    result = _python(code, TESTS)
    assert result.returncode == 130, result.stderr
    assert result.stderr.strip().splitlines() == ["Interrupted: nothing was written"]


def test_an_error_after_the_progress_bar_starts_is_the_first_line_of_stderr(
    tmp_path: Path,
) -> None:
    # stderr is not a terminal here (a CI log): no bar, and no blank line left by one
    result = invoke("run", "tiny_models:Growing", "-n", "6", "-b", "2", "--no-early-stop",
                    "-o", str(tmp_path / "d"))  # fmt: skip
    assert result.exit_code == 2
    assert result.stderr.startswith("Error: ") and result.stderr.count("\n") == 1


def test_the_quick_exit_still_waits_for_threads_and_runs_atexit_callbacks(tmp_path: Path) -> None:
    """`main` ends the process with os._exit (skipping the interpreter's slow teardown), but
    only after what the teardown would wait for: other threads, then atexit callbacks."""
    code = (
        "import atexit, pathlib, sys, threading, time\n"
        f"out = pathlib.Path({str(tmp_path)!r})\n"
        "atexit.register(lambda: (out / 'atexit').write_text('ran'))\n"
        "def late():\n"
        "    time.sleep(0.5)\n"
        "    (out / 'thread').write_text('ran')\n"
        "threading.Thread(target=late).start()\n"
        f"sys.argv = ['hookdump', 'run', 'tiny_models:TwoLinear', '-o', {str(tmp_path / 'd')!r}]\n"
        "from hookdump.cli import main\n"
        "main()\n"
    )
    result = _python(code, TESTS)
    assert result.returncode == 0, result.stderr
    assert "relu6" in result.stdout and "estimated" in result.stdout  # the table, flushed
    assert (tmp_path / "thread").read_text() == (tmp_path / "atexit").read_text() == "ran"
    assert hookdump.load(tmp_path / "d")["relu6"].shape == (8, 1)
