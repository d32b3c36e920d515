"""Inside attention (`--capture pattern,scores,q,k,v,z`), checked against transformers itself:
the same model run whole in eager with `output_attentions=True` (patterns), plain hooks on
the projections (q, k, v, z), and the model's outputs without hookdump; the layers not
selected keep SDPA."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
import transformers
from clitools import assert_usage_error, invoke
from torch import nn

import hookdump
from hookdump.errors import HookdumpError

SMALL = {"num_hidden_layers": 2, "hidden_size": 32, "intermediate_size": 64,
         "num_attention_heads": 4, "vocab_size": 50}  # fmt: skip
KINDS = ("pattern", "scores", "q", "k", "v", "z")


def _gpt2() -> nn.Module:
    torch.manual_seed(0)
    config = transformers.GPT2Config(n_layer=2, n_embd=32, n_head=4, vocab_size=50, n_positions=32)
    return transformers.GPT2LMHeadModel(config).eval()


def _llama() -> nn.Module:  # rotary, and grouped-query attention: 2 key-value heads for 4
    torch.manual_seed(0)
    return transformers.LlamaForCausalLM(
        transformers.LlamaConfig(**SMALL, num_key_value_heads=2)
    ).eval()


def _gemma2() -> nn.Module:  # attention logits soft-capped at 0.5: most scores are capped
    torch.manual_seed(0)
    config = transformers.Gemma2Config(
        **SMALL, num_key_value_heads=2, head_dim=8, attn_logit_softcapping=0.5,
        query_pre_attn_scalar=8, sliding_window=4,
    )  # fmt: skip
    config._attn_implementation = "eager"  # sdpa cannot cap: transformers' own choice
    model = transformers.Gemma2ForCausalLM(config).eval()
    with torch.no_grad():  # scores large enough for the cap to bite
        for layer in model.model.layers:
            layer.self_attn.q_proj.weight *= 30
            layer.self_attn.k_proj.weight *= 30
    return model


def _bert() -> nn.Module:  # bidirectional
    torch.manual_seed(0)
    return transformers.BertModel(transformers.BertConfig(**SMALL)).eval()


def _batch() -> dict[str, torch.Tensor]:
    ids = torch.randint(0, 50, (2, 7), generator=torch.Generator().manual_seed(1))
    mask = torch.ones_like(ids)
    mask[1, 5:] = 0  # padding: its keys get no weight, its queries no rows
    return {"input_ids": ids, "attention_mask": mask}


def _eager_patterns(model: nn.Module, batch: dict[str, torch.Tensor]) -> Any:
    eager = type(model)(model.config)
    eager.load_state_dict(model.state_dict())
    eager.eval().config._attn_implementation = "eager"
    with torch.no_grad():
        return eager(**batch, output_attentions=True).attentions


def _main(output: Any) -> torch.Tensor:
    return output.logits if hasattr(output, "logits") else output.last_hidden_state


@pytest.mark.parametrize(
    ("make", "layer", "index", "kv_heads"),
    [(_gpt2, "transformer.h.1.attn", 1, 4), (_llama, "model.layers.1.self_attn", 1, 2),
     (_bert, "encoder.layer.0.attention.self", 0, 4),
     (_gemma2, "model.layers.1.self_attn", 1, 2)],
    ids=["gpt2", "llama-gqa-rotary", "bert-padded", "gemma2-softcap"],
)  # fmt: skip
def test_patterns_are_transformers_own_and_the_outputs_do_not_change(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, make: Any, layer: str, index: int,
    kv_heads: int,
) -> None:  # fmt: skip
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    model, batch = make(), _batch()
    with torch.no_grad():
        before = _main(model(**batch))
    sdpa_calls: list[str] = []
    real = ALL_ATTENTION_FUNCTIONS["sdpa"]

    def counted(module: nn.Module, *args: Any, **kwargs: Any) -> Any:
        sdpa_calls.append(type(module).__name__)
        return real(module, *args, **kwargs)

    monkeypatch.setitem(ALL_ATTENTION_FUNCTIONS._global_mapping, "sdpa", counted)
    had = model.config._attn_implementation
    with hookdump.capture(model, layers=[layer], capture=KINDS) as cap, torch.no_grad():
        during = _main(model(**batch))
    assert len(sdpa_calls) == (had == "sdpa")  # the other layer kept SDPA (or eager)
    assert model.config._attn_implementation == had  # put back
    torch.testing.assert_close(during, before)
    expected = _eager_patterns(model, batch)[index]
    torch.testing.assert_close(cap.tensors[f"{layer}:pattern"], expected)
    assert cap.tensors[f"{layer}:pattern"][1, :, :, 5:].abs().max() == 0  # no weight on padding
    assert cap.tensors[f"{layer}:k"].shape == (2, 7, kv_heads, 8)  # [B, T, kv heads, dim]
    assert cap.tensors[f"{layer}:q"].shape == cap.tensors[f"{layer}:z"].shape == (2, 7, 4, 8)
    scores = cap.tensors[f"{layer}:scores"]
    torch.testing.assert_close(scores.softmax(-1), expected)  # what the softmax took
    cap_at = getattr(model.config, "attn_logit_softcapping", None)
    if cap_at is not None:  # capped before the mask: every attended score within the cap
        attended = expected > 0
        assert scores[attended].abs().max() <= cap_at
        assert scores[attended].abs().max() > 0.9 * cap_at  # and the cap was reached


def test_gpt2s_q_k_v_and_z_are_its_projections(tmp_path: Path) -> None:
    """q, k, v: GPT-2's fused c_attn output split in three (no rotary); z: what its output
    projection c_proj takes, each seen by a plain hook."""
    model, batch = _gpt2(), _batch()
    attn = model.transformer.h[0].attn
    seen: dict[str, torch.Tensor] = {}
    handles = [
        attn.c_attn.register_forward_hook(lambda m, i, o: seen.update(qkv=o.detach().clone())),
        attn.c_proj.register_forward_pre_hook(lambda m, i: seen.update(z=i[0].detach().clone())),
    ]
    with torch.no_grad():
        model(**batch)
    for handle in handles:
        handle.remove()
    d = hookdump.dump(model, [batch], tmp_path / "d", layers=["transformer.h.0.attn"],
                      capture=["q", "k", "v", "z"])  # fmt: skip
    q, k, v = seen["qkv"].split(32, dim=2)
    for name, value in (("q", q), ("k", k), ("v", v), ("z", seen["z"])):
        torch.testing.assert_close(d[f"transformer.h.0.attn:{name}"], value.view(2, 7, 4, 8))
    assert d.info("transformer.h.0.attn:z").shape == (7, 4, 8)


def test_token_rows_of_a_pattern_are_each_querys_row(tmp_path: Path) -> None:
    model, batch = _gpt2(), _batch()
    d = hookdump.dump(model, [batch], tmp_path / "d", layers=["transformer.h.1.attn"],
                      capture="pattern", per_token=True)  # fmt: skip
    expected = _eager_patterns(model, batch)[1].transpose(1, 2)  # [B, T, heads, T]
    real = batch["attention_mask"].bool()
    torch.testing.assert_close(d["transformer.h.1.attn:pattern"], expected[real])
    assert d.info("transformer.h.1.attn:pattern").shape == (4, 7)  # [heads, T] per token


def test_token_rows_of_patterns_keep_one_width_across_batches(gpt2: Path, tmp_path: Path) -> None:
    """Documents of 3 to 7 tokens in batches of 2, each padded to its longest (dynamic
    padding): the rows of `pattern` and `scores` are padded along the keys to --max-length
    as a masked key is (weight 0, the lowest score), and their real part is each
    document's own pattern, run alone in eager."""
    corpus = tmp_path / "docs.txt"
    docs = ["the cat sat", "the dog sat on the mat today", "hello world again now",
            "a b c d e", "the end"]  # fmt: skip
    corpus.write_text("\n".join(docs) + "\n")
    out = tmp_path / "d"
    result = invoke("run", f"hf:{gpt2}", "--text", str(corpus), "--per-token", "--max-length",
                    "12", "-l", "h.0.attn", "-c", "pattern,scores", "-b", "2", "-q",
                    "-o", str(out))  # fmt: skip
    assert result.exit_code == 0, result.stderr
    dump = hookdump.load(out)
    pattern, scores = dump["h.0.attn:pattern"], dump["h.0.attn:scores"]
    assert pattern.shape[1:] == scores.shape[1:] == (2, 12)  # [heads, --max-length]
    eager = transformers.GPT2Model.from_pretrained(gpt2, attn_implementation="eager").eval()
    samples, positions = dump["__sample__"].tolist(), dump["__position__"].tolist()
    ids = dump["__token_ids__"]
    for sample in sorted(set(samples)):
        rows = [i for i, s in enumerate(samples) if s == sample]
        length = len(rows)
        with torch.no_grad():
            own = eager(ids[rows][None], output_attentions=True).attentions[0][0]  # [h, T, T]
        for row in rows:
            p = positions[row]
            torch.testing.assert_close(pattern[row, :, :length], own[:, p, :])
            torch.testing.assert_close(scores[row, :, :length].softmax(-1), own[:, p, :])
            assert not pattern[row, :, length:].any()
            assert torch.all(scores[row, :, length:] == torch.finfo(torch.float32).min)


