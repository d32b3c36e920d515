"""Shard files written tensor by tensor, and how batches are grouped into shards."""

from __future__ import annotations

import fcntl
import json
import os
from pathlib import Path

import pytest
import torch
from clitools import assert_usage_error, invoke
from safetensors import safe_open
from safetensors.torch import load_file

import hookdump
from hookdump.store.folder import publish
from hookdump.store.write.shards import ShardFile


def test_a_shard_file_is_plain_safetensors_for_every_dtype(tmp_path: Path) -> None:
    torch.manual_seed(0)
    tensors = {
        "f32": torch.randn(3, 4),
        "bf16": torch.randn(3, 2).bfloat16(),
        "f16": torch.randn(3, 5).half(),
        "i64": torch.arange(6).reshape(3, 2),
        "mask": torch.tensor([True, False, True]),
        "empty": torch.zeros(3, 0),
        **{f"{'many.' * 20}{i}": torch.full((3, 1), float(i)) for i in range(40)},
    }
    shard = ShardFile(tmp_path / "s.safetensors", reserve=16)  # too small: the header grows
    for key, value in tensors.items():
        shard.write(key, value)
    shard.finish({"start": "0", "stop": "3"})
    assert shard.sealed is not None
    publish(shard.sealed, shard.path)
    loaded = load_file(tmp_path / "s.safetensors")
    assert loaded.keys() == tensors.keys()
    for key, value in tensors.items():
        assert loaded[key].dtype == value.dtype and torch.equal(loaded[key], value), key
    with safe_open(str(tmp_path / "s.safetensors"), "pt") as f:
        assert f.metadata() == {"start": "0", "stop": "3"}
    assert not list(tmp_path.glob("*.tmp*"))


@pytest.mark.usefixtures("in_tests_dir")
def test_small_batches_are_gathered_into_shards(tmp_path: Path) -> None:
    out, whole = tmp_path / "gathered", tmp_path / "whole"
    assert (
        invoke(
            "run", "tiny_models:TwoLinear", "-n", "10", "-b", "2", "-q", "-o", str(out)
        ).exit_code
        == 0
    )
    assert (
        invoke(
            "run", "tiny_models:TwoLinear", "-n", "10", "-b", "10", "-q", "-o", str(whole)
        ).exit_code
        == 0
    )
    manifest = json.loads((out / "manifest.json").read_text())
    # the first batch streams into its own shard; the rest, far under --shard-size, gather
    assert [(s["start"], s["stop"]) for s in manifest["shards"]] == [(0, 2), (2, 10)]
    a, b = hookdump.load(out), hookdump.load(whole)
    for key in b:
        assert torch.equal(a[key], b[key])


@pytest.mark.usefixtures("in_tests_dir")
def test_big_batches_stream_one_shard_each(tmp_path: Path) -> None:
    out = tmp_path / "d"
    args = ["run", "tiny_models:TwoLinear", "-n", "6", "-b", "2", "--shard-size", "40", "-q"]
    assert invoke(*args, "-o", str(out)).exit_code == 0
    manifest = json.loads((out / "manifest.json").read_text())
    assert [(s["start"], s["stop"]) for s in manifest["shards"]] == [(0, 2), (2, 4), (4, 6)]


@pytest.mark.usefixtures("in_tests_dir")
def test_an_error_in_the_writer_thread_is_one_error_line(tmp_path: Path) -> None:
    out = tmp_path / "d"
    result = invoke("run", "tiny_models:Growing", "-n", "4", "-b", "2", "--no-early-stop",
                    "-o", str(out))  # fmt: skip
    assert_usage_error(result, "'grow' changed its per-sample shape from [3] to [4] at sample 2")
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["complete"] is False  # the first batch's shard stays, listed as incomplete
    assert [s["stop"] for s in manifest["shards"]] == [2]
    assert not list(out.glob("*.tmp"))


