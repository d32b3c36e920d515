"""`hookdump import vllm` (issue 58, part 1): the hidden states vLLM's connectors write, one
file per request, made a dump. No engine runs here: the files are written by a writer that
follows the connector byte for byte (`save_file` of `hidden_states` `[tokens, layers,
hidden]`, as the cache-only layer holds them, and `token_ids` `[tokens]`, under
`<request id>.safetensors`), from transformers' own `output_hidden_states` of a tiny GPT-2.
The import's every row equals that, and equals what `hookdump run` of the same tokens
through the same model captures at `blocks.N.hook_resid_pre`; a file that is not what the
engine writes is one line naming it, exit 2; a file the engine is still writing (its
`.lock` held) is left for a later import."""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

import pytest
import torch
from clitools import assert_usage_error, invoke
from safetensors.torch import save_file

import hookdump

transformers = pytest.importorskip("transformers")

LAYER_IDS = [1, 3]
PROMPTS = [[5, 9, 2, 7, 7, 1], [3, 4], [11, 12, 13, 14, 15, 16, 17, 18, 19]]


@pytest.fixture(scope="module")
def gpt2() -> torch.nn.Module:
    torch.manual_seed(0)
    config = transformers.GPT2Config(n_layer=4, n_embd=16, n_head=2, vocab_size=32, n_positions=32)
    return transformers.GPT2LMHeadModel(config).eval()


def _hidden(model: torch.nn.Module, ids: list[int]) -> torch.Tensor:
    """[tokens, layers, hidden]: transformers' hidden_states[N] for each N of LAYER_IDS (the
    residual stream entering block N), as the connector stores them."""
    with torch.no_grad():
        out = model(torch.tensor([ids]), output_hidden_states=True)
    return torch.stack([out.hidden_states[n][0] for n in LAYER_IDS], dim=1).contiguous()


def _engine_files(model: torch.nn.Module, folder: Path) -> list[Path]:
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for index, ids in enumerate(PROMPTS):
        path = folder / f"cmpl-{index:04x}-0.safetensors"
        save_file({"hidden_states": _hidden(model, ids), "token_ids": torch.tensor(ids)}, path)
        paths.append(path)
    return paths


def _import(source: Path, out: Path, *more: str) -> object:
    layer_ids = ",".join(map(str, LAYER_IDS))
    return invoke("import", "vllm", str(source), "--out", str(out), "--layer-ids", layer_ids,
                  "--quiet", *more)  # fmt: skip


