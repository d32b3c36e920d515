"""Dumps are untrusted input: a table of hostile dumps fed to `inspect`, `diff`, `show` and
`hookdump.load()`.

Each must end in exit 2 with one `Error:` line (the API: one `InvalidDump`), no traceback,
no hang, and nothing outside the dump read or written: the files outside hold a marker
string and the value 7777, and neither may ever show up in any output.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import struct
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from clitools import ENV, invoke
from safetensors.torch import save_file
from typer.testing import Result

import hookdump

MARKER = "MARKER-outside-the-dump-51c9"
OUTSIDE_VALUE = 7777.0
KEYS = ["linear_1", "relu", "linear_2", "relu6"]
TIMEOUT = 300.0  # a hang, not a slow machine: a loaded one took 20 s for what takes 6


@pytest.fixture(scope="module")
def base(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A good dump of two shards (rows 0:2 and 2:4)."""
    from tiny_models import TwoLinear

    root = tmp_path_factory.mktemp("base")
    data = list(torch.rand(4, 2, generator=torch.Generator().manual_seed(0)).split(2))
    hookdump.dump(TwoLinear(), data, root / "dump", shard_size=1)
    return root / "dump"


def _outside(root: Path) -> Path:
    """Files outside the dump that a hostile manifest points at."""
    outside = root / "outside"
    outside.mkdir()
    save_file({k: torch.full((2, 2), OUTSIDE_VALUE) for k in KEYS}, outside / "evil.safetensors")
    (outside / "secret.txt").write_text(MARKER)
    return outside


def _manifest(dump: Path) -> dict[str, Any]:
    return json.loads((dump / "manifest.json").read_text())


def _edit(change: Callable[[dict[str, Any]], Any]) -> Callable[[Path, Path], None]:
    def apply(dump: Path, outside: Path) -> None:
        manifest = _manifest(dump)
        replaced = change(manifest)
        data = manifest if replaced is None else replaced
        (dump / "manifest.json").write_text(json.dumps(data))

    return apply


def _set(path: str, value: Any) -> Callable[[Path, Path], None]:
    def change(manifest: dict[str, Any]) -> None:
        *parents, last = path.split("/")
        node: Any = manifest
        for part in parents:
            node = node[int(part)] if isinstance(node, list) else node[part]
        node[int(last) if isinstance(node, list) else last] = value

    return _edit(change)


def _replace_shard(make: Callable[[Path, Path], None]) -> Callable[[Path, Path], None]:
    def apply(dump: Path, outside: Path) -> None:
        shard = dump / "shard-00000.safetensors"
        shard.unlink()
        make(shard, outside)

    return apply


def _write_manifest(data: bytes) -> Callable[[Path, Path], None]:
    def apply(dump: Path, outside: Path) -> None:
        (dump / "manifest.json").write_bytes(data)

    return apply


def _manifest_link(dump: Path, outside: Path) -> None:
    copy = outside / "manifest.json"
    shutil.copy(dump / "manifest.json", copy)
    (dump / "manifest.json").unlink()
    (dump / "manifest.json").symlink_to(copy)


def _truncated(shard: Path, outside: Path) -> None:
    save_file({k: torch.zeros(2, 2) for k in KEYS}, shard)
    shard.write_bytes(shard.read_bytes()[:-20])


def _huge_header(shard: Path, outside: Path) -> None:
    shard.write_bytes((1 << 60).to_bytes(8, "little") + b"{}")


def _missing_key(shard: Path, outside: Path) -> None:
    save_file({k: torch.zeros(2, 2) for k in KEYS[:-1]}, shard)


def _wrong_shape(shard: Path, outside: Path) -> None:
    save_file({k: torch.zeros(2, 3) for k in KEYS}, shard)


def _fifo_manifest(dump: Path, outside: Path) -> None:
    (dump / "manifest.json").unlink()
    os.mkfifo(dump / "manifest.json")


def _more_rows(manifest: dict[str, Any]) -> None:
    manifest["shards"][1]["stop"] = manifest["num_samples"] = 40


