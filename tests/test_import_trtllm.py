"""`hookdump import trtllm` (issue 58): TensorRT-LLM's `SaveHiddenStates` files, several
requests to a `torch.save` list, made a dump. The files are written as the mode's resource
manager writes them (`{prefix}_{iter}.pt`: `id`, `input_ids`, `hidden_state`, the last
layer of `layers_to_capture`, and `aux_hidden_states`, the others side by side), from
transformers' own `output_hidden_states` of a tiny GPT-2; every row of the import equals
that, and equals what `hookdump run` of the same tokens captures under the same names."""

from __future__ import annotations

import pickle
from pathlib import Path

import pytest
import torch
from clitools import assert_usage_error, invoke

import hookdump

transformers = pytest.importorskip("transformers")

CAPTURED = [1, 2, -1]  # layers_to_capture as the engine orders them: sorted, -1 last
KEYS = ["blocks.1.hook_resid_post", "blocks.2.hook_resid_post", "ln_final.hook_normalized"]
PROMPTS = [[5, 9, 2, 7, 7, 1], [3, 4], [11, 12, 13, 14, 15, 16, 17, 18, 19], [8, 8, 8]]


@pytest.fixture(scope="module")
def gpt2() -> torch.nn.Module:
    torch.manual_seed(0)
    config = transformers.GPT2Config(n_layer=4, n_embd=16, n_head=2, vocab_size=32, n_positions=32)
    return transformers.GPT2LMHeadModel(config).eval()


def _states(model: torch.nn.Module, ids: list[int], captured: list[int]) -> list[torch.Tensor]:
    """Each captured layer's [tokens, hidden]: transformers' hidden_states[N + 1] (the
    residual stream leaving block N) and, for -1, its last (after the final norm)."""
    with torch.no_grad():
        out = model(torch.tensor([ids]), output_hidden_states=True)
    return [out.hidden_states[-1 if n == -1 else n + 1][0] for n in captured]


def _engine_files(
    model: torch.nn.Module, folder: Path, captured: list[int] = CAPTURED, last_in_aux: bool = False
) -> list[Path]:
    """Two requests to a file, as write_interval=2 writes them: data_2.pt, data_4.pt."""
    folder.mkdir(parents=True, exist_ok=True)
    entries = []
    for number, ids in enumerate(PROMPTS, start=1):
        states = _states(model, ids, captured)
        entry = {"id": number, "input_ids": torch.tensor(ids), "hidden_state": states[-1].clone()}
        if len(states) > 1:
            entry["aux_hidden_states"] = torch.cat(states if last_in_aux else states[:-1], dim=1)
        entries.append(entry)
    paths = [folder / "data_2.pt", folder / "data_4.pt"]
    torch.save(entries[:2], paths[0])
    torch.save(entries[2:], paths[1])
    return paths


def _import(source: Path, out: Path, *more: str, ids: str = "1,2,-1") -> object:
    return invoke("import", "trtllm", str(source), "--out", str(out), "--layer-ids", ids,
                  "--quiet", *more)  # fmt: skip


@pytest.mark.parametrize("last_in_aux", [False, True])
def test_an_import_holds_every_row_the_model_computes(
    gpt2: torch.nn.Module, tmp_path: Path, last_in_aux: bool
) -> None:
    _engine_files(gpt2, tmp_path / "engine", last_in_aux=last_in_aux)
    result = _import(tmp_path / "engine", tmp_path / "imported")
    assert result.exit_code == 0, result.stderr
    imported = hookdump.load(tmp_path / "imported")
    assert [k for k in imported if not k.startswith("__")] == KEYS
    assert imported.sample_ids == ["data-1", "data-2", "data-3", "data-4"]
    assert imported["__token_ids__"].tolist() == [t for ids in PROMPTS for t in ids]
    for index, key in enumerate(KEYS):
        expected = torch.cat([_states(gpt2, ids, CAPTURED)[index] for ids in PROMPTS])
        torch.testing.assert_close(imported[key], expected, rtol=0, atol=0)
    about = imported.manifest["input"]
    assert about["engine"] == {"name": "trtllm", "version": None}
    assert about["layer_ids"] == CAPTURED
    assert [(f["id"], f["path"]) for f in about["files"]] == [
        ("data-1", "data_2.pt"), ("data-2", "data_2.pt"), ("data-3", "data_4.pt"),
        ("data-4", "data_4.pt"),
    ]  # fmt: skip
    # and `hookdump run` of the same tokens through the model names the same values so
    batches = [{"input_ids": torch.tensor([ids]), "attention_mask": torch.ones(1, len(ids))}
               for ids in PROMPTS]  # fmt: skip
    run = tmp_path / "run"
    hookdump.dump(gpt2, batches, run, layers=KEYS[:2], per_token=True)
    compared = invoke("diff", str(run), str(tmp_path / "imported"), "--atol", "1e-6",
                      "--keys", "blocks.*")  # fmt: skip
    assert compared.exit_code == 0, compared.stdout + compared.stderr
    assert compared.stdout.startswith("all 2 keys match")


def test_one_layer_files_have_no_aux(gpt2: torch.nn.Module, tmp_path: Path) -> None:
    _engine_files(gpt2, tmp_path / "engine", captured=[2])
    result = _import(tmp_path / "engine", tmp_path / "imported", ids="2")
    assert result.exit_code == 0, result.stderr
    imported = hookdump.load(tmp_path / "imported")
    expected = torch.cat([_states(gpt2, ids, [2])[0] for ids in PROMPTS])
    torch.testing.assert_close(imported["blocks.2.hook_resid_post"], expected, rtol=0, atol=0)


