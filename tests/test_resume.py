"""Ctrl-C keeps the complete shards; --resume finishes the dump as if never interrupted."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from clitools import assert_usage_error, invoke
from PIL import Image
from stattools import assert_same_stats
from tiny_text import ctrl_c_in_batch

import hookdump

pytestmark = pytest.mark.usefixtures("in_tests_dir")
RUN = ["run", "tiny_models:CtrlC", "-n", "10", "-b", "2", "--shard-size", "1", "-q"]


def interrupted(out: Path, monkeypatch: pytest.MonkeyPatch, at: int, *extra: str) -> str:
    monkeypatch.setenv("HOOKDUMP_TEST_CTRL_C_AT", str(at))
    result = invoke(*RUN, *extra, "-o", str(out))
    monkeypatch.delenv("HOOKDUMP_TEST_CTRL_C_AT")
    assert result.exit_code == 130, result.stderr
    return result.stderr


@pytest.fixture(params=[0.0, 60.0], ids=["commit_each", "commit_grouped"])
def commit_every(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> float:
    """Shards committed one by one, or (60 s apart) all only once the run stops: Ctrl-C and
    errors must commit the finished ones all the same."""
    from hookdump.store.write import commit

    monkeypatch.setattr(commit, "COMMIT_EVERY", request.param)
    return float(request.param)


@pytest.mark.usefixtures("commit_every")
def test_ctrl_c_then_resume_equals_an_uninterrupted_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    out, whole = tmp_path / "resumed", tmp_path / "whole"
    stderr = interrupted(out, monkeypatch, at=3)
    assert stderr.strip() == (
        f"Interrupted: 4 samples are safe in {out}; run the same command with --resume to "
        "finish the dump"
    )
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["complete"] is False and manifest["num_samples"] == 4
    (out / "shard-00007.safetensors.tmp").write_bytes(b"half a shard, as kill -9 leaves")

    result = invoke(*RUN, "-o", str(out), "--resume", "--json")
    assert result.exit_code == 0, result.stderr
    assert invoke(*RUN, "-o", str(whole)).exit_code == 0
    assert invoke("diff", str(whole), str(out), "--atol", "0", "--rtol", "0").exit_code == 0
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["complete"] is True
    # the kept shards' statistics read back and merged with the rest's
    assert_same_stats(hookdump.load(whole), hookdump.load(out))
    assert "sample_ids" not in manifest  # row numbers
    assert hookdump.load(out).sample_ids == list(range(10))
    assert [(s["start"], s["stop"]) for s in manifest["shards"]][:3] == [(0, 2), (2, 4), (4, 6)]
    assert not list(out.glob("*.tmp"))
    # the summary covers the whole dump, not only the resumed part
    stats = {t["key"]: t for t in json.loads(result.stdout)["tensors"]}
    dump = hookdump.load(out)
    assert stats["inner.linear_1"]["bytes"] == dump["inner.linear_1"].numel() * 4
    assert stats["inner.linear_1"]["max"] == pytest.approx(float(dump["inner.linear_1"].max()))


def test_resume_needs_the_same_options(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    out = tmp_path / "d"
    interrupted(out, monkeypatch, at=2)
    assert_usage_error(
        invoke(*RUN, "-o", str(out), "--resume", "--seed", "3"), "--seed was 0", "now 3"
    )
    assert invoke(*RUN, "-o", str(out), "--resume").exit_code == 0
    assert_usage_error(invoke(*RUN, "-o", str(out), "--resume"), "already complete")


def test_resume_takes_an_option_newer_than_the_dump_as_off(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A dump begun before `repeat_kv_heads` existed has no such entry in its recipe: the
    option was off, so a resume with it off goes on."""
    out = tmp_path / "d"
    interrupted(out, monkeypatch, at=2)
    manifest = json.loads((out / "manifest.json").read_text())
    del manifest["recipe"]["repeat_kv_heads"]
    (out / "manifest.json").write_text(json.dumps(manifest))
    assert invoke(*RUN, "-o", str(out), "--resume").exit_code == 0
    assert hookdump.load(out).complete


def test_resume_with_nothing_there_starts_anew(tmp_path: Path) -> None:
    out = tmp_path / "d"
    assert invoke(*RUN, "-o", str(out), "--resume").exit_code == 0
    assert hookdump.load(out).complete
    assert_usage_error(invoke("run", "tiny_models:TwoLinear", "--resume"), "--resume needs --out")


