"""Leaving a pass early, every way (issue 43, part 4): `break`, an exception, an iterator
dropped, the interpreter ending with a pass open, DataLoader workers, a thread still
reading; through `Dump.batches`, `hookdump.aligned` and `Dump.dataset`. Each script runs in
a process of its own twice, once over the pass and once over a plain list in its place: the
exit status, stdout and stderr must be the same. (A reading thread inside torch when the
interpreter tore down aborted the process: "terminate called without an active exception",
exit 134.)"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

import hookdump

pytestmark = pytest.mark.slow  # several processes: run with --heavy (CI)

# each script gets the dump's path as argv[1] and, as argv[2], "pass" or "list": SOURCE(...)
# is then a pass of the dump's rows, or a list of as many batches of plain tensors
PRELUDE = """
import sys, threading, torch, hookdump
path, kind = sys.argv[1:3]
dump = hookdump.load(path)
def SOURCE(make):
    return make() if kind == "pass" else [{"a": torch.zeros(1, 8)}] * 32
"""
# batches of one row: a buffer of thousands of them, whose tensors a reading thread left
# behind frees one by one, each time letting the GIL go: the abort's window, made wide

SCRIPTS = {
    "break": """
for batch in SOURCE(lambda: dump.batches(["a"], 1)):
    break
print("done")
""",
    "break_shuffled": """
for batch in SOURCE(lambda: dump.batches(["a"], 2, shuffle=True, buffer_bytes=1 << 12)):
    break
print("done")
""",
    "next_of_a_dropped_iterator": """
next(iter(SOURCE(lambda: dump.batches(["a"], 1, shuffle=True))))
print("done")
""",
    "an_exception": """
for batch in SOURCE(lambda: dump.batches(["a"], 1, shuffle=True)):
    raise RuntimeError("the caller's own error")
""",
    "open_at_exit": """
rows = iter(SOURCE(lambda: dump.batches(["a"], 1, shuffle=True, buffer_bytes=1 << 12)))
next(rows)
print("done")
""",
    "aligned": """
both = hookdump.aligned({"x": (path, "a"), "y": (path, "a:input.0")})
for batch in SOURCE(lambda: both.batches(1, shuffle=True)):
    break
print("done")
""",
    "dataloader_workers": """
from torch.utils.data import DataLoader
made = lambda: DataLoader(dump.dataset(["a"], 2, shuffle=True), batch_size=None, num_workers=2)
for batch in SOURCE(made):
    break
print("done")
""",
    "a_thread_still_reading": """
first, never = threading.Event(), threading.Event()
def read():
    for batch in SOURCE(lambda: dump.batches(["a"], 1, shuffle=True, buffer_bytes=1 << 12)):
        first.set()
        never.wait()
threading.Thread(target=read, daemon=True).start()
first.wait()
print("done")
""",
}


@pytest.fixture(scope="module")
def path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """64 batches of 64 rows of 8 features, in many small shards."""
    torch.manual_seed(0)
    out = tmp_path_factory.mktemp("exit") / "d"
    model = torch.nn.Sequential()
    model.add_module("a", torch.nn.Linear(8, 8))
    data = [torch.randn(64, 8) for _ in range(64)]
    hookdump.dump(model, data, out, layers="a", capture=("input", "output"), shard_size=1 << 16,
                  progress=False)  # fmt: skip
    return out


def _run(script: str, path: Path, kind: str) -> tuple[int, str, str]:
    done = subprocess.run(
        [sys.executable, "-c", PRELUDE + script, str(path), kind],
        capture_output=True,
        text=True,
        timeout=600,
    )
    return done.returncode, done.stdout, done.stderr


@pytest.mark.parametrize("name", sorted(SCRIPTS))
def test_leaving_a_pass_leaves_the_process_as_without_it(name: str, path: Path) -> None:
    without = _run(SCRIPTS[name], path, "list")
    for _ in range(3):  # the abort was a race with the teardown: it showed one time in three
        assert _run(SCRIPTS[name], path, "pass") == without
    if name == "an_exception":
        assert without[0] == 1 and without[2].endswith("the caller's own error\n")
    else:
        assert without == (0, "done\n", "")