HOSTILE: dict[str, Callable[[Path, Path], None]] = {
    "absolute shard path": lambda d, o: _set("shards/0/file", str(o / "evil.safetensors"))(d, o),
    "shard path with ..": _set("shards/0/file", "../outside/evil.safetensors"),
    "shard in a subfolder": _set("shards/0/file", "sub/shard-00000.safetensors"),
    "shard name with a NUL": _set("shards/0/file", "shard\x00.safetensors"),
    "shard named ..": _set("shards/0/file", ".."),
    "one shard listed twice": _set("shards/1/file", "shard-00000.safetensors"),
    "shard symlink out of the dump": _replace_shard(
        lambda s, o: s.symlink_to(o / "evil.safetensors")
    ),
    "dangling shard symlink": _replace_shard(lambda s, o: s.symlink_to(o / "nothing")),
    "shard is a FIFO": _replace_shard(lambda s, o: os.mkfifo(s)),
    "shard is a folder": _replace_shard(lambda s, o: s.mkdir()),
    "shard is not safetensors": _replace_shard(lambda s, o: s.write_bytes(b"\x00" * 64)),
    "shard cut short": _replace_shard(_truncated),
    "shard header of 2**60 bytes": _replace_shard(_huge_header),
    "shard lacks a listed key": _replace_shard(_missing_key),
    "shard shape unlike the manifest": _replace_shard(_wrong_shape),
    "manifest symlink out of the dump": _manifest_link,
    "manifest is a FIFO": _fifo_manifest,
    "manifest is not JSON": _write_manifest(b"{not json"),
    "manifest is binary": _write_manifest(bytes(range(256)) * 4),
    "manifest is empty": _write_manifest(b""),
    "manifest nested 100000 deep": _write_manifest(b"[" * 100_000 + b"]" * 100_000),
    "manifest is an array": _edit(lambda m: [m]),
    "manifest of another format": _set("format", "hookdump/99"),
    "shards is a string": _set("shards", "shard-00000.safetensors"),
    "shards is missing": _edit(lambda m: {k: v for k, v in m.items() if k != "shards"}),
    "num_samples is a string": _set("num_samples", "4"),
    "num_samples beyond the shards": _set("num_samples", 400),
    "num_samples is negative": _set("num_samples", -1),
    "complete is a string": _set("complete", "yes"),
    "tensors is a list": _set("tensors", KEYS),
    "a tensor entry is a string": _set("tensors/relu", "relu"),
    "a shape is a string": _set("tensors/relu/shape", "2"),
    "a shape holds -1": _set("tensors/relu/shape", [-1]),
    "a dtype that is not one": _set("tensors/relu/dtype", "nn"),
    "a kind that is not one": _set("tensors/relu/kind", "weights"),
    "start after stop": _edit(lambda m: m["shards"][1].update(start=3, stop=2)),
    "overlapping shards": _set("shards/1/start", 1),
    "shard rows beyond its file": _edit(_more_rows),
    "sample_ids is a string": _set("sample_ids", "0123"),
}  # fmt: skip


@pytest.fixture(params=sorted(HOSTILE))
def hostile(request: pytest.FixtureRequest, base: Path, tmp_path: Path) -> Path:
    outside = _outside(tmp_path)
    dump = tmp_path / "dump"
    shutil.copytree(base, dump)
    HOSTILE[request.param](dump, outside)
    request.addfinalizer(lambda: _outside_untouched(outside))
    return dump


def _outside_untouched(outside: Path) -> None:
    assert sorted(p.name for p in outside.iterdir()) in (
        ["evil.safetensors", "secret.txt"],
        ["evil.safetensors", "manifest.json", "secret.txt"],
    )
    assert (outside / "secret.txt").read_text() == MARKER
    assert torch.equal(
        hookdump.load(outside / "evil.safetensors")["relu"], torch.full((2, 2), OUTSIDE_VALUE)
    )


def _within_timeout(call: Callable[[], Any], dump: Path) -> Any:
    """`call()` on a daemon thread: a hang fails the test instead of stalling the suite."""
    box: dict[str, Any] = {}

    def target() -> None:
        try:
            box["value"] = call()
        except BaseException as exc:
            box["error"] = exc

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    thread.join(TIMEOUT)
    if thread.is_alive():
        for fifo in dump.iterdir():  # let the stuck reader go
            if fifo.is_fifo():
                fd = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
                os.close(fd)
        pytest.fail(f"hung for more than {TIMEOUT} s")
    if "error" in box:
        raise box["error"]
    return box["value"]