def _import_while_written(path: Path, source: Path, out: Path) -> object:
    """An import while another process holds `path`'s `.lock`, as the connector does."""
    fd = os.open(str(path) + ".lock", os.O_CREAT | os.O_WRONLY, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        return _import(source, out)
    finally:
        os.close(fd)


def test_an_import_holds_every_row_the_model_computes(
    gpt2: torch.nn.Module, tmp_path: Path
) -> None:
    _engine_files(gpt2, tmp_path / "engine")
    result = _import(tmp_path / "engine", tmp_path / "imported")
    assert result.exit_code == 0, result.stderr
    imported = hookdump.load(tmp_path / "imported")
    keys = [f"blocks.{n}.hook_resid_pre" for n in LAYER_IDS]
    assert [k for k in imported if not k.startswith("__")] == keys
    assert imported.complete and imported.num_samples == sum(map(len, PROMPTS))
    assert imported.sample_ids == [f"cmpl-{i:04x}-0" for i in range(len(PROMPTS))]
    assert imported["__token_ids__"].tolist() == [t for ids in PROMPTS for t in ids]
    assert imported["__position__"].tolist() == [p for ids in PROMPTS for p in range(len(ids))]
    expected = torch.cat([_hidden(gpt2, ids) for ids in PROMPTS])  # transformers' own rows
    for index, key in enumerate(keys):
        torch.testing.assert_close(imported[key], expected[:, index], rtol=0, atol=0)
    # and `hookdump run` of the same tokens through the model names the same values so
    batches = [{"input_ids": torch.tensor([ids]), "attention_mask": torch.ones(1, len(ids))}
               for ids in PROMPTS]  # fmt: skip
    hookdump.dump(gpt2, batches, tmp_path / "run", layers=keys, per_token=True)
    compared = invoke("diff", str(tmp_path / "run"), str(tmp_path / "imported"), "--atol", "1e-5")
    assert compared.exit_code == 0, compared.stdout + compared.stderr


def test_a_file_whose_rows_are_not_its_tokens_is_one_line(
    gpt2: torch.nn.Module, tmp_path: Path
) -> None:
    """sglang #26163: fewer hidden-state rows than tokens, silently misattributed there."""
    paths = _engine_files(gpt2, tmp_path / "engine")
    save_file({"hidden_states": _hidden(gpt2, PROMPTS[2])[:-1],
               "token_ids": torch.tensor(PROMPTS[2])}, paths[2])  # fmt: skip
    line = assert_usage_error(_import(tmp_path / "engine", tmp_path / "imported"), paths[2].name)
    assert "8 rows of hidden states for 9 tokens" in line


@pytest.mark.parametrize(
    ("damage", "said"),
    [
        ("nan", "token 1's hidden state in the file's layer 1 (counted from 0) is not finite"),
        ("width", "holds rows 8 wide where the files before it hold 16"),
        ("cut", "is not a whole safetensors file"),
        ("keys", "holds hidden, not hidden_states and token_ids"),
        ("flat", "hidden_states is float32 [2, 16], not floats [tokens, layers, hidden]"),
        ("float_ids", "token_ids is float32 [2], not integers [tokens]"),
        ("dtype", "holds float16 where the files before it hold float32"),
        ("noise", "is not a whole safetensors file"),
        ("huge_header", "is not a whole safetensors file"),
    ],
)
def test_a_damaged_file_is_one_line_naming_it(
    gpt2: torch.nn.Module, tmp_path: Path, damage: str, said: str
) -> None:
    paths = _engine_files(gpt2, tmp_path / "engine")
    hidden, ids = _hidden(gpt2, PROMPTS[1]), torch.tensor(PROMPTS[1])
    if damage == "nan":
        hidden[1, 1, 0] = float("nan")
    if damage == "width":
        hidden = hidden[..., :8].contiguous()
    if damage == "flat":
        hidden = hidden[:, 0].contiguous()
    if damage == "float_ids":
        ids = ids.float()
    if damage == "dtype":
        hidden = hidden.half()
    tensors = (
        {"hidden": hidden} if damage == "keys" else {"hidden_states": hidden, "token_ids": ids}
    )
    save_file(tensors, paths[1])
    if damage == "cut":
        paths[1].write_bytes(paths[1].read_bytes()[:-10])
    if damage == "noise":
        paths[1].write_bytes(os.urandom(4096))
    if damage == "huge_header":  # a header length of 2**60 bytes, and nothing behind it
        paths[1].write_bytes((1 << 60).to_bytes(8, "little") + b"{}")
    line = assert_usage_error(_import(tmp_path / "engine", tmp_path / "imported"), said)
    assert paths[1].name in line
    assert (
        not (tmp_path / "imported" / "manifest.json").exists()
        or not hookdump.load(tmp_path / "imported").complete
    )


def test_a_file_the_engine_is_writing_is_left_for_a_later_import(
    gpt2: torch.nn.Module, tmp_path: Path
) -> None:
    """The connector holds an exclusive flock on `<file>.lock` until the file is whole."""
    paths = _engine_files(gpt2, tmp_path / "engine")
    result = _import_while_written(paths[1], tmp_path / "engine", tmp_path / "imported")
    assert result.exit_code == 0, result.stderr
    assert "1 files the engine is still writing were left for a later import" in result.stderr
    assert paths[1].name in result.stderr
    imported = hookdump.load(tmp_path / "imported")
    assert imported.sample_ids == ["cmpl-0000-0", "cmpl-0002-0"]


def test_the_online_connectors_zstd_files_are_read(gpt2: torch.nn.Module, tmp_path: Path) -> None:
    zstandard = pytest.importorskip("zstandard")
    paths = _engine_files(gpt2, tmp_path / "engine" / "base")  # the online connector's folder
    for path in paths:
        Path(str(path) + ".zst").write_bytes(zstandard.ZstdCompressor(level=3).compress(
            path.read_bytes()))  # fmt: skip
        path.unlink()
    result = _import(tmp_path / "engine", tmp_path / "imported")
    assert result.exit_code == 0, result.stderr
    imported = hookdump.load(tmp_path / "imported")
    expected = torch.cat([_hidden(gpt2, ids) for ids in PROMPTS])
    torch.testing.assert_close(imported["blocks.3.hook_resid_pre"], expected[:, 1], rtol=0, atol=0)
    # decoded on threads ahead of the one kept: a bad one is still named, or skipped, in turn
    cut = Path(str(paths[1]) + ".zst")
    cut.write_bytes(cut.read_bytes()[:-20])
    line = assert_usage_error(_import(tmp_path / "engine", tmp_path / "bad"), cut.name)
    assert "is not a whole zstd frame" in line or "is not a whole safetensors file" in line
    skipped = _import(tmp_path / "engine", tmp_path / "skipping", "--skip-bad")
    assert skipped.exit_code == 0, skipped.stderr
    assert hookdump.load(tmp_path / "skipping").sample_ids == ["cmpl-0000-0", "cmpl-0002-0"]


def test_the_layers_must_be_named_and_counted(gpt2: torch.nn.Module, tmp_path: Path) -> None:
    _engine_files(gpt2, tmp_path / "engine")
    engine, out = str(tmp_path / "engine"), str(tmp_path / "d")
    assert_usage_error(invoke("import", "vllm", engine, "--out", out), "--layer-ids 1,2,3,4")
    assert_usage_error(
        invoke("import", "vllm", engine, "--out", out, "--layer-ids", "1,2,3"),
        "holds 2 layers, and --layer-ids names 3",
    )
    assert_usage_error(
        invoke("import", "vllm", engine, "--out", out, "--layer-ids", "1,x"),
        "'x' is not a layer's number",
    )
    assert_usage_error(
        invoke("import", "sglang", engine, "--out", out, "--layer-ids", "1,3"),
        "cannot import 'sglang': the kinds are vllm, trtllm",
    )
    assert_usage_error(
        invoke("import", "vllm", str(tmp_path / "nothing"), "--out", out, "--layer-ids", "1"),
        "does not exist",
    )


def test_what_an_import_prints(gpt2: torch.nn.Module, tmp_path: Path) -> None:
    _engine_files(gpt2, tmp_path / "engine")
    out = tmp_path / "imported"
    result = invoke("import", "vllm", str(tmp_path / "engine"), "--out", str(out),
                    "--layer-ids", "1,3")  # fmt: skip
    assert result.exit_code == 0, result.stderr
    assert result.stdout == f"imported 3 requests (17 token rows, 2 layers) into {out}\n"


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32, torch.float64])
def test_finite_values_are_told_from_nan_and_infinity_in_every_float(dtype: torch.dtype) -> None:
    """The compiled exponent-bit test against torch.isfinite, on the extremes of each dtype:
    the first NaN or infinity found where it is."""
    from hookdump.inputs.finite import first_nonfinite

    info = torch.finfo(dtype)
    finite = torch.tensor(
        [0.0, -0.0, info.max, info.min, info.tiny, info.tiny / 4, 1.0], dtype=dtype
    )
    assert first_nonfinite(finite) == -1
    for bad in (float("nan"), float("inf"), float("-inf")):
        values = finite.clone()
        values[3] = values[5] = bad
        assert first_nonfinite(values) == 3 and not bool(torch.isfinite(values).all())
        assert first_nonfinite(values.reshape(1, 7).t()) == 3  # not contiguous


