"""Pre-tokenized input: `--input FILE --per-token` with `input_ids` (and `attention_mask`)
in a `.safetensors`, `.npy`, parquet or `datasets` file gives the token rows that tokenizing
the same text with `--text` gives."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from clitools import assert_usage_error, invoke
from safetensors.torch import save_file
from tiny_text import CORPUS

import hookdump

transformers = pytest.importorskip("transformers")
pytestmark = pytest.mark.usefixtures("in_tests_dir")
TOKEN_KEYS = ("h.0", "__token_ids__", "__sample__", "__position__")


def _tokens(out: Path) -> dict[str, torch.Tensor]:
    dump = hookdump.load(out)
    return {key: dump[key] for key in TOKEN_KEYS}


def _run(model: Path, out: Path, *args: str) -> dict[str, torch.Tensor]:
    result = invoke("run", f"hf:{model}", "--per-token", "-l", "h.0", "-b", "2", "-q",
                    "-o", str(out), *args)  # fmt: skip
    assert result.exit_code == 0, result.stderr
    return _tokens(out)


def _assert_same(found: dict[str, torch.Tensor], expected: dict[str, torch.Tensor]) -> None:
    assert found["h.0"].shape[0] == expected["h.0"].shape[0] > 0
    for key in TOKEN_KEYS:
        torch.testing.assert_close(found[key], expected[key], msg=key)


@pytest.fixture
def documents(gpt2: Path, corpus: Path, tmp_path: Path) -> tuple[dict, list[list[int]]]:
    """The token rows of the corpus's documents (`--text`, max length 6), and their ids."""
    expected = _run(gpt2, tmp_path / "text", "--text", str(corpus), "--max-length", "6")
    tokenizer = transformers.AutoTokenizer.from_pretrained(gpt2)
    ids = [tokenizer(d, truncation=True, max_length=6)["input_ids"] for d in CORPUS if d]
    return expected, ids


def test_safetensors_ids_and_mask_equal_the_tokenized_text(
    gpt2: Path, documents: tuple[dict, list[list[int]]], tmp_path: Path
) -> None:
    expected, ids = documents
    padded = torch.zeros(len(ids), 6, dtype=torch.int64)  # padded with 0, not GPT-2's EOS
    mask = torch.zeros_like(padded)
    for row, tokens in enumerate(ids):
        padded[row, : len(tokens)], mask[row, : len(tokens)] = torch.tensor(tokens), 1
    save_file({"input_ids": padded, "attention_mask": mask}, tmp_path / "ids.safetensors")
    found = _run(gpt2, tmp_path / "st", "--input", str(tmp_path / "ids.safetensors"))
    _assert_same(found, expected)
    manifest = hookdump.load(tmp_path / "st").manifest
    assert manifest["input"]["layout"] == "tokens"
    assert manifest["input"]["kind"] == "safetensors"
    assert manifest["num_sequences"] == len(ids)


def test_parquet_and_datasets_rows_of_any_length(
    gpt2: Path, documents: tuple[dict, list[list[int]]], tmp_path: Path
) -> None:
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    expected, ids = documents
    pq.write_table(pa.table({"input_ids": ids}), tmp_path / "ids.parquet", row_group_size=3)
    _assert_same(_run(gpt2, tmp_path / "pq", "--input", str(tmp_path / "ids.parquet")), expected)
    datasets = pytest.importorskip("datasets")
    saved = tmp_path / "saved"
    masks = [[1] * len(row) for row in ids]
    datasets.Dataset.from_dict({"input_ids": ids, "attention_mask": masks}).save_to_disk(
        str(saved), num_shards=2
    )
    _assert_same(_run(gpt2, tmp_path / "ds", "--input", str(saved)), expected)
    assert hookdump.load(tmp_path / "ds").manifest["input"]["kind"] == "datasets"


def test_npy_windows_equal_packed_text(gpt2: Path, corpus: Path, tmp_path: Path) -> None:
    expected = _run(gpt2, tmp_path / "text", "--text", str(corpus), "--context-size", "5")
    windows = hookdump.load(tmp_path / "text")["__token_ids__"].reshape(-1, 5)
    np.save(tmp_path / "ids.npy", windows.numpy().astype(np.int32))  # any integer type
    _assert_same(_run(gpt2, tmp_path / "npy", "--input", str(tmp_path / "ids.npy")), expected)
    limited = _run(gpt2, tmp_path / "two", "--input", str(tmp_path / "ids.npy"), "-n", "2")
    assert limited["__sample__"].unique().tolist() == [0, 1]


