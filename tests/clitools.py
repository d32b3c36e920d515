"""Running the CLI in-process and checking the contract's error shape."""

from __future__ import annotations

from typer.testing import CliRunner, Result

from hookdump.cli import app

# deterministic rendering whatever the environment: no colours, a fixed width
ENV = {"COLUMNS": "160", "FORCE_COLOR": None, "TTY_COMPATIBLE": None, "NO_COLOR": "1"}


def invoke(*args: str, input: str | None = None) -> Result:
    return CliRunner().invoke(app, list(args), env=ENV, input=input)


def assert_usage_error(result: Result, *fragments: str) -> str:
    """Exit 2, nothing on stdout, exactly one `Error: ...` line on stderr naming `fragments`."""
    assert result.exit_code == 2, (result.exit_code, result.stdout, result.stderr)
    assert result.stdout == ""
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("Error: "), lines[0]
    assert "Traceback" not in result.stderr
    for fragment in fragments:
        assert fragment in lines[0], (fragment, lines[0])
    return lines[0]