def test_a_source_without_request_files_or_with_one_too_large_is_one_line(
    gpt2: torch.nn.Module, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "notes.txt").write_text("not a request")
    said = "holds no vllm file (*.safetensors, *.safetensors.zst)"
    assert_usage_error(_import(tmp_path / "empty", tmp_path / "d"), said)
    from hookdump.inputs import engine_files

    paths = _engine_files(gpt2, tmp_path / "engine")
    monkeypatch.setattr(engine_files, "MAX_FILE_BYTES", paths[0].stat().st_size - 1)
    line = assert_usage_error(_import(tmp_path / "engine", tmp_path / "d"), "bytes; refused")
    assert paths[0].name in line


def test_skip_bad_imports_the_rest_and_lists_what_it_left_out(
    gpt2: torch.nn.Module, tmp_path: Path
) -> None:
    """The bad files are the first and the last: one before any row, one after the last."""
    paths = _engine_files(gpt2, tmp_path / "engine")
    hidden = _hidden(gpt2, PROMPTS[2])
    hidden[3, 0, 5] = float("inf")
    save_file({"hidden_states": hidden, "token_ids": torch.tensor(PROMPTS[2])}, paths[2])
    paths[0].write_bytes(paths[0].read_bytes()[:-10])
    result = _import(tmp_path / "engine", tmp_path / "imported", "--skip-bad")
    assert result.exit_code == 0, result.stderr
    assert result.stderr.splitlines() == [
        f"skipped {paths[0]}: is not a whole safetensors file "
        f"({result.stderr.split('(', 1)[1].split(')', 1)[0]})",
        f"skipped {paths[2]}: token 3's hidden state in the file's layer 0 (counted from 0) is "
        "not finite (NaN or infinity)",
    ]
    imported = hookdump.load(tmp_path / "imported")
    assert imported.complete and imported.sample_ids == ["cmpl-0001-0"]
    assert [s["path"] for s in imported.manifest["skipped_inputs"]] == [
        str(paths[0]),
        str(paths[2]),
    ]
    torch.testing.assert_close(
        imported["blocks.1.hook_resid_pre"], _hidden(gpt2, PROMPTS[1])[:, 0], rtol=0, atol=0
    )
    # without it, the first bad file is the one line
    line = assert_usage_error(_import(tmp_path / "engine", tmp_path / "again"), paths[0].name)
    assert "is not a whole safetensors file" in line


