"""`--generate` (issue 45): rows of prompt + response, against transformers' own `generate`
(the tokens, one prompt at a time, unpadded) and a forward with `output_hidden_states` over
the same sequence (the values); decode against prefill; sampling seeded per prompt."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

import hookdump
from hookdump.cli import app

transformers = pytest.importorskip("transformers")

from tiny_text import tiny_causal_lm  # noqa: E402

PROMPTS = ["the cat", "a dog ran in the park and", "hooks", "the park the mat"]
NEW = 6
# prefill against decode: the same sums in another order (a cache, left padding), float32
TOLERANCE = {"rtol": 1e-4, "atol": 1e-5}


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("lm")
    return {family: tiny_causal_lm(root / family, family) for family in ("gpt2", "llama")}


@pytest.fixture
def prompts(tmp_path: Path) -> Path:
    path = tmp_path / "prompts.txt"
    path.write_text("\n".join(PROMPTS) + "\n")
    return path


def _run(*args: str) -> None:
    result = CliRunner().invoke(app, ["run", *args, "-q"])
    assert result.exit_code == 0, result.output
    assert result.stdout == ""


def _reference(
    folder: Path, prompt: str, eos: int, **sampling: object
) -> tuple[list[int], list[int]]:
    """transformers' own greedy generation of one prompt (no padding): prompt and response."""
    tokenizer = transformers.AutoTokenizer.from_pretrained(folder)
    model = transformers.AutoModelForCausalLM.from_pretrained(folder).eval()
    ids = tokenizer(prompt, return_tensors="pt")["input_ids"]
    out = model.generate(ids, max_new_tokens=NEW, do_sample=False, eos_token_id=eos,
                         pad_token_id=eos, **sampling)  # fmt: skip
    return ids[0].tolist(), out[0, ids.shape[1] :].tolist()


def _by_sample(dump: hookdump.Dump, key: str) -> list[torch.Tensor]:
    samples = dump["__sample__"]
    values = dump[key]
    return [values[samples == s] for s in range(int(samples.max()) + 1)]


@pytest.mark.parametrize("family", ["gpt2", "llama"])
def test_prefill_rows_are_the_models_own(
    models: dict[str, Path], prompts: Path, tmp_path: Path, family: str
) -> None:
    folder = models[family]
    tokenizer = transformers.AutoTokenizer.from_pretrained(folder)
    # an EOS the model writes for some prompts and not others: the first prompt's 3rd token
    eos = _reference(folder, PROMPTS[0], -1)[1][2]
    tokenizer.eos_token = tokenizer.convert_ids_to_tokens(eos)
    tokenizer.save_pretrained(folder / "tok")
    layer = "transformer.h.0" if family == "gpt2" else "model.layers.0"  # the last has ln_f
    out = tmp_path / "d"
    _run(f"hf:{folder}", "--tokenizer", str(folder / "tok"), "--text", str(prompts),
         "--generate", str(NEW), "--layers", layer, "--batch-size", "3",
         "--out", str(out))  # fmt: skip
    dump = hookdump.load(out)
    model = transformers.AutoModelForCausalLM.from_pretrained(folder).eval()
    ids, response = _by_sample(dump, "__token_ids__"), _by_sample(dump, "__response__")
    values = _by_sample(dump, layer)
    stops = []
    for index, prompt in enumerate(PROMPTS):
        real, generated = _reference(folder, prompt, eos)
        if eos in generated:
            generated = generated[: generated.index(eos) + 1]
        assert ids[index].tolist() == real + generated
        assert response[index].tolist() == [0] * len(real) + [1] * len(generated)
        with torch.no_grad():
            hidden = model(torch.tensor([real + generated]), output_hidden_states=True)
        torch.testing.assert_close(values[index], hidden.hidden_states[1][0], **TOLERANCE)
        stops.append([len(generated), "eos" if generated[-1] == eos else "length"])
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["generated"] == stops
    assert {s for _, s in stops} == {"eos", "length"}  # both ways of stopping were seen
    assert manifest["generation"]["max_new_tokens"] == NEW
    assert manifest["generation"]["capture"] == "prefill"
    assert dump["__position__"].tolist() == [p for s in ids for p in range(len(s))]


