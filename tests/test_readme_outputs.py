"""The README and its `docs/` pages show each command's output as an 80-column terminal
prints it: every block that starts with `$ hookdump` fits 80 columns, and those of `layers`
and `models` are what the commands print today (the lines shown, in order; `...` stands for
lines left out)."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest
from typer.testing import CliRunner

from hookdump.cli import app

ROOT = Path(__file__).parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def _sessions() -> list[tuple[str, list[str]]]:
    """Each `$ hookdump ...` command in the pages' blocks, with the lines it shows."""
    found: list[tuple[str, list[str]]] = []
    text = "\n".join(page.read_text() for page in PAGES)
    for block in re.findall(r"```\n(\$ hookdump.*?)```", text, re.S):
        for line in block.splitlines():
            if line.startswith("$ "):
                found.append((line[2:], []))
            else:
                found[-1][1].append(line)
    return found


def test_the_readme_has_each_command_at_80_columns() -> None:
    sessions = _sessions()
    shown = {shlex.split(command)[1] for command, _ in sessions}
    assert {"run", "layers", "models", "diff", "export", "show"} <= shown
    for command, lines in sessions:
        for line in [f"$ {command}", *lines]:
            assert len(line) <= 80, (command, line)


@pytest.mark.parametrize("name", ["layers", "models"])
def test_the_listings_in_the_readme_are_what_the_commands_print(name: str) -> None:
    command, lines = next(s for s in _sessions() if shlex.split(s[0])[1] == name)
    result = CliRunner().invoke(
        app, shlex.split(command)[1:], env={"COLUMNS": "80", "NO_COLOR": "1"}
    )
    assert result.exit_code == 0, result.stderr
    printed = [line.rstrip() for line in result.stdout.splitlines()]
    at = 0
    for line in lines:
        if line.strip() == "...":
            continue
        assert line in printed[at:], (line, printed)
        at = printed.index(line, at) + 1