def test_a_planned_shard_that_ends_short_is_compacted(tmp_path: Path) -> None:
    from PIL import Image

    folder = tmp_path / "imgs"
    folder.mkdir()
    for i in range(8):
        Image.new("L", (24, 24), 20 * i).save(folder / f"{i:02d}.png")
    (folder / "03.png").write_bytes(b"not a png")  # skipped: the planned 6 rows get 5
    out = tmp_path / "d"
    args = ["resnet18", "--image-size", "16", "-l", "__root__", "--capture", "input", "-q"]
    result = invoke("run", *args, "--input", str(folder), "--skip-bad-inputs", "-b", "2",
                    "-o", str(out))  # fmt: skip
    assert result.exit_code == 0, result.stderr
    manifest = json.loads((out / "manifest.json").read_text())
    assert [(s["start"], s["stop"]) for s in manifest["shards"]] == [(0, 2), (2, 7)]
    rows = hookdump.load(out)["__root__:input.0"]
    grey = [0, 1, 2, 4, 5, 6, 7]  # image i is uniformly 20 * i
    expected = torch.tensor([20.0 * i / 255 for i in grey])
    torch.testing.assert_close(rows[:, 0, 4, 4], (expected - 0.485) / 0.229)
    assert not list(out.glob("*.tmp*"))


def test_the_buffer_pool_reuses_its_own_buffers_and_only_those() -> None:
    from hookdump.store.write.memory import BufferPool

    pool = BufferPool(min_bytes=0)
    lent = pool.copy(torch.ones(2, 3))
    pool.give_back(lent)
    again = pool.copy(torch.full((2, 3), 5.0))
    assert again.data_ptr() == lent.data_ptr() and torch.equal(again, torch.full((2, 3), 5.0))
    pool.give_back(torch.zeros(2, 3))  # not lent (a reduction's own result): not kept...
    pool.give_back(again)
    pool.give_back(torch.zeros(4))
    assert len(pool) == 1  # ...so the pool never holds more than was lent


def test_the_buffer_pool_leaves_small_copies_to_malloc() -> None:
    from hookdump.store.write.memory import BufferPool

    pool = BufferPool(min_bytes=4 * 6)
    small, large = torch.ones(5), torch.ones(6)
    for tensor in (small, large):
        copy = pool.copy(tensor)
        assert torch.equal(copy, tensor) and copy.data_ptr() != tensor.data_ptr()
        pool.give_back(copy)
    assert len(pool) == 1  # only the 24-byte copy was lent, so only it is kept


