"""Nothing hostile reaches the terminal: control characters from dump keys, module and
class names, model specs, leftover file names, input file names and "did you mean" hints
are shown as escapes in tables, warnings and `Error:` lines; `--json` keeps its JSON."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch
from clitools import invoke
from safetensors.torch import save_file
from tiny_models import HOSTILE

pytestmark = pytest.mark.usefixtures("in_tests_dir")

# every character `HOSTILE` holds, and any other control character but newline and tab
UNPRINTABLE = re.compile(
    "[\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028-\u202e\u2066-\u2069]"
)
SHOWN = "\\x1b]0;pwned\\x07\\u202e\\x9b31m\\x7f"


def _in_a_terminal(*args: str) -> tuple[int, str]:
    """`hookdump ARGS` with stdout and stderr on a pseudo-terminal (where rich colours and
    draws its live lines): its exit code and all it wrote."""
    import os
    import pty
    import subprocess
    import sys

    leader, follower = pty.openpty()
    env = {k: v for k, v in os.environ.items() if k not in ("NO_COLOR", "COLUMNS")}
    process = subprocess.Popen(
        [sys.executable, "-m", "hookdump", *args],
        stdin=subprocess.DEVNULL, stdout=follower, stderr=follower, env=env,
        cwd=Path(__file__).parent,
    )  # fmt: skip
    os.close(follower)
    output = bytearray()
    while True:
        try:
            chunk = os.read(leader, 65536)
        except OSError:  # the terminal closed
            break
        if not chunk:
            break
        output += chunk
    os.close(leader)
    return process.wait(timeout=120), output.decode()


def _clean(*outputs: str) -> str:
    text = "".join(outputs)
    assert not UNPRINTABLE.search(text), repr(text)
    return text


@pytest.fixture
def hostile_run(tmp_path: Path) -> Path:
    out = tmp_path / "d"
    result = invoke("run", "tiny_models:HostileNames", "-n", "2", "-o", str(out))
    assert result.exit_code == 0, result.stderr
    assert SHOWN in _clean(result.stdout, result.stderr)  # the summary table
    return out


def test_module_and_class_names_in_run_layers_and_inspect(hostile_run: Path) -> None:
    result = invoke("layers", "tiny_models:HostileNames")
    assert result.exit_code == 0
    assert f"a{SHOWN}" in _clean(result.stdout, result.stderr)
    assert f"Linear{SHOWN}" in result.stdout
    (hostile_run / f"shard-00009.safetensors{HOSTILE}.tmp").write_bytes(b"half")
    result = invoke("inspect", str(hostile_run))
    text = _clean(result.stdout, result.stderr)
    assert f"a{SHOWN}" in text and f"Linear{SHOWN}" in text
    assert f"shard-00009.safetensors{SHOWN}.tmp" in result.stderr  # the leftover's warning


def test_json_keeps_the_names_as_they_are(hostile_run: Path) -> None:
    result = invoke("inspect", str(hostile_run), "--json")
    assert result.exit_code == 0
    keys = [t["key"] for t in json.loads(result.stdout)["tensors"]]
    assert keys == [f"a{HOSTILE}"]
    _clean(result.stdout)  # JSON escapes them itself


def test_keys_of_a_lone_file_in_inspect_diff_and_show(tmp_path: Path) -> None:
    a, b = tmp_path / "a.safetensors", tmp_path / "b.safetensors"
    save_file({f"k{HOSTILE}": torch.ones(2, 3, 4, 4)}, a)
    save_file({f"k{HOSTILE}": torch.zeros(2, 3, 4, 4)}, b)
    result = invoke("inspect", str(a))
    assert f"k{SHOWN}" in _clean(result.stdout, result.stderr)
    result = invoke("diff", str(a), str(b))
    assert result.exit_code == 1
    assert f"k{SHOWN}" in _clean(result.stdout, result.stderr)
    result = invoke("show", str(a), f"k{HOSTILE}", "-o", str(tmp_path / "x.png"))
    assert result.exit_code == 0
    assert f"k{SHOWN}" in _clean(result.stdout, result.stderr)
    result = invoke("show", str(a), f"x{HOSTILE}", "-o", str(tmp_path / "x.png"))
    assert result.exit_code == 2
    assert "did you mean" in result.stderr and f"k{SHOWN}" in _clean(result.stdout, result.stderr)


@pytest.mark.parametrize(
    "args",
    [
        ["run", f"tiny_models:Nope{HOSTILE}"],
        ["run", "tiny_models:TwoLinear", "--input", f"none{HOSTILE}.npy"],
        ["run", "tiny_models:TwoLinear", "--layers", f"x{HOSTILE}"],
        ["run", "tiny_models:TwoLinear", f"--bogus{HOSTILE}"],
        ["inspect", f"nowhere{HOSTILE}"],
    ],
)
def test_error_lines_from_the_command_line(args: list[str], tmp_path: Path) -> None:
    result = invoke(*args, "-o", str(tmp_path / "d")) if args[0] == "run" else invoke(*args)
    assert result.exit_code == 2
    assert SHOWN in _clean(result.stdout, result.stderr)


def test_a_real_terminal_gets_rich_colours_but_no_hostile_sequence(tmp_path: Path) -> None:
    """In a pseudo-terminal, where rich colours and click strips nothing."""
    a, b = tmp_path / "a.safetensors", tmp_path / "b.safetensors"
    save_file({f"k{HOSTILE}": torch.ones(2, 3)}, a)
    save_file({f"k{HOSTILE}": torch.zeros(2, 3)}, b)
    code, text = _in_a_terminal("diff", str(a), str(b))
    assert code == 1
    assert f"k{SHOWN}" in text
    assert "\x1b[" in text  # rich's own colours
    without_colours = re.sub(r"\x1b\[[0-9;]*m", "", text)
    _clean(without_colours.replace("\r\n", "\n"))


def test_an_ascii_console_gets_plain_characters_and_the_dump_intact(tmp_path: Path) -> None:
    """`PYTHONIOENCODING=ascii` (a legacy console): the table's `x` for `×`, a hostile key's
    non-ASCII shown as an escape, exit 0, and the dump written whole; it used to write the
    dump, then fail printing `×` with a traceback and exit 1."""
    import os
    import subprocess
    import sys

    import hookdump

    env = {**os.environ, "PYTHONIOENCODING": "ascii", "COLUMNS": "200"}

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "hookdump", *args], capture_output=True,
                              text=True, env=env, cwd=Path(__file__).parent, timeout=300,
                              encoding="ascii", errors="strict")  # fmt: skip

    out = tmp_path / "d"
    done = run("run", "tiny_models:ConvNet", "-n", "2", "-o", str(out))
    assert done.returncode == 0, done.stderr
    assert "4x224x224" in done.stdout and "Traceback" not in done.stderr
    assert hookdump.load(out).complete and hookdump.load(out).num_samples == 2
    inspected = run("inspect", str(out))
    assert inspected.returncode == 0 and "4x224x224" in inspected.stdout
    save_file({"k\u00e9": torch.ones(2, 3)}, tmp_path / "a.safetensors")
    shown = run("inspect", str(tmp_path / "a.safetensors"))
    assert shown.returncode == 0 and "k\\xe9" in shown.stdout


def test_a_terminal_sees_what_loads_before_the_first_batch(tmp_path: Path) -> None:
    """In a pseudo-terminal: a status line names what loads until the first batch is done
    (the first seconds used to be silent), then the bar with its time left, both gone once
    the table is printed."""

    code, output = _in_a_terminal("run", "tiny_models:TwoLinear", "-n", "64", "-b", "2",
                                  "-o", str(tmp_path / "d"))  # fmt: skip
    assert code == 0
    text = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", output)
    assert "loading tiny_models:TwoLinear, then the first batch" in text
    assert "64 samples in" in text  # the footer, after the transient lines


def test_a_model_spec_cannot_retitle_the_terminal_from_the_status_line(
    gpt2: Path, tmp_path: Path
) -> None:
    """Issue 32, N10: the status line printed the MODEL spec raw; an `hf:` folder's name
    could retitle the terminal or clear it."""
    import shutil

    hostile = tmp_path / "gpt_\x1b]0;PWN\x07\x1b[2J"
    shutil.copytree(gpt2, hostile)
    corpus = tmp_path / "c.txt"
    corpus.write_text("the cat sat on the mat\n" * 40)
    code, output = _in_a_terminal("run", f"hf:{hostile}", "--text", str(corpus),
                                  "--context-size", "8", "-n", "64", "-b", "1", "-l", "h.0",
                                  "-o", str(tmp_path / "d"))  # fmt: skip
    assert code == 0, output
    assert "\x1b]0;PWN" not in output and "\x1b[2J" not in output
    shown = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", output).replace("\r\n", "")
    assert "gpt_\\x1b]0;PWN\\x07\\x1b[2J, then the first batch" in shown


def test_python_reprs_and_messages_escape_the_names_they_quote(tmp_path: Path) -> None:
    from torch import nn

    import hookdump

    class Odd(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.add_module(f"m{HOSTILE}", nn.Linear(4, 4))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return getattr(self, f"m{HOSTILE}")(x)

    d = hookdump.dump(Odd(), [torch.randn(2, 4)], tmp_path / "d")
    assert f"m{SHOWN}" in _clean(repr(d))
    with pytest.raises(hookdump.HookdumpError) as caught:
        hookdump.dump(Odd(), [torch.randn(2, 4)], tmp_path / "e", layers=["m"])
    assert f"m{SHOWN}" in _clean(str(caught.value))  # the nearest name, as a hint
