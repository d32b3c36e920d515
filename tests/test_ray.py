"""The Ray Data path (issue 34): `hookdump.ray.dump` on a Ray started by the test (two CPUs,
an actor pool of two), to a folder and to the loopback S3 server. The dump reads as
`hookdump.dump`'s of the same rows and ids; values are the forward's own; an actor killed
mid-part is replaced and its part written once; the folder or prefix holds only the dump."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from clitools import assert_shards_checksummed
from stattools import assert_same_stats
from test_url_write import only_the_dump
from torch import nn

import hookdump
import hookdump.ray
from hookdump.errors import HookdumpError

ray = pytest.importorskip("ray")
pytestmark = pytest.mark.slow  # a Ray of its own: about a minute in all

ROWS, PART, BATCH = 50, 16, 5
LAYERS = ["0", "2"]


@pytest.fixture(scope="module")
def cluster(request: pytest.FixtureRequest) -> Iterator[None]:
    """Ray on this machine only, its workers started with the S3 server's environment
    (where there is one: the URL test skips without it)."""
    import ray.data

    with contextlib.suppress(pytest.skip.Exception):
        request.getfixturevalue("s3_server")

    ray.init(
        num_cpus=2,
        include_dashboard=False,
        log_to_driver=False,
        configure_logging=False,
        _node_ip_address="127.0.0.1",
    )
    ray.data.DataContext.get_current().enable_progress_bars = False
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])  # the test's functions
    try:
        yield
    finally:
        ray.shutdown()


def model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(6, 8), nn.ReLU(), nn.Linear(8, 4)).eval()


def inputs() -> torch.Tensor:
    return torch.randn(ROWS, 6, generator=torch.Generator().manual_seed(1))


def ids() -> list[str]:
    return [f"img-{i:03d}" for i in range(ROWS)]


def dataset() -> Any:
    x = inputs()
    return ray.data.from_items([{"id": i, "x": x[n].numpy()} for n, i in enumerate(ids())])


def as_ray_batches() -> list[torch.Tensor]:
    """The forward batches the Ray path makes: parts of PART rows, each in BATCH-row pieces
    (float32 matmuls give the same bits only for the same batches)."""
    x = inputs()
    return [
        x[start : min(start + BATCH, part + PART, ROWS)]
        for part in range(0, ROWS, PART)
        for start in range(part, min(part + PART, ROWS), BATCH)
    ]


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> hookdump.Dump:
    out = tmp_path_factory.mktemp("ref") / "d"
    return hookdump.dump(model(), as_ray_batches(), out, layers=LAYERS, ids=ids())


def reads_as_reference(dump: hookdump.Dump, reference: hookdump.Dump) -> None:
    """The same keys, rows, ids and manifest fields as `hookdump.dump`'s; the values are
    the forward's own (computed here, whole) and equal `hookdump.dump`'s bit for bit."""
    net, x = model(), inputs()
    with torch.no_grad():
        own = {"0": net[0](x), "2": net(x)}
    assert dump.complete and dump.num_samples == ROWS
    assert list(dump.sample_ids) == ids()
    assert list(dump.keys()) == list(reference.keys()) == LAYERS
    for key in LAYERS:
        torch.testing.assert_close(dump[key], own[key], rtol=1e-5, atol=1e-6)
        assert torch.equal(dump[key], reference[key]), key
    assert set(dump.manifest) == set(reference.manifest)
    assert dump.manifest["input"] == {"source": "ray", "layout": "batches"}
    assert dump.manifest["model"] == reference.manifest["model"]  # the same module, weights
    assert_same_stats(reference, dump)  # the parts' statistics merged


def folder_holds_only_the_dump(out: Path) -> None:
    listed = json.loads((out / "manifest.json").read_text())["shards"]
    expected = ["manifest.json", "stats.safetensors", *(s["file"] for s in listed)]
    assert sorted(os.listdir(out)) == sorted(expected)
    assert_shards_checksummed(out)  # each part's shards, as one process's


def _dies_once(marker: str, row: torch.Tensor) -> Any:
    """A forward that kills its own process (SIGKILL) the first time it meets `row`."""

    def forward(module: nn.Module, batch: torch.Tensor) -> torch.Tensor:
        if (batch == row).all(dim=1).any() and not os.path.exists(marker):
            Path(marker).touch()
            os.kill(os.getpid(), signal.SIGKILL)
        return module(batch)

    return forward


def test_a_killed_actor_is_replaced_and_its_part_written_once(
    cluster: None, reference: hookdump.Dump, tmp_path: Path
) -> None:
    out, marker = tmp_path / "acts", tmp_path / "killed"
    # the second piece of the second part: the killed attempt has listed a shard already
    forward = _dies_once(str(marker), inputs()[PART + BATCH])
    dump = hookdump.ray.dump(
        dataset(),
        model(),
        out,
        layers=LAYERS,
        part_size=PART,
        batch_size=BATCH,
        concurrency=2,
        forward=forward,
    )
    assert marker.exists()  # an actor did die
    reads_as_reference(dump, reference)
    folder_holds_only_the_dump(out)
    assert len({s["file"].split("-")[1] for s in dump.manifest["shards"]}) == 4  # 4 parts


class Tokens(nn.Module):
    """Token ids and a mask in (as a tokenizer's map_batches gives them), a row per sequence
    of [T, 3] out."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(2)
        self.embed = nn.Embedding(20, 4)
        self.mix = nn.Linear(4, 3)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        return self.mix(self.embed(input_ids)) * attention_mask[..., None]


def test_token_sequences_to_a_url(cluster: None, bucket: str) -> None:
    token_ids = torch.randint(0, 20, (ROWS, 8), generator=torch.Generator().manual_seed(3))
    mask = (torch.arange(8) < torch.arange(ROWS)[:, None] % 8 + 1).long()  # right padding
    rows = [
        {"id": n, "input_ids": token_ids[n].numpy(), "attention_mask": mask[n].numpy()}
        for n in range(ROWS)
    ]
    url = f"{bucket}/ray/run1"
    dump = hookdump.ray.dump(
        ray.data.from_items(rows),
        Tokens,
        url,
        layers=["embed", "mix"],
        part_size=PART,
        batch_size=BATCH,
        concurrency=1,
    )
    only_the_dump(bucket, "ray/run1")
    net = Tokens().eval()
    with torch.no_grad():  # the forward's own values, computed here
        torch.testing.assert_close(dump["embed"], net.embed(token_ids))
        torch.testing.assert_close(dump["mix"], net.mix(net.embed(token_ids)))
    assert list(dump.sample_ids) == list(range(ROWS))


def test_an_error_in_a_task_is_its_one_line(tmp_path: Path) -> None:
    """A task's HookdumpError comes back as its row (Ray keeps only a traceback's text of
    an exception), and the driver raises it as it was, its options named; the task's actor
    class run here in this process, as an actor runs it."""
    from hookdump.engine.live import run_options
    from hookdump.engine.on_ray import _collected, _PartWriter, _Task

    options = run_options("m", None, tmp_path / "d", layers="nomatch")
    task = _Task(options, "run-id", "id", ["x"], None, BATCH, "cpu")
    row = _PartWriter(model, task)({"id": np.array(["a", "b"]), "x": np.zeros((2, 6), np.float32)})

    class Mapped:  # what map_batches gives back: every task's row
        def take_all(self) -> list[dict[str, Any]]:
            return [{"part": row["part"][0], "done": row["done"][0]}]

    with pytest.raises(HookdumpError, match=r"^layers 'nomatch' matches no module") as failed:
        _collected(Mapped())
    assert "\n" not in str(failed.value)
    assert not (tmp_path / "d").exists()  # the part wrote nothing
    fine = _Task(run_options("m", None, tmp_path / "d"), "run-id", "id", ["x"], None, 2, "cpu")
    row = _PartWriter(model, fine)({"id": np.array(["a", "b"]), "x": np.array(["no", "ok"])})
    with pytest.raises(HookdumpError, match=r"^column 'x' holds <U2 values, not tensors"):
        _collected(Mapped())


def test_a_pool_that_fills_every_cpu_still_runs(cluster: None, tmp_path: Path) -> None:
    """Two actors on this cluster's two CPUs, and a dataset that needs Ray Data's own tasks
    (a read and a map, a CPU each): the actors ask for less than a CPU each, so the tasks
    run (with a CPU each, the job waited for ever: "pending: 1 CPU"). The dump is the
    reference's, rows and ids. A GPU the cluster lacks is one line."""
    import threading

    x = inputs().numpy()
    dataset = ray.data.range(ROWS).map(
        lambda row: {"id": f"img-{row['id']:03d}", "x": x[row["id"]]}
    )
    done: dict[str, Any] = {}

    def dump() -> None:
        done["dump"] = hookdump.ray.dump(
            dataset, model, tmp_path / "d", layers=LAYERS, batch_size=BATCH, part_size=PART,
            concurrency=2,
        )  # fmt: skip

    thread = threading.Thread(target=dump, daemon=True)
    thread.start()
    thread.join(300)  # a bound on a hang, not a guess at the speed
    assert not thread.is_alive(), "the job waits for a CPU"
    dump = done["dump"]
    assert dump.complete and dump.sample_ids == ids()
    with torch.no_grad():  # the forward's own, whole (batches cut elsewhere: not bitwise)
        torch.testing.assert_close(dump["2"], model()(inputs()), rtol=1e-5, atol=1e-6)
    with pytest.raises(HookdumpError, match=r"^the Ray cluster has 0 GPUs: 2 actors of num_gpus"):
        hookdump.ray.dump(dataset, model, tmp_path / "g", concurrency=2, num_gpus=1)


def test_a_dead_runs_lock_offers_the_ray_paths_own_next_step(cluster: None, bucket: str) -> None:
    """The Ray path has no `resume`: a lock a killed run left is refused with `overwrite`
    as the way on, and taken over with it."""
    import json

    import fsspec

    fs = fsspec.filesystem("s3", skip_instance_cache=True)
    lock = {"run_id": "r1", "host": "elsewhere", "pid": 12, "started": 1.0, "beat": 1.0}
    fs.pipe_file(f"{bucket[5:]}/d/hookdump.lock", json.dumps(lock).encode())
    with pytest.raises(HookdumpError) as refused:
        hookdump.ray.dump(dataset(), model, f"{bucket}/d", layers=LAYERS)
    line = str(refused.value)
    assert "which is gone; pass overwrite=True to replace it" in line, line
    assert "resume" not in line
    dump = hookdump.ray.dump(dataset(), model, f"{bucket}/d", layers=LAYERS, overwrite=True)
    assert dump.complete and not fs.exists(f"{bucket[5:]}/d/hookdump.lock")


def test_rows_without_an_id_are_refused_in_one_line(cluster: None, tmp_path: Path) -> None:
    """An integer id column with a missing value arrives as floats and NaN (a string
    column's as None): refused, never written as float ids and 'nan' in the manifest."""
    x = inputs()
    for kind, missing in ((int, None), (int, float("nan")), (str, None)):
        rows: list[dict[str, Any]] = [{"id": kind(n), "x": x[n].numpy()} for n in range(6)]
        rows[3]["id"] = missing
        with pytest.raises(HookdumpError, match=r"^id_column 'id' has rows without an id"):
            hookdump.ray.dump(ray.data.from_items(rows), model, tmp_path / "d")
        assert not (tmp_path / "d" / "manifest.json").exists()


def test_checked_before_ray_runs_anything(cluster: None, tmp_path: Path) -> None:
    """Wrong arguments are named in one line before any task starts, and `out` is left
    as it was."""
    with pytest.raises(HookdumpError, match=r"must be a ray\.data\.Dataset, not list"):
        hookdump.ray.dump([1, 2], model, tmp_path / "a")
    with pytest.raises(HookdumpError, match=r"^id_column 'key' is not a column .*id, x"):
        hookdump.ray.dump(dataset(), model, tmp_path / "a", id_column="key")
    with pytest.raises(HookdumpError, match=r"^columns pixels: the model's input"):
        hookdump.ray.dump(dataset(), model, tmp_path / "a", columns="pixels")
    with pytest.raises(TypeError, match="per_token"):
        hookdump.ray.dump(dataset(), model, tmp_path / "a", per_token=True)  # type: ignore[call-arg]
    assert not (tmp_path / "a").exists()


def test_without_ray_installed(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setitem(sys.modules, "ray", None)  # `import ray` raises ImportError
    with pytest.raises(HookdumpError, match=r"needs Ray Data: pip install 'hookdump\[ray\]'"):
        hookdump.ray.dump(object(), model, tmp_path / "a")


_SIGTERM_SCRIPT = """
import sys, time
import ray, ray.data, torch
from torch import nn
import hookdump, hookdump.ray

ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False,
         _node_ip_address="127.0.0.1")
ready = sys.argv[2]

class Waits(nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(6, 4)

    def forward(self, x):
        open(ready, "w").write("in the forward")
        time.sleep(600)
        return self.linear(x)

rows = [{"id": n, "x": torch.zeros(6).numpy()} for n in range(4)]
try:
    hookdump.ray.dump(ray.data.from_items(rows), Waits, sys.argv[1])
except hookdump.Interrupted as exc:
    print(f"{exc.exit_code} {exc}", flush=True)
"""


def test_sigterm_ends_the_ray_driver_with_its_line_and_gives_the_lock_back(
    cluster: None, bucket: str, tmp_path: Path
) -> None:
    """ray.init's own SIGTERM handler left the driver with a bare SystemExit (or an abort)
    and the URL's lock behind; now SIGTERM is the run's: `Interrupted` (143) saying how to
    go on, and the lock given back."""
    import subprocess
    import time

    import fsspec

    ready = tmp_path / "ready"
    driver = subprocess.Popen(
        [sys.executable, "-c", _SIGTERM_SCRIPT, f"{bucket}/d", str(ready)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 300  # a bound on a hang, not a guess at the speed
    while not ready.exists():
        assert driver.poll() is None, driver.communicate()
        assert time.monotonic() < deadline, "no task reached its forward"
        time.sleep(0.05)
    fs = fsspec.filesystem("s3", skip_instance_cache=True, use_listings_cache=False)
    assert fs.exists(f"{bucket[5:]}/d/hookdump.lock")
    driver.send_signal(signal.SIGTERM)
    stdout, stderr = driver.communicate(timeout=300)
    assert stdout.startswith("143 the Ray job stopped before its parts were joined"), stderr
    assert "overwrite=True" in stdout
    assert not fs.exists(f"{bucket[5:]}/d/hookdump.lock")
