"""SIGTERM and a second Ctrl-C never throw a finished shard away: the run commits what is
finished, marks the dump incomplete and says how to go on; `--resume` then makes the dump
an uninterrupted run makes.

The run is stopped in its third batch, known to be there by a file barrier (not by how long
it has run): the first two batches' shards are finished, and with commits 30 s apart, not
yet listed when the signal comes.
"""

from __future__ import annotations

import json
import signal
import subprocess
import time
from pathlib import Path

import pytest
import torch
from clitools import finish, hookdump_process, invoke

import hookdump

pytestmark = pytest.mark.usefixtures("in_tests_dir")
RUN = ["run", "tiny_models:Barrier", "-n", "10", "-b", "2", "--shard-size", "1", "-q"]


def stopped_in_batch_3(
    tmp_path: Path, out: Path, ignore_sigint: bool = False
) -> subprocess.Popen[str]:
    """A run waiting inside its third batch."""
    barrier = tmp_path / "barrier"
    barrier.mkdir()
    env = {"HOOKDUMP_TEST_BARRIER_AT": "3", "HOOKDUMP_TEST_BARRIER": str(barrier)}
    process = hookdump_process(*RUN, "-o", str(out), env=env, ignore_sigint=ignore_sigint)
    deadline = time.monotonic() + 300  # a bound on a hang, not a guess at the speed
    while not (barrier / "ready").exists():
        assert process.poll() is None, finish(process)
        assert time.monotonic() < deadline, "the run never reached its third batch"
        time.sleep(0.01)
    return process


def pending(pid: int, sig: int) -> bool:
    """Whether `sig` waits, not yet taken by any of the process's threads (Linux's /proc;
    elsewhere taken as delivered)."""
    bit = 1 << (sig - 1)
    try:
        status = [Path(f"/proc/{pid}/status").read_text()]
        status += [p.read_text() for p in Path(f"/proc/{pid}/task").glob("*/status")]
    except OSError:
        return False
    lines = [line.split() for text in status for line in text.splitlines()]
    return any(int(f[1], 16) & bit for f in lines if f[0] in ("ShdPnd:", "SigPnd:"))


def signal_until_gone(process: subprocess.Popen[str], first: int, then: int | None) -> None:
    """Send `first`, then keep sending `then` until the process has ended (a second signal
    lands wherever the first one's handling is, again and again)."""
    process.send_signal(first)
    deadline = time.monotonic() + 300  # a bound on a hang, not a guess at the speed
    while then is not None and pending(process.pid, first):
        # Linux hands a process's signals to any of its threads; the second could run its
        # handler first if the thread given the first is waiting for a core.
        assert time.monotonic() < deadline, "the first signal was never taken"
        time.sleep(0.001)
    while then is not None and process.poll() is None:
        assert time.monotonic() < deadline, "the run outlived its signals"
        process.send_signal(then)
        time.sleep(0.001)


@pytest.mark.parametrize(
    ("first", "then", "code", "word"),
    [
        (signal.SIGTERM, None, 143, "Terminated"),
        (signal.SIGINT, signal.SIGINT, 130, "Interrupted"),
        (signal.SIGTERM, signal.SIGTERM, 143, "Terminated"),
        (signal.SIGINT, signal.SIGTERM, 130, "Interrupted"),
    ],
    ids=["sigterm", "ctrl_c_twice_and_more", "sigterm_twice_and_more", "ctrl_c_then_sigterm"],
)
def test_a_signal_commits_the_finished_shards_and_resume_finishes_the_dump(
    tmp_path: Path, first: int, then: int | None, code: int, word: str
) -> None:
    out, whole = tmp_path / "resumed", tmp_path / "whole"
    process = stopped_in_batch_3(tmp_path, out)
    signal_until_gone(process, first, then)
    returncode, stdout, stderr = finish(process)
    assert returncode == code, stderr
    assert stdout == ""
    assert stderr.strip() == (
        f"{word}: 4 samples are safe in {out}; run the same command with --resume to finish "
        "the dump"
    )
    manifest = json.loads((out / "manifest.json").read_text())
    assert (manifest["complete"], manifest["num_samples"]) == (False, 4)
    assert sorted(p.name for p in out.iterdir()) == [
        "manifest.json", "shard-00000.safetensors", "shard-00001.safetensors"
    ]  # fmt: skip

    listed = json.loads(invoke("inspect", str(out), "--json").stdout)
    assert (listed["complete"], listed["num_samples"], listed["shards"]) == (False, 4, 2)
    assert listed["problems"][0].endswith("finish it with the same command and --resume")
    shown = invoke("inspect", str(out))
    assert "finish it with the same command and --resume" in shown.stdout
    assert shown.stderr.strip().endswith("finish it with the same command and --resume")
    result = invoke(*RUN, "-o", str(out), "--resume")
    assert result.exit_code == 0, result.stderr
    assert invoke(*RUN, "-o", str(whole)).exit_code == 0
    a, b = hookdump.load(whole), hookdump.load(out)
    assert b.complete and b.sample_ids == a.sample_ids == list(range(10))
    for key in sorted(a.keys()):
        assert torch.equal(a[key], b[key]), key


def test_sigterm_is_handled_where_ctrl_c_is_ignored(tmp_path: Path) -> None:
    """A background job of a script (or nohup) starts with SIGINT ignored: SIGTERM must be
    handled all the same, and SIGINT stay ignored."""
    out = tmp_path / "d"
    process = stopped_in_batch_3(tmp_path, out, ignore_sigint=True)
    process.send_signal(signal.SIGINT)  # ignored: the run waits on
    process.send_signal(signal.SIGTERM)
    returncode, stdout, stderr = finish(process)
    assert returncode == 143, stderr
    assert stdout == ""
    assert stderr.strip().startswith(f"Terminated: 4 samples are safe in {out};")
    assert json.loads((out / "manifest.json").read_text())["num_samples"] == 4


def test_the_library_puts_the_callers_signal_handlers_back() -> None:
    from hookdump.engine.options import RunOptions
    from hookdump.engine.runner import run
    from hookdump.inputs.samples import InputOptions
    from hookdump.model.prepare import ModelOptions

    before = signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)
    run(
        RunOptions(
            ModelOptions("tiny_models:TwoLinear"), input=InputOptions(num_samples=2, batch_size=2)
        )
    )
    assert (signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)) == before


def test_the_signal_tests_finish_when_the_suite_runs_as_a_background_job() -> None:
    """`python -m pytest &` or nohup: the suite starts with SIGINT ignored, which its
    children inherit and hookdump rightly keeps; a test that stops a run with Ctrl-C must
    start that run as a terminal would, or it waits for ever."""
    import os
    import sys

    tests = Path(__file__).parent
    process = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-k",
         "ctrl_c_twice_and_more", str(tests / "test_signals.py")],
        cwd=tests.parent, capture_output=True, text=True, timeout=600, start_new_session=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN),
        env={**os.environ, "PYTEST_ADDOPTS": ""},
    )  # fmt: skip
    assert process.returncode == 0, process.stdout[-2000:] + process.stderr[-2000:]
    assert "1 passed" in process.stdout