def test_the_manifest_names_the_engine_and_every_file_with_its_size(
    gpt2: torch.nn.Module, tmp_path: Path
) -> None:
    paths = _engine_files(gpt2, tmp_path / "engine" / "base")
    assert _import(tmp_path / "engine", tmp_path / "imported").exit_code == 0
    about = hookdump.load(tmp_path / "imported").manifest["input"]
    assert about["engine"] == {"name": "vllm", "version": None}
    assert about["source"] == str(tmp_path / "engine")
    assert about["layer_ids"] == LAYER_IDS
    assert about["files"] == [
        {"id": p.name.removesuffix(".safetensors"), "path": f"base/{p.name}",
         "bytes": p.stat().st_size}
        for p in paths
    ]  # fmt: skip


def test_resume_adds_the_files_written_since_without_reading_the_others_again(
    gpt2: torch.nn.Module, tmp_path: Path
) -> None:
    """The engine was writing the second file at the first import, and wrote a fourth
    after it; the files already imported are damaged since, so reading one again fails."""
    paths = _engine_files(gpt2, tmp_path / "engine")
    first = _import_while_written(paths[1], tmp_path / "engine", tmp_path / "imported")
    assert first.exit_code == 0, first.stderr
    assert hookdump.load(tmp_path / "imported").sample_ids == ["cmpl-0000-0", "cmpl-0002-0"]
    sizes = {p.name: p.stat().st_size for p in paths}
    for done in (paths[0], paths[2]):
        done.write_bytes(b"damaged after its rows were imported")
    later = [20, 21, 22]
    save_file({"hidden_states": _hidden(gpt2, later), "token_ids": torch.tensor(later)},
              tmp_path / "engine" / "cmpl-0003-0.safetensors")  # fmt: skip
    result = _import(tmp_path / "engine", tmp_path / "imported", "--resume")
    assert result.exit_code == 0, result.stderr
    imported = hookdump.load(tmp_path / "imported")
    order = [PROMPTS[0], PROMPTS[2], PROMPTS[1], later]
    assert imported.complete
    assert imported.sample_ids == ["cmpl-0000-0", "cmpl-0002-0", "cmpl-0001-0", "cmpl-0003-0"]
    assert imported["__token_ids__"].tolist() == [t for ids in order for t in ids]
    expected = torch.cat([_hidden(gpt2, ids) for ids in order])
    torch.testing.assert_close(imported["blocks.3.hook_resid_pre"], expected[:, 1], rtol=0, atol=0)
    files = imported.manifest["input"]["files"]
    assert [f["id"] for f in files] == imported.sample_ids
    assert [f["bytes"] for f in files[:3]] == [
        sizes[p.name] for p in (paths[0], paths[2], paths[1])
    ]
    checked = invoke("inspect", str(tmp_path / "imported"), "--check")
    assert checked.exit_code == 0, checked.stdout + checked.stderr
    # nothing new: the dump is as it was
    again = _import(tmp_path / "engine", tmp_path / "imported", "--resume")
    assert again.exit_code == 0, again.stderr
    assert hookdump.load(tmp_path / "imported").sample_ids == imported.sample_ids


