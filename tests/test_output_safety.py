"""The output folder: nothing outside it is written, an old dump is never lost, one run at a
time, a run never reads from it, and what the manifest lists is on disk first.

Each test plants the fault it is about (a symlink, a file-size limit, a second run, an
input inside --out) and checks the folder and a marker file outside it afterwards.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from pathlib import Path

import pytest
import torch
from clitools import assert_usage_error, finish, hookdump_process, invoke
from safetensors.torch import save_file

import hookdump
from hookdump.store.folder import describe_os_error

TESTS = Path(__file__).parent
MARKER = "MARKER-outside-the-dump-7f3a"
RUN = ["run", "tiny_models:TwoLinear", "-n", "6", "-b", "2", "-q"]
pytestmark = pytest.mark.usefixtures("in_tests_dir")


def fingerprint(folder: Path) -> dict[str, str]:
    """Every entry of a folder: a file's SHA-256, a link's target."""
    found = {}
    for path in sorted(folder.iterdir()):
        if path.is_symlink():
            found[path.name] = "-> " + os.readlink(path)
        elif path.is_file():
            found[path.name] = hashlib.sha256(path.read_bytes()).hexdigest()
        else:
            found[path.name] = "dir"
    return found


def marker_file(tmp_path: Path) -> Path:
    victim = tmp_path / "outside" / "victim.txt"
    victim.parent.mkdir()
    victim.write_text(MARKER)
    return victim


# --- writing through a planted symlink ----------------------------------------------------


@pytest.mark.parametrize(
    "planted",
    [
        "shard-00000.safetensors.tmp",  # the first shard, streamed
        "shard-00001.safetensors.tmp2",  # a gathered (planned) shard
        "shard-00001.safetensors.tmp",  # a planned shard compacted at the end
        "manifest.json.tmp",
        "shard-00000.safetensors",  # the final name: replaced, not written through
        "manifest.json",
    ],
)
def test_overwrite_never_writes_through_a_planted_symlink(tmp_path: Path, planted: str) -> None:
    out, victim = tmp_path / "d", marker_file(tmp_path)
    assert invoke(*RUN, "-o", str(out)).exit_code == 0
    (out / planted).unlink(missing_ok=True)
    (out / planted).symlink_to(victim)
    # 7 samples in batches of 2: a streamed first shard, then a planned one compacted to 5 rows
    result = invoke(*RUN[:-3], "-n", "7", "-b", "2", "-q", "-o", str(out), "--overwrite")
    assert result.exit_code == 0, result.stderr
    assert victim.read_text() == MARKER
    assert not any(p.is_symlink() for p in out.iterdir())
    assert hookdump.load(out).complete and hookdump.load(out).num_samples == 7


def test_resume_removes_planted_links_and_leftovers_without_following_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    out, victim = tmp_path / "d", marker_file(tmp_path)
    args = ["run", "tiny_models:CtrlC", "-n", "10", "-b", "2", "--shard-size", "1", "-q"]
    monkeypatch.setenv("HOOKDUMP_TEST_CTRL_C_AT", "3")
    assert invoke(*args, "-o", str(out)).exit_code == 130
    monkeypatch.delenv("HOOKDUMP_TEST_CTRL_C_AT")
    (out / "shard-00002.safetensors.tmp").symlink_to(victim)
    (out / ".hookdump-old-1-x").symlink_to(victim.parent, target_is_directory=True)
    result = invoke(*args, "-o", str(out), "--resume")
    assert result.exit_code == 0, result.stderr
    assert victim.read_text() == MARKER and victim.parent.is_dir()
    assert not any(p.is_symlink() for p in out.iterdir())


def test_out_may_itself_be_a_symlink(tmp_path: Path) -> None:
    real = tmp_path / "real"
    real.mkdir()
    (tmp_path / "link").symlink_to(real, target_is_directory=True)
    assert invoke(*RUN, "-o", str(tmp_path / "link")).exit_code == 0
    assert invoke(*RUN, "-o", str(tmp_path / "link"), "--overwrite").exit_code == 0
    assert (tmp_path / "link").is_symlink() and hookdump.load(real).complete


# --- a failed --overwrite keeps the old dump ----------------------------------------------


@pytest.mark.parametrize("direct_io", ["1", "0"], ids=["o_direct", "page_cache"])
def test_a_failed_overwrite_leaves_the_old_dump_whole(tmp_path: Path, direct_io: str) -> None:
    out = tmp_path / "d"
    args = ["run", "tiny_models:ConvNet", "--input-shape", "3,32,32", "-n", "4", "-b", "4", "-q"]
    assert invoke(*args, "-o", str(out)).exit_code == 0
    before = fingerprint(out)
    # a first shard of ~500 KB against a 64 KiB file-size limit: its first write past the
    # limit fails (EFBIG; Python ignores SIGXFSZ), with O_DIRECT only when the file is closed
    process = hookdump_process(
        *args, "-o", str(out), "--overwrite",
        env={"HOOKDUMP_DIRECT_IO": direct_io}, limit_bytes=64 << 10,
    )  # fmt: skip
    code, stdout, stderr = finish(process)
    assert code == 2, stderr
    assert stdout == ""
    lines = stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: ") and "File too large" in lines[0]
    assert fingerprint(out) == before  # the old dump, and no stray temporary file
    assert hookdump.load(out).complete


def test_a_run_that_fails_in_its_first_batch_leaves_a_new_folder_absent(tmp_path: Path) -> None:
    out = tmp_path / "new" / "d"
    result = invoke("run", "tiny_models:FailsMidway", "-n", "4", "-b", "2", "-o", str(out))
    assert result.exit_code == 2
    assert list(tmp_path.iterdir()) == []


# --- two runs on one --out ----------------------------------------------------------------


@pytest.mark.parametrize("overwrite", [True, False], ids=["overwrite", "fresh"])
def test_two_runs_on_one_out_leave_one_complete_dump(tmp_path: Path, overwrite: bool) -> None:
    """The first run waits inside its third batch (a file barrier) until the second has
    reached the lock and given up: the two overlap however slowly either starts."""
    out, barrier = tmp_path / "d", tmp_path / "barrier"
    barrier.mkdir()
    if overwrite:
        assert invoke(*RUN, "-o", str(out)).exit_code == 0
    args = ["run", "tiny_models:Barrier", "-n", "20", "-b", "2", "--shard-size", "1", "-q",
            "-o", str(out)] + (["--overwrite"] if overwrite else [])  # fmt: skip
    env = {"HOOKDUMP_TEST_BARRIER_AT": "3", "HOOKDUMP_TEST_BARRIER": str(barrier)}
    first = hookdump_process(*args, env=env)
    deadline = time.monotonic() + 300  # a bound on a hang, not a guess at the speed
    while not (barrier / "ready").exists():
        assert first.poll() is None and time.monotonic() < deadline, finish(first)
        time.sleep(0.01)
    code, stdout, stderr = finish(hookdump_process(*args))  # ends once refused at the lock
    (barrier / "go").touch()
    assert finish(first)[0] == 0
    assert code == 2 and stdout == ""
    lines = stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"Error: --out {out} is being written by run ")
    assert lines[0].endswith(f"(pid {first.pid}); wait for it to finish, or choose another folder")
    dump = hookdump.load(out)
    assert dump.complete and dump.num_samples == 20
    assert sorted(p.name for p in out.iterdir()) == ["manifest.json"] + [
        f"shard-{i:05d}.safetensors" for i in range(10)
    ] + ["stats.safetensors"]


def test_two_runs_started_at_once_leave_one_complete_dump(tmp_path: Path) -> None:
    """Whichever takes the lock waits in its second batch until the other has given up."""
    out, barrier = tmp_path / "d", tmp_path / "barrier"
    barrier.mkdir()
    args = ["run", "tiny_models:Barrier", "-n", "6", "-b", "2", "-q", "-o", str(out), "--overwrite"]
    env = {"HOOKDUMP_TEST_BARRIER_AT": "2", "HOOKDUMP_TEST_BARRIER": str(barrier)}
    runs = [hookdump_process(*args, env=env) for _ in range(2)]
    deadline = time.monotonic() + 300  # a bound on a hang, not a guess at the speed
    while all(run.poll() is None for run in runs):
        assert time.monotonic() < deadline, "neither run was refused"
        time.sleep(0.01)
    (barrier / "go").touch()
    results = sorted(finish(run) for run in runs)
    assert [code for code, _, _ in results] == [0, 2], results
    assert "is being written by" in results[1][2]  # (its note may not be written yet)
    assert hookdump.load(out).complete
    assert invoke("inspect", str(out)).exit_code == 0


# --- a run never reads from --out ---------------------------------------------------------


def _dump_with_files(out: Path) -> None:
    assert invoke(*RUN, "-o", str(out)).exit_code == 0
    model = __import__("tiny_models").TwoLinear()
    save_file(model.state_dict(), out / "shard-00099.safetensors")  # named like a shard
    save_file({"x": torch.zeros(4, 2)}, out / "shard-00098.safetensors")


@pytest.mark.parametrize(
    ("option", "name"),
    [
        ("--input", "shard-00098.safetensors"),
        ("--weights", "shard-00099.safetensors"),
        ("MODEL", "shard-00000.safetensors"),
        ("--config", "manifest.json.tmp"),
    ],
)
def test_a_file_the_run_reads_inside_out_is_refused(tmp_path: Path, option: str, name: str) -> None:
    out = tmp_path / "d"
    _dump_with_files(out)
    (out / "manifest.json.tmp").write_text("batch_size = 2\n")
    before = fingerprint(out)
    path = str(out / name)
    args = {
        "--input": [*RUN, "--input", path],
        "--weights": [*RUN, "--weights", path],
        "MODEL": ["run", path, "-q"],
        "--config": [*RUN, "--config", path],
    }[option]
    result = invoke(*args, "-o", str(out), "--overwrite")
    assert_usage_error(result, f"{option} {path} lies inside --out {out}")
    assert fingerprint(out) == before


def test_inputs_reached_through_links_or_lists_are_refused_too(tmp_path: Path) -> None:
    from PIL import Image

    out = tmp_path / "d"
    assert invoke(*RUN, "-o", str(out)).exit_code == 0
    # an image named like a leftover of ours (a list may name any file): --overwrite would
    # remove it, so reading it is refused
    Image.new("RGB", (8, 8)).save(out / "shard-00007.safetensors.tmp2", format="PNG")
    (tmp_path / "link.safetensors").symlink_to(out / "shard-00000.safetensors")
    listing = tmp_path / "images.txt"
    listing.write_text(f"{out / 'shard-00007.safetensors.tmp2'}\n")
    before = fingerprint(out)
    result = invoke(*RUN, "--input", str(tmp_path / "link.safetensors"), "-o", str(out),
                    "--overwrite")  # fmt: skip
    assert_usage_error(result, "lies inside --out")
    result = invoke("run", "resnet18", "--input", str(listing), "-q", "-o", str(out),
                    "--overwrite")  # fmt: skip
    assert_usage_error(result, "--input", "shard-00007.safetensors.tmp2 lies inside --out")
    assert fingerprint(out) == before


# --- durability ---------------------------------------------------------------------------


@pytest.mark.parametrize("grouped", [False, True], ids=["commit_each", "commit_grouped"])
def test_each_shard_is_on_disk_before_the_manifest_lists_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, grouped: bool
) -> None:
    """Committed as soon as possible or (within COMMIT_EVERY) together, each shard is synced,
    renamed and its folder entry synced before a manifest names it. Without a hold, how many
    shards one commit takes depends on the machine's speed (a loaded one queues both), so
    the check is the rule itself: each manifest is read as it is synced."""
    from hookdump.store.write import commit

    monkeypatch.setattr(commit, "COMMIT_EVERY", 60.0 if grouped else 0.0)
    out = tmp_path / "d"
    events: list[str] = []
    listed: list[list[str]] = []  # the shards each synced manifest names, in order
    real_fsync, real_replace = os.fsync, os.replace

    def fsync(fd: int) -> None:
        path = os.readlink(f"/proc/self/fd/{fd}")
        name = os.path.basename(path)
        events.append(f"fsync {'DIR' if os.path.isdir(f'/proc/self/fd/{fd}') else name}")
        if name == "manifest.json.tmp":
            shards = json.loads(Path(path).read_text())["shards"]
            listed.append([s["file"] for s in shards])
        real_fsync(fd)

    def replace(src: str | Path, dst: str | Path, **kw: object) -> None:
        events.append(f"rename {Path(src).name} {Path(dst).name}")
        real_replace(src, dst, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "replace", replace)
    args = ["run", "tiny_models:TwoLinear", "-n", "4", "-b", "2", "--shard-size", "1", "-q"]
    assert invoke(*args, "-o", str(out)).exit_code == 0
    events = [e for e in events if "running.json" not in e]  # the run's note: no dump data

    def durable(shard: str) -> list[str]:
        return [f"fsync {shard}.tmp", f"rename {shard}.tmp {shard}", "fsync DIR"]

    manifest = ["fsync manifest.json.tmp", "rename manifest.json.tmp manifest.json", "fsync DIR"]
    shards = ["shard-00000.safetensors", "shard-00001.safetensors"]
    assert listed[-1] == shards
    # replay the events: a manifest names only shards made durable before it
    expected: list[str] = []
    done: list[str] = []
    for index, names in enumerate(listed):
        for shard in names[len(done) :]:
            expected += durable(shard)
        done = names
        if index == len(listed) - 1:  # the complete manifest: the statistics before it
            expected += durable("stats.safetensors")
        expected += manifest
    assert events == expected
    if grouped:
        assert listed == [shards, shards]  # one commit, then the one that says complete
    else:
        assert listed[0] in ([shards[0]], shards)  # each shard committed as soon as it can be


# --- error messages that name the real cause ----------------------------------------------


def test_out_under_a_file_names_the_cause(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("x")
    result = invoke(*RUN, "-o", str(tmp_path / "file" / "d"))
    assert_usage_error(result, "part of the path is a file, not a folder")


def test_os_errors_get_the_advice_that_fits() -> None:
    import errno

    assert "make room" in describe_os_error(OSError(errno.ENOSPC, "No space left on device"))
    assert "writable disk" in describe_os_error(OSError(errno.EROFS, "Read-only file system"))
    assert "make room" not in describe_os_error(OSError(errno.EROFS, "Read-only file system"))
    assert "can write to" in describe_os_error(OSError(errno.EACCES, "Permission denied"))


def test_a_dump_that_cannot_fit_is_refused_before_anything_is_written(tmp_path: Path) -> None:
    out = tmp_path / "d"
    result = invoke(*RUN[:2], "-n", str(10**20), "-b", "2", "-o", str(out))
    assert_usage_error(result, "the dump needs about", "GiB is free under --out")
    assert not out.exists()


def test_the_estimate_is_reported_in_json_and_the_table(tmp_path: Path) -> None:
    args = [*RUN[:2], "-n", "40", "-b", "8"]
    result = invoke(*args, "-o", str(tmp_path / "a"), "--json")
    report = json.loads(result.stdout)
    # every batch the same size: the estimate from the first is exact
    assert report["estimated_bytes"] == report["total_bytes"] > 0
    table = invoke(*args, "-o", str(tmp_path / "b"))
    line = " ".join(table.stdout.split())  # the footer as one line, however it wraps
    assert f"dump: {tmp_path / 'b'} (2 shards + manifest.json; the first batch" in line
    assert "in one), estimated" in line


def test_inspect_tells_a_dump_being_written_from_one_stopped(tmp_path: Path) -> None:
    """While a run writes the dump (held in its third batch by a file barrier), inspect says
    who writes it and how far it is, not "stopped": before its first shard is listed, and
    after (over an old dump the first is listed at once); once that run is killed, it says
    the run stopped and how to finish it."""
    import signal
    import socket

    barrier = tmp_path / "barrier"
    barrier.mkdir()
    env = {"HOOKDUMP_TEST_BARRIER_AT": "3", "HOOKDUMP_TEST_BARRIER": str(barrier)}
    for out, old in ((tmp_path / "new", False), (tmp_path / "old", True)):
        args = ["run", "tiny_models:Barrier", "-n", "20", "-b", "2", "--shard-size", "1", "-q",
                "-o", str(out)]  # fmt: skip
        if old:  # a dump there already: this run's first shard is listed at once
            assert invoke(*RUN, "-o", str(out)).exit_code == 0
            before = hookdump.load(out).manifest.run_id
        (barrier / "ready").unlink(missing_ok=True)
        first = hookdump_process(*args, *(["--overwrite"] if old else []), env=env)
        deadline = time.monotonic() + 300  # a bound on a hang, not a guess at the speed
        while not (barrier / "ready").exists() or (old and _run_id(out) in (before, None)):
            assert first.poll() is None and time.monotonic() < deadline, finish(first)
            time.sleep(0.01)
        during = invoke("inspect", str(out))
        said = during.stdout + during.stderr
        assert f"being written by a run on {socket.gethostname()} (pid {first.pid}) since" in said
        assert ("2 samples (1 complete shard) so far" if old else "no shard is listed yet") in said
        assert "--resume" not in said
        first.send_signal(signal.SIGKILL)
        first.wait()
    after = invoke("inspect", str(out))
    assert "the run stopped after 2 samples (1 complete shard)" in after.stdout + after.stderr
    assert "--resume" in after.stdout + after.stderr


def _run_id(out: Path) -> str | None:
    """The run id of the manifest in `out` now (None: none, or being replaced)."""
    try:
        return json.loads((out / "manifest.json").read_text()).get("run_id")
    except (FileNotFoundError, ValueError):
        return None
