"""`hookdump.dump`: a live module and the caller's own batches streamed to a dump, checked
against plain hooks that clone, the model's own outputs, transformers' hidden states, and
the CLI's dump of the same model and input."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from clitools import invoke
from safetensors.torch import save_file
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import hookdump
from hookdump.errors import HookdumpError, Interrupted

ROOT = Path(__file__).parent.parent


def _net(seed: int = 0) -> nn.Sequential:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 3))


def _cloned_outputs(model: nn.Module, batches: list[Any], call: Any) -> dict[str, torch.Tensor]:
    """The reference: a plain forward hook on every leaf that clones its output."""
    seen: dict[str, list[torch.Tensor]] = {}
    handles = [
        m.register_forward_hook(
            lambda _m, _i, out, name=name: seen.setdefault(name, []).append(out.detach().clone())
        )
        for name, m in model.named_modules()
        if not list(m.children())
    ]
    try:
        with torch.no_grad():
            for batch in batches:
                call(model, batch)
    finally:
        for h in handles:
            h.remove()
    return {name: torch.cat(values) for name, values in seen.items()}


def test_a_dataloader_of_pairs_with_forward_matches_plain_hooks(tmp_path: Path) -> None:
    model = _net().eval()
    x, y = torch.randn(10, 4), torch.arange(10)
    loader = DataLoader(TensorDataset(x, y), batch_size=4)  # batches of 4, 4 and 2
    d = hookdump.dump(model, loader, tmp_path / "d", forward=lambda m, b: m(b[0]))
    expected = _cloned_outputs(model, list(loader), lambda m, b: m(b[0]))
    assert isinstance(d, hookdump.Dump) and d.complete
    assert d.keys() == ["0", "1", "2"]
    for key, value in expected.items():
        torch.testing.assert_close(d[key], value, rtol=0, atol=0)
    assert d.sample_ids == list(range(10))
    assert d.manifest["input"] == {"source": "python", "layout": "batches"}


def test_dict_batches_go_in_as_keyword_arguments_and_ids_come_from_a_callable(
    tmp_path: Path,
) -> None:
    from tiny_models import Scale

    class Named(Scale):
        def forward(
            self, x: torch.Tensor, *, factor: torch.Tensor, names: list[str]
        ) -> torch.Tensor:
            return super().forward(x, factor=factor)

    batches = [
        {
            "x": torch.full((2, 3), float(i)),
            "factor": torch.tensor(2.0),
            "names": [f"a{i}", f"b{i}"],
        }
        for i in range(3)
    ]
    d = hookdump.dump(Named(), batches, tmp_path / "d", layers=["__root__"],
                      ids=lambda b: b["names"])  # fmt: skip
    assert d.sample_ids == ["a0", "b0", "a1", "b1", "a2", "b2"]
    expected = torch.cat([b["x"] * 2 for b in batches])
    torch.testing.assert_close(d["__root__"], expected, rtol=0, atol=0)


def test_batches_of_different_sizes_and_a_single_tensor(tmp_path: Path) -> None:
    model = _net().eval()
    batches = [torch.randn(n, 4) for n in (3, 1, 5)]
    d = hookdump.dump(model, batches, tmp_path / "d", layers=["2"])
    with torch.no_grad():
        expected = torch.cat([model(b) for b in batches])
    torch.testing.assert_close(d["2"], expected, rtol=0, atol=0)
    one = hookdump.dump(model, batches[2], tmp_path / "one", layers=["2"], num_samples=4)
    torch.testing.assert_close(one["2"], expected[4:8], rtol=0, atol=0)  # one batch, cut to 4


def test_a_model_with_lazy_modules_not_yet_run(tmp_path: Path) -> None:
    """A `LazyLinear` has no weights until its first forward: the manifest's hash of the
    model's state took their shape, and the run ended in a traceback."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Flatten(), nn.LazyLinear(3))
    batches = [torch.randn(2, 2, 3), torch.randn(3, 2, 3)]
    dump = hookdump.dump(model, batches, tmp_path / "d", layers="1")
    with torch.no_grad():
        own = torch.cat([model(b) for b in batches])
    torch.testing.assert_close(dump["1"], own)


def test_the_manifest_records_the_precision_the_forward_ran_in(tmp_path: Path) -> None:
    model = _net().eval().to(torch.bfloat16)
    d = hookdump.dump(model, torch.randn(2, 4, dtype=torch.bfloat16), tmp_path / "d", layers=["2"])
    assert d.manifest["dtype"] == "bfloat16" and d["2"].dtype == torch.bfloat16
    plain = hookdump.dump(_net(), torch.randn(2, 4), tmp_path / "f", layers=["2"])
    assert plain.manifest["dtype"] == "float32"