def test_the_dump_may_not_lie_among_the_engines_files(
    gpt2: torch.nn.Module, tmp_path: Path
) -> None:
    _engine_files(gpt2, tmp_path / "engine")
    line = assert_usage_error(_import(tmp_path / "engine", tmp_path / "engine" / "dump"))
    assert "overlap; write the dump outside the engine's folder" in line
    assert not (tmp_path / "engine" / "dump").exists()
    line = assert_usage_error(_import(tmp_path / "engine", tmp_path))
    assert "overlap" in line


def test_two_files_of_one_request_are_one_line(gpt2: torch.nn.Module, tmp_path: Path) -> None:
    paths = _engine_files(gpt2, tmp_path / "engine" / "base")
    (tmp_path / "engine" / "lora").mkdir()
    (tmp_path / "engine" / "lora" / paths[1].name).write_bytes(paths[1].read_bytes())
    line = assert_usage_error(_import(tmp_path / "engine", tmp_path / "d"))
    assert "are both request 'cmpl-0001-0'" in line


def test_resume_goes_on_after_an_import_that_stopped_at_a_bad_file(
    gpt2: torch.nn.Module, tmp_path: Path
) -> None:
    """Small shards: the first files' rows are committed before the bad one stops the import;
    once the file is whole, `--resume` keeps them and imports the rest."""
    paths = _engine_files(gpt2, tmp_path / "engine")
    whole = paths[2].read_bytes()
    paths[2].write_bytes(whole[:-10])
    stopped = _import(tmp_path / "engine", tmp_path / "imported", "--shard-size", "1KB")
    assert_usage_error(stopped, paths[2].name)
    before = hookdump.load(tmp_path / "imported")
    assert not before.complete and before.sample_ids == ["cmpl-0000-0", "cmpl-0001-0"]
    paths[2].write_bytes(whole)
    result = _import(tmp_path / "engine", tmp_path / "imported", "--shard-size", "1KB", "--resume")
    assert result.exit_code == 0, result.stderr
    imported = hookdump.load(tmp_path / "imported")
    assert imported.complete and imported.sample_ids == [f"cmpl-{i:04x}-0" for i in range(3)]
    expected = torch.cat([_hidden(gpt2, ids) for ids in PROMPTS])
    torch.testing.assert_close(imported["blocks.1.hook_resid_pre"], expected[:, 0], rtol=0, atol=0)


