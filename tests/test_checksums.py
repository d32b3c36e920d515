"""Every shard checksummed, everywhere (issue 44): each shard entry of a manifest records
the shard's size and SHA-256, in a folder and at a URL (compared with `hashlib` over the
file's bytes), and `inspect --check` reads every shard against them: one byte flipped
inside a shard (its size unchanged) is exit 1 naming the shard; a dump from before the
checksums is checked by size and says so."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import fsspec
import pytest
import torch
from clitools import invoke

import hookdump


def _fs(where: Path | str) -> tuple[Any, str]:
    if isinstance(where, Path):
        return fsspec.filesystem("file"), str(where)
    fs = fsspec.filesystem("s3", skip_instance_cache=True, use_listings_cache=False)
    return fs, where.removeprefix("s3://")


def _dump(where: Path | str, samples: int = 24) -> dict[str, Any]:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 64), torch.nn.ReLU(), torch.nn.Linear(64, 32))
    data = [torch.randn(4, 4) for _ in range(samples // 4)]
    hookdump.dump(model, data, where, layers=["0", "2"], shard_size="1KiB")
    fs, root = _fs(where)
    return dict(json.loads(fs.cat_file(f"{root}/manifest.json")))


def _flip(where: Path | str, name: str, at: int) -> None:
    """One bit of byte `at` of shard `name` flipped; the shard keeps its size."""
    fs, root = _fs(where)
    data = bytearray(fs.cat_file(f"{root}/{name}"))
    data[at] ^= 1
    fs.pipe_file(f"{root}/{name}", bytes(data))


def test_every_shard_entry_records_its_size_and_sha256(
    place: Callable[[str], Path | str],
) -> None:
    where = place("recorded")
    listed = _dump(where)
    fs, root = _fs(where)
    assert len(listed["shards"]) > 2
    for entry in listed["shards"]:
        data = fs.cat_file(f"{root}/{entry['file']}")
        assert (entry["bytes"], entry["sha256"]) == (len(data), hashlib.sha256(data).hexdigest())
    ok = invoke("inspect", str(where), "--check")
    assert ok.exit_code == 0, ok.stderr
    assert f"checked: sizes and SHA-256 of {len(listed['shards'])} shards" in ok.stdout
    assert ok.stderr == ""


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
    assert "SHA-256" in line
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
        del entry["bytes"], entry["sha256"]
    (out / "manifest.json").write_text(json.dumps(listed))
    result = invoke("inspect", str(out), "--check")
    assert result.exit_code == 0, result.stderr
    assert "checked: sizes only of" in result.stdout
    assert "records no SHA-256" in result.stdout
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
    assert final[1]["sha256"] == damaged["sha256"]  # written again, the same bytes
