"""A dump at a URL reads as the same dump in a folder (issue 34, the read side): the objects
under the prefix are the local layout byte for byte, so a dump uploaded as it is (`aws s3 cp
--recursive`, `fs.put`) is read by `hookdump.load`, `Dump.batches`, `Dump.dataset` and every
command, with ranged requests to a real S3 server on the loopback (moto), never a download.
"""

from __future__ import annotations

import json
from pathlib import Path

import fsspec
import numpy as np
import pytest
import torch
from clitools import invoke
from tiny_models import TwoLinear

import hookdump

X, Y = "linear_1:input.0", "linear_1"
PLANTED = "PLANTED-SECRET-7f3a9c"  # a storage option's value that must never be shown


@pytest.fixture(scope="module")
def local(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """TwoLinear's first layer (input and output) for 37 random rows, in 10 shards."""
    torch.manual_seed(0)
    out = tmp_path_factory.mktemp("url") / "d"
    data = list(torch.rand(37, 2).split(4))
    hookdump.dump(TwoLinear(), data, out, layers="linear_1", capture=("input", "output"),
                  shard_size=1, ids=[f"row-{i}" for i in range(37)])  # fmt: skip
    return out


def _upload(local: Path, url: str) -> None:
    fs, root = fsspec.core.url_to_fs(url, skip_instance_cache=True)
    for file in sorted(local.iterdir()):
        fs.put_file(str(file), f"{root}/{file.name}")


def _objects(url: str) -> list[str]:
    fs, root = fsspec.core.url_to_fs(url, skip_instance_cache=True, use_listings_cache=False)
    return sorted(p.removeprefix(root.split("/")[0] + "/") for p in fs.find(root.split("/")[0]))


def test_a_dump_uploaded_as_it_is_reads_as_the_folder(local: Path, bucket: str) -> None:
    url = f"{bucket}/runs/one"
    _upload(local, url)
    before = _objects(bucket)
    a, b = hookdump.load(local), hookdump.load(url)
    assert str(b.path) == url and b.complete and b.keys() == a.keys() == [X, Y]
    assert b.sample_ids == a.sample_ids == [f"row-{i}" for i in range(37)]
    for key in a:
        assert torch.equal(b[key], a[key]), key
    assert torch.equal(b.row(Y, 21), a.row(Y, 21))
    # the same shuffled pass, batch for batch, with its row numbers
    shuffled = [
        b.batches([X, Y], 5, shuffle=True, seed=3, with_index=True, buffer_bytes=256),
        a.batches([X, Y], 5, shuffle=True, seed=3, with_index=True, buffer_bytes=256),
    ]
    for remote_batch, local_batch in zip(*shuffled, strict=True):
        for name in (X, Y, "__row__"):
            assert torch.equal(remote_batch[name], local_batch[name])
    # rows are what the model computes of their inputs: linear_1 has weights and bias 1
    whole = next(iter(b.batches([X, Y], 37)))
    assert torch.allclose(whole[Y], whole[X].sum(1, keepdim=True) + 1)
    assert repr(b).startswith(f"Dump('{url}', 2 keys, 37 samples)")
    assert _objects(bucket) == before  # reading writes nothing


def test_dataloader_workers_together_read_every_row_once(local: Path, bucket: str) -> None:
    url = f"{bucket}/d"
    _upload(local, url)
    dataset = hookdump.load(url).dataset([Y], 4, shuffle=True, seed=1, with_index=True)
    loader = torch.utils.data.DataLoader(dataset, batch_size=None, num_workers=2)
    rows = sorted(r for batch in loader for r in batch["__row__"].tolist())
    assert rows == list(range(37))


def test_every_command_reads_a_url(local: Path, bucket: str, tmp_path: Path) -> None:
    url = f"{bucket}/d"
    _upload(local, url)
    there, here = invoke("inspect", url, "--json"), invoke("inspect", str(local), "--json")
    assert (there.exit_code, there.stderr) == (0, "")
    found, expected = json.loads(there.stdout), json.loads(here.stdout)
    assert found["path"] == url and found.pop("path") != expected.pop("path")
    assert found == expected
    same = invoke("diff", str(local), url)
    assert (same.exit_code, same.stderr) == (0, ""), same.stdout
    shown = invoke("show", url, Y, "--sample", "3", "-o", str(tmp_path / "y.png"))
    assert shown.exit_code == 0, shown.stderr
    assert (tmp_path / "y.png").stat().st_size > 1000
    exported = invoke("export", url, str(tmp_path / "npy"), "--to", "npy")
    assert exported.exit_code == 0, exported.stderr
    index = json.loads((tmp_path / "npy" / "index.json").read_text())
    values = np.load(tmp_path / "npy" / index[Y]["file"])
    assert torch.equal(torch.from_numpy(values), hookdump.load(local)[Y])


def test_another_protocol_goes_through_the_same_code(local: Path) -> None:
    _upload(local, "memory://hookdump-test/d")
    remote, mine = hookdump.load("memory://hookdump-test/d"), hookdump.load(local)
    assert torch.equal(remote[X], mine[X])


def test_a_url_that_holds_no_dump_is_one_line(bucket: str) -> None:
    empty = invoke("inspect", f"{bucket}/nothing")
    assert empty.exit_code == 2 and empty.stdout == ""
    assert empty.stderr == (
        f"Error: {bucket}/nothing has no manifest.json: not a dump, or its run stopped before "
        "its first shard\n"
    )
    gone = invoke("inspect", "s3://no-such-bucket-hookdump/d")
    assert gone.exit_code == 2 and gone.stderr.startswith("Error: ")
    assert len(gone.stderr.splitlines()) == 1
    bad = invoke("inspect", f"{bucket}/d", "--storage-option", "no-equals-sign")
    assert bad.exit_code == 2
    assert bad.stderr.startswith("Error: --storage-option 'no-equals-sign' is not KEY=VALUE")


def test_no_storage_option_value_is_ever_shown(local: Path, bucket: str) -> None:
    _upload(local, f"{bucket}/d")
    planted = ["--storage-option", f"key={PLANTED}", "--storage-option", f"secret={PLANTED}x"]
    for args in (
        ["inspect", f"{bucket}/d"],
        ["inspect", "s3://no-such-bucket-hookdump/d"],
        ["inspect", f"{bucket}/d", "--json"],
        ["diff", str(local), f"{bucket}/d"],
        ["inspect", f"memory://user:{PLANTED}@host/d"],  # a password in the URL itself
    ):
        result = invoke(*args, *planted)
        assert PLANTED not in result.stdout + result.stderr, args


def test_a_shard_replaced_under_the_manifest_is_refused(local: Path, bucket: str) -> None:
    url = f"{bucket}/d"
    _upload(local, url)
    fs, root = fsspec.core.url_to_fs(url, skip_instance_cache=True)
    fs.pipe_file(f"{root}/{sorted(p.name for p in local.glob('shard-*'))[0]}", b"not a shard")
    with pytest.raises(hookdump.InvalidDump, match=r"shard-00000\.safetensors"):
        hookdump.load(url)[Y]
