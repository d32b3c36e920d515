"""`--capture routing` (issue 48): router logits, chosen experts and their weights of the
MoE blocks of tiny random Mixtral, Qwen2-MoE (shared expert, a dense layer), Qwen3-MoE and
OLMoE models, against the model's own router logits (`output_router_logits`) and against
the block's own output rebuilt by hand from the captured experts and weights."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from clitools import assert_usage_error, invoke

import hookdump

transformers = pytest.importorskip("transformers")

VOCAB, EXPERTS, TOP = 64, 4, 2
SMALL = {"vocab_size": VOCAB, "hidden_size": 32, "intermediate_size": 48,
         "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
         "num_experts_per_tok": TOP}  # fmt: skip


def _model(family: str) -> Any:
    torch.manual_seed(0)
    if family == "mixtral":
        config = transformers.MixtralConfig(**SMALL, num_local_experts=EXPERTS)
        return transformers.MixtralForCausalLM(config).eval()
    if family == "qwen2_moe":  # a shared expert; layer 1 dense
        config = transformers.Qwen2MoeConfig(**SMALL, num_experts=EXPERTS, moe_intermediate_size=24,
                                             shared_expert_intermediate_size=40,
                                             mlp_only_layers=[1], norm_topk_prob=False)  # fmt: skip
        return transformers.Qwen2MoeForCausalLM(config).eval()
    if family == "qwen3_moe":
        config = transformers.Qwen3MoeConfig(**SMALL, num_experts=EXPERTS, moe_intermediate_size=24,
                                             norm_topk_prob=True, head_dim=8)  # fmt: skip
        return transformers.Qwen3MoeForCausalLM(config).eval()
    config = transformers.OlmoeConfig(**SMALL, num_experts=EXPERTS)
    return transformers.OlmoeForCausalLM(config).eval()


def _batch() -> dict[str, torch.Tensor]:
    """Two sequences of 6, the first left-padded by 2."""
    ids = torch.randint(0, VOCAB, (2, 6), generator=torch.Generator().manual_seed(1))
    mask = torch.ones(2, 6, dtype=torch.long)
    mask[0, :2] = 0
    return {"input_ids": ids, "attention_mask": mask}


def _rebuilt(block: Any, x: torch.Tensor, ids: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """The block's output from its experts' own weights, each token's chosen experts
    weighted as captured (and a shared expert's part, where it has one)."""
    experts = block.experts
    out = torch.zeros_like(x)
    for token in range(len(x)):
        for slot in range(ids.shape[-1]):
            e = int(ids[token, slot])
            gate, up = torch.nn.functional.linear(x[token], experts.gate_up_proj[e]).chunk(2)
            hidden = experts.act_fn(gate) * up
            down = torch.nn.functional.linear(hidden, experts.down_proj[e])
            out[token] += weights[token, slot] * down
    if hasattr(block, "shared_expert"):
        gate = torch.sigmoid(block.shared_expert_gate(x))
        out += gate * block.shared_expert(x)
    return out


@pytest.mark.parametrize("family", ["mixtral", "qwen2_moe", "qwen3_moe", "olmoe"])
def test_routing_is_the_models_own(family: str, tmp_path: Path) -> None:
    model = _model(family)
    batch = _batch()
    moe = [n for n, m in model.named_modules() if n.endswith(".mlp") and hasattr(m, "gate")]
    assert moe  # the MoE blocks (Qwen2-MoE's layer 1 is dense)
    with (
        hookdump.capture(model, layers=moe, capture="routing,input,output") as cap,
        torch.no_grad(),
    ):
        out = model(**batch, output_router_logits=True)
    for n, name in enumerate(moe):
        logits = cap.tensors[f"{name}:router_logits"]
        ids, weights = cap.tensors[f"{name}:topk_ids"], cap.tensors[f"{name}:topk_weights"]
        assert logits.shape == (2, 6, EXPERTS) and ids.shape == weights.shape == (2, 6, TOP)
        assert ids.dtype == torch.int64
        torch.testing.assert_close(logits.reshape(-1, EXPERTS), out.router_logits[n],
                                   rtol=1e-5, atol=1e-5)  # fmt: skip
        # the experts chosen are the top k of the logits, in the model's order
        order = logits.softmax(-1).topk(TOP, dim=-1).indices
        assert torch.equal(ids, order)
        # the weights are what the block multiplies its experts' outputs by
        block = dict(model.named_modules())[name]
        x = cap.tensors[f"{name}:input.0"].reshape(-1, 32)
        with torch.no_grad():
            rebuilt = _rebuilt(block, x, ids.reshape(-1, TOP), weights.reshape(-1, TOP))
        torch.testing.assert_close(rebuilt, cap.tensors[name].reshape(-1, 32), rtol=1e-5,
                                   atol=1e-6)  # fmt: skip


def test_token_rows_of_a_left_padded_batch(tmp_path: Path) -> None:
    """Per token: a row for each real token (the padding left out), equal to the per-sample
    values at the real positions; the ids int64, as the model's."""
    model, batch = _model("mixtral"), _batch()
    name = "model.layers.0.mlp"
    with hookdump.capture(model, layers=[name], capture="routing") as cap, torch.no_grad():
        model(**batch)
    dump = hookdump.dump(model, [batch], tmp_path / "d", layers=[name], capture=["routing"],
                         per_token=True)  # fmt: skip
    real = batch["attention_mask"].bool()
    assert dump.num_samples == int(real.sum()) == 10
    for kind in ("router_logits", "topk_ids", "topk_weights"):
        key = f"{name}:{kind}"
        torch.testing.assert_close(dump[key], cap.tensors[key][real])
    assert dump[f"{name}:topk_ids"].dtype == torch.int64
    assert dump.info(f"{name}:topk_ids").kind == "topk_ids"


def test_what_routing_is_refused(tmp_path: Path) -> None:
    """A dense layer, a decoder layer, a model without MoE blocks and a reduction: one line
    each, naming the nearest MoE blocks where there are some."""
    model = _model("qwen2_moe")
    with pytest.raises(hookdump.HookdumpError, match=r"'model\.layers\.1\.mlp' is not a mixture"):
        hookdump.capture(model, layers=["model.layers.*.mlp"], capture="routing")
    with pytest.raises(hookdump.HookdumpError, match=r"nearest MoE blocks: model\.layers\.0\.mlp"):
        hookdump.capture(model, layers=["model.layers.0"], capture="routing")
    with pytest.raises(hookdump.HookdumpError, match="leave reduce mean out"):
        hookdump.capture(model, layers=["model.layers.0.mlp"], capture="routing", reduce="mean")
    gpt2 = transformers.GPT2Model(transformers.GPT2Config(n_layer=1, n_embd=16, n_head=2))
    with pytest.raises(hookdump.HookdumpError, match="this model has none"):
        hookdump.capture(gpt2, layers=["h.0.mlp"], capture="routing")
    folder = tmp_path / "qwen"
    model.save_pretrained(folder)
    result = invoke("run", f"hf:{folder}", "--input-shape", "6", "-l", "model.layers.1.mlp",
                    "--capture", "routing", "-o", str(tmp_path / "d"))  # fmt: skip
    assert_usage_error(result, "'model.layers.1.mlp' is not a mixture-of-experts block")
    assert not (tmp_path / "d").exists()


def _folder(tmp_path: Path) -> Path:
    """A Mixtral folder with the CORPUS word tokenizer (an LM head, for --generate)."""
    from tiny_text import save_tokenizer

    folder = tmp_path / "mixtral"
    _model("mixtral").save_pretrained(folder)
    save_tokenizer(folder, cls_sep=False)
    return folder


def test_the_cli_takes_routing_as_token_rows_and_while_generating(
    tmp_path: Path, corpus: Path
) -> None:
    """`run --text --per-token --capture routing`: a row per real token, the model's own
    values; `--generate` with `--generate-capture decode` gives what prefill gives."""
    import json

    folder = _folder(tmp_path)
    block = "model.layers.1.mlp"
    listed = invoke("layers", f"hf:{folder}", "-l", "model.layers.1.*", "--json")
    marked = {row["name"]: row.get("moe", False) for row in json.loads(listed.stdout)}
    assert marked[block] and not marked[f"{block}.gate"] and not marked["model.layers.1.self_attn"]
    args = ["run", f"hf:{folder}", "--text", str(corpus), "--layers", block, "--capture",
            "routing", "-q"]  # fmt: skip
    result = invoke(*args, "--per-token", "--out", str(tmp_path / "rows"))
    assert result.exit_code == 0, result.stderr
    dump = hookdump.load(tmp_path / "rows")
    assert set(dump.keys()) >= {f"{block}:{k}" for k in ("router_logits", "topk_ids",
                                                         "topk_weights")}  # fmt: skip
    ids = dump[f"{block}:topk_ids"]
    assert ids.dtype == torch.int64 and ids.shape[1] == TOP and int(ids.max()) < EXPERTS
    weights = dump[f"{block}:topk_weights"]
    torch.testing.assert_close(weights.sum(-1), torch.ones(len(weights)))  # Mixtral's: normed
    chosen = dump[f"{block}:router_logits"].softmax(-1).topk(TOP, dim=-1).indices
    assert torch.equal(chosen, ids)
    generate = [*args, "--generate", "3", "--batch-size", "2"]
    assert invoke(*generate, "--out", str(tmp_path / "prefill")).exit_code == 0
    decoded = invoke(*generate, "--generate-capture", "decode", "--out", str(tmp_path / "dec"))
    assert decoded.exit_code == 0, decoded.stderr
    prefill, decode = hookdump.load(tmp_path / "prefill"), hookdump.load(tmp_path / "dec")
    assert decode.keys() == prefill.keys()
    for key in prefill:
        torch.testing.assert_close(decode[key], prefill[key], rtol=1e-4, atol=1e-5, msg=key)


def test_show_draws_tokens_by_experts_and_inspect_says_each_experts_load(
    tmp_path: Path, corpus: Path
) -> None:
    """`show M:topk_ids`: a sample's real tokens by the block's experts; `inspect`: how often
    each expert was chosen by the real tokens (padding's choices left out), as counted here."""
    import json

    from hookdump.tools.pictures.sample import draw_sample

    pytest.importorskip("matplotlib")
    folder, block = _folder(tmp_path), "model.layers.1.mlp"
    out = tmp_path / "d"
    result = invoke("run", f"hf:{folder}", "--text", str(corpus), "--layers", block,
                    "--capture", "routing", "-q", "--out", str(out))  # fmt: skip
    assert result.exit_code == 0, result.stderr
    dump = hookdump.load(out)
    mask = dump["__attention_mask__"].bool()
    ids = dump[f"{block}:topk_ids"]
    drawn = draw_sample(out, f"{block}:topk_ids", tmp_path / "r.png", 1)
    assert (drawn.chart, drawn.rows, drawn.cols) == ("routing", int(mask[1].sum()), EXPERTS)
    shown = invoke("show", str(out), f"{block}:topk_weights", "-s", "1", "-o",
                   str(tmp_path / "w.png"))  # fmt: skip
    assert shown.exit_code == 0 and "routing of" in shown.stdout
    rows = tmp_path / "rows"
    result = invoke("run", f"hf:{folder}", "--text", str(corpus), "--layers", block,
                    "--capture", "routing", "--per-token", "-q", "--out", str(rows))  # fmt: skip
    assert result.exit_code == 0, result.stderr
    sequences = hookdump.load(rows)["__sample__"]
    last = len(sequences) - 1  # a token row draws every row of its sequence
    drawn = draw_sample(rows, f"{block}:topk_ids", tmp_path / "t.png", last)
    assert (drawn.rows, drawn.cols) == (int((sequences == sequences[last]).sum()), EXPERTS)
    counts = torch.bincount(ids[mask].flatten(), minlength=EXPERTS).tolist()
    report = json.loads(invoke("inspect", str(out), "--json").stdout)
    assert report["experts"] == {f"{block}:topk_ids": counts}
    line = next(x for x in invoke("inspect", str(out)).stdout.splitlines() if "experts of" in x)
    top = max(range(EXPERTS), key=lambda e: (counts[e], -e))
    assert line.startswith(f"experts of {block}: most #{top} {counts[top] / sum(counts):.0%}")


@pytest.mark.parametrize("family", ["mixtral", "qwen2_moe"])
def test_standard_names_of_the_experts_chosen(family: str) -> None:
    """`blocks.N.mlp.hook_expert_indices` is the MoE block's chosen experts and
    `hook_expert_weights` its router's softmax over every expert; a dense layer (Qwen2-MoE's
    layer 1) has neither, but its stream names."""
    model, batch = _model(family), _batch()
    names = ["blocks.*.mlp.hook_expert_indices", "blocks.*.mlp.hook_expert_weights",
             "resid_post"]  # fmt: skip
    with hookdump.capture(model, layers=names) as cap, torch.no_grad():
        model(**batch)
    block = "model.layers.0.mlp"
    routing = hookdump.capture(model, layers=[block], capture="routing")
    with routing as by_name, torch.no_grad():
        model(**batch)
    moe = [0, 1] if family == "mixtral" else [0]
    expected = {f"blocks.{n}.mlp.hook_expert_{w}" for n in moe for w in ("indices", "weights")}
    assert set(cap.tensors) == expected | {"blocks.0.hook_resid_post", "blocks.1.hook_resid_post"}
    assert torch.equal(cap.tensors["blocks.0.mlp.hook_expert_indices"],
                       by_name.tensors[f"{block}:topk_ids"])  # fmt: skip
    probs = by_name.tensors[f"{block}:router_logits"].float().softmax(-1)
    torch.testing.assert_close(cap.tensors["blocks.0.mlp.hook_expert_weights"], probs)
    assert by_name.info[f"{block}:topk_ids"].standard_name == "blocks.0.mlp.hook_expert_indices"


@pytest.mark.filterwarnings("ignore")
@pytest.mark.parametrize("family", ["mixtral", "olmoe"])
def test_standard_names_are_transformer_lens_own(family: str, tmp_path: Path) -> None:
    """Against TransformerLens' own `run_with_cache` on the same weights (the MoE families it
    converts): the experts chosen, the router's probabilities and the residual stream."""
    pytest.importorskip("transformer_lens")
    from transformer_lens import HookedTransformer
    from transformer_lens import loading_from_pretrained as loading

    model = _model(family)
    model.save_pretrained(tmp_path / "m")
    cfg = loading.get_pretrained_model_config(str(tmp_path / "m"), fold_ln=False, device="cpu")
    cfg.use_hook_mlp_in, cfg.tokenizer_name = True, None
    state = loading.get_pretrained_state_dict(str(tmp_path / "m"), cfg, hf_model=model)
    reference = HookedTransformer(cfg, move_to_device=False)
    reference.load_and_process_state_dict(
        state, fold_ln=False, center_writing_weights=False, center_unembed=False,
        fold_value_biases=False, refactor_factored_attn_matrices=False,
    )  # fmt: skip
    ids = torch.randint(0, VOCAB, (2, 7), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        _, cache = reference.eval().run_with_cache(ids)
    dump = hookdump.dump(model, [{"input_ids": ids}], tmp_path / "d",
                         layers=["blocks.*.mlp.hook_expert_*", "blocks.*.hook_*"])  # fmt: skip
    moe_names = [k for k in dump if ".mlp.hook_expert_" in k]
    assert len(moe_names) == 4
    for name in dump:
        got, expected = dump[name], cache[name]
        torch.testing.assert_close(got.reshape(expected.shape).to(expected.dtype), expected,
                                   rtol=1e-5, atol=1e-5, msg=name)  # fmt: skip
