"""`hookdump.follow` and `--max-disk` (issue 46): a run and its follower as separate
processes. Every row once without kills, at least once with them (the repeats as said);
the budget sampled and never passed; a follower started first waits; a run that fails ends
its follower with the run's error; a dump being overwritten is refused. Waits are on the
files' own signals (a shard listed, a progress file, a barrier file), never on the clock."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import torch

import hookdump

pytestmark = pytest.mark.slow  # several processes: run with --heavy (CI)

ROWS, BATCH = 96, 8
DEADLINE_S = 300  # a process of these tests still running then has hung
SHARD, BUDGET = "8KiB", "40KiB"  # a batch of avgpool is 16 KiB: a shard of its own each
# a follower: every batch's rows (`__row__`) logged as it comes, then its last line
FOLLOWER = textwrap.dedent(
    """
    import json, sys, time
    from pathlib import Path
    import hookdump
    out, log, name, stop = sys.argv[1], Path(sys.argv[2]), sys.argv[3], int(sys.argv[4])
    with log.open("a") as f:
        for n, b in enumerate(hookdump.follow(out, ["avgpool"], 7, with_index=True,
                                              consume=True, name=name, shuffle=True)):
            f.write(json.dumps(b["__row__"].tolist()) + "\\n")
            f.flush()
            if n + 1 == stop:  # a barrier for the test, which kills it here
                Path(str(log) + ".stopped").touch()
                time.sleep(3600)
    """
)


def _writer(out: Path, *extra: str) -> subprocess.Popen[str]:
    args = ["run", "resnet18", "--layers", "avgpool", "--num-samples", str(ROWS),
            "--batch-size", str(BATCH), "--shard-size", SHARD, "--out", str(out), "-q"]  # fmt: skip
    return subprocess.Popen(
        [sys.executable, "-m", "hookdump", *args, *extra],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _follower(out: Path, log: Path, name: str = "default", stop: int = 0) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", FOLLOWER, str(out), str(log), name, str(stop)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _shard_bytes(out: Path) -> int:
    total = 0
    for path in out.glob("shard-*.safetensors*"):
        with contextlib.suppress(FileNotFoundError):  # consumed meanwhile
            total += path.stat().st_size
    return total


def _rows(log: Path) -> list[int]:
    return [row for line in log.read_text().splitlines() for row in json.loads(line)]


def _wait_for(process: subprocess.Popen[str], timeout: float = 300) -> tuple[str, str]:
    out, err = process.communicate(timeout=timeout)
    return out, err


def _watching(*processes: subprocess.Popen[str]) -> Iterator[None]:
    """Once per look while any of `processes` runs (every few ms, not a spinning core),
    failing after DEADLINE_S (a hung process ends the test, not the suite)."""
    deadline = time.monotonic() + DEADLINE_S
    while any(p.poll() is None for p in processes):
        if time.monotonic() > deadline:
            for p in processes:
                p.kill()
            pytest.fail(f"still running after {DEADLINE_S} s")
        yield
        time.sleep(0.002)


def _until(done: Callable[[], bool], *watched: subprocess.Popen[str]) -> None:
    """Wait for `done`, failing if a watched process ends first or after DEADLINE_S."""
    deadline = time.monotonic() + DEADLINE_S
    while not done():
        for p in watched:
            assert p.poll() is None, p.stderr.read() if p.stderr else ""
        assert time.monotonic() < deadline, f"not done after {DEADLINE_S} s"
        time.sleep(0.002)


@pytest.mark.slow
def test_every_row_once_within_the_budget(tmp_path: Path) -> None:
    """The follower starts first (it waits for the first shard), consumes as it goes, and
    the writer keeps within --max-disk: the shards' bytes under --out, sampled all along,
    never pass the budget and one shard."""
    out, log = tmp_path / "d", tmp_path / "rows.log"
    follower = _follower(out, log)
    writer = _writer(out, "--max-disk", BUDGET)
    most = 0
    for _ in _watching(writer, follower):
        if out.is_dir():
            most = max(most, _shard_bytes(out))
    assert writer.returncode == 0, writer.stderr.read() if writer.stderr else ""
    assert follower.returncode == 0, follower.stderr.read() if follower.stderr else ""
    assert sorted(_rows(log)) == list(range(ROWS))
    manifest = json.loads((out / "manifest.json").read_text())
    largest = max(shard["bytes"] for shard in manifest["shards"])
    assert 0 < most <= 40 * 1024 + largest
    assert not list(out.glob("shard-*"))  # every shard consumed
    with pytest.raises(hookdump.InvalidDump, match="consumed by the follower 'default'"):
        hookdump.load(out)["avgpool"]


@pytest.mark.slow
def test_a_killed_follower_goes_on_and_says_what_comes_again(tmp_path: Path) -> None:
    out, log = tmp_path / "d", tmp_path / "rows.log"
    writer = _writer(out, "--max-disk", BUDGET)
    stop = 1 + int.from_bytes(os.urandom(1), "little") % 9  # a point in the pass
    first = _follower(out, log, "trainer", stop)
    stopped = Path(str(log) + ".stopped")
    _until(stopped.exists, first)
    first.send_signal(signal.SIGKILL)
    first.wait()
    before = log.read_text().splitlines()
    again = _follower(out, log, "trainer")
    _, err = _wait_for(again)
    assert again.returncode == 0, err
    _wait_for(writer)
    rows = _rows(log)
    assert sorted(set(rows)) == list(range(ROWS))  # none lost
    repeats = len(rows) - ROWS
    said = [line for line in err.splitlines() if "come again" in line]
    told = int(said[0].split(": ")[1].split()[0]) if said else 0
    # the rows said, and the batch in hand when it was killed (not yet marked given)
    last = len(json.loads(before[-1]))
    assert told <= repeats <= told + last


@pytest.mark.slow
def test_a_killed_run_resumed_goes_on_under_its_follower(tmp_path: Path) -> None:
    out, log = tmp_path / "d", tmp_path / "rows.log"
    follower = _follower(out, log)
    writer = _writer(out, "--max-disk", BUDGET)
    listed = 1 + int.from_bytes(os.urandom(1), "little") % 4  # a point in the run

    def enough() -> bool:
        try:
            return len(json.loads((out / "manifest.json").read_text())["shards"]) >= listed
        except (FileNotFoundError, ValueError, KeyError):
            return False  # not written yet, or being replaced

    _until(enough, writer)
    writer.send_signal(signal.SIGKILL)
    writer.wait()
    resumed = _writer(out, "--max-disk", BUDGET, "--resume")
    _, err = _wait_for(resumed)
    assert resumed.returncode == 0, err
    _, err = _wait_for(follower)
    assert follower.returncode == 0, err
    assert sorted(_rows(log)) == list(range(ROWS))  # each once: the kept shards are not redone


def test_a_follower_ends_with_the_runs_error(tmp_path: Path) -> None:
    out = tmp_path / "d"
    script = textwrap.dedent(
        f"""
        import torch, hookdump
        def batches():
            for i in range(6):
                yield torch.randn(4, 8)
            yield torch.randn(4, 5)  # the model takes 8 features
        hookdump.dump(torch.nn.Linear(8, 3), batches(), {str(out)!r}, shard_size=64)
        """
    )
    writer = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert writer.returncode == 1 and "HookdumpError" in writer.stderr
    follower = subprocess.run(
        [sys.executable, "-c", f"import hookdump\nfor b in hookdump.follow({str(out)!r}, "
         "['__root__'], 4): pass"],
        capture_output=True, text=True,
    )  # fmt: skip
    assert follower.returncode == 1
    assert "failed" in follower.stderr and "mat1 and mat2" in follower.stderr


def test_a_dump_being_overwritten_is_refused(tmp_path: Path) -> None:
    out, barrier = tmp_path / "d", tmp_path / "go"
    hookdump.dump(torch.nn.Linear(8, 3), [torch.randn(4, 8)], out)
    script = textwrap.dedent(
        f"""
        import time, torch, hookdump
        from pathlib import Path
        def batches():
            while not Path({str(barrier)!r}).exists():  # the test lets it go on
                time.sleep(0.01)
            yield torch.randn(4, 8)
        hookdump.dump(torch.nn.Linear(8, 3), batches(), {str(out)!r}, overwrite=True)
        """
    )
    writer = subprocess.Popen([sys.executable, "-c", script], stderr=subprocess.PIPE, text=True)
    try:
        _until((out / "running.json").exists, writer)
        with pytest.raises(hookdump.HookdumpError, match="being overwritten"):
            next(hookdump.follow(out, ["__root__"], 4))
    finally:
        barrier.touch()
        writer.wait(timeout=300)
    assert writer.returncode == 0
    assert len(list(hookdump.follow(out, ["__root__"], 4))) == 1  # the new dump, once written


def test_two_followers_each_see_every_row(tmp_path: Path) -> None:
    out = tmp_path / "d"
    model = torch.nn.Linear(8, 3)
    data = [torch.randn(5, 8) for _ in range(4)]
    hookdump.dump(model, data, out, shard_size=64)
    with torch.no_grad():
        expected = model(torch.cat(data))
    for name in ("a", "b"):
        given = list(hookdump.follow(out, ["__root__"], 3, name=name, with_index=True))
        rows = torch.cat([b["__row__"] for b in given])
        assert sorted(rows.tolist()) == list(range(20))
        values = torch.cat([b["__root__"] for b in given])
        torch.testing.assert_close(values, expected[rows])
        assert [len(b["__root__"]) for b in given] == [3] * 6 + [2]  # as Dump.batches gives
    assert (out / "follow-a.json").exists() and (out / "follow-b.json").exists()
    torch.testing.assert_close(hookdump.load(out)["__root__"], expected)  # nothing consumed
    # a finished follower started again has nothing left to give
    assert list(hookdump.follow(out, ["__root__"], 3, name="a")) == []
    # its arguments are checked as Dump.batches checks them, in one line
    with pytest.raises(hookdump.HookdumpError, match=r"'h\.5' is not in"):
        next(hookdump.follow(out, ["h.5"], 3, name="c"))
    with pytest.raises(hookdump.HookdumpError, match="batch_size 0 must be"):
        hookdump.follow(out, ["__root__"], 0)


def test_dataloader_workers_and_ranks_each_take_their_shards(tmp_path: Path) -> None:
    """`follow_dataset`: each of workers x ranks follows every n-th shard, so every row
    goes to one of them (consumed as it goes), each with its own progress."""
    out = tmp_path / "d"
    model = torch.nn.Linear(8, 3)
    hookdump.dump(model, [torch.randn(5, 8) for _ in range(8)], out, shard_size=64)
    rows: list[int] = []
    for rank in range(2):
        dataset = hookdump.follow_dataset(out, ["__root__"], 3, with_index=True, consume=True,
                                          rank=rank, world_size=2)  # fmt: skip
        loader = torch.utils.data.DataLoader(dataset, batch_size=None, num_workers=2)
        rows += [row for batch in loader for row in batch["__row__"].tolist()]
    assert sorted(rows) == list(range(40))
    assert not list(out.glob("shard-*"))
    names = sorted(p.name for p in out.glob("follow-*.json"))
    assert names == [f"follow-default.{i}-of-4.json" for i in range(4)]
    with pytest.raises(hookdump.InvalidDump, match=r"consumed by the follower 'default\.\d-of-4'"):
        hookdump.load(out)["__root__"]


def _object_bytes(url: str) -> int:
    """The bytes of the shard objects under `url` now."""
    import fsspec

    fs = fsspec.filesystem("s3", skip_instance_cache=True, use_listings_cache=False)
    try:
        listed = fs.ls(url.removeprefix("s3://"), detail=True, refresh=True)
    except FileNotFoundError:
        return 0
    return sum(int(e["size"]) for e in listed if "/shard-" in e["name"])


@pytest.mark.slow
def test_at_a_url_every_row_once_within_the_budget(bucket: str, tmp_path: Path) -> None:
    """At an S3 URL: the run keeps its objects within --max-disk (listed all along), the
    follower deletes the objects it consumed, and the dump says which were."""
    out, log = f"{bucket}/d", tmp_path / "rows.log"
    follower = _follower(out, log)
    writer = _writer(out, "--max-disk", BUDGET)
    most = 0
    for _ in _watching(writer, follower):
        most = max(most, _object_bytes(out))
    assert writer.returncode == 0, writer.stderr.read() if writer.stderr else ""
    assert follower.returncode == 0, follower.stderr.read() if follower.stderr else ""
    assert sorted(_rows(log)) == list(range(ROWS))
    dump = hookdump.load(out)
    largest = max(shard.bytes or 0 for shard in dump.reader.shards)
    assert 0 < most <= 40 * 1024 + largest
    assert _object_bytes(out) == 0  # every shard consumed
    assert len(dump.manifest.get("consumed", [])) >= 1  # the last manifest's count
    with pytest.raises(hookdump.InvalidDump, match="consumed by the follower 'default'"):
        dump["avgpool"]
    # the run's notes of itself are gone with it; the follower's progress stays
    names = {p.rsplit("/", 1)[-1] for p in _listing(out)}
    assert "running.json" not in names and "follow-default.json" in names


def _listing(url: str) -> list[str]:
    import fsspec

    fs = fsspec.filesystem("s3", skip_instance_cache=True, use_listings_cache=False)
    return [str(p) for p in fs.ls(url.removeprefix("s3://"), refresh=True)]


TORCHRUN_FOLLOWER = textwrap.dedent(
    """
    import json, sys
    import hookdump
    rows = [b["linear_1"].tolist() for b in hookdump.follow(sys.argv[1], ["linear_1"], 5,
                                                           consume=True, shuffle=True)]
    print(json.dumps([r for batch in rows for r in batch]))
    """
)


@pytest.mark.slow
def test_torchrun_writers_each_keep_their_share_of_the_budget(tmp_path: Path) -> None:
    """Two torchrun ranks write their shards under one --max-disk (half each) while a
    follower consumes them from the ranks' own manifests: it gets every row of the dump
    one process makes, once."""
    tests = Path(__file__).parent
    args = ["run", "tiny_models:TwoLinear", "-n", "48", "-b", "4", "--layers", "linear_1",
            "--shard-size", "32"]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    one = tmp_path / "one"
    subprocess.run([sys.executable, "-m", "hookdump", *args, "-o", str(one), "-q"], cwd=tests,
                   env=env, check=True, capture_output=True, timeout=300)  # fmt: skip
    out = tmp_path / "two"
    follower = subprocess.Popen(
        [sys.executable, "-c", TORCHRUN_FOLLOWER, str(out)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    writer = subprocess.Popen(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
         "-m", "hookdump", *args, "--max-disk", BUDGET, "-o", str(out), "-q"],
        cwd=tests, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    most = 0
    for _ in _watching(writer, follower):
        if out.is_dir():
            most = max(most, _shard_bytes(out))
    assert writer.returncode == 0, writer.stderr.read() if writer.stderr else ""
    given, err = follower.communicate()
    assert follower.returncode == 0, err
    rows = sorted(tuple(row) for row in json.loads(given))
    assert rows == sorted(tuple(row) for row in hookdump.load(one)["linear_1"].tolist())
    largest = max(shard.bytes or 0 for shard in hookdump.load(one).reader.shards)
    assert 0 < most <= 40 * 1024 + 2 * largest  # each rank: its half, and the shard it writes
    assert not list(out.glob("shard-*"))


def test_row_numbers_wait_for_the_torchrun_ranks_to_be_joined(tmp_path: Path) -> None:
    """A dump still listed in a torchrun rank's own manifest has no dump row numbers yet:
    with_index is one line; without it, the rank's rows come."""
    out, model = tmp_path / "d", torch.nn.Linear(8, 3)
    data = [torch.randn(4, 8), torch.randn(4, 8)]
    hookdump.dump(model, data, out)
    manifest = json.loads((out / "manifest.json").read_text())
    (out / "manifest.json").unlink()
    rank = {**manifest, "complete": False, "processes": 2}
    (out / "manifest-r00.json").write_text(json.dumps(rank))
    with pytest.raises(hookdump.HookdumpError, match="written by 2 torchrun processes"):
        next(hookdump.follow(out, ["__root__"], 4, with_index=True))
    batches = hookdump.follow(out, ["__root__"], 8)
    with torch.no_grad():
        torch.testing.assert_close(next(batches)["__root__"], model(torch.cat(data)))
