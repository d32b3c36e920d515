"""The dump's file-name grammar (`format.names`): every name a writer or a follower makes is
one the parsers read back as what it is, and the folder's check (`DUMP_FILE`) takes it as
the dump's; names that are not the dump's are not."""

from __future__ import annotations

import pytest

from hookdump.format import names
from hookdump.format.names import (
    DUMP_FILE,
    LEFTOVER,
    MANIFEST,
    RANK_MANIFEST,
    SHARD_FILE,
    WAITING_FILE,
    FileNames,
    part_files,
    rank_files,
)

WRITERS = [FileNames(), rank_files(0), rank_files(13), part_files("00ff3a")]


@pytest.mark.parametrize("writer", WRITERS, ids=lambda w: w.manifest)
def test_a_writers_names_are_the_dumps(writer: FileNames) -> None:
    made = [writer.shard(0), writer.shard(12345), writer.manifest, writer.waiting]
    for name in made + [names.temporary(n) for n in made]:
        assert DUMP_FILE.match(name), name
    assert not LEFTOVER.search(writer.shard(7)) and LEFTOVER.search(
        names.temporary(writer.shard(7))
    )
    assert WAITING_FILE.match(writer.waiting)
    assert writer.own_manifest is (writer.manifest != MANIFEST)


def test_a_shards_name_says_whose_and_which_it_is() -> None:
    one, rank, part = FileNames().shard(42), rank_files(3).shard(7), part_files("ab").shard(1)
    assert (one, rank, part) == (
        "shard-00042.safetensors",
        "shard-r03-00007.safetensors",
        "shard-pab-00001.safetensors",
    )
    found = [SHARD_FILE.match(n) for n in (one, rank, part)]
    assert [(f["rank"], f["part"], int(f["index"])) for f in found if f] == [
        (None, None, 42),
        ("03", None, 7),
        (None, "ab", 1),
    ]
    ranks = RANK_MANIFEST.match(rank_files(3).manifest)
    assert ranks is not None and ranks[1] == "03"
    assert not RANK_MANIFEST.match(part_files("ab").manifest)
    assert names.PART_FILE.match(part) and not names.PART_FILE.match(rank)


def test_a_followers_files() -> None:
    made = [names.follow_file("a.b-1"), names.inside_file("a.b-1"), names.follow_lock("a.b-1")]
    assert all(names.is_follower_file(n) and DUMP_FILE.match(n) for n in made)
    assert names.follower_of(made[0]) == "a.b-1"
    assert names.follower_of(made[1]) is None  # the rows inside, not the progress
    assert not names.is_follower_file("follow-a b.json")
    assert names.FOLLOWER_NAME.match("x" * 64) and not names.FOLLOWER_NAME.match("x" * 65)


@pytest.mark.parametrize(
    "name",
    [
        "notes.txt",
        "shard-00001.safetensors.bak",
        "shard-x1-00001.safetensors",
        "manifest.json~",
        "stats.json",
        "follow-.json",
        "hookdump.lock",  # a URL's lock: its place ignores it by name, never as a dump file
    ],
)
def test_names_that_are_not_the_dumps(name: str) -> None:
    assert not DUMP_FILE.match(name)
    assert not SHARD_FILE.match(name)