def test_resume_an_image_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    folder = tmp_path / "imgs"
    folder.mkdir()
    for i in range(7):
        Image.new("L", (20, 20), 30 * i).save(folder / f"{i}.png")
    (folder / "2.png").write_bytes(b"broken")
    capture = ["-l", "__root__", "--capture", "input", "--shard-size", "1"]
    args = ["run", "resnet18", "--input", str(folder), "--image-size", "16", "-b", "2", "-q",
            "--skip-bad-inputs", *capture]  # fmt: skip
    out, whole = tmp_path / "resumed", tmp_path / "whole"
    assert invoke(*args, "-o", str(whole)).exit_code == 0
    ctrl_c_in_batch(monkeypatch, 2)  # the third batch: the second has one row (2.png is bad)
    assert invoke(*args, "-o", str(out)).exit_code == 130
    monkeypatch.undo()
    # an image changed meanwhile (one already dumped): the rows would no longer match it
    import os

    stamp = (folder / "1.png").stat()
    os.utime(folder / "1.png", ns=(stamp.st_atime_ns, stamp.st_mtime_ns + 10**9))
    assert_usage_error(
        invoke(*args, "-o", str(out), "--resume"),
        f"--input file {folder / '1.png'} changed (size or modification time)",
    )
    os.utime(folder / "1.png", ns=(stamp.st_atime_ns, stamp.st_mtime_ns))
    assert invoke(*args, "-o", str(out), "--resume").exit_code == 0
    a, b = hookdump.load(whole), hookdump.load(out)
    assert a.manifest["sample_ids"] == b.manifest["sample_ids"]
    assert [s["path"] for s in b.manifest["skipped_inputs"]] == [str(folder / "2.png")]
    assert torch.equal(a["__root__:input.0"], b["__root__:input.0"])


@pytest.mark.usefixtures("commit_every")
def test_a_full_disk_is_a_clear_error_and_resume_finishes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import errno

    from hookdump.store.write.shards import ShardFile

    out = tmp_path / "d"
    real_write = ShardFile.write

    def write_until_full(self: ShardFile, key: str, tensor: torch.Tensor, *release: Any) -> None:
        if self.path.name == "shard-00002.safetensors":
            raise OSError(errno.ENOSPC, "No space left on device")
        real_write(self, key, tensor, *release)

    monkeypatch.setattr(ShardFile, "write", write_until_full)
    result = invoke(*RUN, "-o", str(out))
    assert_usage_error(result, "No space left on device", "--resume")
    manifest = json.loads((out / "manifest.json").read_text())
    assert (manifest["complete"], manifest["num_samples"]) == (False, 4)
    assert not list(out.glob("*.tmp"))
    monkeypatch.setattr(ShardFile, "write", real_write)
    assert invoke(*RUN, "-o", str(out), "--resume").exit_code == 0
    assert hookdump.load(out).num_samples == 10


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A real 1 MiB file system (tmpfs): what fills it fails as a full disk does."""
    disk = tmp_path / "disk"
    disk.mkdir()
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(disk)], capture_output=True
    )
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here (needs root): {mounted.stderr!r:.100}")
    try:
        yield disk
    finally:
        subprocess.run(["umount", "-l", str(disk)], check=True)


@pytest.mark.usefixtures("commit_every")
def test_a_disk_that_fills_mid_run_keeps_every_finished_shard(
    small_disk: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A real disk fills in the fourth batch: the shards finished before are listed (their
    headers and the manifest need no new space; batch 3's may be, as its last bytes raced
    the filling), the one that failed is gone, and --resume finishes the dump."""
    out, whole = small_disk / "d", tmp_path / "whole"
    filler = small_disk / "filler"
    monkeypatch.setenv("HOOKDUMP_TEST_FILL", str(filler))
    monkeypatch.setenv("HOOKDUMP_TEST_FILL_LEAVE", "0")
    args = ["run", "tiny_models:FillsDisk", "-n", "40", "-b", "2", "--shard-size", "1", "-q"]
    monkeypatch.setenv("HOOKDUMP_TEST_FILL_AT", "4")
    result = invoke(*args, "-o", str(out))
    assert_usage_error(result, "No space left on device", "--resume")
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["complete"] is False and manifest["num_samples"] >= 4
    listed = [s["file"] for s in manifest["shards"]]
    assert sorted(p.name for p in out.iterdir()) == ["manifest.json", *listed]
    inspected = json.loads(invoke("inspect", str(out), "--json").stdout)
    assert (inspected["num_samples"], inspected["shards"]) == (manifest["num_samples"], len(listed))

    filler.unlink()
    monkeypatch.delenv("HOOKDUMP_TEST_FILL_AT")
    result = invoke(*args, "-o", str(out), "--resume")
    assert result.exit_code == 0, result.stderr
    assert invoke(*args, "-o", str(whole)).exit_code == 0
    a, b = hookdump.load(whole), hookdump.load(out)
    assert b.complete and b.sample_ids == list(range(40))
    for key in sorted(a.keys()):
        assert torch.equal(a[key], b[key]), key