def test_attention_kinds_without_attention_modules_are_one_line(tmp_path: Path) -> None:
    with pytest.raises(HookdumpError, match="this model has none"):
        hookdump.capture(nn.Sequential(nn.Linear(2, 2)), capture="pattern")
    with pytest.raises(HookdumpError, match=r"the selection holds none; the nearest: .*attn"):
        hookdump.capture(_gpt2(), layers=["transformer.h.0.mlp"], capture="pattern")
    # every leaf (no layers given) holds no attention module: the first are named
    with pytest.raises(HookdumpError, match=r"the nearest: model\.layers\.0\.self_attn, "):
        hookdump.capture(_llama(), capture="pattern")
    line = assert_usage_error(invoke("run", "resnet18", "-c", "pattern"), "--capture pattern")
    assert "needs the attention modules of a transformers model" in line


def test_layers_marks_the_attention_modules(tmp_path: Path) -> None:
    _gpt2().save_pretrained(tmp_path / "gpt2")
    result = invoke("layers", f"hf:{tmp_path / 'gpt2'}", "-l", "transformer.h.0*", "--json")
    assert result.exit_code == 0, result.stderr
    marked = [row["name"] for row in json.loads(result.stdout) if row.get("attention")]
    assert marked == ["transformer.h.0.attn"]
    table = invoke("layers", f"hf:{tmp_path / 'gpt2'}", "-l", "transformer.h.0.attn").stdout
    assert "GPT2Attention (attention)" in table


