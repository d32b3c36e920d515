"""A dump written to a URL (issue 34, the write side), against a real S3 server on the
loopback (moto) spoken to by the real client (s3fs): the same dump as in a folder, one
writer at a time, `--overwrite` touching only the old dump's objects, `--resume` after a
kill keeping the shards that match, and faults that outlast the client's retries ending in
one line. Each test checks the bucket object by object afterwards."""

from __future__ import annotations

import json
import math
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import fsspec
import pytest
import torch
from clitools import assert_recorded, assert_usage_error, finish, hookdump_process, invoke
from s3proxy import FaultProxy, Rule
from tiny_models import TwoLinear

import hookdump

pytestmark = [pytest.mark.usefixtures("in_tests_dir"), pytest.mark.slow]  # run with --heavy
RUN = ["run", "tiny_models:Barrier", "-n", "12", "-b", "2", "--shard-size", "1", "-q"]
PLANTED = "PLANTED-SECRET-94be21"
TESTS = Path(__file__).parent


def _fs() -> Any:
    return fsspec.filesystem("s3", skip_instance_cache=True, use_listings_cache=False)


def objects(bucket: str) -> list[str]:
    """Every object in the bucket, by key."""
    name = bucket.removeprefix("s3://")
    return sorted(p.removeprefix(name + "/") for p in _fs().find(name))


def unfinished(bucket: str) -> list[str]:
    """The keys of the bucket's unfinished multipart uploads."""
    listed = _fs().call_s3("list_multipart_uploads", Bucket=bucket.removeprefix("s3://"))
    return sorted(u["Key"] for u in listed.get("Uploads", []) or [])


def manifest(url: str) -> dict[str, Any]:
    return json.loads(_fs().cat_file(url.removeprefix("s3://") + "/manifest.json"))


def only_the_dump(bucket: str, prefix: str, others: tuple[str, ...] = ()) -> None:
    """The bucket holds the dump at `prefix` (its manifest and the shards it lists, each
    of the size and SHA-256 recorded) and `others`, nothing else, and no unfinished upload."""
    listed = manifest(f"{bucket}/{prefix}")
    assert listed["complete"]
    files = [*listed["shards"], listed["feature_stats"]]  # statistics: checked alike
    shards = [f"{prefix}/{s['file']}" for s in files]
    assert objects(bucket) == sorted([f"{prefix}/manifest.json", *shards, *others])
    assert unfinished(bucket) == []
    fs = _fs()
    for entry in files:
        data = fs.cat_file(f"{bucket.removeprefix('s3://')}/{prefix}/{entry['file']}")
        assert_recorded(entry, data)


def same_dump(a: str | Path, b: str | Path) -> None:
    assert invoke("diff", str(a), str(b), "--atol", "0", "--rtol", "0").exit_code == 0
    da, db = hookdump.load(a), hookdump.load(b)
    assert da.complete and db.complete and da.num_samples == db.num_samples
    assert da.sample_ids == db.sample_ids and da.keys() == db.keys()


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The command's dump in a local folder, made by one uninterrupted run."""
    out = tmp_path_factory.mktemp("ref") / "d"
    cwd = os.getcwd()
    os.chdir(Path(__file__).parent)
    try:
        assert invoke(*RUN, "-o", str(out)).exit_code == 0
    finally:
        os.chdir(cwd)
    return out


def barrier_run(
    tmp_path: Path, url: str, at: int, *extra: str
) -> tuple[subprocess.Popen[str], Path]:
    """The command writing to `url` in a process of its own, waiting inside batch `at`."""
    barrier = tmp_path / f"barrier-{at}"
    barrier.mkdir()
    env = {"HOOKDUMP_TEST_BARRIER_AT": str(at), "HOOKDUMP_TEST_BARRIER": str(barrier)}
    process = hookdump_process(*RUN, "-o", url, *extra, env=env)
    deadline = time.monotonic() + 300  # a bound on a hang, not a guess at the speed
    while not (barrier / "ready").exists():
        assert process.poll() is None, finish(process)
        assert time.monotonic() < deadline, "the run never reached its batch"
        time.sleep(0.01)
    return process, barrier