def test_the_model_runs_in_the_mode_asked_and_comes_back_as_it_was(tmp_path: Path) -> None:
    model = nn.Sequential(nn.Linear(4, 4), nn.Dropout(0.5)).train()
    model[0].eval()  # a mixed mode, to be put back exactly
    x = torch.ones(6, 4)
    d = hookdump.dump(model, [x], tmp_path / "d", train=False)
    with torch.no_grad():
        expected = model[0](x)  # eval: dropout is the identity
    torch.testing.assert_close(d["1"], expected, rtol=0, atol=0)
    assert model.training and not model[0].training and model[1].training
    assert d.manifest["train"] is False


def test_a_forward_that_raises_names_it_removes_the_hooks_and_leaves_out_alone(
    tmp_path: Path,
) -> None:
    from conftest import hook_state
    from tiny_models import Broken

    model = nn.Sequential(nn.Linear(4, 4), Broken())
    before = hook_state(model)
    with pytest.raises(HookdumpError, match=r"raised .*inside '1'"):
        hookdump.dump(model, [torch.ones(2, 4)], tmp_path / "d")
    assert hook_state(model) == before
    assert not (tmp_path / "d").exists() or not any((tmp_path / "d").iterdir())


def _interrupting(batches: list[torch.Tensor], after: int) -> Iterator[torch.Tensor]:
    for i, batch in enumerate(batches):
        if i == after:
            raise KeyboardInterrupt
        yield batch


def test_an_interrupted_dump_resumed_equals_one_run_whole(tmp_path: Path) -> None:
    model = _net().eval()
    batches = [torch.randn(2, 4, generator=torch.Generator().manual_seed(i)) for i in range(5)]
    whole = hookdump.dump(model, batches, tmp_path / "whole", shard_size=1)
    out = tmp_path / "resumed"
    with pytest.raises(Interrupted, match="resume"):
        hookdump.dump(model, _interrupting(batches, 3), out, shard_size=1)
    assert not hookdump.load(out).complete and hookdump.load(out).num_samples == 6
    resumed = hookdump.dump(model, batches, out, shard_size=1, resume=True)
    assert resumed.complete and resumed.sample_ids == whole.sample_ids
    for key in whole:
        torch.testing.assert_close(resumed[key], whole[key], rtol=0, atol=0)


def test_a_resume_with_other_ids_or_other_weights_is_refused(tmp_path: Path) -> None:
    model = _net().eval()
    batches = [torch.randn(2, 4) for _ in range(4)]
    ids = [f"s{i}" for i in range(8)]
    out = tmp_path / "d"
    with pytest.raises(Interrupted):
        hookdump.dump(model, _interrupting(batches, 2), out, ids=ids, shard_size=1)
    with pytest.raises(HookdumpError, match="sample 1 has id 'x1', but the dump holds 's1'"):
        hookdump.dump(model, batches, out, ids=["s0", "x1", *ids[2:]], resume=True)
    with torch.no_grad():
        model[0].bias.add_(1)
    with pytest.raises(HookdumpError, match=r"weights are not those the dump .* was made from"):
        hookdump.dump(model, batches, out, ids=ids, resume=True)


def test_token_rows_from_dict_batches_match_output_hidden_states(
    tmp_path: Path, gpt2: Path
) -> None:
    import transformers

    model = transformers.AutoModel.from_pretrained(gpt2).eval()
    ids = torch.randint(0, 30, (3, 7), generator=torch.Generator().manual_seed(0))
    mask = torch.ones_like(ids)
    mask[1, 5:] = 0  # a padded sample: its last two positions are no rows
    batches = [{"input_ids": ids[:2], "attention_mask": mask[:2]},
               {"input_ids": ids[2:], "attention_mask": mask[2:]}]  # fmt: skip
    d = hookdump.dump(model, batches, tmp_path / "d", layers=["h.0"], per_token=True)
    with torch.no_grad():
        hidden = model(input_ids=ids, attention_mask=mask, output_hidden_states=True)
    real = mask.bool()
    torch.testing.assert_close(d["h.0"], hidden.hidden_states[1][real])
    assert d["__token_ids__"].tolist() == ids[real].tolist()
    assert d["__sample__"].tolist() == real.nonzero()[:, 0].tolist()
    assert d["__position__"].tolist() == real.nonzero()[:, 1].tolist()
    assert d.manifest["rows"] == "tokens" and d.manifest["num_sequences"] == 3