def test_llamas_q_and_k_are_after_its_own_rotary_and_k_v_keep_the_key_value_heads(
    tmp_path: Path,
) -> None:
    """The reference: plain hooks on q_proj, k_proj, v_proj and the rotary embedding, with
    rotary applied by the model's own `apply_rotary_pos_emb`."""
    from transformers.models.llama import modeling_llama

    model, batch = _llama(), _batch()
    attn = model.model.layers[0].self_attn
    seen: dict[str, Any] = {}

    def keep(name: str) -> Any:
        return lambda m, i, o: seen.update({name: o})

    handles = [attn.q_proj.register_forward_hook(keep("q")),
               attn.k_proj.register_forward_hook(keep("k")),
               attn.v_proj.register_forward_hook(keep("v")),
               model.model.rotary_emb.register_forward_hook(keep("rotary"))]  # fmt: skip
    with torch.no_grad():
        model(**batch)
    for handle in handles:
        handle.remove()
    d = hookdump.dump(model, [batch], tmp_path / "d", layers=["model.layers.0.self_attn"],
                      capture=["q", "k", "v", "q_pre_rope", "k_pre_rope"])  # fmt: skip
    cos, sin = seen["rotary"]
    heads = {"q": 4, "k": 2, "v": 2}
    q, k, v = (seen[n].view(2, 7, heads[n], 8).transpose(1, 2) for n in ("q", "k", "v"))
    # before the rotation: the projections themselves (TransformerLens' hook_q, hook_k)
    for name, value in (("q_pre_rope", q), ("k_pre_rope", k)):
        got = d[f"model.layers.0.self_attn:{name}"]
        torch.testing.assert_close(got, value.transpose(1, 2), rtol=1e-5, atol=1e-6)
    q, k = modeling_llama.apply_rotary_pos_emb(q, k, cos, sin)
    for name, value in (("q", q), ("k", k), ("v", v)):
        torch.testing.assert_close(d[f"model.layers.0.self_attn:{name}"], value.transpose(1, 2))
    assert not torch.allclose(q, seen["q"].view(2, 7, 4, 8).transpose(1, 2))  # rotated