def test_delete_source_deletes_only_files_whose_rows_the_dump_lists(
    gpt2: torch.nn.Module, tmp_path: Path
) -> None:
    """Small shards, the last file bad: the import stops there, and every file it deleted
    is a request the dump lists (whenever the writer listed it); the bad file is kept. Made
    whole, `--resume` imports the rest and deletes every file."""
    paths = _engine_files(gpt2, tmp_path / "engine")
    whole = paths[2].read_bytes()
    paths[2].write_bytes(whole[:-10])
    out = tmp_path / "imported"
    small = ("--shard-size", "1KB", "--delete-source")
    assert_usage_error(_import(tmp_path / "engine", out, *small), paths[2].name)
    listed = hookdump.load(out).sample_ids
    for path in paths[:2]:
        assert path.exists() or path.name.removesuffix(".safetensors") in listed
    assert paths[2].exists()
    paths[2].write_bytes(whole)
    result = _import(tmp_path / "engine", out, *small, "--resume")
    assert result.exit_code == 0, result.stderr
    assert not any(path.exists() for path in paths)
    imported = hookdump.load(out)
    assert imported.complete and imported.sample_ids == [f"cmpl-{i:04x}-0" for i in range(3)]
    expected = torch.cat([_hidden(gpt2, ids) for ids in PROMPTS])
    torch.testing.assert_close(imported["blocks.3.hook_resid_pre"], expected[:, 1], rtol=0, atol=0)
    files = imported.manifest["input"]["files"]
    assert [f["id"] for f in files] == imported.sample_ids
    assert files[2] == {"id": "cmpl-0002-0", "path": paths[2].name, "bytes": len(whole)}


def test_delete_source_never_deletes_a_path_a_manifest_names_outside_the_source(
    gpt2: torch.nn.Module, tmp_path: Path
) -> None:
    """The dump's manifest is untrusted: its files' paths are never what is deleted."""
    import json

    paths = _engine_files(gpt2, tmp_path / "engine")
    victim = tmp_path / "victim.safetensors"
    victim.write_bytes(b"not the engine's")
    out = tmp_path / "imported"
    assert _import(tmp_path / "engine", out).exit_code == 0
    manifest = json.loads((out / "manifest.json").read_text())
    for entry in manifest["input"]["files"]:
        entry["path"] = "../victim.safetensors"
    (out / "manifest.json").write_text(json.dumps(manifest))
    later = [20, 21, 22]
    save_file({"hidden_states": _hidden(gpt2, later), "token_ids": torch.tensor(later)},
              tmp_path / "engine" / "cmpl-0003-0.safetensors")  # fmt: skip
    result = _import(tmp_path / "engine", out, "--resume", "--delete-source")
    assert result.exit_code == 0, result.stderr
    assert victim.read_bytes() == b"not the engine's"
    assert all(path.exists() for path in paths)  # named otherwise by the manifest: kept
    assert not (tmp_path / "engine" / "cmpl-0003-0.safetensors").exists()


def test_delete_source_needs_a_folder(gpt2: torch.nn.Module, tmp_path: Path) -> None:
    _engine_files(gpt2, tmp_path / "engine")
    args = ["import", "vllm", str(tmp_path / "engine"), "--layer-ids", "1,3", "--delete-source"]
    line = assert_usage_error(invoke(*args, "--out", "s3://bucket/d"))
    assert "--delete-source deletes a file once the dump's folder lists its rows" in line