def test_special_tokens_come_from_the_model_folder(
    gpt2: Path, corpus: Path, tmp_path: Path
) -> None:
    expected = _run(gpt2, tmp_path / "text", "--text", str(corpus), "--context-size", "5",
                    "--skip-special-tokens")  # fmt: skip
    packed = _run(gpt2, tmp_path / "all", "--text", str(corpus), "--context-size", "5")
    np.save(tmp_path / "ids.npy", packed["__token_ids__"].reshape(-1, 5).numpy())
    found = _run(gpt2, tmp_path / "npy", "--input", str(tmp_path / "ids.npy"),
                 "--skip-special-tokens")  # fmt: skip
    _assert_same(found, expected)
    bare = tmp_path / "no-tokenizer"
    bare.mkdir()
    for name in ("config.json", "model.safetensors"):
        shutil.copy(gpt2 / name, bare / name)
    assert_usage_error(
        invoke("run", f"hf:{bare}", "--input", str(tmp_path / "ids.npy"), "--per-token",
               "--skip-special-tokens", "-o", str(tmp_path / "x")),
        "--skip-special-tokens needs the tokenizer's special ids", "has no tokenizer files",
    )  # fmt: skip
    assert not (tmp_path / "x").exists()
    assert invoke("run", f"hf:{bare}", "--input", str(tmp_path / "ids.npy"), "--per-token",
                  "-q", "-l", "h.0").exit_code == 0  # fmt: skip


def test_bad_token_files_are_one_line(gpt2: Path, tmp_path: Path) -> None:
    def run(path: Path, *more: str) -> object:
        return invoke("run", f"hf:{gpt2}", "--input", str(path), "-l", "h.0", "-q", *more)

    ids = torch.tensor([[1, 2, 3], [4, 5, 99]])  # the vocabulary has 32 ids
    save_file({"input_ids": ids}, tmp_path / "big.safetensors")
    assert_usage_error(run(tmp_path / "big.safetensors", "--per-token"),
                       "row 1: token id 99 is outside the model's vocabulary",
                       "(0 to 31)")  # fmt: skip
    save_file({"input_ids": ids.float()}, tmp_path / "float.safetensors")
    assert_usage_error(run(tmp_path / "float.safetensors", "--per-token"),
                       "input_ids holds torch.float32 values")  # fmt: skip
    save_file({"tokens": ids, "other": ids.clone()}, tmp_path / "named.safetensors")
    assert_usage_error(run(tmp_path / "named.safetensors", "--per-token"),
                       "holds no 'input_ids' tensor", "other, tokens")  # fmt: skip
    save_file({"input_ids": ids, "attention_mask": ids.clone()}, tmp_path / "mask.safetensors")
    assert_usage_error(run(tmp_path / "mask.safetensors", "--per-token"),
                       "row 0: attention_mask holds values other than 0 and 1")  # fmt: skip
    save_file({"input_ids": ids[0]}, tmp_path / "flat.safetensors")
    assert_usage_error(run(tmp_path / "flat.safetensors", "--per-token"),
                       "token ids are [samples, tokens]")  # fmt: skip
    assert_usage_error(invoke("run", f"hf:{gpt2}", "--per-token", "-q"),
                       "--per-token needs text input", "--input FILE of token ids")  # fmt: skip
    assert_usage_error(
        invoke("run", "tiny_models:TwoLinear", "--input", str(tmp_path / "flat.safetensors"),
               "--per-token", "-q"),
        "feeds token ids to a Hugging Face language model",
    )  # fmt: skip
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    pq.write_table(pa.table({"input_ids": [[1, 2]]}), tmp_path / "ids.parquet")
    assert_usage_error(run(tmp_path / "ids.parquet"), "a table of token ids is read under "
                       "--per-token")  # fmt: skip
    pq.write_table(pa.table({"ids": [[1, 2]]}), tmp_path / "other.parquet")
    assert_usage_error(run(tmp_path / "other.parquet", "--per-token"),
                       "'input_ids' is not a column of", "its columns: ids")  # fmt: skip