def test_q_and_k_before_rotary_are_q_and_k_without_it_and_another_rotation_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """GPT-2 has no rotary embedding: its q and k as they are. A rotation hookdump cannot
    undo (here, Llama's own function made to rotate the other way) is refused."""
    from transformers.models.llama import modeling_llama

    kinds = ["q", "k", "q_pre_rope", "k_pre_rope"]
    d = hookdump.dump(_gpt2(), [_batch()], tmp_path / "g", layers=["transformer.h.0.attn"],
                      capture=kinds)  # fmt: skip
    for kind in ("q", "k"):
        key = f"transformer.h.0.attn:{kind}"
        assert torch.equal(d[key], d[f"{key}_pre_rope"])
    real = modeling_llama.apply_rotary_pos_emb

    def other_way(q: Any, k: Any, cos: Any, sin: Any, *rest: Any, **kw: Any) -> Any:
        return real(q, k, cos, -sin, *rest, **kw)

    monkeypatch.setattr(modeling_llama, "apply_rotary_pos_emb", other_way)
    with pytest.raises(HookdumpError, match="is not the rotate-half kind hookdump can undo"):
        hookdump.dump(_llama(), [_batch()], tmp_path / "l", layers=["model.layers.0.self_attn"],
                      capture=kinds)  # fmt: skip


@pytest.mark.parametrize("how", ["mean", "max", "first", "last"])
def test_reduce_takes_attention_kinds_over_their_query_tokens(tmp_path: Path, how: str) -> None:
    """Issue 32, N6: the feature-map rule reduced a pattern [heads, T, T] to [heads] (always
    1/T) and q [T, heads, head_dim] to [T]; both now reduce over the query tokens."""
    model, batch = _gpt2(), _batch()
    batch["attention_mask"] = torch.ones_like(batch["attention_mask"])
    whole = hookdump.dump(model, [batch], tmp_path / "whole", layers=["transformer.h.0.attn"],
                          capture=["pattern", "q"])  # fmt: skip
    reduced = hookdump.dump(model, [batch], tmp_path / "r", layers=["transformer.h.0.attn"],
                            capture=["pattern", "q"], reduce=how)  # fmt: skip
    pattern, q = whole["transformer.h.0.attn:pattern"], whole["transformer.h.0.attn:q"]
    take = {
        "mean": lambda t, dim: t.mean(dim), "max": lambda t, dim: t.amax(dim),
        "first": lambda t, dim: t.select(dim, 0), "last": lambda t, dim: t.select(dim, -1),
    }[how]  # fmt: skip
    torch.testing.assert_close(reduced["transformer.h.0.attn:pattern"], take(pattern, 2))
    torch.testing.assert_close(reduced["transformer.h.0.attn:q"], take(q, 1))
    assert reduced.info("transformer.h.0.attn:pattern").shape == (4, 7)  # [heads, keys]
    assert reduced.info("transformer.h.0.attn:q").shape == (4, 8)  # [heads, head_dim]


