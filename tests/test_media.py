"""The medium under both wings (`store.media`): every kind keeps the same contract (a put
replaces whole, a create only where nothing is, a finished file put whole, a lock held by
one process), and the rules written once above it (a follower's progress, a run's note of
itself, consumed shards) run unchanged on each, the in-memory kind included. A store whose
creates are not atomic is refused for writing in one line."""

from __future__ import annotations

import itertools
import json
import os
import socket
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import fsspec
import pytest
import torch
from fsspec.implementations.memory import MemoryFileSystem
from tiny_models import TwoLinear

import hookdump
from hookdump.format.names import RUNNING
from hookdump.store.location import Remote
from hookdump.store.media import FolderMedium, Medium, UrlMedium, open_medium
from hookdump.store.media.memory import MemoryMedium
from hookdump.store.notes import running_note
from hookdump.store.read.progress import Progress, consumed_shards

_NAMES = itertools.count()
KINDS = ["folder", "s3", "fsspec-memory", "memory"]


@pytest.fixture(params=KINDS)
def medium(request: pytest.FixtureRequest, tmp_path: Path) -> Medium:
    """An empty medium of each kind: a folder, a prefix in a bucket of the loopback S3
    server, a prefix of fsspec's `memory://`, and hookdump's in-memory kind."""
    kind = request.param
    if kind == "folder":
        return FolderMedium(tmp_path)
    if kind == "s3":
        bucket = request.getfixturevalue("bucket")
        return open_medium(f"{bucket}/m")
    if kind == "fsspec-memory":
        return open_medium(f"memory://media-tests/{next(_NAMES)}")
    return MemoryMedium(f"tests-{next(_NAMES)}")


def test_a_put_replaces_an_entry_whole_and_is_read_back(medium: Medium) -> None:
    assert medium.names() == [] and medium.read("a") is None and medium.info("a") is None
    medium.put("a", b"first")
    before = medium.version("a")
    medium.put("a", b"second, longer")
    assert medium.read("a") == b"second, longer" and medium.read("a", 6) == b"second"
    info = medium.info("a")
    assert info is not None and info.size == len(b"second, longer")
    assert medium.version("a") != before  # a follower tells a rewrite by it
    medium.put("b", b"")
    assert medium.names() == ["a", "b"]
    with medium.reading("a") as read:
        assert read(3) + read(100) + read(1) == b"second, longer"
    medium.delete("a")
    medium.delete("a")  # already gone: no error
    assert medium.names() == ["b"] and medium.read("a") is None


def test_a_create_happens_only_where_nothing_is(medium: Medium) -> None:
    assert medium.put_if_absent("lock", b"mine")
    assert not medium.put_if_absent("lock", b"theirs")
    assert medium.read("lock") == b"mine"


def test_a_finished_local_file_becomes_an_entry_whole(medium: Medium, tmp_path: Path) -> None:
    local = tmp_path / "spool-file"
    raw = os.urandom(3000)
    local.write_bytes(raw)
    stored = medium.put_file(local, "shard", None)
    assert not local.exists()  # moved, or uploaded and deleted
    assert medium.read("shard") == raw and stored.size == len(raw)


def test_a_lock_is_held_by_one_holder_and_a_gone_processs_is_taken_over(
    medium: Medium,
) -> None:
    with medium.hold("follow-x.lock", "follower 'x'"):
        with (
            pytest.raises(hookdump.HookdumpError) as raised,
            medium.hold("follow-x.lock", "follower 'x'"),
        ):
            pass
        assert "follower 'x' of" in str(raised.value) and "already running" in str(raised.value)
    with medium.hold("follow-x.lock", "follower 'x'"):  # given back: taken again
        pass
    code = "import os; print(os.getpid())"
    gone = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    dead = json.dumps({"pid": int(gone.stdout), "host": socket.gethostname()}).encode()
    medium.put("follow-y.lock", dead)  # what a killed follower left
    with medium.hold("follow-y.lock", "follower 'y'"):
        pass


def test_the_rules_above_a_medium_run_on_each_kind(medium: Medium) -> None:
    """A follower's progress, the shards it consumed and a run's note of itself: written
    once, over the medium, read back the same on every kind."""
    progress = Progress("x", "run-1")
    progress.gave("shard-00000.safetensors", 4, 4, consume=True)
    progress.gave("shard-00001.safetensors", 2, 4, consume=True)
    progress.write(medium, finished=True)
    again = Progress.read(medium, "x")
    assert again.run_id == "run-1" and again.finished == ["shard-00000.safetensors"]
    assert again.inside == {"shard-00001.safetensors": 2}
    assert consumed_shards(medium) == {"shard-00000.safetensors": "x"}
    note = {"run_id": "r", "overwrite": False, "pid": os.getpid(), "host": "h", "started": 1.0}
    medium.put(RUNNING, json.dumps(note).encode())
    assert running_note(medium) == note
    medium.put(RUNNING, b"[" * 100_000)  # a damaged note: none
    assert running_note(medium) is None