def _one_error_line(result: Result) -> None:
    assert result.exit_code == 2, (result.exit_code, result.stdout, result.stderr)
    assert result.stdout == ""
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: "), result.stderr
    _never_shows_outside(result.stderr)


def _never_shows_outside(text: str) -> None:
    assert MARKER not in text
    assert "7777" not in text
    assert "outside/evil" not in text and "outside/manifest" not in text


def test_inspect_refuses_it(hostile: Path) -> None:
    _one_error_line(_within_timeout(lambda: invoke("inspect", str(hostile)), hostile))
    _one_error_line(_within_timeout(lambda: invoke("inspect", str(hostile), "--json"), hostile))


def test_diff_refuses_it_on_either_side(hostile: Path, base: Path) -> None:
    for a, b in ((base, hostile), (hostile, base)):
        _one_error_line(_within_timeout(lambda a=a, b=b: invoke("diff", str(a), str(b)), hostile))


def test_show_refuses_it(hostile: Path, tmp_path: Path) -> None:
    """A row is read from its own shard only: a row of the good shard may still be drawn,
    but the hostile one is refused, and nothing is drawn from it."""
    refused = 0
    for key in ("relu", "linear_1"):
        for sample in ("0", "3"):
            png = tmp_path / f"{key}-{sample}.png"
            result = _within_timeout(
                lambda key=key, sample=sample, png=png: invoke(
                    "show", str(hostile), key, "--out", str(png), "-s", sample
                ),
                hostile,
            )
            _never_shows_outside(result.stdout + result.stderr)
            if result.exit_code == 0:
                continue
            _one_error_line(result)
            assert not png.exists()
            refused += 1
    assert refused >= 2


def test_load_raises_one_error_type(hostile: Path) -> None:
    def read_everything() -> None:
        dump = hookdump.load(hostile)
        for key in dump:
            dump[key]
            dump.row(key, dump.num_samples - 1)

    with pytest.raises(hookdump.InvalidDump) as caught:
        _within_timeout(read_everything, hostile)
    _never_shows_outside(str(caught.value))
    assert isinstance(caught.value, hookdump.HookdumpError)


def test_the_good_dump_reads_and_a_lone_shard_too(base: Path, tmp_path: Path) -> None:
    assert invoke("inspect", str(base)).exit_code == 0
    dump = hookdump.load(base)
    assert dump.complete and dump["relu"].shape == (4, 2)
    # a lone shard's own rows count from 0, whatever rows of its dump it held
    lone = hookdump.load(base / "shard-00001.safetensors")
    assert lone.num_samples == 2 and torch.equal(lone["relu"], dump["relu"][2:])
    assert invoke("show", str(base / "shard-00001.safetensors"), "relu", "-o",
                  str(tmp_path / "x.png"), "-s", "1").exit_code == 0  # fmt: skip


def test_leftovers_of_an_interrupted_run_are_reported(base: Path, tmp_path: Path) -> None:
    dump = tmp_path / "dump"
    shutil.copytree(base, dump)
    (dump / "shard-00002.safetensors.tmp2").write_bytes(b"half")
    (dump / ".hookdump-old-12-ab").mkdir()
    result = invoke("inspect", str(dump))
    assert result.exit_code == 0
    assert "warning:" in result.stderr
    assert ".hookdump-old-12-ab, shard-00002.safetensors.tmp2" in result.stderr
    assert invoke("inspect", str(dump), "--check").exit_code == 1  # leftovers fail a check


assert ENV  # the shared CLI environment is what `invoke` uses