@pytest.mark.usefixtures("commit_every")
@pytest.mark.parametrize("failing", [1, 2])
def test_a_sync_that_fails_in_the_background_is_a_clear_error_and_resume_finishes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, failing: int
) -> None:
    """Shards are synced and listed by a thread of their own while the next is written:
    its error reaches the user as the same one line, the shards before stay listed (also
    those committed in the same group as the failed one), and none after the failed one
    is (the dump has no gap)."""
    import errno

    from hookdump.store.write import area as writer

    out = tmp_path / "d"
    real_fsync = writer.fsync_file

    def fsync_until_full(tmp: Path) -> None:
        if tmp.name.startswith(f"shard-{failing:05d}."):
            raise OSError(errno.ENOSPC, "No space left on device")
        real_fsync(tmp)

    monkeypatch.setattr(writer, "fsync_file", fsync_until_full)
    result = invoke(*RUN, "-o", str(out))
    assert_usage_error(result, "No space left on device", "--resume")
    manifest = json.loads((out / "manifest.json").read_text())
    assert (manifest["complete"], manifest["num_samples"]) == (False, 2 * failing)
    kept = [f"shard-{i:05d}.safetensors" for i in range(failing)]
    assert [s["file"] for s in manifest["shards"]] == kept
    assert sorted(p.name for p in out.iterdir()) == ["manifest.json", *kept]
    monkeypatch.setattr(writer, "fsync_file", real_fsync)
    assert invoke(*RUN, "-o", str(out), "--resume").exit_code == 0
    assert hookdump.load(out).num_samples == 10


@pytest.mark.parametrize("old_dump", [False, True], ids=["new_folder", "overwrite"])
def test_shards_are_committed_together_every_interval(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, old_dump: bool
) -> None:
    """Each commit syncs the disk, which slows the writes beside it: shards finished within
    COMMIT_EVERY of the run's start or of the last commit go in one, every listed shard on
    disk before the manifest names it, and the end of the run commits at once rather than
    waiting. Over an old dump the first shard is committed at once: it moves the old dump
    aside, and the disk should not hold both for longer. The second batch's forward waits
    for that first commit (an event, not a guess at the machine's speed), so a loaded
    machine cannot finish a second shard before the commit thread takes the first."""
    import threading
    import time

    from torch import nn

    from hookdump.store.write import commit
    from hookdump.store.write.writer import DumpWriter

    out = tmp_path / "d"
    if old_dump:
        assert invoke(*RUN, "-o", str(out)).exit_code == 0
    monkeypatch.setattr(commit, "COMMIT_EVERY", 3600.0)  # an end that waited it out: a hang
    listings: list[tuple[bool, list[str]]] = []
    first_commit = threading.Event()
    real_write_manifest = DumpWriter.write_manifest

    def spy(
        self: DumpWriter, complete: bool, extra: Any = None, stats: Any = None
    ) -> dict[str, Any]:
        files = [s.file for s in self.shards]
        assert all((self.out / f).is_file() for f in files)
        listings.append((complete, files))
        written = real_write_manifest(self, complete, extra, stats)
        first_commit.set()
        return written

    monkeypatch.setattr(DumpWriter, "write_manifest", spy)
    model = nn.Sequential(nn.Linear(4, 4))
    calls = [0]

    def after_the_first_commit(_: nn.Module, __: Any) -> None:
        calls[0] += 1
        if old_dump and calls[0] == 2:
            assert first_commit.wait(300), "the first shard was never committed"

    model.register_forward_pre_hook(after_the_first_commit)
    batches = [torch.randn(2, 4) for _ in range(5)]
    started = time.monotonic()
    hookdump.dump(model, batches, out, overwrite=True, shard_size=1, early_stop=False)
    assert time.monotonic() - started < 600  # did not wait out the hour at the end
    files = [f"shard-{i:05d}.safetensors" for i in range(5)]
    assert listings[-1] == (True, files)
    commits = [listed for complete, listed in listings if not complete]
    assert commits == ([files[:1], files] if old_dump else [files])
    assert hookdump.load(out).num_samples == 10