def test_a_run_to_a_url_is_the_local_dump(reference: Path, bucket: str, tmp_path: Path) -> None:
    spool = tmp_path / "spool"
    result = invoke(*RUN, "-o", f"{bucket}/runs/a", "--spool", str(spool))
    assert result.exit_code == 0, result.stderr
    only_the_dump(bucket, "runs/a")
    assert list(spool.iterdir()) == []  # the spool's own folder is gone
    same_dump(reference, f"{bucket}/runs/a")
    # the objects copied to a folder are a local dump
    copy = tmp_path / "copy"
    _fs().get(f"{bucket.removeprefix('s3://')}/runs/a/", str(copy), recursive=True)
    same_dump(reference, copy)
    assert invoke("inspect", f"{bucket}/runs/a", "--check").exit_code == 0


def test_the_bytes_to_upload_are_said_as_the_run_starts(bucket: str) -> None:
    """Before the run goes on past its first batch, stderr names what it will upload (the
    tensors' bytes, estimated from that batch); a folder's estimate is its disk check."""
    from hookdump.format.dtypes import ITEMSIZE
    from hookdump.format.values import format_bytes

    url = f"{bucket}/said"
    result = invoke(*[a for a in RUN if a != "-q"], "-o", url)
    assert result.exit_code == 0, result.stderr
    listed = manifest(url)
    per_sample = sum(
        math.prod(t["shape"]) * ITEMSIZE[t["dtype"]] for t in listed["tensors"].values()
    )
    line = f"uploading about {format_bytes(per_sample * 12)} to {url}, a few shards at a time"
    assert line in result.stderr.splitlines()
    assert line not in result.stdout
    quiet = invoke(*RUN, "-o", f"{bucket}/quiet")
    assert quiet.exit_code == 0 and quiet.stderr == ""


def test_python_writes_to_a_url(bucket: str, tmp_path: Path) -> None:
    torch.manual_seed(0)
    data = list(torch.rand(9, 2).split(2))
    local = hookdump.dump(TwoLinear(), data, tmp_path / "d", layers="linear_1", shard_size=1)
    remote = hookdump.dump(TwoLinear(), data, f"{bucket}/p", layers="linear_1", shard_size=1,
                           spool=tmp_path / "spool")  # fmt: skip
    assert str(remote.path) == f"{bucket}/p" and remote.complete
    assert torch.equal(remote["linear_1"], local["linear_1"])
    only_the_dump(bucket, "p")


def test_one_writer_at_a_time_and_a_killed_run_resumes_to_the_same_dump(
    reference: Path, bucket: str, tmp_path: Path
) -> None:
    url = f"{bucket}/d"
    first, _ = barrier_run(tmp_path, url, 5)
    for extra in ([], ["--overwrite"], ["--resume"]):  # refused while it runs
        line = assert_usage_error(invoke(*RUN, "-o", url, *extra), f"--out {url}")
        assert "is being written by run" in line and f"pid {first.pid}" in line, line
        assert socket.gethostname()[:20] in line
    first.send_signal(signal.SIGKILL)
    first.communicate(timeout=60)
    assert "d/hookdump.lock" in objects(bucket)  # a killed run cannot remove its lock
    # an upload the killed run left unfinished, and a stray object of its names
    fs = _fs()
    key = "d/shard-00011.safetensors"
    upload = fs.call_s3("create_multipart_upload", Bucket=bucket[5:], Key=key)
    fs.call_s3("upload_part", Bucket=bucket[5:], Key=key, PartNumber=1,
               UploadId=upload["UploadId"], Body=b"x" * (5 << 20))  # fmt: skip
    fs.pipe_file(f"{bucket[5:]}/d/shard-00010.safetensors", b"half")
    line = assert_usage_error(invoke(*RUN, "-o", url), "which is gone", "--resume")
    assert f"pid {first.pid}" in line
    result = invoke(*RUN, "-o", url, "--resume")
    assert result.exit_code == 0, result.stderr
    only_the_dump(bucket, "d")  # no lock, no stray, no unfinished upload
    same_dump(reference, url)
    assert f"run {manifest(url)['run_id']} on" in line  # the lock named the dump's run id


