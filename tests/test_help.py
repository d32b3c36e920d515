"""`--help` answers without importing torch."""

from __future__ import annotations

import subprocess
import sys

import pytest


@pytest.mark.parametrize(
    "args",
    [["--help"]] + [[c, "--help"] for c in ("run", "layers", "models", "inspect", "diff", "show")],
)
def test_help_does_not_import_torch(args: list[str]) -> None:
    proc = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "hookdump", *args],
        capture_output=True,
        text=True,
        check=True,
    )
    imported = [line.split("|")[-1].strip() for line in proc.stderr.splitlines()]
    assert "typer" in imported  # the import log was read
    assert not [name for name in imported if name.split(".")[0] in ("torch", "torchvision")]
    assert "Usage: hookdump" in proc.stdout


def test_main_help_lists_the_commands() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "hookdump", "--help"], capture_output=True, text=True, check=True
    )
    for command in ("run", "layers", "models", "inspect", "diff", "show"):
        assert f"\n  {command} " in proc.stdout


def test_the_command_list_is_not_cut() -> None:
    """Click cuts a docstring's first line at 45 characters with "..."; each command's line
    in `hookdump --help` is whole."""
    from typer.testing import CliRunner

    from hookdump.cli import app

    result = CliRunner().invoke(app, ["--help"], env={"COLUMNS": "100"})
    commands = result.stdout.split("Commands")[1]
    assert "..." not in commands
    for name in ("run", "layers", "models", "inspect", "diff", "show", "export"):
        assert f"  {name} " in commands


def test_run_help_lists_every_capture_kind() -> None:
    """`run --help` names each kind `--capture` takes (issue 36: the attention ones were
    missing), as the parser knows them."""
    from typer.testing import CliRunner

    from hookdump.choices import CAPTURE_KINDS
    from hookdump.cli import app

    result = CliRunner().invoke(app, ["run", "--help"], env={"COLUMNS": "200"})
    said = " ".join(result.stdout.split("--capture")[1].split("--ops")[0].split())
    for kind in CAPTURE_KINDS:
        assert f" {kind}" in said, kind
    assert "pattern, scores, q, k, v, z" in said
