"""A dump's rules, written once over a medium (`store.write.place.DumpPlace`), on every kind
of medium: a folder, a prefix in a bucket of the loopback S3 server, fsspec's `memory://`,
and the in-memory kind no writer was written for (`store.media.memory`): one writer at a
time, the destination checked, an old dump cleared manifest first and only its own files,
a shard committed and checked, strays of a killed run removed, the run's notes gone when
it ends. What differs, a folder's rename and lock against a spool and a lock entry, is the
medium's capabilities, asked nowhere else."""

from __future__ import annotations

import itertools
import json
import os
from pathlib import Path

import pytest

import hookdump
from hookdump.format.manifest import ShardEntry
from hookdump.format.names import MANIFEST, RUNNING, URL_LOCK
from hookdump.store.checksum import file_checksum
from hookdump.store.media import FolderMedium, Medium, open_medium
from hookdump.store.media.memory import MemoryMedium
from hookdump.store.write.place import DumpPlace

_NAMES = itertools.count()
SHARD = "shard-00000.safetensors"


class _Recording(MemoryMedium):
    """The in-memory kind, keeping the order entries are deleted in."""

    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.deleted: list[str] = []

    def delete(self, name: str) -> None:
        self.deleted.append(name)
        super().delete(name)


@pytest.fixture(params=["folder", "s3", "fsspec-memory", "memory"])
def medium(request: pytest.FixtureRequest, tmp_path: Path) -> Medium:
    kind = request.param
    if kind == "folder":
        return FolderMedium(tmp_path / "d")
    if kind == "s3":
        return open_medium(f"{request.getfixturevalue('bucket')}/d")
    if kind == "fsspec-memory":
        return open_medium(f"memory://place-tests/{next(_NAMES)}")
    return _Recording(f"place-{next(_NAMES)}")


def _place(medium: Medium, tmp_path: Path) -> DumpPlace:
    return DumpPlace(medium, tmp_path / "spool")


def _old_dump(medium: Medium) -> None:
    """What a finished run left: a manifest, a shard, its statistics."""
    if isinstance(medium, FolderMedium):
        medium.folder.mkdir(exist_ok=True)
    for name in (SHARD, "stats.safetensors", MANIFEST):
        medium.put(name, b"old " + name.encode())


def test_a_place_is_held_by_one_run_and_its_notes_go_with_it(
    medium: Medium, tmp_path: Path
) -> None:
    place = _place(medium, tmp_path)
    with place.held(main=True, take_over=False) as work:
        assert work.is_dir() and place.work == work
        place.check(overwrite=False)
        place.mark_running("r1", overwrite=False)
        assert json.loads(medium.read(RUNNING) or b"")["run_id"] == "r1"
        other = _place(medium, tmp_path / "other")
        with (
            pytest.raises(hookdump.HookdumpError) as raised,
            other.held(main=True, take_over=False),
        ):
            pass
        line = str(raised.value)
        assert "being written by" in line and "\n" not in line
    assert medium.read(RUNNING) is None and URL_LOCK not in medium.names()
    with _place(medium, tmp_path).held(main=True, take_over=False):  # let go: free again
        pass


def test_the_destination_is_checked(medium: Medium, tmp_path: Path) -> None:
    _old_dump(medium)
    place = _place(medium, tmp_path)
    with place.held(main=True, take_over=True):
        with pytest.raises(hookdump.HookdumpError, match="holds a dump already; pass overwrite"):
            place.check(overwrite=False)
        medium.put("notes.txt", b"mine")
        with pytest.raises(hookdump.HookdumpError, match=r"not part of a hookdump dump \(notes"):
            place.check(overwrite=True)
        medium.delete("notes.txt")
        place.check(overwrite=True)  # a dump's files only: replaced


