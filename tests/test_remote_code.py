"""No code from a model folder runs, whatever reaches standard input: a folder whose config
files point at its own `.py` (`auto_map`) is refused in one line, and hookdump never asks.

Each folder holds a `.py` that writes a marker file when imported; every command runs with
a stdin answering `y` to everything, and the marker must never appear.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from clitools import assert_usage_error, invoke
from tiny_text import tiny_gpt2

YES = "y\n" * 200
CONFIGS = ["config.json", "tokenizer_config.json", "preprocessor_config.json"]


def folder_with_code(tmp_path: Path, config: str) -> tuple[Path, Path]:
    """A tiny GPT-2 folder whose `config` names `modeling_evil.py` in its auto_map; the
    marker file that module writes when imported."""
    folder = tiny_gpt2(tmp_path / "model")
    marker = tmp_path / "MARKER-code-ran"
    (folder / "modeling_evil.py").write_text(
        f"import pathlib\npathlib.Path({str(marker)!r}).write_text('ran')\n"
        "from transformers import GPT2Model as EvilModel, GPT2Config as EvilConfig\n"
        "from transformers import PreTrainedTokenizerFast as EvilTokenizer\n"
        "from transformers import ViTImageProcessor as EvilProcessor\n"
    )
    path = folder / config
    data = json.loads(path.read_text()) if path.is_file() else {}
    data["auto_map"] = {
        "config.json": {"AutoConfig": "modeling_evil.EvilConfig",
                        "AutoModel": "modeling_evil.EvilModel"},
        "tokenizer_config.json": {"AutoTokenizer": ["modeling_evil.EvilTokenizer", None]},
        "preprocessor_config.json": {"AutoImageProcessor": "modeling_evil.EvilProcessor"},
    }[config]  # fmt: skip
    if config == "preprocessor_config.json":
        data["image_processor_type"] = "EvilProcessor"
    path.write_text(json.dumps(data))
    return folder, marker


COMMANDS = {
    "run": lambda f: ["run", f"hf:{f}", "-o", str(f.parent / "out")],
    "run --json": lambda f: ["run", f"hf:{f}", "--json"],
    "run --text -": lambda f: ["run", f"hf:{f}", "--text", "-", "-o", str(f.parent / "out")],
    "layers": lambda f: ["layers", f"hf:{f}"],
    "--tokenizer": lambda f: ["run", "tiny_models:TwoLinear", "--text", "-", "--tokenizer", str(f)],
}


@pytest.mark.usefixtures("in_tests_dir")
@pytest.mark.parametrize("config", CONFIGS)
@pytest.mark.parametrize("command", list(COMMANDS))
def test_a_folder_that_needs_its_own_code_is_refused_and_never_asked(
    tmp_path: Path, config: str, command: str
) -> None:
    folder, marker = folder_with_code(tmp_path, config)
    if command == "--tokenizer" and config != "tokenizer_config.json":
        pytest.skip("--tokenizer reads only the tokenizer's files")
    result = invoke(*COMMANDS[command](folder), input=YES)
    line = assert_usage_error(result, config, "modeling_evil", "never runs")
    assert "[y/N]" not in result.stdout + result.stderr
    assert not marker.exists(), line
    assert not (folder.parent / "out").exists()


def test_a_real_stdin_of_yes_runs_nothing_and_json_stays_clean(tmp_path: Path) -> None:
    folder, marker = folder_with_code(tmp_path, "config.json")
    process = subprocess.run(
        [sys.executable, "-m", "hookdump", "run", f"hf:{folder}", "--text", "-", "--json"],
        input=YES, capture_output=True, text=True, timeout=300,
        env={**os.environ, "NO_COLOR": "1"}, cwd=tmp_path,
    )  # fmt: skip
    assert process.returncode == 2, process.stderr
    assert process.stdout == ""
    assert process.stderr.startswith("Error: ") and len(process.stderr.splitlines()) == 1
    assert not marker.exists()


def test_trust_remote_code_cannot_be_slipped_in_as_a_model_arg(tmp_path: Path) -> None:
    folder = tiny_gpt2(tmp_path / "model")
    result = invoke("layers", f"hf:{folder}", "--model-arg", "trust_remote_code=true")
    assert_usage_error(result, "trust_remote_code", "never runs")