def test_resume_under_torchrun_refuses_a_dump_of_another_shape(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from hookdump.engine.distributed import Ranks
    from hookdump.engine.options import RunOptions
    from hookdump.engine.resume import previous_dump
    from hookdump.inputs.samples import InputOptions
    from hookdump.model.prepare import ModelOptions
    from hookdump.store.write.place import open_place
    from hookdump.store.write.writer import DumpOptions

    out = tmp_path / "d"
    interrupted(out, monkeypatch, at=3)  # one process: manifest.json, incomplete
    options = RunOptions(
        ModelOptions("tiny_models:CtrlC"),
        input=InputOptions(num_samples=10, batch_size=2),
        dump=DumpOptions(out=out),
    )
    with pytest.raises(hookdump.HookdumpError, match="started by one process; resume it without"):
        previous_dump(options, Ranks(rank=1, world=2, local_rank=1), open_place(out, {}, None))

    (out / "manifest.json").unlink()  # as if two torchrun processes had started it
    mine = {"format": "hookdump/1", "complete": False, "processes": 2, "recipe": {},
            "tensors": {}, "shards": [], "num_samples": 0}  # fmt: skip
    (out / "manifest-r01.json").write_text(json.dumps(mine))
    with pytest.raises(hookdump.HookdumpError, match="started by 2 torchrun processes, now 3"):
        previous_dump(options, Ranks(rank=1, world=3, local_rank=1), open_place(out, {}, None))
    # a rank that had written nothing starts its part anew
    fresh = previous_dump(options, Ranks(rank=2, world=3, local_rank=0), open_place(out, {}, None))
    assert fresh is not None and (fresh["shards"], fresh["num_samples"]) == ([], 0)


# --- --resume proves it is the same run ---------------------------------------------------


def test_resume_refuses_weights_that_changed_behind_the_same_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from safetensors.torch import save_file
    from tiny_models import CtrlC

    weights, out = tmp_path / "w.safetensors", tmp_path / "d"
    save_file(CtrlC().state_dict(), weights)
    interrupted(out, monkeypatch, 3, "--weights", str(weights))
    changed = {k: v + 1 for k, v in CtrlC().state_dict().items()}
    save_file(changed, weights)
    line = assert_usage_error(
        invoke(*RUN, "-o", str(out), "--resume", "--weights", str(weights)),
        f"--resume: --weights {weights} is not the file the dump in {out} was made from",
    )
    assert "SHA-256" in line and "--overwrite" in line
    save_file(CtrlC().state_dict(), weights)  # the same bytes again: it goes on
    assert invoke(*RUN, "-o", str(out), "--resume", "--weights", str(weights)).exit_code == 0


def test_resume_refuses_an_input_file_that_changed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import os

    from safetensors.torch import save_file

    data, out = tmp_path / "x.safetensors", tmp_path / "d"
    save_file({"x": torch.randn(10, 2)}, data)
    interrupted(out, monkeypatch, 3, "--input", str(data))
    save_file({"x": torch.randn(10, 2)}, data)  # same size, other values
    os.utime(data, ns=(1, 1))
    assert_usage_error(
        invoke(*RUN, "-o", str(out), "--resume", "--input", str(data)),
        f"--resume: --input file {data} changed (size or modification time)",
    )


def test_resume_names_each_kind_of_change_to_its_sources(tmp_path: Path) -> None:
    from hookdump.engine.resume import check_sources

    before = {"input": [["a.png", 10, 1], ["b.png", 10, 1]], "model": {"path": "m.pt2",
              "sha256": "ab" * 32}}  # fmt: skip
    out = tmp_path
    check_sources(out, before, dict(before))
    cases = {
        "input file c.png was added": {**before, "input": [*before["input"], ["c.png", 1, 1]]},
        "input file b.png changed": {**before, "input": [["a.png", 10, 1], ["b.png", 11, 1]]},
        "input file b.png is no longer among": {**before, "input": [["a.png", 10, 1]]},
        "model m.pt2 is not the file": {**before, "model": {"path": "m.pt2", "sha256": "cd"}},
    }
    for fragment, now in cases.items():
        with pytest.raises(hookdump.HookdumpError, match=fragment):
            check_sources(out, before, now)
    check_sources(out, None, before)  # a dump from before sources were recorded


def test_a_kill_before_the_first_shard_resumes_from_scratch(tmp_path: Path) -> None:
    out, whole = tmp_path / "d", tmp_path / "whole"
    out.mkdir()
    (out / "shard-00000.safetensors.tmp").write_bytes(b"the first shard, cut short by kill -9")
    result = invoke(*RUN, "-o", str(out), "--resume")
    assert result.exit_code == 0, result.stderr
    assert invoke(*RUN, "-o", str(whole)).exit_code == 0
    assert invoke("diff", str(whole), str(out), "--atol", "0", "--rtol", "0").exit_code == 0
    assert not list(out.glob("*.tmp*")) and hookdump.load(out).complete
    (tmp_path / "foreign").mkdir()
    (tmp_path / "foreign" / "notes.txt").write_text("mine")
    assert_usage_error(
        invoke(*RUN, "-o", str(tmp_path / "foreign"), "--resume"),
        "not part of a hookdump dump",
    )


def test_resume_refuses_a_model_whose_definition_changed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An edited config.json of an hf: folder, or an edited source file of a
    module:attribute model's class: rows before and after would come from two models."""
    from tiny_text import CORPUS, tiny_gpt2

    gpt2 = tiny_gpt2(tmp_path / "gpt2")
    corpus = tmp_path / "c.txt"
    corpus.write_text("\n".join(CORPUS * 4) + "\n")
    source = tmp_path / "src" / "edited_model.py"
    source.parent.mkdir()
    source.write_text(
        "from torch import nn\n\nclass Net(nn.Sequential):\n"
        "    def __init__(self):\n        super().__init__(nn.Linear(4, 3), nn.ReLU())\n"
    )
    monkeypatch.syspath_prepend(str(source.parent))
    runs = {
        gpt2 / "config.json": ["run", f"hf:{gpt2}", "--text", str(corpus), "--context-size", "4"],
        source: ["run", "edited_model:Net", "--input-shape", "4"],
    }
    for edited, args in runs.items():
        args = [*args, "-n", "8", "-b", "2", "--shard-size", "1", "-q"]
        out = tmp_path / f"d-{edited.stem}"
        ctrl_c_in_batch(monkeypatch, 3)
        assert invoke(*args, "-o", str(out)).exit_code == 130
        monkeypatch.undo()
        monkeypatch.syspath_prepend(str(source.parent))
        before = edited.read_text()
        comment = "" if edited.suffix == ".json" else "# edited\n"
        edited.write_text(before.replace("1e-05", "2e-05") + comment)
        assert edited.read_text() != before
        result = invoke(*args, "-o", str(out), "--resume")
        assert_usage_error(result, str(edited), "changed since the dump", "--overwrite")
        edited.write_text(before)  # put back: it resumes
        result = invoke(*args, "-o", str(out), "--resume")
        assert result.exit_code == 0, result.stderr


def test_resume_over_a_foreign_manifest_with_no_shards_starts_afresh(tmp_path: Path) -> None:
    out = tmp_path / "d"
    assert invoke(*RUN, "-o", str(out)).exit_code == 0
    manifest = json.loads((out / "manifest.json").read_text())
    for shard in manifest["shards"]:
        (out / shard["file"]).unlink()
    stale = {**manifest, "complete": False, "num_samples": 0, "shards": [], "sample_ids": []}
    stale["tensors"] = {"stale.key": {**manifest["tensors"]["inner.linear_1"], "shape": [99]}}
    (out / "manifest.json").write_text(json.dumps(stale))
    result = invoke(*RUN, "-o", str(out), "--resume")
    assert result.exit_code == 0, result.stderr
    dump = hookdump.load(out)
    assert dump.complete and "stale.key" not in list(dump.keys()) and dump.num_samples == 10

    stale["recipe"] = {**stale["recipe"], "batch_size": 5}  # another run's, even with no shards
    (out / "manifest.json").write_text(json.dumps(stale))
    (out / "shard-00000.safetensors").unlink()  # an incomplete folder again
    assert_usage_error(invoke(*RUN, "-o", str(out), "--resume"), "--batch-size was 5")