def test_a_reader_never_mixes_the_shards_of_two_runs(tmp_path: Path) -> None:
    """A Dump opened before another run's --overwrite (shard names repeat from run to run)
    meets the new run's shards: one InvalidDump, never some old rows and some new."""
    from clitools import invoke
    from safetensors import safe_open

    from hookdump.errors import InvalidDump

    out = tmp_path / "d"
    run = ["run", "tiny_models:TwoLinear", "-n", "6", "-b", "2", "--shard-size", "1", "-q"]
    cwd = os.getcwd()
    os.chdir(Path(__file__).parent)
    try:
        assert invoke(*run, "-o", str(out)).exit_code == 0
        old = hookdump.load(out)
        run_id = old.manifest["run_id"]
        for shard in old.manifest["shards"]:
            with safe_open(out / shard["file"], framework="pt") as opened:
                assert opened.metadata()["run_id"] == run_id
        assert invoke(*run, "--seed", "1", "-o", str(out), "--overwrite").exit_code == 0
    finally:
        os.chdir(cwd)
    assert hookdump.load(out).manifest["run_id"] != run_id
    with pytest.raises(InvalidDump, match="the dump changed while it was read"):
        old["linear_1"]
    with pytest.raises(InvalidDump, match="the dump changed while it was read"):
        next(iter(old.batches(["linear_1"], batch_size=2)))


# Dumps whose claims are hostile in size: memory must stay bounded by a fixed budget or by
# the bytes really on disk, and time by the shards that are there. Each runs inspect, diff,
# show and Dump.batches in a child whose heap may grow by LIMITED bytes at most, beyond the
# copy-on-write mappings of the two dumps' shards that safetensors makes (address space
# that RLIMIT_DATA counts, but no memory unless written to).
LIMITED = 384 << 20
_SIZES_CHILD = """
import json, sys
from itertools import islice
from typer.testing import CliRunner
import hookdump
from hookdump.cli import app
dump, other, png, sample = sys.argv[1:5]
seen = {}
for name, args in (("inspect", ["inspect", dump, "--json"]), ("diff", ["diff", dump, other]),
                   ("show", ["show", dump, "x", "-o", png, "-s", sample])):
    result = CliRunner().invoke(app, args, env={"COLUMNS": "160"})
    seen[name] = [result.exit_code, result.stdout[-3000:], result.stderr[-3000:],
                  repr(result.exception)]
opened = hookdump.load(dump)
for shuffle in (False, True):
    batches = opened.batches(["x"], 4096, shuffle=shuffle)
    seen[f"batches shuffle={shuffle}"] = [list(b["x"].shape) for b in islice(batches, 3)]
print(json.dumps(seen))
"""


def _claiming(folder: Path, rows: int, shape: list[int], data: bytes | None = None) -> Path:
    """A dump of one float32 key `x` whose one shard's header claims `rows` rows of `shape`:
    the file is sparse (a hole where the data would be) unless `data` is given."""
    import math
    import struct

    folder.mkdir()
    nbytes = rows * math.prod(shape) * 4
    header = {"x": {"dtype": "F32", "shape": [rows, *shape], "data_offsets": [0, nbytes]},
              "__metadata__": {"run_id": "r"}}  # fmt: skip
    encoded = json.dumps(header).encode()
    encoded += b" " * (-len(encoded) % 8)
    with (folder / "shard-00000.safetensors").open("wb") as handle:
        handle.write(struct.pack("<Q", len(encoded)) + encoded)
        if data is not None:
            handle.write(data)
        handle.truncate(8 + len(encoded) + nbytes)
    manifest = {
        "format": "hookdump/1", "complete": True, "num_samples": rows, "run_id": "r",
        "tensors": {"x": {"module": "x", "kind": "output", "shape": shape, "dtype": "float32"}},
        "shards": [{"file": "shard-00000.safetensors", "start": 0, "stop": rows}],
    }  # fmt: skip
    (folder / "manifest.json").write_text(json.dumps(manifest))
    return folder


def _run_sizes_child(dump: Path, other: Path, png: Path, sample: int) -> dict[str, Any]:
    from clitools import memory_limited

    mapped = sum(os.stat(d / "shard-00000.safetensors").st_size for d in (dump, other))
    code, stdout, stderr = memory_limited(
        str(dump), str(other), str(png), str(sample), headroom=LIMITED + mapped, limit="DATA",
        code=_SIZES_CHILD, timeout=240,
    )  # fmt: skip
    assert code == 0, stderr[-3000:]
    seen: dict[str, Any] = json.loads(stdout.splitlines()[-1])
    for name in ("inspect", "diff", "show"):
        assert seen[name][0] == 0, (name, seen[name])
    return seen