@pytest.mark.usefixtures("in_tests_dir")
def test_the_cli_and_hookdump_dump_write_the_same_dump(tmp_path: Path) -> None:
    """The same model (by MODEL string) and input: identical keys, metadata and bytes."""
    x = torch.randn(6, 2, generator=torch.Generator().manual_seed(3))
    save_file({"x": x}, tmp_path / "x.safetensors")
    cli = tmp_path / "cli"
    args = ["run", "tiny_models:TwoLinear", "--input", str(tmp_path / "x.safetensors")]
    result = invoke(*args, "-b", "4", "-o", str(cli), "-q")
    assert result.exit_code == 0, result.stderr
    py = hookdump.dump("tiny_models:TwoLinear", [x[:4], x[4:]], tmp_path / "py")
    a = hookdump.load(cli)
    assert a.keys() == py.keys()
    assert a.manifest.tensors == py.manifest.tensors
    for key in a:
        assert torch.equal(a[key], py[key]), key


def test_the_public_surface(tmp_path: Path) -> None:
    for name in ("dump", "run", "capture", "Capture", "load", "Dump", "KeyInfo",
                 "HookdumpError", "InvalidDump", "__version__", "options"):  # fmt: skip
        assert name in dir(hookdump) and getattr(hookdump, name) is not None
    assert "RunOptions" not in dir(hookdump) and "RunOptions" in hookdump.options.__all__
    assert hookdump.RunOptions is hookdump.options.RunOptions  # kept for older scripts
    assert callable(hookdump.dump)
    code = "import sys, hookdump; dir(hookdump); print('torch' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "False"
    result = invoke("--version")
    assert (result.exit_code, result.stdout) == (0, f"hookdump {hookdump.__version__}\n")


def test_one_python_vocabulary_at_the_top_level() -> None:
    """Issue 33 and the contract (2026-11-25): the verbs show their real, typed keywords;
    `dir` is `__all__`; `help` opens with the verbs."""
    import inspect
    import typing

    assert dir(hookdump) == sorted(hookdump.__all__)
    assert {"dump", "load", "capture", "export", "Interrupted"} <= set(hookdump.__all__)
    signature = inspect.signature(hookdump.dump)
    keywords = [p for p in signature.parameters.values() if p.kind is p.KEYWORD_ONLY]
    assert len(keywords) > 20 and {"layers", "reduce", "per_token", "shard_size"} <= {
        p.name for p in keywords
    }
    hints = typing.get_type_hints(hookdump.dump)  # every annotation resolves
    assert all(p.name in hints for p in keywords)
    from hookdump.choices import EXPORT_TARGETS, REDUCTIONS, ExportTarget, Reduction

    assert hints["reduce"] == Reduction and typing.get_args(Reduction) == REDUCTIONS
    assert typing.get_type_hints(hookdump.export)["to"] == ExportTarget
    assert EXPORT_TARGETS == ("hf", "saelens", "npy", "routing")
    assert list(inspect.signature(hookdump.export).parameters)[:3] == ["dump", "out", "to"]
    assert (
        inspect.signature(hookdump.export).parameters["to"].kind is inspect.Parameter.KEYWORD_ONLY
    )
    with pytest.raises(TypeError, match=r"argument 'layer' \(did you mean layers\?\)"):
        hookdump.dump(nn.Linear(2, 2), [torch.randn(1, 2)], "never", layer=["x"])
    with pytest.raises(TypeError, match=r"^export\(\) got .* 'keyz' \(did you mean keys\?\)"):
        hookdump.export("never", "never2", to="npy", keyz=["x"])  # type: ignore[call-arg]
    assert not Path("never").exists()
    assert hookdump.__doc__ is not None
    opening = hookdump.__doc__.split("Example:")[0]
    for verb in ("dump(", "load(", "capture(", "export("):
        assert verb in opening
    assert issubclass(hookdump.Interrupted, KeyboardInterrupt)
    assert not issubclass(hookdump.Interrupted, Exception)


def test_export_takes_a_dump_or_its_folder(tmp_path: Path) -> None:
    d = hookdump.dump(_net(), [torch.randn(3, 4)], tmp_path / "d")
    by_path = hookdump.export(tmp_path / "d", tmp_path / "a", to="npy")
    by_dump = hookdump.export(d, tmp_path / "b", to="npy")
    assert by_path.rows == by_dump.rows == 3
    assert (tmp_path / "a" / "index.json").read_text() == (
        tmp_path / "b" / "index.json"
    ).read_text()


