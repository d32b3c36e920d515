"""`hookdump import files` (issue 58): a folder of per-sample safetensors written by hand,
`--key NAME=KEY` naming each tensor, made a dump. With token ids (a tensor of the file, or a
`--tokens` file) the rows are token rows and equal what `hookdump run` captures of the same
tokens; without, each file is one sample's value, as a hand-written hook saves it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from clitools import assert_usage_error, invoke
from safetensors.torch import save_file

import hookdump

transformers = pytest.importorskip("transformers")

PROMPTS = {"a-0": [5, 9, 2, 7], "b-1": [3, 4], "c-2": [11, 12, 13, 14, 15]}
KEYS = ["blocks.0.hook_resid_post", "blocks.1.hook_resid_post"]


@pytest.fixture(scope="module")
def gpt2() -> torch.nn.Module:
    torch.manual_seed(0)
    config = transformers.GPT2Config(n_layer=3, n_embd=8, n_head=2, vocab_size=32, n_positions=16)
    return transformers.GPT2LMHeadModel(config).eval()


def _hand_written(model: torch.nn.Module, folder: Path, with_ids: bool = True) -> None:
    """What a hand-written hook saves: each sample's residual stream after blocks 0 and 1
    (transformers' hidden_states[1] and [2]; the last is after the final norm), under names
    of its own."""
    folder.mkdir(parents=True, exist_ok=True)
    for sample, ids in PROMPTS.items():
        with torch.no_grad():
            states = model(torch.tensor([ids]), output_hidden_states=True).hidden_states
        tensors = {"resid_0": states[1][0].contiguous(), "resid_1": states[2][0].contiguous()}
        if with_ids:
            tensors["ids"] = torch.tensor(ids, dtype=torch.int32)
        save_file(tensors, folder / f"{sample}.safetensors")


def _import(source: Path, out: Path, *more: str) -> object:
    return invoke("import", "files", str(source), "--out", str(out), "--key",
                  f"{KEYS[0]}=resid_0", "--key", f"{KEYS[1]}=resid_1", *more)  # fmt: skip


def _same_as_run(model: torch.nn.Module, imported: Path, tmp_path: Path) -> None:
    batches = [{"input_ids": torch.tensor([ids]), "attention_mask": torch.ones(1, len(ids))}
               for ids in PROMPTS.values()]  # fmt: skip
    hookdump.dump(model, batches, tmp_path / "run", layers=KEYS, per_token=True)
    compared = invoke("diff", str(tmp_path / "run"), str(imported), "--atol", "1e-6")
    assert compared.exit_code == 0, compared.stdout + compared.stderr
    assert compared.stdout.startswith("all 5 keys match")  # and the token ids, positions


def test_token_ids_in_the_files_make_token_rows(gpt2: torch.nn.Module, tmp_path: Path) -> None:
    _hand_written(gpt2, tmp_path / "saved")
    result = _import(tmp_path / "saved", tmp_path / "imported", "--key", "__token_ids__=ids")
    assert result.exit_code == 0, result.stderr
    assert result.stdout == (
        f"imported 3 samples (11 token rows, 2 keys) into {tmp_path / 'imported'}\n"
    )
    imported = hookdump.load(tmp_path / "imported")
    assert imported.sample_ids == list(PROMPTS)
    assert imported["__token_ids__"].tolist() == [t for ids in PROMPTS.values() for t in ids]
    assert imported.manifest["input"]["keys"] == {KEYS[0]: "resid_0", KEYS[1]: "resid_1"}
    _same_as_run(gpt2, tmp_path / "imported", tmp_path)


def test_a_tokens_file_gives_the_token_ids(gpt2: torch.nn.Module, tmp_path: Path) -> None:
    _hand_written(gpt2, tmp_path / "saved", with_ids=False)
    tokens = tmp_path / "tokens.jsonl"
    tokens.write_text("".join(json.dumps({"id": s, "token_ids": ids}) + "\n"
                              for s, ids in reversed(PROMPTS.items())))  # fmt: skip
    result = _import(tmp_path / "saved", tmp_path / "imported", "--tokens", str(tokens), "-q")
    assert result.exit_code == 0, result.stderr
    assert hookdump.load(tmp_path / "imported")["__position__"].tolist() == [
        p for ids in PROMPTS.values() for p in range(len(ids))
    ]
    _same_as_run(gpt2, tmp_path / "imported", tmp_path)
    # a sample the file does not list: one line naming it
    tokens.write_text(json.dumps({"id": "a-0", "token_ids": PROMPTS["a-0"]}) + "\n")
    line = assert_usage_error(_import(tmp_path / "saved", tmp_path / "d", "--tokens", str(tokens)))
    assert "b-1.safetensors is sample 'b-1', which --tokens does not list" in line
    tokens.write_text('{"id": "a-0", "token_ids": [1, "x"]}\n')
    line = assert_usage_error(_import(tmp_path / "saved", tmp_path / "d", "--tokens", str(tokens)))
    assert "tokens.jsonl line 1 is not" in line


def test_without_token_ids_each_file_is_one_samples_value(tmp_path: Path) -> None:
    """Pooled features, one [8] tensor a file: the dump holds them as rows, in name order."""
    folder = tmp_path / "saved"
    folder.mkdir()
    values = {f"img_{n}": torch.randn(8) for n in (2, 10, 1)}
    for name, value in values.items():
        save_file({"pooled": value}, folder / f"{name}.safetensors")
    result = invoke("import", "files", str(folder), "--out", str(tmp_path / "d"),
                    "--key", "pooled=pooled")  # fmt: skip
    assert result.exit_code == 0, result.stderr
    assert result.stdout == f"imported 3 samples (1 key) into {tmp_path / 'd'}\n"
    imported = hookdump.load(tmp_path / "d")
    assert imported.sample_ids == ["img_1", "img_2", "img_10"]
    expected = torch.stack([values["img_1"], values["img_2"], values["img_10"]])
    torch.testing.assert_close(imported["pooled"], expected, rtol=0, atol=0)
    # values of another length need token ids to be rows: the line says so
    save_file({"pooled": torch.randn(9)}, folder / "img_11.safetensors")
    line = assert_usage_error(invoke("import", "files", str(folder), "--out",
                                     str(tmp_path / "e"), "--key", "pooled=pooled"))  # fmt: skip
    assert "img_11.safetensors holds pooled of float32 [9] where the files before it hold" in line
    assert "give the token ids (--key __token_ids__=KEY or --tokens FILE)" in line


@pytest.mark.parametrize(
    ("args", "said"),
    [
        ([], "say which tensors to import: --key NAME=KEY"),
        (["--key", "x"], "--key 'x' is not NAME=KEY of a new NAME"),
        (["--key", "a=b", "--key", "a=c"], "--key 'a=c' is not NAME=KEY of a new NAME"),
        (["--key", "a b=c"], "--key 'a b' is not a key's name"),
        (["--key", "__token_ids__=ids"], "names only __token_ids__: name a value too"),
        (["--key", "a=resid_0", "--layer-ids", "1"], "--layer-ids is for vllm and trtllm"),
        (["--key", "a=nothing"], "holds ids, resid_0, resid_1, not nothing"),
        (["--key", "forward=resid_0"], "'forward' cannot be a key here"),
    ],
)
def test_keys_must_be_named_and_held(
    gpt2: torch.nn.Module, tmp_path: Path, args: list[str], said: str
) -> None:
    _hand_written(gpt2, tmp_path / "saved")
    result = invoke("import", "files", str(tmp_path / "saved"), "--out", str(tmp_path / "d"),
                    *args)  # fmt: skip
    assert_usage_error(result, said)


def test_a_file_whose_rows_are_not_its_tokens_is_one_line_or_skipped(
    gpt2: torch.nn.Module, tmp_path: Path
) -> None:
    _hand_written(gpt2, tmp_path / "saved")
    save_file({"resid_0": torch.zeros(3, 8), "resid_1": torch.zeros(2, 8),
               "ids": torch.tensor([1, 2, 3])}, tmp_path / "saved" / "b-1.safetensors")  # fmt: skip
    ids = ("--key", "__token_ids__=ids")
    line = assert_usage_error(_import(tmp_path / "saved", tmp_path / "d", *ids))
    assert "b-1.safetensors holds 2 rows of blocks.1.hook_resid_post for 3 tokens" in line
    result = _import(tmp_path / "saved", tmp_path / "skipping", *ids, "--skip-bad", "-q")
    assert result.exit_code == 0, result.stderr
    assert "skipped" in result.stderr and "b-1.safetensors" in result.stderr
    assert hookdump.load(tmp_path / "skipping").sample_ids == ["a-0", "c-2"]


def test_engines_take_no_keys(tmp_path: Path) -> None:
    (tmp_path / "e").mkdir()
    result = invoke("import", "vllm", str(tmp_path / "e"), "--out", str(tmp_path / "d"),
                    "--key", "a=b", "--layer-ids", "1")  # fmt: skip
    assert_usage_error(result, "--key and --tokens are for files")