@pytest.mark.slow
@pytest.mark.slow
def test_a_sparse_shard_claiming_more_than_the_limit_is_read_in_slices(tmp_path: Path) -> None:
    """512 MiB of rows claimed, 4 KiB on disk: every reader used to read the shard whole."""
    rows = (1 << 29) // (64 * 4)
    dump = _claiming(tmp_path / "a", rows, [64])
    other = _claiming(tmp_path / "b", rows, [64])
    assert os.stat(dump / "shard-00000.safetensors").st_blocks * 512 < 1 << 20
    seen = _run_sizes_child(dump, other, tmp_path / "x.png", rows - 1)
    stats = json.loads(seen["inspect"][1])["tensors"][0]
    assert (stats["bytes"], stats["mean"], stats["max"]) == (1 << 29, 0.0, 0.0)
    assert "match" in seen["diff"][1]
    assert seen["batches shuffle=False"] == [[4096, 64]] * 3
    assert seen["batches shuffle=True"] == [[4096, 64]] * 3


@pytest.mark.slow
def test_zero_width_rows_claiming_a_trillion_samples(tmp_path: Path) -> None:
    rows = 10**12
    dump = _claiming(tmp_path / "a", rows, [0])
    other = _claiming(tmp_path / "b", rows, [0])
    seen = _run_sizes_child(dump, other, tmp_path / "x.png", rows - 1)
    assert json.loads(seen["inspect"][1])["num_samples"] == rows
    assert seen["batches shuffle=True"] == [[4096, 0]] * 3


@pytest.mark.slow
@pytest.mark.slow
def test_show_of_200000_channels_draws_a_bounded_picture(tmp_path: Path) -> None:
    from PIL import Image

    from hookdump.tools.pictures.grids import MAX_PIXELS, MAX_TILES

    values = torch.arange(200_000 * 4, dtype=torch.float32)
    dump = _claiming(tmp_path / "a", 1, [200_000, 2, 2], data=values.numpy().tobytes())
    seen = _run_sizes_child(dump, dump, tmp_path / "x.png", 0)
    assert f"the first {MAX_TILES} of 200000 channels" in seen["show"][1]
    width, height = Image.open(tmp_path / "x.png").size
    assert width * height <= MAX_PIXELS
    assert seen["batches shuffle=True"] == [[1, 200_000, 2, 2]]


def test_a_manifest_of_millions_of_small_objects_is_refused_unparsed(tmp_path: Path) -> None:
    """15 million `{}` (45 MB) would take about a gigabyte once parsed."""
    dump = _claiming(tmp_path / "a", 1, [2], data=bytes(8))
    manifest = (dump / "manifest.json").read_bytes()
    (dump / "manifest.json").write_bytes(
        manifest[:-1] + b', "skipped": [' + b"{}," * 15_000_000 + b"{}]}"
    )
    result = _within_timeout(lambda: invoke("inspect", str(dump)), dump)
    _one_error_line(result)
    assert "15,000,008 objects and lists, more than a manifest may" in result.stderr
    with pytest.raises(hookdump.InvalidDump, match="more than a manifest may"):
        hookdump.load(dump)


def test_200000_missing_shards_are_one_line(tmp_path: Path) -> None:
    dump = _claiming(tmp_path / "a", 1, [2], data=bytes(8))
    manifest = json.loads((dump / "manifest.json").read_text())
    manifest["shards"] = [{"file": f"s{i}", "start": i, "stop": i + 1} for i in range(200_000)]
    manifest["num_samples"] = 200_000
    (dump / "manifest.json").write_text(json.dumps(manifest))
    result = _within_timeout(lambda: invoke("inspect", str(dump)), dump)
    assert result.exit_code == 0, result.stderr
    assert "200,000 of 200,000 shards are missing, the first s0 (samples 0:1)" in (result.stdout)
    assert len(result.stdout.splitlines()) < 20