def test_a_dump_is_a_mapping_with_info_and_a_short_summary(tmp_path: Path) -> None:
    from collections.abc import Mapping

    model = _net().eval()
    d = hookdump.dump(model, [torch.randn(5, 4)], tmp_path / "d", ids=list("abcde"))
    assert isinstance(d, Mapping) and len(d) == 3 and "1" in d and "9" not in d
    assert d.get("9") is None and [k for k, _ in d.items()] == ["0", "1", "2"]
    info = d.info("2")
    assert (info.module, info.module_type, info.kind, info.shape, info.dtype, info.rows) == (
        "2", "Linear", "output", (3,), torch.float32, 5,
    )  # fmt: skip
    assert info.nbytes == 5 * 3 * 4
    assert d.sample_ids == list("abcde") and d.num_samples == 5
    lines = repr(d).splitlines()
    assert lines[0].startswith("Dump(") and "3 keys, 5 samples" in lines[0]
    assert lines[3].split()[:5] == ["2", "Linear", "output", "[3]", "float32"]
    assert d == d and d != hookdump.load(tmp_path / "d")  # identity: no tensor compared


def test_bad_arguments_are_one_clear_error(tmp_path: Path) -> None:
    model = _net()
    with pytest.raises(HookdumpError, match="iterable of batches"):
        hookdump.dump(model, 3, tmp_path / "a")
    with pytest.raises(HookdumpError, match="holds no tensor"):
        hookdump.dump(model, [["text"]], tmp_path / "b")
    with pytest.raises(HookdumpError, match="per_token=True takes dict batches"):
        hookdump.dump(model, [torch.ones(2, 4)], tmp_path / "c", per_token=True)
    with pytest.raises(HookdumpError, match="gave 1 ids for the batch at row 0"):
        hookdump.dump(model, [torch.ones(2, 4)], tmp_path / "e", ids=lambda b: ["only"])
    with pytest.raises(HookdumpError, match="skip_special_tokens needs tokenizer"):
        hookdump.dump(model, [{"input_ids": torch.ones(1, 2).long()}], tmp_path / "f",
                      per_token=True, skip_special_tokens=True)  # fmt: skip
    assert not any(p.exists() for p in (tmp_path / n for n in "abcef"))
    manifest = json.dumps(dict(hookdump.dump(model, [torch.ones(1, 4)], tmp_path / "g").manifest))
    assert '"source": "python"' in manifest


def test_options_take_typed_values_or_the_clis_spellings(tmp_path: Path) -> None:
    model = _net().eval()
    x = [torch.randn(3, 4)]
    typed = hookdump.dump(model, x, tmp_path / "a", capture=("output", "input"), layers=["2"],
                          save_dtype=torch.float16, shard_size=1 << 20)  # fmt: skip
    spelled = hookdump.dump(model, x, tmp_path / "b", capture="output,input", layers="2",
                            save_dtype="float16", shard_size="1MiB")  # fmt: skip
    assert typed.keys() == spelled.keys() == ["2:input.0", "2"]
    assert (
        typed.manifest.tensors == spelled.manifest.tensors
        and typed.info("2").dtype == torch.float16
    )
    assert typed.manifest["recipe"] == spelled.manifest["recipe"]
    with pytest.raises(HookdumpError, match="save_dtype 'float8' is not one of"):
        hookdump.dump(model, x, tmp_path / "c", save_dtype="float8")


def test_run_with_grouped_options_and_the_reprs_of_its_result_and_a_capture(
    tmp_path: Path,
) -> None:
    from hookdump.options import CaptureOptions, DumpOptions, InputOptions, ModelOptions, RunOptions

    options = RunOptions(
        ModelOptions("resnet18", device="cpu"),
        CaptureOptions(layers=("layer1.0.conv1", "fc")),
        InputOptions(num_samples=2, batch_size=2, shape=(3, 32, 32)),
        dump=DumpOptions(tmp_path / "d"),
    )
    result = hookdump.run(options)
    lines = repr(result).splitlines()
    assert lines[0].startswith("RunResult('resnet18' -> ") and "2 samples, 2 keys" in lines[0]
    assert lines[1].split()[:3] == ["layer1.0.conv1", "[64,", "8,"]
    assert hookdump.load(tmp_path / "d").manifest["recipe"]["input_shape"] == [3, 32, 32]
    model = _net()
    with hookdump.capture(model, layers=["0", "2"]) as cap:
        model(torch.ones(1, 4))
        assert repr(cap) == (
            "Capture(Sequential: 2 modules hooked [0, 2], capture output, reduce none, "
            "2 tensors kept)"
        )