def test_the_factory_decides_the_kind_once(tmp_path: Path) -> None:
    assert isinstance(open_medium(tmp_path), FolderMedium)
    folder = open_medium(f"file://{tmp_path}")  # this host's file:// is the folder
    assert isinstance(folder, FolderMedium) and folder.root == tmp_path
    assert isinstance(open_medium("memory://media-tests/f"), UrlMedium)
    with pytest.raises(hookdump.HookdumpError, match="storage_options are for a dump at a URL"):
        open_medium(tmp_path, {"key": "k"})
    lenient = open_medium(tmp_path, {"key": "k"}, strict=False)  # a run's: left unused
    assert isinstance(lenient, FolderMedium)


class _PlainMemory(MemoryFileSystem):
    """A store like fsspec's memory, under a protocol hookdump knows no conditional put of
    (as sftp://, http:// or a plugin's)."""

    protocol = "plainmem"


@pytest.fixture
def plain_store() -> Callable[[], list[str]]:
    fsspec.register_implementation("plainmem", _PlainMemory, clobber=True)
    fs = fsspec.filesystem("plainmem")
    return lambda: sorted(fs.find("/weak")) if fs.exists("/weak") else []


def test_a_store_without_an_atomic_create_is_refused_for_writing(
    plain_store: Callable[[], list[str]], in_tests_dir: Path
) -> None:
    """Two runs could both take a lock made by "exists, then write": refused in one line,
    from Python and the CLI, before anything is written; a follower's lock too."""
    from clitools import assert_usage_error, invoke

    with pytest.raises(hookdump.HookdumpError) as raised:
        hookdump.dump(TwoLinear(), [torch.rand(2, 3)], "plainmem://weak/d", layers="linear_1")
    line = str(raised.value)
    assert "cannot lock plainmem://weak/d for a run" in line and "no atomic create" in line
    result = invoke("run", "tiny_models:TwoLinear", "-n", "2", "-o", "plainmem://weak/e")
    assert_usage_error(result, "cannot lock plainmem://weak/e", "s3://")
    assert plain_store() == []
    weak = UrlMedium(Remote("plainmem://weak/f"))
    with (
        pytest.raises(hookdump.HookdumpError, match="no atomic create"),
        weak.hold("follow-x.lock", "follower 'x'"),
    ):
        pass
    assert plain_store() == []


def test_a_folders_link_is_no_regular_entry_but_its_version_is_its_targets(
    tmp_path: Path,
) -> None:
    """A link inside the folder is never taken for a shard the run wrote (`info`: none, so a
    resumed run writes the shard again), while a reader follows it, and so does the version a
    follower watches."""
    medium = FolderMedium(tmp_path)
    medium.put("target.json", b"{}")
    (tmp_path / "manifest.json").symlink_to("target.json")
    assert medium.info("manifest.json") is None
    assert medium.version("manifest.json") == medium.version("target.json") is not None
    medium.put("target.json", b'{"complete": true}')
    assert medium.version("manifest.json") == medium.version("target.json")


def test_an_entry_is_read_at_offsets_and_a_missing_one_is_one_line(medium: Medium) -> None:
    raw = bytes(range(256)) * 4
    medium.put("shard", raw)
    blob = medium.blob("shard", "shard")
    try:
        assert blob.size == len(raw) and blob.pread(10, 250) == raw[250:260]
        view = memoryview(bytearray(8))
        assert blob.readinto(view, len(raw) - 4) == 4 and bytes(view[:4]) == raw[-4:]
    finally:
        blob.close()
    with pytest.raises(hookdump.InvalidDump) as raised:
        medium.blob("gone", "shard")
    assert "gone" in str(raised.value) and "\n" not in str(raised.value)


def test_a_folders_entry_that_leads_outside_it_is_refused(tmp_path: Path) -> None:
    outside = tmp_path / "secret"
    outside.write_bytes(b"not the dump's")
    medium = FolderMedium(tmp_path / "d")
    medium.folder.mkdir()
    (medium.folder / "shard").symlink_to(outside)
    with pytest.raises(hookdump.InvalidDump, match="resolves outside the dump folder"):
        medium.blob("shard", "shard")