@pytest.mark.parametrize("family", ["gpt2", "llama"])
def test_decode_gives_the_rows_prefill_gives(
    models: dict[str, Path], prompts: Path, tmp_path: Path, family: str
) -> None:
    """Values from the passes that generated the tokens (a key-value cache, left padding)
    equal one forward over prompt + response, attention kinds included."""
    folder = models[family]
    attention = "transformer.h.0.attn" if family == "gpt2" else "model.layers.0.self_attn"
    args = [f"hf:{folder}", "--text", str(prompts), "--generate", str(NEW), "--layers",
            attention, "--layers", "resid_post.1", "--capture", "output,pattern,scores,q,k,v,z",
            "--batch-size", "3"]  # fmt: skip
    _run(*args, "--out", str(tmp_path / "prefill"))
    _run(*args, "--generate-capture", "decode", "--out", str(tmp_path / "decode"))
    prefill, decode = hookdump.load(tmp_path / "prefill"), hookdump.load(tmp_path / "decode")
    assert decode.keys() == prefill.keys()
    assert {f"{attention}:{k}" for k in ("pattern", "scores", "q", "k", "v", "z")} <= set(
        prefill.keys()
    )
    for key in prefill:
        a, b = prefill[key], decode[key]
        if key.endswith(":scores"):  # masked keys: the lowest float, give or take a score
            a, b = a.clamp(min=-1e30), b.clamp(min=-1e30)
        torch.testing.assert_close(b, a, **TOLERANCE, msg=key)


def test_decode_takes_inputs_and_ops_as_prefill_does(
    models: dict[str, Path], prompts: Path, tmp_path: Path
) -> None:
    args = [f"hf:{models['llama']}", "--text", str(prompts), "--generate", str(NEW),
            "--layers", "model.layers.1.mlp", "--capture", "input,output,ops",
            "--batch-size", "4"]  # fmt: skip
    _run(*args, "--out", str(tmp_path / "prefill"))
    _run(*args, "--generate-capture", "decode", "--out", str(tmp_path / "decode"))
    prefill, decode = hookdump.load(tmp_path / "prefill"), hookdump.load(tmp_path / "decode")
    assert decode.keys() == prefill.keys()
    assert any(":op." in key for key in prefill) and any(":input" in key for key in prefill)
    for key in prefill:
        torch.testing.assert_close(decode[key], prefill[key], **TOLERANCE, msg=key)


def test_sampled_tokens_do_not_depend_on_the_batch(
    models: dict[str, Path], prompts: Path, tmp_path: Path
) -> None:
    args = [f"hf:{models['gpt2']}", "--text", str(prompts), "--generate", str(NEW),
            "--layers", "transformer.h.0", "--do-sample", "--temperature", "1.5",
            "--top-k", "20", "--top-p", "0.95", "--seed", "3"]  # fmt: skip
    _run(*args, "--batch-size", "1", "--out", str(tmp_path / "one"))
    _run(*args, "--batch-size", "4", "--out", str(tmp_path / "four"))
    _run(*args, "--batch-size", "4", "--seed", "4", "--out", str(tmp_path / "other"))
    one, four = hookdump.load(tmp_path / "one"), hookdump.load(tmp_path / "four")
    assert torch.equal(one["__token_ids__"], four["__token_ids__"])
    other = hookdump.load(tmp_path / "other")
    assert not torch.equal(one["__token_ids__"], other["__token_ids__"])
    greedy = [_reference(models["gpt2"], p, -1)[1] for p in PROMPTS]
    sampled = [s[-NEW:].tolist() for s in _by_sample(one, "__token_ids__")]
    assert sampled != greedy
    assert one.manifest["generation"]["seed"] == 3