def test_hookdump_dump_under_torchrun_is_refused_before_anything_starts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "0")
    with pytest.raises(HookdumpError, match="does not split data over torchrun's 2 processes"):
        hookdump.dump(_net(), [torch.ones(2, 4)], tmp_path / "d")
    assert not torch.distributed.is_initialized() and not (tmp_path / "d").exists()


def test_run_takes_a_live_module_and_python_data(tmp_path: Path) -> None:
    """`run(options, model=..., data=...)`: the engine's own door for a module and batches
    from Python, the values the forward computes; data and a file input at once refused."""
    from hookdump.options import (
        CaptureOptions,
        DumpOptions,
        InputOptions,
        ModelOptions,
        PythonData,
        RunOptions,
    )

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 3), nn.ReLU()).eval()
    batches = [torch.randn(2, 4), torch.randn(3, 4)]
    options = RunOptions(
        ModelOptions("live"), CaptureOptions(layers=("0",)), dump=DumpOptions(tmp_path / "d")
    )
    result = hookdump.run(options, model=model, data=batches)
    assert result.num_samples == 5
    d = hookdump.load(tmp_path / "d")
    assert d.manifest["input"]["source"] == "python"
    with torch.no_grad():
        assert torch.allclose(d["0"], model[0](torch.cat(batches)), atol=1e-6)
    ids = PythonData(batches, ids=[f"s{i}" for i in range(5)])
    again = dataclasses.replace(options, dump=DumpOptions(tmp_path / "e"))
    hookdump.run(again, model=model, data=ids)
    assert hookdump.load(tmp_path / "e").sample_ids == [f"s{i}" for i in range(5)]
    both = dataclasses.replace(options, input=InputOptions("images/"))
    with pytest.raises(HookdumpError, match="give the input once"):
        hookdump.run(both, model=model, data=batches)


def test_pairs_without_forward_are_told_to_give_forward(tmp_path: Path) -> None:
    """A DataLoader of (input, label) pairs, as every notebook has: the batch is called as
    model(x, y), and the one line says what to give."""
    from torch.utils.data import DataLoader, TensorDataset

    pairs = DataLoader(TensorDataset(torch.randn(8, 4), torch.arange(8)), batch_size=4)
    with pytest.raises(hookdump.HookdumpError) as failed:
        hookdump.dump(nn.Linear(4, 2), pairs, tmp_path / "d")
    assert str(failed.value).endswith(
        "each batch is a tuple or list of 2, called as model(*batch); for (input, label) "
        "pairs give forward=lambda m, b: m(b[0])"
    )
    assert not (tmp_path / "d").exists()
    d = hookdump.dump(nn.Linear(4, 2), pairs, tmp_path / "d", forward=lambda m, b: m(b[0]))
    assert d.num_samples == 8


def test_left_padding_gets_positions_from_the_mask(gpt2: Path, tmp_path: Path) -> None:
    """Issue 36: a left-padded batch of token rows gave activations far from the
    right-padded ones (the model counted the padding as positions) while `__position__`
    counted the real tokens. The model now gets position_ids from the mask, as `generate`
    makes them: the rows equal the right-padded run's, layer by layer."""
    transformers = pytest.importorskip("transformers")
    model = transformers.AutoModel.from_pretrained(gpt2).eval()
    ids = torch.tensor([[5, 6, 7, 8], [9, 10, 0, 0]])
    right = {"input_ids": ids, "attention_mask": torch.tensor([[1, 1, 1, 1], [1, 1, 0, 0]])}
    left_ids = torch.tensor([[5, 6, 7, 8], [0, 0, 9, 10]])
    left = {"input_ids": left_ids, "attention_mask": torch.tensor([[1, 1, 1, 1], [0, 0, 1, 1]])}
    given = hookdump.dump(model, [left], tmp_path / "l", layers="h.*", per_token=True)
    reference = hookdump.dump(model, [right], tmp_path / "r", layers="h.*", per_token=True)
    assert given["__token_ids__"].tolist() == reference["__token_ids__"].tolist()
    assert given["__position__"].tolist() == reference["__position__"].tolist()
    for key in ("h.0", "h.1"):
        torch.testing.assert_close(given[key], reference[key], rtol=1e-4, atol=1e-5)