def test_resume_redoes_the_shards_that_do_not_match(
    reference: Path, bucket: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    url = f"{bucket}/d"
    monkeypatch.setenv("HOOKDUMP_TEST_CTRL_C_AT", "5")
    ctrl_c = ["run", "tiny_models:CtrlC", *RUN[2:]]
    assert invoke(*ctrl_c, "-o", url).exit_code == 130
    monkeypatch.delenv("HOOKDUMP_TEST_CTRL_C_AT")
    before = manifest(url)
    assert not before["complete"] and len(before["shards"]) == 4
    assert "d/hookdump.lock" not in objects(bucket)  # Ctrl-C gives the lock back
    # the second shard's bytes changed under the manifest (same size)
    fs, second = _fs(), f"{bucket[5:]}/d/{before['shards'][1]['file']}"
    data = bytearray(fs.cat_file(second))
    data[-1] ^= 0xFF
    fs.pipe_file(second, bytes(data))
    assert invoke(*ctrl_c, "-o", url, "--resume").exit_code == 0
    only_the_dump(bucket, "d")
    same_dump(reference, url)


def test_overwrite_removes_only_the_old_dumps_objects(bucket: str) -> None:
    url = f"{bucket}/run1"
    assert invoke(*RUN, "-n", "4", "-o", url).exit_code == 0
    fs, name = _fs(), bucket[5:]
    siblings = ("run1-notes.txt", "run10/keep.txt", "other/run1/x")
    for key in siblings:
        fs.pipe_file(f"{name}/{key}", b"mine")
    assert_usage_error(invoke(*RUN, "-o", url), "holds a dump already", "--overwrite")
    assert invoke(*RUN, "-o", url, "--overwrite").exit_code == 0
    only_the_dump(bucket, "run1", siblings)
    assert manifest(url)["num_samples"] == 12
    # an object that is not a dump's is never removed
    fs.pipe_file(f"{name}/run1/notes.txt", b"mine")
    assert_usage_error(invoke(*RUN, "-o", url, "--overwrite"), "notes.txt", "not part of")
    assert "run1/notes.txt" in objects(bucket) and manifest(url)["complete"]


@pytest.fixture
def proxy(s3_server: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[FaultProxy]:
    """The fault-injecting proxy in front of the S3 server, as the client's endpoint, with
    the client's retries kept short."""
    faults = FaultProxy(s3_server)
    monkeypatch.setenv("AWS_ENDPOINT_URL", faults.endpoint)
    monkeypatch.setenv("AWS_RETRY_MODE", "standard")
    monkeypatch.setenv("AWS_MAX_ATTEMPTS", "2")
    yield faults
    faults.close()


def test_throttling_and_dropped_connections_are_retried(
    reference: Path, bucket: str, proxy: FaultProxy
) -> None:
    proxy.rules += [
        Rule("PUT", r"/d/shard-00000", 503, times=3),
        Rule("PUT", r"/d/manifest\.json", 503, times=2),
        Rule("PUT", r"/d/shard-00002", "drop", times=2),
    ]
    result = invoke(*RUN, "-o", f"{bucket}/d")
    assert result.exit_code == 0, result.stderr
    assert all(rule.hits == rule.times for rule in proxy.rules)
    only_the_dump(bucket, "d")
    same_dump(reference, f"{bucket}/d")


def test_a_fault_that_outlasts_the_retries_is_one_line_and_resumable(
    reference: Path, bucket: str, proxy: FaultProxy, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AWS_MAX_ATTEMPTS", "1")  # botocore's retries: none (s3fs's remain)
    proxy.rules.append(Rule("PUT", r"/d/shard-00003", 500))
    planted = ["--storage-option", f"key={PLANTED}", "--storage-option", f"secret={PLANTED}x"]
    result = invoke(*RUN, "-o", f"{bucket}/d", *planted)
    line = assert_usage_error(result, "cannot upload", "shard-00003", "--resume")
    assert PLANTED not in result.stdout + result.stderr + json.dumps(manifest(f"{bucket}/d"))
    kept = manifest(f"{bucket}/d")
    assert not kept["complete"] and [s["file"] for s in kept["shards"]] == [
        f"shard-{i:05d}.safetensors" for i in range(3)
    ], line
    assert "d/hookdump.lock" not in objects(bucket)
    assert invoke("inspect", f"{bucket}/d", "--check").exit_code == 1  # incomplete
    proxy.rules.clear()
    result = invoke(*RUN, "-o", f"{bucket}/d", "--resume", *planted)
    assert result.exit_code == 0, result.stderr
    assert PLANTED not in json.dumps(manifest(f"{bucket}/d"))
    assert "key=***" in manifest(f"{bucket}/d")["command"]
    only_the_dump(bucket, "d")
    same_dump(reference, f"{bucket}/d")


def two_nodes(
    tmp_path: Path, url: str, port: int, *extra: str, barrier: Path | None = None
) -> list[subprocess.Popen[str]]:
    """`torchrun --nnodes 2 --node-rank K --nproc-per-node 1` for K = 0, 1, with rendezvous
    on 127.0.0.1, each with its own temporary folder (its spool) and no shared folder; node
    1 waits inside its batch 2 when `barrier` is given."""
    nodes = []
    for node in (0, 1):
        own = tmp_path / f"node{node}"
        own.mkdir(exist_ok=True)
        env = {**os.environ, "TMPDIR": str(own), "OMP_NUM_THREADS": "1"}
        if barrier is not None and node == 1:
            env |= {"HOOKDUMP_TEST_BARRIER_AT": "2", "HOOKDUMP_TEST_BARRIER": str(barrier)}
        command = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2",
                   "--node-rank", str(node), "--nproc-per-node", "1", "--master-addr",
                   "127.0.0.1", "--master-port", str(port), "-m", "hookdump", *RUN, "-n",
                   "11", "-o", url, *extra]  # fmt: skip
        nodes.append(
            subprocess.Popen(
                command,
                cwd=Path(__file__).parent,
                env=env,
                text=True,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                start_new_session=True,
            )
        )
    return nodes


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@pytest.mark.slow
def test_two_nodes_without_a_shared_disk_survive_a_lost_node(bucket: str, tmp_path: Path) -> None:
    url = f"{bucket}/d"
    barrier = tmp_path / "barrier"
    barrier.mkdir()
    first = two_nodes(tmp_path, url, free_port(), barrier=barrier)
    deadline = time.monotonic() + 300  # a bound on a hang, not a guess at the speed
    while not (barrier / "ready").exists():
        assert all(node.poll() is None for node in first), [finish(n) for n in first]
        assert time.monotonic() < deadline, "node 1 never reached its batch"
        time.sleep(0.01)
    # node 1 is lost: its worker and its torchrun, at once
    os.kill(int((barrier / "ready").read_text()), signal.SIGKILL)
    os.killpg(first[1].pid, signal.SIGKILL)
    first[1].communicate(timeout=60)
    code, _, stderr = finish(first[0])
    assert code != 0
    assert "Error: torchrun rank 0: another process of the job stopped" in stderr
    assert "hookdump/engine" not in stderr  # no traceback of hookdump's (torchrun's follows)
    assert "d/manifest.json" not in objects(bucket)
    again = two_nodes(tmp_path, url, free_port(), "--resume")
    for node in again:
        code, _, stderr = finish(node)
        assert code == 0, stderr
    one = tmp_path / "one"
    assert invoke(*RUN, "-n", "11", "-o", str(one)).exit_code == 0
    same_dump(one, url)
    only_the_dump(bucket, "d")
    files = [s["file"] for s in manifest(url)["shards"]]
    assert {f[:10] for f in files} == {"shard-r00-", "shard-r01-"}
    for node in (0, 1):  # each node's spool is gone (the killed run's too, by the next)
        assert not list((tmp_path / f"node{node}").glob("hookdump-spool-*"))


def test_the_spool_holds_a_few_shards_at_most() -> None:
    """While uploads wait, the committer takes SPOOL_SHARDS - 1 shards (the one being
    written makes SPOOL_SHARDS); the next waits for room, given back as each is committed."""
    import threading

    from hookdump.store.write.area import SPOOL_SHARDS, Spool
    from hookdump.store.write.commit import Committer

    release, committed = threading.Event(), []

    class Place:  # as a URL's: each shard goes up at once, a few in the spool at most
        groups_commits = Spool.groups_commits
        in_flight = Spool.in_flight

    class Writer:  # a DumpWriter whose uploads wait for `release`
        place = Place()
        checksum = "crc32c"

        def replaces_old_dump(self) -> bool:
            return False

        def fix_keys(self) -> None:
            pass

        def commit_shards(self, jobs: list[Any]) -> None:
            release.wait()
            committed.extend(jobs)

    class Shard:  # a finished shard, its checksum taken
        def take_checksum(self, algorithm: str) -> None:
            pass

    shards = [Shard() for _ in range(SPOOL_SHARDS - 1)]
    committer = Committer(Writer())  # type: ignore[arg-type]
    for shard in shards:
        committer.commit(shard, None)  # type: ignore[arg-type]
    assert not committer._room.acquire(blocking=False)  # the next shard would wait
    release.set()
    committer.wait()
    assert [shard for shard, _ in committed] == shards
    assert committer._room.acquire(blocking=False)  # room again
    committer.close()


def test_other_protocols_write_through_the_same_code(tmp_path: Path) -> None:
    """`memory://` (an object store with no folders) and `file://` (a local folder made
    for the prefix) get the same objects, and read as the same dump."""
    torch.manual_seed(1)
    data = list(torch.rand(7, 2).split(3))
    local = hookdump.dump(TwoLinear(), data, tmp_path / "d", layers="linear_1", shard_size=1)
    for url in ("memory://hookdump-tests/write", f"file://{tmp_path}/via-url/d"):
        remote = hookdump.dump(TwoLinear(), data, url, layers="linear_1", shard_size=1)
        assert torch.equal(remote["linear_1"], local["linear_1"]) and remote.complete
        fs, root = fsspec.core.url_to_fs(url)
        names = sorted(p.rsplit("/", 1)[-1] for p in fs.find(root))
        shards = [f"shard-{i:05d}.safetensors" for i in range(3)]
        assert names == ["manifest.json", *shards, "stats.safetensors"]
    assert torch.equal(hookdump.load(tmp_path / "via-url" / "d")["linear_1"], local["linear_1"])


@pytest.mark.parametrize("parts", [False, True], ids=["one_put", "multipart"])
def test_crc_sent(
    bucket: str, proxy: FaultProxy, monkeypatch: pytest.MonkeyPatch, tmp_path: Path, parts: bool
) -> None:
    """Every shard upload carries its CRC32C (the test's name is short: its bucket's): the
    request that stores a shard sends `x-amz-checksum-crc32c`, the manifest's CRC32C
    (base64 of its 4 bytes), for the server to check; a multipart upload sends each part's
    and, when it completes, the whole object's (FULL_OBJECT)."""
    import base64

    from hookdump.store.media import url as url_medium

    if parts:  # parts of 5 MiB (S3's least), a shard of about 12 MiB
        monkeypatch.setattr(url_medium, "PART_BYTES", 5 << 20)
    torch.manual_seed(2)
    rows = 3 << 20 if parts else 64  # float32 rows of 1: 12 MiB, or 256 bytes
    url = f"{bucket}/crc"
    model = torch.nn.Sequential(torch.nn.Identity())
    dump = hookdump.dump(model, [torch.randn(rows, 1)], url, layers=["0"], shard_size="1GiB")
    (entry,) = dump.manifest.shards
    want = base64.b64encode(int(str(entry.crc32c), 16).to_bytes(4, "big")).decode()
    sent = [(method, path, headers) for method, path, headers in proxy.headers
            if entry.file in path]  # fmt: skip
    if not parts:
        (put,) = [h for m, p, h in sent if m == "PUT"]
        assert put["x-amz-checksum-crc32c"] == want
        return
    uploaded = [h for m, p, h in sent if m == "PUT" and "partNumber=" in p]
    assert len(uploaded) == 3 and all("x-amz-checksum-crc32c" in h for h in uploaded)
    (completed,) = [h for m, p, h in sent if m == "POST" and "uploadId=" in p]
    assert completed["x-amz-checksum-crc32c"] == want
    assert completed.get("x-amz-checksum-type") == "FULL_OBJECT"
    data = _fs().cat_file(f"{url.removeprefix('s3://')}/{entry.file}")
    assert_recorded(entry.to_json(), data)