class _Payload:
    """What weights_only refuses to unpickle: a class of the writer's own."""

    def __reduce__(self) -> tuple[object, tuple[str]]:
        return (print, ("this runs if the file is unpickled",))


@pytest.mark.parametrize(
    ("damage", "said"),
    [
        ("code", "is not a whole torch.save file"),
        ("cut", "is not a whole torch.save file"),
        ("dict", "holds a dict, not the list of requests SaveHiddenStates saves"),
        ("rows", "(request 3) holds 8 rows of hidden states for 9 tokens"),
        ("nan", "(request 4): token 2's hidden state in the file's layer 1"),
        ("aux", "(request 3): aux_hidden_states is [9, 20], not [9, 16 * layers] of float32"),
        ("ids", "(request 4): input_ids is float32 [3], not integers [tokens]"),
    ],
)
def test_a_damaged_file_is_one_line_naming_it(
    gpt2: torch.nn.Module, tmp_path: Path, damage: str, said: str, capfd: pytest.CaptureFixture[str]
) -> None:
    paths = _engine_files(gpt2, tmp_path / "engine")
    entries = torch.load(paths[1], weights_only=True)
    if damage == "code":
        paths[1].write_bytes(pickle.dumps([_Payload()]))
    if damage == "cut":
        paths[1].write_bytes(paths[1].read_bytes()[:-100])
    if damage == "dict":
        torch.save({"requests": entries}, paths[1])
    if damage == "rows":
        entries[0]["hidden_state"] = entries[0]["hidden_state"][:-1]
        entries[0]["aux_hidden_states"] = entries[0]["aux_hidden_states"][:-1]
    if damage == "nan":
        entries[1]["aux_hidden_states"][2, 20] = float("nan")
    if damage == "aux":
        entries[0]["aux_hidden_states"] = entries[0]["aux_hidden_states"][:, :20].contiguous()
    if damage == "ids":
        entries[1]["input_ids"] = entries[1]["input_ids"].float()
    if damage in ("rows", "nan", "aux", "ids"):
        torch.save(entries, paths[1])
    line = assert_usage_error(_import(tmp_path / "engine", tmp_path / "imported"), said)
    assert paths[1].name in line
    assert "this runs" not in capfd.readouterr().out
    skipped = _import(tmp_path / "engine", tmp_path / "skipping", "--skip-bad")
    assert skipped.exit_code == 0, skipped.stderr
    assert hookdump.load(tmp_path / "skipping").sample_ids == ["data-1", "data-2"]


def test_the_layers_must_be_those_captured(gpt2: torch.nn.Module, tmp_path: Path) -> None:
    _engine_files(gpt2, tmp_path / "engine")
    line = assert_usage_error(_import(tmp_path / "engine", tmp_path / "d", ids="1,-1"))
    assert "(request 1) holds 3 layers, and --layer-ids names 2" in line
    line = assert_usage_error(_import(tmp_path / "engine", tmp_path / "d", ids="1,-2,-1"))
    assert "each a layer's number, -1 or more, once" in line
    line = assert_usage_error(
        invoke(
            "import",
            "vllm",
            str(tmp_path / "engine"),
            "--out",
            str(tmp_path / "d"),
            "--layer-ids",
            "-1,2",
        )
    )
    assert "each a layer's number, 0 or more, once" in line


def test_a_request_in_two_files_is_one_line(gpt2: torch.nn.Module, tmp_path: Path) -> None:
    paths = _engine_files(gpt2, tmp_path / "engine")
    (tmp_path / "engine" / "data_6.pt").write_bytes(paths[0].read_bytes())
    line = assert_usage_error(_import(tmp_path / "engine", tmp_path / "d"))
    assert "request 'data-1' appears twice" in line


def test_resume_adds_the_files_written_since(gpt2: torch.nn.Module, tmp_path: Path) -> None:
    paths = _engine_files(gpt2, tmp_path / "engine")
    later = paths[1].read_bytes()
    paths[1].unlink()
    assert _import(tmp_path / "engine", tmp_path / "imported").exit_code == 0
    (tmp_path / "engine" / "data_10.pt").write_bytes(later)  # after data_2.pt, as a number
    result = _import(tmp_path / "engine", tmp_path / "imported", "--resume")
    assert result.exit_code == 0, result.stderr
    imported = hookdump.load(tmp_path / "imported")
    assert imported.sample_ids == ["data-1", "data-2", "data-3", "data-4"]
    expected = torch.cat([_states(gpt2, ids, CAPTURED)[2] for ids in PROMPTS])
    torch.testing.assert_close(imported["ln_final.hook_normalized"], expected, rtol=0, atol=0)


def test_delete_source_keeps_a_file_until_every_request_of_it_is_listed(
    gpt2: torch.nn.Module, tmp_path: Path
) -> None:
    """Two requests a file: a file goes only once both are in listed shards. The import
    stops at a bad third file; every file it deleted has both requests listed."""
    paths = _engine_files(gpt2, tmp_path / "engine")
    torch.save([{"id": 9, "input_ids": torch.tensor([1, 2])}], tmp_path / "engine" / "data_9.pt")
    out = tmp_path / "imported"
    small = ("--shard-size", "1KB", "--delete-source")
    assert_usage_error(_import(tmp_path / "engine", out, *small), "data_9.pt")
    listed = set(hookdump.load(out).sample_ids)
    held = {paths[0]: {"data-1", "data-2"}, paths[1]: {"data-3", "data-4"}}
    for path, requests in held.items():
        assert path.exists() or requests <= listed
    (tmp_path / "engine" / "data_9.pt").unlink()
    assert _import(tmp_path / "engine", out, *small, "--resume").exit_code == 0
    assert not any(path.exists() for path in paths)
    assert hookdump.load(out).sample_ids == ["data-1", "data-2", "data-3", "data-4"]
