"""torchrun: two CPU processes (gloo) make the same dump, in the same order, as one."""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from clitools import assert_shards_checksummed
from PIL import Image
from stattools import assert_same_stats

import hookdump

pytestmark = pytest.mark.slow  # several processes: run with --heavy (CI)

TESTS = Path(__file__).parent


def torchrun(*args: str, cwd: Path = TESTS) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "COLUMNS": "160"}
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone",
               "--nproc-per-node", "2", "-m", "hookdump", *args]  # fmt: skip
    return subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=300)


def one_process(*args: str, cwd: Path = TESTS) -> None:
    command = [sys.executable, "-m", "hookdump", *args]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}  # as each rank has: the same kernels' sums
    subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, check=True,
                   timeout=300)  # fmt: skip


def same_dump(a: Path, b: Path) -> None:
    one, two = hookdump.load(a), hookdump.load(b)
    assert one.complete and two.complete
    assert one.keys() == two.keys()
    assert one.sample_ids == two.sample_ids
    for key in one:
        assert (one[key] == two[key]).all(), key
    assert_same_stats(one, two)  # merged across the ranks as in one process


@pytest.mark.slow
def test_two_ranks_make_the_single_process_dump(tmp_path: Path) -> None:
    args = ["run", "tiny_models:TwoLinear", "-n", "11", "-b", "2", "--capture", "input,output"]
    result = torchrun(*args, "-o", str(tmp_path / "two"))
    assert result.returncode == 0, result.stderr
    one_process(*args, "-o", str(tmp_path / "one"))
    same_dump(tmp_path / "one", tmp_path / "two")
    manifest = json.loads((tmp_path / "two" / "manifest.json").read_text())
    files = [s["file"] for s in manifest["shards"]]
    assert any(f.startswith("shard-r00-") for f in files)
    assert any(f.startswith("shard-r01-") for f in files)
    starts = [(s["start"], s["stop"]) for s in manifest["shards"]]
    assert starts[0][0] == 0 and starts[-1][1] == 11
    assert all(a[1] == b[0] for a, b in itertools.pairwise(starts))
    assert_shards_checksummed(tmp_path / "two")  # each rank's shards, as one process's
    assert result.stdout.count("8 tensors") == 1  # rank 0 alone prints the table


@pytest.mark.slow
def test_two_ranks_split_an_image_folder(tmp_path: Path) -> None:
    folder = tmp_path / "imgs"
    folder.mkdir()
    for i in range(5):
        Image.new("RGB", (30, 20), (40 * i, 10, 90)).save(folder / f"{i}.png")
    args = ["run", "resnet18", "--input", str(folder), "--image-size", "16", "-l", "avgpool",
            "-b", "2", "-q"]  # fmt: skip
    result = torchrun(*args, "-o", str(tmp_path / "two"), cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    one_process(*args, "-o", str(tmp_path / "one"), cwd=tmp_path)
    same_dump(tmp_path / "one", tmp_path / "two")


@pytest.mark.slow
def test_an_interrupted_torchrun_dump_resumes_under_torchrun(tmp_path: Path) -> None:
    args = ["run", "tiny_models:CtrlC", "-n", "11", "-b", "2", "-q"]
    out = tmp_path / "two"
    # rank 0 (samples 0-4: batches of 2, 2, 1) finishes; rank 1 (5-10) stops in its 3rd batch
    os.environ["HOOKDUMP_TEST_CTRL_C_AT"] = "3"
    try:
        result = torchrun(*args, "-o", str(out))
    finally:
        del os.environ["HOOKDUMP_TEST_CTRL_C_AT"]
    assert result.returncode != 0 and "--resume" in result.stderr
    assert not (out / "manifest.json").exists()
    assert sorted(p.name for p in out.glob("manifest-r*.json")) == [
        "manifest-r00.json",
        "manifest-r01.json",
    ]
    in_one = subprocess.run(
        [sys.executable, "-m", "hookdump", *args, "-o", str(out), "--resume"],
        cwd=TESTS, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert in_one.returncode == 2 and "torchrun --nproc-per-node 2" in in_one.stderr

    result = torchrun(*args, "-o", str(out), "--resume")
    assert result.returncode == 0, result.stderr
    assert not list(out.glob("manifest-r*.json")) and not list(out.glob("*.tmp*"))
    one_process(*args, "-o", str(tmp_path / "one"))
    same_dump(tmp_path / "one", out)


@pytest.mark.slow
@pytest.mark.parametrize(
    "shape", [["--context-size", "6", "--per-token", "--positions", "1:"], ["--max-length", "9"]]
)
def test_two_ranks_split_a_corpus(tmp_path: Path, shape: list[str]) -> None:
    """Text under torchrun: each rank takes a contiguous slice of the samples (counted
    first, as no limit is given), and token rows keep `__sample__` as the whole dump's."""
    pytest.importorskip("transformers")
    from tiny_text import CORPUS, tiny_gpt2

    folder = tiny_gpt2(tmp_path / "gpt2", n_embd=16, n_positions=16)
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n".join(CORPUS * 3) + "\n")
    args = ["run", f"hf:{folder}", "--text", str(corpus), *shape, "-l", "h.*", "-b", "2", "-q"]
    result = torchrun(*args, "-o", str(tmp_path / "two"), cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    one_process(*args, "-o", str(tmp_path / "one"), cwd=tmp_path)
    same_dump(tmp_path / "one", tmp_path / "two")
    two = hookdump.load(tmp_path / "two")
    files = [s["file"] for s in two.manifest["shards"]]
    assert any(f.startswith("shard-r01-") for f in files)  # rank 1 did dump its part
    if "--per-token" in shape:
        one = hookdump.load(tmp_path / "one")
        assert two.manifest["num_sequences"] == one.manifest["num_sequences"] > 4
        samples = two["__sample__"].tolist()
        assert samples == sorted(samples) and samples[-1] == two.manifest["num_sequences"] - 1
