"""Every shard checksummed, everywhere (issues 44, 55): each shard entry of a manifest
records the shard's size and CRC32C (or, with `checksum="sha256"`, its SHA-256), in a folder
and at a URL (compared with awscrt's CRC32C and `hashlib` over the file's bytes), and
`inspect --check` reads every shard against them: one byte flipped inside a shard (its size
unchanged) is exit 1 naming the shard; a dump from before the checksums is checked by size
and says so."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import fsspec
import pytest
import torch
from clitools import independent_checksum, invoke

import hookdump


def _fs(where: Path | str) -> tuple[Any, str]:
    if isinstance(where, Path):
        return fsspec.filesystem("file"), str(where)
    fs = fsspec.filesystem("s3", skip_instance_cache=True, use_listings_cache=False)
    return fs, where.removeprefix("s3://")


def _dump(where: Path | str, samples: int = 24, checksum: str = "crc32c") -> dict[str, Any]:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 64), torch.nn.ReLU(), torch.nn.Linear(64, 32))
    data = [torch.randn(4, 4) for _ in range(samples // 4)]
    hookdump.dump(model, data, where, layers=["0", "2"], shard_size="1KiB",
                  checksum=checksum)  # type: ignore[arg-type]  # fmt: skip
    fs, root = _fs(where)
    return dict(json.loads(fs.cat_file(f"{root}/manifest.json")))


def _flip(where: Path | str, name: str, at: int) -> None:
    """One bit of byte `at` of shard `name` flipped; the shard keeps its size."""
    fs, root = _fs(where)
    data = bytearray(fs.cat_file(f"{root}/{name}"))
    data[at] ^= 1
    fs.pipe_file(f"{root}/{name}", bytes(data))


def test_every_shard_entry_records_its_size_and_crc32c(
    place: Callable[[str], Path | str],
) -> None:
    """The CRC32C taken as the shard was written (hookdump's) is awscrt's of the whole file."""
    where = place("recorded")
    listed = _dump(where)
    fs, root = _fs(where)
    assert len(listed["shards"]) > 2
    for entry in listed["shards"]:
        data = fs.cat_file(f"{root}/{entry['file']}")
        assert "sha256" not in entry and len(entry["crc32c"]) == 8
        assert (entry["bytes"], entry["crc32c"]) == (len(data), independent_checksum(data))
    ok = invoke("inspect", str(where), "--check")
    assert ok.exit_code == 0, ok.stderr
    assert f"checked: sizes and CRC32C of {len(listed['shards'])} shards" in ok.stdout
    assert ok.stderr == ""


def test_checksum_sha256_records_sha256_and_either_verifies(tmp_path: Path) -> None:
    where = tmp_path / "sha"
    listed = _dump(where, checksum="sha256")
    for entry in listed["shards"]:
        data = (where / entry["file"]).read_bytes()
        assert "crc32c" not in entry
        assert (entry["bytes"], entry["sha256"]) == (len(data), hashlib.sha256(data).hexdigest())
    ok = invoke("inspect", str(where), "--check")
    assert ok.exit_code == 0 and "sizes and SHA-256 of" in ok.stdout
    bad = listed["shards"][1]
    _flip(where, bad["file"], bad["bytes"] - 3)
    result = invoke("inspect", str(where), "--check")
    assert result.exit_code == 1 and "SHA-256" in result.stderr and bad["file"] in result.stderr
    with pytest.raises(hookdump.HookdumpError, match="checksum 'md5' is not a checksum hookdump"):
        _dump(tmp_path / "x", checksum="md5")


def test_a_flipped_byte_is_exit_1_naming_the_shard(place: Callable[[str], Path | str]) -> None:
    where = place("flipped")
    listed = _dump(where)
    bad = listed["shards"][1]
    _flip(where, bad["file"], bad["bytes"] - 3)  # in the data, far from the header
    result = invoke("inspect", str(where), "--check")
    assert result.exit_code == 1
    assert "DAMAGED" in result.stdout
    (line,) = result.stderr.splitlines()
    assert line.startswith(f"warning: {where} is a damaged dump: shard ")
    assert bad["file"] in line and f"samples {bad['start']}:{bad['stop']}" in line
    assert "CRC32C" in line
    as_json = json.loads(invoke("inspect", str(where), "--check", "--json").stdout)
    assert as_json["damaged"] is True and as_json["complete"] is False
    # without --check the shards are read for their statistics, not hashed: exit 0
    assert invoke("inspect", str(where)).exit_code == 0


def test_several_bad_shards_the_first_is_named_and_the_rest_counted(tmp_path: Path) -> None:
    listed = _dump(tmp_path / "d")
    for entry in listed["shards"][2:5]:
        _flip(tmp_path / "d", entry["file"], entry["bytes"] - 1)
    result = invoke("inspect", str(tmp_path / "d"), "--check")
    assert result.exit_code == 1
    assert listed["shards"][2]["file"] in result.stderr
    assert "(and 2 more shards fail)" in result.stderr


def test_a_dump_from_before_the_checksums_is_checked_by_size(tmp_path: Path) -> None:
    out = tmp_path / "old"
    listed = _dump(out)
    for entry in listed["shards"]:
        del entry["bytes"], entry["crc32c"]
    (out / "manifest.json").write_text(json.dumps(listed))
    result = invoke("inspect", str(out), "--check")
    assert result.exit_code == 0, result.stderr
    assert "checked: sizes only of" in result.stdout
    assert "records no checksum" in result.stdout
    cut = listed["shards"][0]["file"]
    with open(out / cut, "r+b") as file:  # a shard cut short is still found
        file.truncate(100)
    result = invoke("inspect", str(out), "--check")
    assert result.exit_code == 1
    assert cut in result.stderr


def test_a_size_that_differs_is_named(tmp_path: Path) -> None:
    out = tmp_path / "grown"
    listed = _dump(out)
    name = listed["shards"][0]["file"]
    with open(out / name, "ab") as file:
        file.write(b"\0")
    result = invoke("inspect", str(out), "--check")
    assert result.exit_code == 1
    assert f"{name} is {listed['shards'][0]['bytes'] + 1} bytes" in result.stderr


def test_resume_rechecks_what_it_keeps_and_redoes_a_damaged_shard(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, in_tests_dir: Path
) -> None:
    """A folder's `--resume` keeps the listed shards up to the first whose bytes differ from
    their manifest entry, as a URL's does; the dump then equals an uninterrupted run's."""
    run = ["run", "tiny_models:CtrlC", "-n", "10", "-b", "2", "--shard-size", "1", "-q"]
    out, whole = tmp_path / "resumed", tmp_path / "whole"
    monkeypatch.setenv("HOOKDUMP_TEST_CTRL_C_AT", "4")
    assert invoke(*run, "-o", str(out)).exit_code == 130
    monkeypatch.delenv("HOOKDUMP_TEST_CTRL_C_AT")
    listed = json.loads((out / "manifest.json").read_text())["shards"]
    assert len(listed) == 3
    damaged = listed[1]
    _flip(out, damaged["file"], damaged["bytes"] - 2)
    result = invoke(*run, "-o", str(out), "--resume")
    assert result.exit_code == 0, result.stderr
    assert invoke(*run, "-o", str(whole)).exit_code == 0
    assert invoke("diff", str(whole), str(out), "--atol", "0", "--rtol", "0").exit_code == 0
    assert invoke("inspect", str(out), "--check").exit_code == 0
    final = json.loads((out / "manifest.json").read_text())["shards"]
    assert final[0] == listed[0]  # kept as it was
    assert final[1]["crc32c"] == damaged["crc32c"]  # written again, the same bytes


@pytest.mark.parametrize("direct", ["1", "0"], ids=["o_direct", "page_cache"])
def test_the_crc_taken_as_written_is_the_whole_files(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, direct: str
) -> None:
    """Appended shards (a header that outgrows its room: the data moved once; a block-aligned
    tensor written from its own memory) and planned shards (rows written in place, key by
    key, across several staging buffers and partial blocks; one that ends short compacted):
    the CRC32C folded from the pieces as they were written (on the disk thread, where
    O_DIRECT is used) is awscrt's over the finished file."""
    from hookdump.store.write import direct_io
    from hookdump.store.write.shards import PlannedShard, ShardFile

    monkeypatch.setenv("HOOKDUMP_DIRECT_IO", direct)
    monkeypatch.setattr(direct_io, "STAGE_BYTES", 4 * direct_io.BLOCK)
    torch.manual_seed(0)
    released: list[int] = []
    appended = ShardFile(tmp_path / "a.safetensors", reserve=64)  # far too small a header
    for n in range(40):
        appended.write(f"key.{n}", torch.randn(30, 5 + n))
        aligned = torch.randn(8 * direct_io.BLOCK + 3)  # whole blocks lent, a tail staged
        appended.write(f"big.{n}", aligned, lambda n=n: released.append(n))
    appended.finish({"format": "test"})
    assert released == list(range(40))
    layout = [("x", torch.float32, [7001]), ("y", torch.int64, [2]), ("z", torch.float16, [3])]
    planned = PlannedShard(tmp_path / "p.safetensors", layout, rows=10)
    for start in (0, 3):  # 6 of the 10 rows planned: compacted when finished
        planned.write_rows("x", start, torch.randn(3, 7001))
        planned.write_rows("y", start, torch.randint(0, 9, (3, 2)))
        planned.write_rows("z", start, torch.randn(3, 3).half())
    planned.finish({"format": "test"})
    for shard in (appended, planned):
        assert shard.sealed is not None and shard.crc is not None
        data = shard.sealed.read_bytes()
        taken = shard.take_checksum("crc32c")
        assert (taken.bytes, taken.crc32c) == (len(data), independent_checksum(data))
    from safetensors.torch import load_file

    assert load_file(planned.sealed)["y"].shape == (6, 2)  # a real, compacted file


def test_a_planned_shard_written_out_of_order_is_read_back(tmp_path: Path) -> None:
    from hookdump.store.write.shards import PlannedShard

    planned = PlannedShard(tmp_path / "p.safetensors", [("x", torch.float32, [4])], rows=6)
    planned.write_rows("x", 3, torch.randn(3, 4))
    planned.write_rows("x", 0, torch.randn(3, 4))
    planned.finish({"format": "test"})
    assert planned.crc is None  # not every byte was seen in order
    data = planned.sealed.read_bytes() if planned.sealed else b""
    assert planned.take_checksum("crc32c").crc32c == independent_checksum(data)


def test_crc32c_combine_is_the_crc_of_the_whole() -> None:
    import os

    from awscrt.checksums import crc32c

    from hookdump.store.checksum import combine

    for first, second in [(0, 0), (0, 9), (9, 0), (1, 1), (100, 4096), (4097, 1 << 20)]:
        a, b = os.urandom(first), os.urandom(second)
        assert combine(crc32c(a), crc32c(b), len(b)) == crc32c(a + b)