@pytest.mark.usefixtures("in_tests_dir")
def test_reduced_runs_do_not_pile_up_buffers(monkeypatch: pytest.MonkeyPatch) -> None:
    import hookdump.store.write.sink as batch_sink

    pools = []
    real_init = batch_sink.BatchSink.__init__

    def keep_pool(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        real_init(self, *args, **kwargs)
        pools.append(self.pool)

    monkeypatch.setattr(batch_sink.BatchSink, "__init__", keep_pool)
    monkeypatch.setenv("HOOKDUMP_POOL_MIN_BYTES", "0")  # pool even these tiny copies
    for samples in ("4", "40"):
        result = invoke("run", "tiny_models:ConvNet", "--input-shape", "3,8,8", "--reduce", "mean",
                        "-n", samples, "-b", "2", "-q")  # fmt: skip
        assert result.exit_code == 0, result.stderr
    # only head's [B, 3] output (rank 2, not reduced) is a pooled copy; the means are their own
    assert len(pools[0]) == len(pools[1]) == 1


def test_append_file_stages_in_aligned_blocks_and_ends_at_the_last_byte(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from hookdump.store.write import direct_io

    monkeypatch.setattr(direct_io, "STAGE_BYTES", 2 * direct_io.BLOCK)  # many flushes
    chunks = [bytes([i % 251]) * size for i, size in enumerate([1, 5000, 8192, 3, 20000, 77])]
    file = direct_io.AppendFile(tmp_path / "f", start=direct_io.BLOCK)
    for chunk in chunks:
        file.write(memoryview(chunk))
    assert file.close() == direct_io.BLOCK + sum(map(len, chunks))
    data = (tmp_path / "f").read_bytes()
    assert data[: direct_io.BLOCK] == bytes(direct_io.BLOCK)  # left for the header
    assert data[direct_io.BLOCK :] == b"".join(chunks)


def test_append_file_falls_back_to_the_page_cache_when_o_direct_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import errno

    from hookdump.store.write import direct_io

    if not hasattr(os, "O_DIRECT"):
        pytest.skip("no O_DIRECT here")
    real_pwrite, refused = os.pwrite, []

    def refuse_direct(fd: int, data: object, offset: int) -> int:
        if fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_DIRECT:
            refused.append(offset)
            raise OSError(errno.EINVAL, "Invalid argument")
        return real_pwrite(fd, data, offset)  # type: ignore[arg-type]

    monkeypatch.setattr(direct_io, "STAGE_BYTES", direct_io.BLOCK)
    monkeypatch.setattr(os, "pwrite", refuse_direct)
    file = direct_io.AppendFile(tmp_path / "f", start=0)
    chunks = [b"a" * 5000, b"b" * 10]
    for chunk in chunks:
        file.write(memoryview(chunk))
    file.close()
    assert (tmp_path / "f").read_bytes() == b"".join(chunks)
    if direct_io.direct_io_wanted() and file.path.stat().st_dev:
        assert refused in ([0], [])  # refused once, then the page cache ([]: no O_DIRECT here)


def test_hookdump_direct_io_0_writes_through_the_page_cache(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from hookdump.store.write import direct_io

    monkeypatch.setenv("HOOKDUMP_DIRECT_IO", "0")
    file = direct_io.AppendFile(tmp_path / "f", start=0)
    assert not file.direct
    file.write(memoryview(b"xyz"))
    assert file.close() == 3 and (tmp_path / "f").read_bytes() == b"xyz"


@pytest.mark.parametrize("refuse_direct", [False, True])
def test_positional_file_puts_every_write_in_its_place(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, refuse_direct: bool
) -> None:
    import errno

    from hookdump.store.write import direct_io

    block = direct_io.BLOCK
    monkeypatch.setattr(direct_io, "STAGE_BYTES", 2 * block)
    if refuse_direct:  # accepted at open, refused at the first write, as some file systems do
        real_pwrite = os.pwrite

        def pwrite(fd: int, data: object, offset: int) -> int:
            if fcntl.fcntl(fd, fcntl.F_GETFL) & getattr(os, "O_DIRECT", 0):
                raise OSError(errno.EINVAL, "Invalid argument")
            return real_pwrite(fd, data, offset)  # type: ignore[arg-type]

        monkeypatch.setattr(os, "pwrite", pwrite)
    # unaligned starts and ends, whole blocks, several stages, a write inside one block
    writes = [(10, 3 * block), (3 * block + 10, 5 * block + 7), (8 * block + 17, 100)]
    size = 10 * block
    file = direct_io.PositionalFile(tmp_path / "f", size)
    expected = bytearray(size)
    for i, (offset, length) in enumerate(writes):
        chunk = bytes([(i * 37 + j) % 256 for j in range(length)])
        file.pwrite(memoryview(chunk), offset)
        expected[offset : offset + length] = chunk
    file.flush()  # the direct writes are on their way on the disk thread until then
    assert os.pread(file.fileno(), size, 0) == bytes(expected)  # read back through the cache
    file.close()
    assert (tmp_path / "f").read_bytes() == bytes(expected)


def test_a_write_error_on_the_disk_thread_reaches_the_caller(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import errno

    from hookdump.store.write import direct_io

    if not hasattr(os, "O_DIRECT"):
        pytest.skip("no O_DIRECT here")

    def full(fd: int, data: object, offset: int) -> int:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(direct_io, "STAGE_BYTES", direct_io.BLOCK)
    file = direct_io.AppendFile(tmp_path / "f", start=0)
    if not file.direct:
        file.abort()
        pytest.skip("this file system refuses O_DIRECT")
    monkeypatch.setattr(os, "pwrite", full)
    with pytest.raises(OSError, match="No space left"):
        for _ in range(8):  # the error surfaces at a later write, or at the latest at close
            file.write(memoryview(bytes(direct_io.BLOCK)))
        file.close()
    file.abort()


@pytest.mark.parametrize("code", ["EINVAL", "EOPNOTSUPP"])
def test_a_file_system_that_refuses_o_direct_at_open_gets_the_page_cache(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, code: str
) -> None:
    import errno

    from hookdump.store.write import direct_io

    if not hasattr(os, "O_DIRECT"):
        pytest.skip("no O_DIRECT here")
    real_open = os.open

    def refusing_open(path: object, flags: int, *args: int) -> int:
        if flags & os.O_DIRECT:
            raise OSError(getattr(errno, code), "refused")
        return real_open(path, flags, *args)  # type: ignore[arg-type]

    monkeypatch.setattr(os, "open", refusing_open)
    file = direct_io.AppendFile(tmp_path / "f", start=0)
    assert not file.direct
    file.write(memoryview(b"abc" * 5000))
    assert file.close() == 15000 and (tmp_path / "f").read_bytes() == b"abc" * 5000
    positional = direct_io.PositionalFile(tmp_path / "g", 10)
    positional.pwrite(memoryview(b"xyz"), 7)
    positional.close()
    assert (tmp_path / "g").read_bytes() == bytes(7) + b"xyz"


def _aligned_bytes(pattern: list[tuple[int, int]]) -> list[torch.Tensor]:
    """Block-aligned byte tensors of the given (value, length) pairs."""
    from hookdump.store.write.memory import aligned_empty

    out = []
    for value, length in pattern:
        tensor = aligned_empty(torch.empty(length, dtype=torch.uint8))
        out.append(tensor.fill_(value))
    return out


def test_aligned_buffers_are_written_from_where_they_lie_and_released_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Whole blocks of an aligned buffer go to the disk with no staging copy (`lend`) and
    are released once written; a buffer after an unaligned one is copied (the file is no
    longer at a block boundary), and released at once. The bytes land in order."""
    from hookdump.store.write import direct_io

    block = direct_io.BLOCK
    monkeypatch.setattr(direct_io, "STAGE_BYTES", 2 * block)
    lent: list[int] = []
    real_lend = direct_io._DiskThread.lend

    def spy(
        self: direct_io._DiskThread, data: memoryview, offset: int, release: object, crc: object
    ) -> None:
        lent.append(len(data))
        real_lend(self, data, offset, release, crc)  # type: ignore[arg-type]

    monkeypatch.setattr(direct_io._DiskThread, "lend", spy)
    # aligned, aligned with a tail, then (past the tail) aligned but staged, and too small
    sizes = [3 * block, 2 * block + 100, 4 * block, 50]
    tensors = _aligned_bytes([(i + 1, n) for i, n in enumerate(sizes)])
    released: list[int] = []
    from hookdump.store.checksum import Crc

    crc = Crc()  # taken on the disk thread, the lent blocks and the staged tails in order
    file = direct_io.AppendFile(tmp_path / "f", start=block, crc=crc)
    if not file.direct:
        file.abort()
        pytest.skip("this file system refuses O_DIRECT")
    for i, tensor in enumerate(tensors):
        file.write(memoryview(tensor.numpy()), lambda i=i: released.append(i))
    assert file.close() == block + sum(sizes)
    assert lent == [3 * block, 2 * block]  # the tail of the second one was staged
    assert sorted(released) == [0, 1, 2, 3]  # each exactly once
    data = (tmp_path / "f").read_bytes()[block:]
    assert data == b"".join(bytes([i + 1]) * n for i, n in enumerate(sizes))
    from clitools import independent_checksum

    assert (crc.size, f"{crc.value:08x}") == (len(data), independent_checksum(data))


def test_a_lent_buffer_is_released_when_its_write_fails(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import errno

    from hookdump.store.write import direct_io

    file = direct_io.AppendFile(tmp_path / "f", start=0)
    if not file.direct:
        file.abort()
        pytest.skip("this file system refuses O_DIRECT")

    def full(fd: int, data: object, offset: int) -> int:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "pwrite", full)
    released: list[int] = []
    (tensor,) = _aligned_bytes([(7, 2 * direct_io.BLOCK)])
    file.write(memoryview(tensor.numpy()), lambda: released.append(1))
    with pytest.raises(OSError, match="No space left"):
        file.close()
    file.abort()
    assert released == [1]


def test_pooled_buffers_are_not_reused_before_the_disk_has_read_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A slow disk, every copy pooled and lent to it: if a buffer went back to the pool
    before its write, the next batch's copy would overwrite it and the dump would differ
    from one written through the page cache (where nothing is lent)."""
    import time

    from hookdump.store.write import direct_io

    real_write = direct_io._DiskThread._write

    def slow(self: direct_io._DiskThread, data: memoryview, offset: int) -> None:
        time.sleep(0.002)
        real_write(self, data, offset)

    args = ["run", "resnet18", "--input-shape", "3,32,32", "-n", "6", "-b", "2", "-q"]
    args += ["--shard-size", "1KB"]  # a shard per batch: every batch streams
    monkeypatch.setenv("HOOKDUMP_POOL_MIN_BYTES", "1")
    monkeypatch.setenv("HOOKDUMP_DIRECT_IO", "0")
    assert invoke(*args, "-o", str(tmp_path / "cache")).exit_code == 0
    monkeypatch.setenv("HOOKDUMP_DIRECT_IO", "1")
    monkeypatch.setattr(direct_io._DiskThread, "_write", slow)
    result = invoke(*args, "-o", str(tmp_path / "direct"))
    assert result.exit_code == 0, result.stderr
    result = invoke("diff", str(tmp_path / "direct"), str(tmp_path / "cache"), "--atol", "0")
    assert result.exit_code == 0, result.stdout
    assert "all 60 keys match" in result.stdout


@pytest.mark.parametrize(
    "device",
    [
        "cpu",
        pytest.param(
            "cuda",
            marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
        ),
    ],
)
def test_the_hooks_wait_for_the_disk_past_a_budget_of_bytes_in_flight(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, device: str
) -> None:
    """A slow disk and a small budget: the forward waits in the hooks, so the captured bytes
    not yet written never pass the budget by more than one tensor, and the dump is whole.
    On a GPU the pinned host copies count too."""
    import time

    from hookdump.store.write import direct_io, memory, sink

    real_write = direct_io._DiskThread._write

    def slow(self: direct_io._DiskThread, data: memoryview, offset: int) -> None:
        time.sleep(0.002)
        real_write(self, data, offset)

    peaks: list[int] = []
    real_take = memory.Budget.take

    def noting(self: memory.Budget, n: int) -> None:
        real_take(self, n)
        peaks.append(self.used)

    monkeypatch.setattr(direct_io._DiskThread, "_write", slow)
    monkeypatch.setattr(sink, "IN_FLIGHT_BYTES", 300_000)
    monkeypatch.setattr(memory.Budget, "take", noting)
    args = ["run", "resnet18", "--input-shape", "3,32,32", "-n", "4", "-b", "2", "-q"]
    result = invoke(*args, "--device", device, "-o", str(tmp_path / "d"))
    assert result.exit_code == 0, result.stderr
    biggest = 2 * 64 * 16 * 16 * 4  # conv1's output, the largest tensor
    assert max(peaks) <= 300_000 + biggest
    assert max(peaks) > 300_000 - biggest  # it did fill up: the hooks waited
    assert hookdump.load(tmp_path / "d")["fc"].shape == (4, 1000)


def test_a_short_planned_shard_whose_header_outgrows_its_room_keeps_every_row(
    tmp_path: Path,
) -> None:
    """Compacted in place, cut to its rows, then its data moved along for a header longer
    than the room planned (keys of 900 characters): every value where it belongs."""
    from safetensors.torch import load_file

    from hookdump.store.write.shards import PlannedShard

    keys = [f"{'k' * 900}{i}" for i in range(10)]
    shard = PlannedShard(tmp_path / "s.safetensors", [(k, torch.float32, [3]) for k in keys], 4)
    values = {k: torch.arange(6, dtype=torch.float32).reshape(2, 3) + 10 * i
              for i, k in enumerate(keys)}  # fmt: skip
    for key, value in values.items():
        shard.write_rows(key, 0, value)
    shard.finish({"start": "0", "stop": "2"})
    assert shard.sealed is not None
    loaded = load_file(shard.sealed)
    assert loaded.keys() == values.keys()
    for key, value in values.items():
        assert torch.equal(loaded[key], value), key


def test_the_sink_refuses_two_tensors_of_one_batch_under_one_key(tmp_path: Path) -> None:
    from hookdump.errors import HookdumpError
    from hookdump.format.keys import KeyInfo
    from hookdump.format.rows import Rows
    from hookdump.store.write.place import open_place
    from hookdump.store.write.sink import BatchSink
    from hookdump.store.write.writer import DumpWriter

    out = tmp_path / "d"
    out.mkdir()
    sink = BatchSink(DumpWriter(open_place(out, {}, None)), None, total=4)
    info = KeyInfo("x", "x", "Linear", "output", 0, None, (2, 3), torch.float32)
    for batch in range(2):
        sink.begin(Rows.of_samples(2 * batch, 2 * batch + 2), ["x"])
        sink.keep("x", torch.zeros(2, 3), info, fresh=True)
        if batch:  # a planned shard gathers this batch: the key must not be written twice
            sink.keep("x", torch.ones(2, 3), info, fresh=True)
        sink.end()
    with pytest.raises(HookdumpError, match="two tensors of one batch came under the key 'x'"):
        sink.close()
    assert [p.name for p in out.iterdir()] == ["manifest.json", "shard-00000.safetensors"]