def _within(seconds: float, call: Callable[[], object]) -> object:
    """`call()`'s result, or a failed test (not a hung one) if it takes longer."""
    import threading

    done: list[object] = []
    worker = threading.Thread(target=lambda: done.append(_outcome(call)), daemon=True)
    worker.start()
    worker.join(seconds)
    assert done, f"still blocked after {seconds} s"
    if isinstance(done[0], BaseException):
        raise done[0]
    return done[0]


def _outcome(call: Callable[[], object]) -> object:
    try:
        return call()
    except BaseException as exc:
        return exc


def test_a_fifo_beside_a_dump_is_refused_not_waited_on(tmp_path: Path) -> None:
    """A FIFO under a note's or a follower's progress's name (a tar carries FIFOs) would
    block its open, and the read, until something wrote to it: refused in one line, and a
    run's note there reads as a damaged one."""
    medium = FolderMedium(tmp_path)
    os.mkfifo(tmp_path / RUNNING)
    os.mkfifo(tmp_path / "follow-x.json")
    with pytest.raises(hookdump.InvalidDump, match=r"follow-x\.json is not a regular file"):
        _within(30, lambda: medium.read("follow-x.json"))
    assert _within(30, lambda: running_note(medium)) is None
    with pytest.raises(hookdump.HookdumpError, match=r"follow-x\.json is not a regular file"):
        _within(30, lambda: Progress.read(medium, "x"))


def test_inspect_of_a_dump_whose_note_is_a_fifo_ends(tmp_path: Path, in_tests_dir: Path) -> None:
    """`inspect` of an incomplete dump reads the run's note: a FIFO there ends in the
    stopped run's line, as a missing note does, not in a wait."""
    from clitools import finish, hookdump_process

    out = tmp_path / "d"
    hookdump.dump(TwoLinear(), [torch.rand(4, 2)], out, layers="linear_1")
    manifest = json.loads((out / "manifest.json").read_text())
    (out / "manifest.json").write_text(json.dumps({**manifest, "complete": False}))
    os.mkfifo(out / RUNNING)
    code, stdout, stderr = finish(hookdump_process("inspect", str(out)))
    assert code == 0, stderr
    assert "incomplete" in stdout and "--resume" in stdout


def test_a_protocol_whose_client_is_not_installed_names_the_package(tmp_path: Path) -> None:
    """fsspec names a missing client package only in its message (`sftp://` without
    paramiko): the line names it and the pip command, never `needs None`."""
    fsspec.register_implementation(
        "needsfake",
        "fakepkg_missing.FS",
        clobber=True,
        errtxt='FakeFS requires "fakepkg" to be installed',
    )
    with pytest.raises(hookdump.HookdumpError) as raised:
        open_medium("needsfake://bucket/d")
    assert (
        str(raised.value) == "needsfake://bucket/d: needsfake:// needs fakepkg: pip install fakepkg"
    )
    fsspec.register_implementation(
        "needsother", "fakepkg_missing.FS", clobber=True, errtxt="no client here"
    )
    with pytest.raises(
        hookdump.HookdumpError, match=r"needs its fsspec client: install it \(no client here\)"
    ):
        open_medium("needsother://bucket/d")


def test_an_entry_larger_than_its_limit_is_refused_before_it_is_read(
    medium: Medium, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A manifest is read whole, so one that is too large is refused by its size, before a
    byte of it is read: on every kind, through the one reader of a manifest."""
    from hookdump.store.read import manifest as manifest_module

    medium.put("manifest.json", b"{" + b" " * 4000 + b"}")
    monkeypatch.setattr(manifest_module, "MAX_MANIFEST_BYTES", 1000)
    with pytest.raises(hookdump.InvalidDump) as raised:
        hookdump.load(str(medium.root))
    message = str(raised.value)
    assert "manifest.json is 4,002 bytes, more than the 1,000 it may be" in message
    assert "\n" not in message
    assert medium.read("manifest.json", limit=4002) is not None  # at its limit: read


def test_a_sparse_manifest_of_terabytes_is_refused_at_once(tmp_path: Path) -> None:
    """A forged manifest.json of 1 TiB of holes (no disk taken) is refused by its size: a
    read of it, even of the limit's gigabyte, would take minutes and that memory."""
    (tmp_path / "d").mkdir()
    with (tmp_path / "d" / "manifest.json").open("wb") as file:
        file.truncate(1 << 40)
    with pytest.raises(hookdump.InvalidDump, match=r"is 1,099,511,627,776 bytes, more than"):
        hookdump.load(tmp_path / "d")