def test_left_padding_gives_the_same_token_rows(gpt2: Path, tmp_path: Path) -> None:
    """A mask padded on the left: positions count the real tokens, and `positions=` slices
    them, as with the same rows padded on the right."""
    model = transformers.AutoModel.from_pretrained(gpt2).eval()
    right = {"input_ids": torch.tensor([[5, 6, 7, 0], [8, 9, 0, 0]]),
             "attention_mask": torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0]])}  # fmt: skip
    left = {"input_ids": torch.tensor([[0, 5, 6, 7], [0, 0, 8, 9]]),
            "attention_mask": torch.tensor([[0, 1, 1, 1], [0, 0, 1, 1]])}  # fmt: skip
    found = [
        hookdump.dump(
            model, [batch], tmp_path / side, layers=["wte"], per_token=True, positions="1:"
        )
        for side, batch in (("right", right), ("left", left))
    ]
    for key in ("__token_ids__", "__sample__", "__position__", "wte"):
        assert torch.equal(found[0][key], found[1][key]), key
    assert found[1]["__position__"].tolist() == [1, 2, 1]
    assert found[1]["__token_ids__"].tolist() == [6, 7, 9]


def test_a_left_padded_token_file_gets_positions_from_its_mask(gpt2: Path, tmp_path: Path) -> None:
    """Issue 44: `run --input ids.safetensors --per-token` with rows padded on the left gave
    GPT-2 no position_ids (off by up to 1.41); the CLI now takes the Python door's path.
    The rows equal the same rows padded on the right, block by block, and each document
    alone (its own batch, no padding), as transformers computes it."""
    right = {"input_ids": torch.tensor([[5, 6, 7, 8], [9, 10, 0, 0]]),
             "attention_mask": torch.tensor([[1, 1, 1, 1], [1, 1, 0, 0]])}  # fmt: skip
    left = {"input_ids": torch.tensor([[5, 6, 7, 8], [0, 0, 9, 10]]),
            "attention_mask": torch.tensor([[1, 1, 1, 1], [0, 0, 1, 1]])}  # fmt: skip
    found = {}
    for side, batch in (("right", right), ("left", left)):
        ids = tmp_path / f"{side}.safetensors"
        save_file(batch, ids)
        result = invoke("run", f"hf:{gpt2}", "--per-token", "-l", "h.*", "-b", "2", "-q",
                        "-i", str(ids), "-o", str(tmp_path / side))  # fmt: skip
        assert result.exit_code == 0, result.stderr
        found[side] = hookdump.load(tmp_path / side)
    model = transformers.AutoModel.from_pretrained(gpt2).eval()
    with torch.no_grad():
        alone = [model(torch.tensor([ids]), output_hidden_states=True).hidden_states
                 for ids in ([5, 6, 7, 8], [9, 10])]  # fmt: skip
    for block in range(2):
        key = f"h.{block}"
        torch.testing.assert_close(found["left"][key], found["right"][key], rtol=1e-5, atol=1e-5)
        own = torch.cat([states[block + 1][0] for states in alone])  # hidden_states[0]: wte+wpe
        if block == 1:  # the last block's hidden state is after ln_f in transformers'
            continue
        torch.testing.assert_close(found["left"][key], own, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(
    ("column", "said"),
    [([[1.5, 2.0]], ("column input_ids is list<", "double>, not lists of integers")),
     ([[[1, 2]], [[3]]], ("column input_ids is list<", ": list<")),
     ([["a", "b"]], ("column input_ids is list<", "string>")),
     ([[1, 2], None, [3, None, 4]], ("row 2: input_ids holds a missing value (null)",))],
)  # fmt: skip
def test_table_ids_that_are_not_integers_are_refused_naming_why(
    gpt2: Path, tmp_path: Path, column: list[object], said: tuple[str, ...]
) -> None:
    """Issue 32, N6 and N14: float ids were cut to integers (1.5 became 1), nested lists
    blamed the mask, strings and nulls said "found list"."""
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    pq.write_table(pa.table({"input_ids": column}), tmp_path / "ids.parquet")
    result = invoke("run", f"hf:{gpt2}", "--input", str(tmp_path / "ids.parquet"), "-l", "h.0",
                    "--per-token", "-q", "-o", str(tmp_path / "d"))  # fmt: skip
    assert_usage_error(result, *said)  # arrow spells list items as item or element


def test_token_rows_longer_than_the_models_positions_are_named(gpt2: Path, tmp_path: Path) -> None:
    """Issue 32 (CO57): 100 ids for 64 positions was an IndexError blamed on --input-shape."""
    save_file({"input_ids": torch.zeros(2, 100, dtype=torch.int64)}, tmp_path / "long.safetensors")
    result = invoke("run", f"hf:{gpt2}", "--input", str(tmp_path / "long.safetensors"), "-l",
                    "h.0", "--per-token", "-q", "-o", str(tmp_path / "d"))  # fmt: skip
    assert_usage_error(result, "row 0 has 100 token ids, more than the model takes in a sample "
                       "(64 positions)")  # fmt: skip