@pytest.mark.slow
def test_diff_pairs_a_million_shards_in_one_walk() -> None:
    """Each segment's shards used to be found by a scan of every shard: hours for 10**6."""
    from hookdump.format.manifest import Manifest
    from hookdump.store.read.reader import ShardReader
    from hookdump.tools.diff import _segments

    def dump(width: int, count: int) -> ShardReader:
        shards = [{"file": f"s{i}", "start": i * width, "stop": (i + 1) * width}
                  for i in range(count)]  # fmt: skip
        manifest = {"complete": True, "num_samples": width * count, "tensors": {}}
        return ShardReader(Path("."), Manifest.of_checked({**manifest, "shards": shards}))

    a, b = dump(1, 10**6), dump(2, 5 * 10**5)
    segments = _within_timeout(lambda: list(_segments(a, b, 10**6, 10**6)), Path("."))
    assert len(segments) == 10**6
    assert [(lo, hi, sa.file, sb.file) for lo, hi, sa, sb in segments[:3]] == [
        (0, 1, "s0", "s0"), (1, 2, "s1", "s0"), (2, 3, "s2", "s1")
    ]  # fmt: skip


_ROWS_CHILD = """
import json, sys
from itertools import islice
import hookdump
opened = hookdump.load(sys.argv[1])
row = opened.row("x", 3)
batch = next(iter(opened.batches(["x"], 4, buffer_bytes=1 << 26)))
shuffled = next(iter(opened.batches(["x"], 4, shuffle=True, buffer_bytes=1 << 26)))
print(json.dumps([list(row.shape), float(row.abs().sum()), list(batch["x"].shape),
                  list(shuffled["x"].shape)]))
"""


@pytest.mark.slow
@pytest.mark.slow
def test_a_shard_larger_than_the_address_space_limit_is_read_row_by_row(tmp_path: Path) -> None:
    """Issue 32 (D6): readers mapped whole shards, so under `ulimit -v` below a shard's size
    (4 GB claimed here, 600 MiB allowed) no row could be read, whatever its size."""
    from clitools import memory_limited

    dump = _claiming(tmp_path / "a", 200, [5_000_000])  # 20 MB rows, sparse
    code, stdout, stderr = memory_limited(str(dump), headroom=600 << 20, limit="AS",
                                          code=_ROWS_CHILD, timeout=240)  # fmt: skip
    assert code == 0, stderr[-3000:]
    assert json.loads(stdout.splitlines()[-1]) == [[5_000_000], 0.0, [4, 5_000_000],
                                                   [4, 5_000_000]]  # fmt: skip
    picture = str(tmp_path / "x.png")
    code, _, stderr = memory_limited(
        "show", str(dump), "x", "--sample", "3", "-o", picture, headroom=600 << 20, limit="AS"
    )
    assert code == 0, stderr[-3000:]


def test_inspect_of_a_sparse_shard_reads_only_the_bytes_on_disk(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 32 (D6): 4 GB of rows claimed and 20 MB on disk took 70 s in inspect; a hole
    reads as zeros, so its statistics are known without reading it."""
    from hookdump.store.read.reader import ShardReader
    from hookdump.tools.inspect import inspect_dump

    row = torch.linspace(-3, 5, 5_000_000)
    dump = _claiming(tmp_path / "a", 200, [5_000_000])
    shard = dump / "shard-00000.safetensors"
    with shard.open("r+b") as handle:  # row 3 holds values; the rest is a hole
        length = struct.unpack("<Q", handle.read(8))[0]
        handle.seek(8 + length + 3 * row.numel() * 4)
        handle.write(row.numpy().tobytes())
    fd = os.open(shard, os.O_RDONLY)
    try:
        os.lseek(fd, 8 + length + 150 * row.numel() * 4, os.SEEK_DATA)
        pytest.skip("this file system does not report holes")
    except OSError:
        pass
    finally:
        os.close(fd)
    read: list[int] = []
    original = ShardReader.read_rows

    def counting(self: ShardReader, *args: Any, **kwargs: Any) -> torch.Tensor:
        part = original(self, *args, **kwargs)
        read.append(part.numel() * 4)
        return part

    monkeypatch.setattr(ShardReader, "read_rows", counting)
    (summary,) = inspect_dump(dump).keys
    assert sum(read) <= 128 << 20  # the slices holding row 3 (and its edge blocks), not 4 GB
    count = 200 * row.numel()
    assert summary.stats.count == count
    assert summary.stats.mean == pytest.approx(float(row.double().sum()) / count, rel=1e-5)
    assert (summary.stats.min, summary.stats.max) == (-3.0, 5.0)
    expected_std = math.sqrt(float((row.double() ** 2).sum()) / count - summary.stats.mean**2)
    assert summary.stats.std == pytest.approx(expected_std, rel=1e-4)