def test_reduce_of_attention_kinds_counts_real_queries_only() -> None:
    from hookdump.hooks.reduce import reduce_attention

    torch.manual_seed(0)
    pattern, q = torch.rand(2, 3, 5, 5), torch.rand(2, 5, 3, 4)  # [B, heads, T, T], [B, T, h, d]
    mask = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0]])
    got = reduce_attention(pattern, "mean", "pattern", mask)
    torch.testing.assert_close(got[1], pattern[1, :, :3].mean(1))  # three real queries
    torch.testing.assert_close(reduce_attention(q, "last", "q", mask)[1], q[1, 2])
    torch.testing.assert_close(reduce_attention(q, "max", "q", mask)[1], q[1, :3].amax(0))


def test_repeated_key_value_heads_are_the_ones_each_query_head_reads(tmp_path: Path) -> None:
    """`repeat_kv_heads`: k, v and k_pre_rope with a head per query head, as transformers'
    own `repeat_kv` makes them, and such that each head's z is its pattern times its v."""
    from transformers.models.llama import modeling_llama

    model, batch = _llama(), _batch()
    kinds = ["k", "v", "k_pre_rope", "pattern", "z"]
    layer = ["model.layers.1.self_attn"]
    grouped = hookdump.dump(model, [batch], tmp_path / "g", layers=layer, capture=kinds)
    repeated = hookdump.dump(model, [batch], tmp_path / "r", layers=layer, capture=kinds,
                             repeat_kv_heads=True)  # fmt: skip
    for kind in ("k", "v", "k_pre_rope"):
        key = f"{layer[0]}:{kind}"
        assert grouped[key].shape == (2, 7, 2, 8) and repeated[key].shape == (2, 7, 4, 8)
        own = modeling_llama.repeat_kv(grouped[key].transpose(1, 2), 2).transpose(1, 2)
        assert torch.equal(repeated[key], own), kind
    pattern, v = repeated[f"{layer[0]}:pattern"], repeated[f"{layer[0]}:v"]
    z = torch.einsum("bhts,bshd->bthd", pattern, v)
    torch.testing.assert_close(repeated[f"{layer[0]}:z"], z, rtol=1e-5, atol=1e-6)
    assert json.loads((tmp_path / "r" / "manifest.json").read_text())["recipe"]["repeat_kv_heads"]


def test_repeating_key_value_heads_needs_k_or_v(tmp_path: Path) -> None:
    with pytest.raises(HookdumpError, match=r"repeat_kv_heads=True repeats the key-value heads"):
        hookdump.dump(_llama(), [_batch()], tmp_path / "d", layers=["model.layers.0.self_attn"],
                      capture="pattern", repeat_kv_heads=True)  # fmt: skip
    result = invoke("run", "resnet18", "--repeat-kv-heads", "-n", "1", "-o", str(tmp_path / "x"))
    assert_usage_error(result, "--repeat-kv-heads repeats the key-value heads of k, v")


@pytest.mark.parametrize("make", [_gpt2, _gemma2], ids=["sdpa", "eager"])
def test_output_and_pattern_write_the_weights_once(make: Any, tmp_path: Path) -> None:
    """`--capture output,pattern`: the weights are `M:pattern` alone. An sdpa model's
    module hands on no weights (the tap's `M:output.1` was a copy of `M:pattern`); an
    eager one's does, and they are the pattern's memory: not kept twice. The module's
    output is the model's own."""
    model = make()
    name = "transformer.h.0.attn" if make is _gpt2 else "model.layers.0.self_attn"
    module = model.get_submodule(name)
    seen: list[Any] = []
    module.register_forward_hook(lambda _m, _a, out: seen.append(out))
    with torch.no_grad():
        model(**_batch())
    with (
        hookdump.capture(model, layers=[name], capture="output,pattern") as cap,
        torch.no_grad(),
    ):
        model(**_batch())
    keys = [k for k in cap.tensors if k.startswith(name)]
    assert keys == [f"{name}:pattern", f"{name}:output.0"]  # in the order they came
    assert (seen[1][1] is None) == (seen[0][1] is None)  # what the module hands on, as before
    torch.testing.assert_close(cap.tensors[f"{name}:output.0"], seen[0][0])