def test_resumed_generation_goes_on_with_the_same_tokens(
    models: dict[str, Path], prompts: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tiny_text import ctrl_c_in_batch

    args = [f"hf:{models['gpt2']}", "--text", str(prompts), "--generate", str(NEW),
            "--layers", "transformer.h.0", "--do-sample", "--batch-size", "2",
            "--shard-size", "1KiB"]  # fmt: skip
    _run(*args, "--out", str(tmp_path / "whole"))
    ctrl_c_in_batch(monkeypatch, 2)
    result = CliRunner().invoke(app, ["run", *args, "--out", str(tmp_path / "cut"), "-q"])
    assert result.exit_code == 130, result.output
    monkeypatch.undo()
    _run(*args, "--out", str(tmp_path / "cut"), "--resume")
    whole, cut = hookdump.load(tmp_path / "whole"), hookdump.load(tmp_path / "cut")
    for key in ("__token_ids__", "__response__", "transformer.h.0"):
        assert torch.equal(whole[key], cut[key]), key
    assert whole.manifest["generated"] == cut.manifest["generated"]


def test_the_python_door_generates_too(models: dict[str, Path], tmp_path: Path) -> None:
    folder = models["gpt2"]
    tokenizer = transformers.AutoTokenizer.from_pretrained(folder)
    model = transformers.AutoModelForCausalLM.from_pretrained(folder).eval()
    tokenizer.pad_token = tokenizer.eos_token
    tokenizer.padding_side = "left"  # either side will do
    batch = tokenizer(PROMPTS[:2], return_tensors="pt", padding=True)
    dump = hookdump.dump(model, [dict(batch)], tmp_path / "d", layers="transformer.h.0",
                         tokenizer=tokenizer,
                         generate=hookdump.Generation(NEW, capture="decode"))  # fmt: skip
    ids = _by_sample(dump, "__token_ids__")
    for index, prompt in enumerate(PROMPTS[:2]):
        real, generated = _reference(folder, prompt, tokenizer.eos_token_id)
        assert ids[index].tolist() == real + generated
    assert dump.manifest["generation"]["capture"] == "decode"


@pytest.mark.parametrize(
    ("extra", "said"),
    [
        (["--context-size", "8"], "leave --context-size out"),
        (["--capture", "grad"], "leave grad out"),
        (["--temperature", "0.5"], "add --do-sample"),
        (["--generate-capture", "later"], "--generate-capture"),
    ],
)
def test_refusals_are_one_line(
    models: dict[str, Path], prompts: Path, tmp_path: Path, extra: list[str], said: str
) -> None:
    out = tmp_path / "d"
    result = CliRunner().invoke(
        app,
        ["run", f"hf:{models['gpt2']}", "--text", str(prompts), "--generate", "4",
         "--layers", "transformer.h.0", "--out", str(out), *extra],
    )  # fmt: skip
    assert result.exit_code == 2, result.output
    assert result.stderr.startswith("Error: ") and said in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
    assert not out.exists()


def test_a_model_without_a_head_is_refused(tmp_path: Path, prompts: Path) -> None:
    from tiny_text import tiny_gpt2

    folder = tiny_gpt2(tmp_path / "bare", n_positions=64)
    result = CliRunner().invoke(app, ["run", f"hf:{folder}", "--text", str(prompts),
                                      "--generate", "4", "--out", str(tmp_path / "d")])  # fmt: skip
    assert result.exit_code == 2
    assert "GPT2Model" in result.stderr and "GPT2LMHeadModel" in result.stderr
    assert not (tmp_path / "d").exists()


def test_images_are_refused(tmp_path: Path) -> None:
    result = CliRunner().invoke(app, ["run", "resnet18", "--generate", "4",
                                      "--out", str(tmp_path / "d")])  # fmt: skip
    assert result.exit_code == 2
    assert "--generate" in result.stderr and "--text" in result.stderr


def test_inspect_show_and_export_carry_the_response(
    models: dict[str, Path], tmp_path: Path
) -> None:
    """`inspect` says how the tokens were made and shows the first sequence's text; `show`
    names a response token; every export carries `__response__` (SAELens': `response`)."""
    pytest.importorskip("datasets")
    import datasets

    prompts = tmp_path / "p.txt"
    prompts.write_text("the cat\na dog\nhooks dump\n")  # two tokens each: SAELens' one context
    out = tmp_path / "d"
    _run(f"hf:{models['gpt2']}", "--text", str(prompts), "--generate", "3", "--layers",
         "transformer.h.0", "--out", str(out))  # fmt: skip
    dump = hookdump.load(out)
    tokenizer = transformers.AutoTokenizer.from_pretrained(models["gpt2"])
    first = dump["__token_ids__"][dump["__sample__"] == 0].tolist()
    result = CliRunner().invoke(app, ["inspect", str(out)], env={"COLUMNS": "100"})
    assert result.exit_code == 0, result.output
    stops = dump.manifest["generated"]
    assert f"generated: up to 3 new tokens, greedy, prefill; {len(stops)} at " in result.stdout
    text = f"{prompts}:1: 'the cat' -> {tokenizer.decode(first[2:])!r}"
    assert text in result.stdout
    picture = tmp_path / "row.png"
    result = CliRunner().invoke(app, ["show", str(out), "transformer.h.0", "--sample", "2",
                                      "-o", str(picture)])  # fmt: skip
    assert result.exit_code == 0, result.output
    from hookdump.tools.pictures.tokens import row_token

    assert [row_token(dump, row)[3] for row in (1, 2)] == [False, True]  # type: ignore[index]
    for to in ("hf", "saelens"):
        keys = ["--keys", "transformer.h.0"] if to == "saelens" else []
        result = CliRunner().invoke(app, ["export", str(out), str(tmp_path / to), "--to", to,
                                          *keys])  # fmt: skip
        assert result.exit_code == 0, result.output
    hf = datasets.load_from_disk(str(tmp_path / "hf"))
    assert hf["__response__"] == dump["__response__"].tolist()
    saelens = datasets.load_from_disk(str(tmp_path / "saelens"))
    want = [dump["__response__"][dump["__sample__"] == s].tolist() for s in range(3)]
    assert saelens["response"] == want


def test_a_manifests_generated_list_is_checked(models: dict[str, Path], tmp_path: Path) -> None:
    """Dumps from elsewhere are untrusted: a `generated` entry that is not [tokens, stop]
    makes the dump invalid, in one line."""
    prompts = tmp_path / "p.txt"
    prompts.write_text("the cat\n")
    out = tmp_path / "d"
    _run(f"hf:{models['gpt2']}", "--text", str(prompts), "--generate", "2", "--layers",
         "transformer.h.0", "--out", str(out))  # fmt: skip
    manifest = json.loads((out / "manifest.json").read_text())
    for bad in ([[2, "bored"]], [["2", "eos"]], [[-1, "eos"]], [[2]], "eos"):
        (out / "manifest.json").write_text(json.dumps({**manifest, "generated": bad}))
        with pytest.raises(hookdump.InvalidDump, match="generated"):
            hookdump.load(out)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_on_cuda_decode_and_prefill_give_the_cpus_tokens(
    models: dict[str, Path], prompts: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(torch.backends.cuda.matmul, "allow_tf32", False)
    args = [f"hf:{models['llama']}", "--text", str(prompts), "--generate", str(NEW),
            "--layers", "model.layers.0.self_attn", "--capture", "output,pattern,k",
            "--batch-size", "3"]  # fmt: skip
    _run(*args, "--out", str(tmp_path / "cpu"))
    for capture in ("prefill", "decode"):
        _run(*args, "--device", "cuda", "--generate-capture", capture,
             "--out", str(tmp_path / capture))  # fmt: skip
        cpu, cuda = hookdump.load(tmp_path / "cpu"), hookdump.load(tmp_path / capture)
        assert torch.equal(cpu["__token_ids__"], cuda["__token_ids__"])
        for key in cpu:
            torch.testing.assert_close(cuda[key], cpu[key], **TOLERANCE, msg=key)


@pytest.fixture(scope="module")
def gemma2(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny Gemma 2: a sliding window of 4 on every other layer (its cache keeps the last
    few tokens there), soft-capped logits; the CORPUS tokenizer."""
    folder = tiny_causal_lm(tmp_path_factory.mktemp("gemma2") / "m", "gpt2")
    torch.manual_seed(0)
    config = transformers.Gemma2Config(
        num_hidden_layers=2, hidden_size=32, intermediate_size=64, num_attention_heads=4,
        num_key_value_heads=2, head_dim=8, vocab_size=32, max_position_embeddings=64,
        sliding_window=4, attn_logit_softcapping=50.0, final_logit_softcapping=30.0,
    )  # fmt: skip
    for name in ("model.safetensors", "config.json", "generation_config.json"):
        (folder / name).unlink(missing_ok=True)
    transformers.Gemma2ForCausalLM(config).eval().save_pretrained(folder)
    return folder


def test_decode_gives_prefills_rows_on_sliding_window_layers_and_the_lm_head(
    gemma2: Path, tmp_path: Path
) -> None:
    """A sliding-window layer's cache holds its last few tokens: a generated token's pattern
    has the window's weights as in prefill (they were all zero); the LM head's logits are
    every position's in decode too (generate computes the last position's alone)."""
    prompts = tmp_path / "p.txt"
    prompts.write_text("the\nthe cat sat on the mat and a dog ran in the park\ndog\nthe park\n")
    args = [f"hf:{gemma2}", "--text", str(prompts), "--generate", "10", "--layers",
            "model.layers.*.self_attn", "--layers", "lm_head", "--capture",
            "output,pattern,scores,z", "--batch-size", "4"]  # fmt: skip
    _run(*args, "--out", str(tmp_path / "prefill"))
    _run(*args, "--generate-capture", "decode", "--out", str(tmp_path / "decode"))
    prefill, decode = hookdump.load(tmp_path / "prefill"), hookdump.load(tmp_path / "decode")
    assert decode.keys() == prefill.keys() and "lm_head" in prefill
    pattern = prefill["model.layers.0.self_attn:pattern"]
    assert torch.allclose(pattern.sum(-1), torch.ones(()), atol=1e-5)  # every row, prefill
    for key in prefill:
        a, b = prefill[key], decode[key]
        if key.endswith(":scores"):
            a, b = a.clamp(min=-1e30), b.clamp(min=-1e30)
        torch.testing.assert_close(b, a, **TOLERANCE, msg=key)


def test_prompts_cut_to_leave_room_for_the_new_tokens_are_counted_and_recorded(
    models: dict[str, Path], tmp_path: Path
) -> None:
    """64 positions and --generate 60 leave 4 tokens per prompt: the run says how many
    prompts were cut, and the manifest records the length they were cut to."""
    prompts = tmp_path / "p.txt"
    prompts.write_text("the cat\na dog ran in the park and the cat sat on the mat\nhooks\n")
    result = CliRunner().invoke(app, ["run", f"hf:{models['gpt2']}", "--text", str(prompts),
                                      "--generate", "60", "--layers", "transformer.h.0",
                                      "--out", str(tmp_path / "d")])  # fmt: skip
    assert result.exit_code == 0, result.output
    lines = [line for line in result.stderr.splitlines() if "prompts" in line]
    assert len(lines) == 1 and "1 of 3 prompts had more than 4 tokens" in lines[0], result.stderr
    assert "takes 64 positions, and --generate 60 leaves 4 for a prompt" in lines[0]
    dump = hookdump.load(tmp_path / "d")
    assert dump.manifest["input"]["max_length"] == 4
    tokenizer = transformers.AutoTokenizer.from_pretrained(models["gpt2"])
    real = [len(tokenizer(p)["input_ids"]) for p in prompts.read_text().splitlines()]
    kept = [int((r == 0).sum()) for r in _by_sample(dump, "__response__")]
    assert kept == [min(n, 4) for n in real] and sum(n > 4 for n in real) == 1