def test_an_old_dump_goes_manifest_first_once_the_first_shard_is_committed(
    medium: Medium, tmp_path: Path
) -> None:
    _old_dump(medium)
    place = _place(medium, tmp_path)
    with place.held(main=True, take_over=True) as work:
        place.check(overwrite=True)
        assert place.old_present()
        sealed = work / "shard-00000.safetensors.tmp"
        place.claim(sealed.name)
        sealed.write_bytes(os.urandom(1000))
        checksum = file_checksum(sealed, "crc32c")
        assert medium.read(MANIFEST) == b"old manifest.json"  # whole until the commit
        entry = place.commit_shard(sealed, SHARD, checksum)
        place.wait_old()
        assert not place.old_present()
        assert entry["bytes"] == 1000 and entry["crc32c"] == checksum.crc32c
        listed = ShardEntry(SHARD, 0, 1, bytes=1000, crc32c=checksum.crc32c)
        assert place.matches(listed)
        assert not place.matches(ShardEntry(SHARD, 0, 1, bytes=1000, crc32c="00000000"))
        assert not place.matches(ShardEntry(SHARD, 0, 1, bytes=999))
        place.put_manifest(MANIFEST, {"complete": True}, complete=True)
    assert medium.names() == [MANIFEST, SHARD]  # the old statistics gone, nothing else
    assert json.loads(medium.read(MANIFEST) or b"") == {"complete": True}
    if isinstance(medium, _Recording):
        old = [name for name in medium.deleted if name != RUNNING]
        assert old[:3] == [MANIFEST, SHARD, "stats.safetensors"]


def test_what_a_killed_run_left_is_removed_and_nothing_else(medium: Medium, tmp_path: Path) -> None:
    _old_dump(medium)
    medium.put("shard-r01-00000.safetensors", b"a rank's")
    place = _place(medium, tmp_path)
    with place.held(main=True, take_over=True):
        place.remove_strays(lambda name: name.startswith("shard-r01-"))
        place.remove_strays(lambda name: name == "elsewhere.txt")  # not a dump's: never
    assert medium.names() == [MANIFEST, SHARD, "stats.safetensors"]


def test_resuming_keeps_what_is_there(medium: Medium, tmp_path: Path) -> None:
    _old_dump(medium)
    place = _place(medium, tmp_path)
    with place.held(main=True, take_over=True) as work:
        place.check(overwrite=False, keep_old=True)
        assert not place.old_present()
        sealed = work / "shard-00001.safetensors.tmp"
        place.claim(sealed.name)
        sealed.write_bytes(b"new")
        place.commit_shard(sealed, "shard-00001.safetensors", file_checksum(sealed, "crc32c"))
    assert medium.names() == [MANIFEST, SHARD, "shard-00001.safetensors", "stats.safetensors"]


def test_a_dump_in_memory_goes_round_whole_through_the_one_factory(tmp_path: Path) -> None:
    """The third kind is a line in the factory (`mem://NAME`), and every door takes it: a
    dump written there by `hookdump.dump` (spooled: memory renames nothing) reads back, key
    by key and through a shuffled pass, exactly as the same run written to a folder, and
    `inspect --check` finds every shard's checksum good."""
    import torch

    from hookdump.tools.inspect import inspect_dump

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.ReLU(), torch.nn.Linear(5, 3))
    inputs = [torch.randn(4, 6) for _ in range(3)]
    where = f"mem://round-{next(_NAMES)}"
    kwargs = {"shard_size": "200B", "spool": tmp_path / "spool"}
    hookdump.dump(model, inputs, where, **kwargs)
    hookdump.dump(model, inputs, tmp_path / "d", **kwargs)
    held, folder = hookdump.load(where), hookdump.load(tmp_path / "d")
    assert str(held.path) == where and held.complete and len(held.manifest.shards) > 1
    assert held.keys() == folder.keys() == ["0", "1", "2"]
    for key in folder:
        torch.testing.assert_close(held[key], folder[key], rtol=0, atol=0)
    with torch.no_grad():  # and the forward itself computed the last layer's rows
        torch.testing.assert_close(held["2"], model(torch.cat(inputs)), rtol=0, atol=0)
    rows = list(held.batches(["0", "2"], 5, shuffle=True, seed=3, with_index=True))
    order = torch.cat([b["__row__"] for b in rows])
    assert sorted(order.tolist()) == list(range(12))
    torch.testing.assert_close(torch.cat([b["2"] for b in rows]), folder["2"][order])
    checked = inspect_dump(where, check=True)
    assert checked.complete and not checked.problems and checked.shards == len(held.manifest.shards)
    assert checked.checked is not None and not checked.checked.damaged
