"""Running the CLI in-process and checking the contract's error shape."""

from __future__ import annotations

import os
import resource
import signal
import subprocess
import sys
from pathlib import Path

from typer.testing import CliRunner, Result

from hookdump.cli import app

TESTS = Path(__file__).parent
# deterministic rendering whatever the environment: no colours, a fixed width
ENV = {"COLUMNS": "160", "FORCE_COLOR": None, "TTY_COMPATIBLE": None, "NO_COLOR": "1"}


def invoke(*args: str, input: str | None = None) -> Result:
    """The CLI in-process; no output of any test may hold an option marker that was never
    rendered (`errors.opt`'s NUL-delimited form)."""
    result = CliRunner().invoke(app, list(args), env=ENV, input=input)
    assert "\x00" not in result.stdout + result.stderr, (result.stdout, result.stderr)
    return result


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


def hookdump_process(
    *args: str,
    env: dict[str, str] | None = None,
    limit_bytes: int | None = None,
    ignore_sigint: bool = False,
) -> subprocess.Popen[str]:
    """`python -m hookdump ARGS` from tests/, optionally under a file-size limit, or with
    Ctrl-C ignored (as a script's background job or nohup starts it)."""

    def limit() -> None:
        if limit_bytes is not None:
            resource.setrlimit(resource.RLIMIT_FSIZE, (limit_bytes, limit_bytes))
        # as a terminal starts it, whatever the suite's own disposition: a suite started as
        # a background job (`&`, nohup) has SIGINT ignored, and its children would inherit it
        signal.signal(signal.SIGINT, signal.SIG_IGN if ignore_sigint else signal.SIG_DFL)

    return subprocess.Popen(
        [sys.executable, "-m", "hookdump", *args],
        cwd=TESTS,
        env={**os.environ, "NO_COLOR": "1", **(env or {})},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=limit,
    )


def finish(process: subprocess.Popen[str]) -> tuple[int, str, str]:
    stdout, stderr = process.communicate(timeout=120)
    return process.returncode, stdout, stderr


_LIMITED = """\
import gc, os, resource, sys
import torch, transformers, tokenizers  # mapped before the limit is measured
import hookdump.cli
kind, headroom, code = sys.argv[1], int(sys.argv[2]), sys.argv[3]
# what loading a model folder imports lazily (accelerate, sentencepiece, scipy where they
# are installed) is mapped before the limit too: the headroom is hookdump's alone
for folder in [a[3:] for a in sys.argv[4:] if a.startswith("hf:") and os.path.isdir(a[3:])]:
    transformers.AutoModel.from_pretrained(folder)
    try:
        transformers.AutoTokenizer.from_pretrained(folder)
    except Exception:
        pass
gc.collect()
field = {"AS": "VmSize:", "DATA": "VmData:"}[kind]
used = next(int(line.split()[1]) * 1024 for line in open("/proc/self/status")
            if line.startswith(field))
limit = used + headroom
resource.setrlimit(getattr(resource, "RLIMIT_" + kind), (limit, limit))
sys.argv = ["hookdump", *sys.argv[4:]]
exec(code or "hookdump.cli.main()")
"""


def memory_limited(
    *args: str,
    headroom: int,
    limit: str = "AS",
    code: str = "",
    stdin: int | None = None,
    timeout: float = 300,
) -> tuple[int, str, str]:
    """`hookdump ARGS` (or the Python `code`, with ARGS in `sys.argv[1:]`) in a child whose
    memory may grow by at most `headroom` bytes past what torch, transformers and hookdump
    take when imported: `limit` "AS" bounds the address space (`RLIMIT_AS`), "DATA" the
    heap and anonymous mappings (`RLIMIT_DATA`; files mapped to be read do not count)."""
    process = subprocess.run(
        [sys.executable, "-c", _LIMITED, limit, str(headroom), code, *args],
        cwd=TESTS,
        env={**os.environ, "NO_COLOR": "1", "MALLOC_ARENA_MAX": "2", "OMP_NUM_THREADS": "1"},
        stdin=stdin if stdin is not None else subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    return process.returncode, process.stdout, process.stderr


def independent_checksum(data: bytes, kind: str = "crc32c") -> str:
    """A file's checksum by another implementation than hookdump's: awscrt's CRC32C (hookdump
    uses the crc32c package and its own combine), hashlib's SHA-256."""
    import hashlib

    if kind == "sha256":
        return hashlib.sha256(data).hexdigest()
    from awscrt.checksums import crc32c

    return f"{crc32c(data):08x}"


def assert_recorded(entry: dict[str, object], data: bytes) -> None:
    """A shard entry records the file's size and its checksum (CRC32C by default)."""
    kind = "sha256" if "sha256" in entry else "crc32c"
    assert (entry["bytes"], entry[kind]) == (len(data), independent_checksum(data, kind))


def assert_shards_checksummed(out: Path) -> None:
    """Every shard entry of the dump in folder `out` records the file's size and checksum."""
    import json

    shards = json.loads((out / "manifest.json").read_text())["shards"]
    for entry in shards:
        assert_recorded(entry, (out / entry["file"]).read_bytes())
