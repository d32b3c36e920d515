"""`hookdump export` / `hookdump.export`: the dump's rows read back equal through
`datasets.load_from_disk` and `numpy.load(mmap_mode="r")`, SAELens' layout for packed token
dumps (refused otherwise, in one line), and a folder made whole before it is in place."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from clitools import assert_usage_error, invoke
from safetensors.torch import load_file

import hookdump
from hookdump.store.read.dump import Dump

datasets = pytest.importorskip("datasets")
pytestmark = pytest.mark.usefixtures("in_tests_dir")


def _run(*args: str) -> None:
    result = invoke("run", *args, "-q")
    assert result.exit_code == 0, result.stderr


@pytest.fixture(scope="module")
def packed(gpt2: Path, tmp_path_factory: pytest.TempPathFactory) -> Dump:
    """Token rows of the corpus in windows of 5, both blocks, in 3 shards."""
    from tiny_text import CORPUS

    folder = tmp_path_factory.mktemp("packed")
    corpus = folder / "c.txt"
    corpus.write_text("\n".join(CORPUS * 3) + "\n")
    _run(f"hf:{gpt2}", "--text", str(corpus), "--context-size", "5", "--per-token",
         "-l", "h.0", "-l", "h.1", "-b", "2", "--shard-size", "3000",
         "-o", str(folder / "d"))  # fmt: skip
    dump = hookdump.load(folder / "d")
    assert len(dump.manifest.shards) >= 3
    return dump


def test_hf_rows_equal_the_dump(packed: Dump, tmp_path: Path) -> None:
    result = invoke("export", str(packed.path), str(tmp_path / "hf"), "--to", "hf")
    assert result.exit_code == 0, result.stderr
    assert f"{packed.num_samples} rows of 5 keys" in result.stdout
    loaded = datasets.load_from_disk(str(tmp_path / "hf")).with_format("torch")[:]
    assert len(loaded["__sample_id__"]) == packed.num_samples
    for key in packed:
        torch.testing.assert_close(loaded[key], packed[key], msg=key)
    ids = packed.sample_ids
    assert loaded["__sample_id__"] == [str(ids[i]) for i in packed["__sample__"].tolist()]
    # the floating keys' statistics come along, as the dump holds them
    stats = load_file(str(tmp_path / "hf" / "stats.safetensors"))
    assert sorted({name.rpartition("/")[0] for name in stats}) == ["h.0", "h.1"]
    for name, value in packed.stats("h.1").items():
        if name != "std":
            assert torch.equal(stats[f"h.1/{name}"], value), name


def test_npy_files_map_the_dump(packed: Dump, tmp_path: Path) -> None:
    result = hookdump.export(packed, tmp_path / "npy", to="npy", keys=["h.1", "__token_ids__"])
    assert result.rows == packed.num_samples and result.notes == []
    index = json.loads((tmp_path / "npy" / "index.json").read_text())
    assert sorted(index) == ["__token_ids__", "h.1"]
    for key, entry in index.items():
        array = np.load(tmp_path / "npy" / entry["file"], mmap_mode="r")
        assert isinstance(array, np.memmap)
        assert torch.equal(torch.from_numpy(np.array(array)), packed[key])
    ids = json.loads((tmp_path / "npy" / "sample_ids.json").read_text())  # null: row numbers
    assert (ids if ids is not None else list(range(len(packed.sample_ids)))) == packed.sample_ids


def test_bfloat16_is_written_as_float32_and_said(gpt2: Path, corpus: Path, tmp_path: Path) -> None:
    _run(f"hf:{gpt2}", "--text", str(corpus), "-l", "h.0", "--save-dtype", "bfloat16",
         "-o", str(tmp_path / "d"))  # fmt: skip
    dump = hookdump.load(tmp_path / "d")
    assert dump["h.0"].dtype == torch.bfloat16
    for to in ("hf", "npy"):
        result = invoke("export", str(tmp_path / "d"), str(tmp_path / to), "--to", to)
        assert result.exit_code == 0, result.stderr
        assert "note: h.0: bfloat16 written as float32" in result.stderr
    loaded = datasets.load_from_disk(str(tmp_path / "hf")).with_format("torch")[:]
    torch.testing.assert_close(loaded["h.0"], dump["h.0"].float(), rtol=0, atol=0)
    assert loaded["__sample_id__"] == [str(i) for i in dump.sample_ids]  # a row per sample
    array = np.load(tmp_path / "npy" / "h.0.npy", mmap_mode="r")
    assert array.dtype == np.float32 and torch.equal(torch.from_numpy(array.copy()),
                                                     dump["h.0"].float())  # fmt: skip


def test_saelens_layout_is_a_row_per_sequence(packed: Dump, tmp_path: Path) -> None:
    result = hookdump.export(packed, tmp_path / "sae", to="saelens", keys="h.1",
                           hook_name="blocks.1.hook_resid_post")  # fmt: skip
    sequences = packed.manifest["num_sequences"]
    assert result.rows == sequences
    loaded = datasets.load_from_disk(str(tmp_path / "sae"))
    assert loaded.column_names == ["blocks.1.hook_resid_post", "token_ids"]
    assert loaded.features["blocks.1.hook_resid_post"].shape == (5, 32)
    assert loaded.features["token_ids"].feature.dtype == "int32"
    loaded = loaded.with_format("torch")[:]
    acts = packed["h.1"].reshape(sequences, 5, 32)
    torch.testing.assert_close(loaded["blocks.1.hook_resid_post"], acts)
    assert torch.equal(loaded["token_ids"].long(), packed["__token_ids__"].reshape(-1, 5))


def test_saelens_refuses_what_does_not_fit(
    packed: Dump, gpt2: Path, corpus: Path, tmp_path: Path
) -> None:
    def refused(dump: Path, *args: str) -> str:
        return assert_usage_error(
            invoke("export", str(dump), str(tmp_path / "x"), "--to", "saelens", *args)
        )

    assert "one key under the hook's name" in refused(packed.path)  # two blocks
    _run(f"hf:{gpt2}", "--text", str(corpus), "-l", "h.0", "--per-token",
         "-o", str(tmp_path / "docs"))  # fmt: skip
    line = refused(tmp_path / "docs")  # documents of different lengths
    assert "needs every sequence's tokens in order, as many each: sample" in line
    _run(f"hf:{gpt2}", "--text", str(corpus), "-l", "h.0", "-o", str(tmp_path / "samples"))
    assert "needs token rows" in refused(tmp_path / "samples")
    assert not (tmp_path / "x").exists()
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []


def test_out_is_replaced_only_whole_and_only_an_export(
    packed: Dump, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    out = tmp_path / "out"
    assert hookdump.export(packed, out, to="npy", keys="h.0").rows == packed.num_samples
    assert_usage_error(invoke("export", str(packed.path), str(out), "--to", "npy"),
                       "is not empty; give --overwrite")  # fmt: skip
    other = tmp_path / "mine"
    other.mkdir()
    (other / "notes.txt").write_text("keep me")
    assert_usage_error(invoke("export", str(packed.path), str(other), "--to", "npy",
                              "--overwrite"), "holds no export of hookdump")  # fmt: skip
    assert (other / "notes.txt").read_text() == "keep me"
    assert_usage_error(invoke("export", str(packed.path), str(packed.path / "x"), "--to", "npy"),
                       "overlap")  # fmt: skip
    assert_usage_error(invoke("export", str(packed.path), str(out), "--to", "csv"),
                       "--to 'csv' is not a format")  # fmt: skip
    assert_usage_error(invoke("export", str(packed.path), str(out), "--to", "npy", "-k", "h.9",
                              "--overwrite"), "--keys 'h.9' matches no key")  # fmt: skip

    import hookdump.tools.export as export

    def fails(*args: object) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(export, "_WRITERS", {"npy": fails})
    with pytest.raises(hookdump.HookdumpError, match=r"export to .* failed: No space left"):
        hookdump.export(packed, out, to="npy", overwrite=True)
    monkeypatch.undo()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mine", "out"]  # no leftovers
    assert json.loads((out / "index.json").read_text()).keys() == {"h.0"}  # the old export
    result = invoke("export", str(packed.path), str(out), "--to", "npy", "--overwrite")
    assert result.exit_code == 0, result.stderr
    assert len(json.loads((out / "index.json").read_text())) == 5


@pytest.mark.slow
def test_saelens_trains_from_the_export(gpt2: Path, tmp_path: Path) -> None:
    """SAELens' own cached-activations reader (`ActivationsStore` with
    `cached_activations_path`) gives the dump's rows, and its trainer takes 5 steps."""
    pytest.importorskip("sae_lens")
    from sae_lens import StandardTrainingSAE, StandardTrainingSAEConfig
    from sae_lens.config import SAETrainerConfig
    from sae_lens.training.activations_store import ActivationsStore
    from sae_lens.training.sae_trainer import SAETrainer
    from tiny_text import CORPUS

    corpus = tmp_path / "c.txt"
    corpus.write_text("\n".join(CORPUS * 12) + "\n")
    _run(f"hf:{gpt2}", "--text", str(corpus), "--context-size", "5", "--per-token", "-l", "h.0",
         "-o", str(tmp_path / "d"))  # fmt: skip
    dump = hookdump.load(tmp_path / "d")
    hook = "blocks.0.hook_resid_post"
    hookdump.export(dump, tmp_path / "sae", to="saelens", keys="h.0", hook_name=hook)
    # the norm scaling factor carried: SAELens' own estimate, made over every row at once
    from sae_lens.training.activation_scaler import ActivationScaler

    scaler = ActivationScaler()
    scaler.estimate_scaling_factor(d_in=32, data_provider=iter([dump["h.0"]]),
                                   n_batches_for_norm_estimate=1)  # fmt: skip
    marker = json.loads((tmp_path / "sae" / "hookdump-export.json").read_text())
    carried = marker["statistics"][hook]["norm_scaling_factor"]
    assert carried == pytest.approx(scaler.scaling_factor, rel=1e-6)
    stats = load_file(str(tmp_path / "sae" / "stats.safetensors"))
    torch.testing.assert_close(stats[f"{hook}/mean"], dump.stats("h.0")["mean"], rtol=0, atol=0)
    store = ActivationsStore(
        model=None, dataset=None, streaming=False, hook_name=hook, hook_head_index=None,  # type: ignore[arg-type]
        context_size=5, d_in=32, n_batches_in_buffer=2, total_training_tokens=400,
        store_batch_size_prompts=4, train_batch_size_tokens=8, prepend_bos=True,
        normalize_activations="none", device=torch.device("cpu"), dtype="float32",
        cached_activations_path=str(tmp_path / "sae"),
    )  # fmt: skip
    rows = {tuple(row.tolist()) for row in dump["h.0"].round(decimals=5)}
    batch = store.next_batch()
    assert batch.shape == (8, 32)
    assert all(tuple(row.tolist()) in rows for row in batch.round(decimals=5))
    sae = StandardTrainingSAE(StandardTrainingSAEConfig(d_in=32, d_sae=64))
    before = sae.W_enc.detach().clone()
    config = SAETrainerConfig(total_training_samples=40, train_batch_size_samples=8, lr_end=3e-4)
    trainer = SAETrainer(config,
                         sae, data_provider=store)  # fmt: skip
    trained = trainer.fit()
    assert trainer.n_training_steps == 5
    assert torch.isfinite(trained.W_enc).all() and not torch.equal(trained.W_enc, before)
