"""Standard names (`--layers 'blocks.*.hook_resid_post'`): each equals TransformerLens' own
hook of that name, on a tiny model of every family TransformerLens supports, built from the
same weights with nothing folded; and the refusals, the manifest, the export's hook name."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from clitools import assert_usage_error, invoke

import hookdump
from hookdump.hooks.names import ALIASES

pytestmark = pytest.mark.usefixtures("in_tests_dir")

LAYERS, VOCAB = 2, 100
# the families of hooks.names.LAYOUTS that TransformerLens builds
FAMILIES = ["gpt2", "llama", "mistral", "qwen2", "qwen3", "gemma", "gemma2", "bert"]


def _hf_model(family: str) -> torch.nn.Module:
    import transformers as t

    torch.manual_seed(0)
    sizes: dict[str, Any] = {"hidden_size": 32, "intermediate_size": 64, "vocab_size": VOCAB,
                             "num_hidden_layers": LAYERS, "num_attention_heads": 4,
                             "max_position_embeddings": 64}  # fmt: skip
    grouped = {**sizes, "num_key_value_heads": 2}
    if family == "gpt2":  # n_ctx: TransformerLens reads it from the config
        config = t.GPT2Config(n_layer=LAYERS, n_embd=32, n_head=4, vocab_size=VOCAB,
                              n_positions=64, n_ctx=64)  # fmt: skip
        return t.GPT2LMHeadModel(config)
    if family == "bert":  # TransformerLens converts the pooler too
        return t.BertForPreTraining(t.BertConfig(**sizes))
    if family == "gemma2":  # a window shorter than the text: local layers differ
        config = t.Gemma2Config(head_dim=8, query_pre_attn_scalar=8, sliding_window=4, **grouped)
        return t.Gemma2ForCausalLM(config)
    made = {
        "llama": lambda: t.LlamaForCausalLM(t.LlamaConfig(**grouped)),
        "mistral": lambda: t.MistralForCausalLM(t.MistralConfig(sliding_window=None, **grouped)),
        "qwen2": lambda: t.Qwen2ForCausalLM(t.Qwen2Config(**grouped)),
        "qwen3": lambda: t.Qwen3ForCausalLM(t.Qwen3Config(head_dim=8, **grouped)),
        "gemma": lambda: t.GemmaForCausalLM(t.GemmaConfig(head_dim=8, **grouped)),
    }
    return made[family]()


def _by_hand(family: str, model: Any) -> dict[str, Any]:
    """TransformerLens' config for the families it knows by their hub names only."""
    c = model.config
    common = {"d_model": 32, "d_head": 8, "n_heads": 4, "d_mlp": 64, "n_layers": LAYERS,
              "n_ctx": 64, "d_vocab": VOCAB, "device": "cpu"}  # fmt: skip
    if family == "bert":
        return {**common, "eps": c.layer_norm_eps, "act_fn": "gelu",
                "attention_dir": "bidirectional",
                "original_architecture": "BertForMaskedLM"}  # fmt: skip
    gemma = {**common, "eps": c.rms_norm_eps, "normalization_type": "RMS", "rotary_dim": 8,
             "act_fn": getattr(c, "hidden_activation", None) or c.hidden_act,
             "positional_embedding_type": "rotary", "rotary_base": 10000.0,
             "use_attn_scale": True, "n_key_value_heads": 2, "gated_mlp": True,
             "final_rms": True, "original_architecture": type(model).__name__}  # fmt: skip
    if family == "gemma2":
        gemma |= {"window_size": 4, "use_local_attn": True, "attn_types": ["local", "global"],
                  "attn_scores_soft_cap": c.attn_logit_softcapping,
                  "output_logits_soft_cap": c.final_logit_softcapping,
                  "use_normalization_before_and_after": True}  # fmt: skip
    return gemma


def _reference(family: str, model: Any, folder: Path) -> Any:
    """The HookedTransformer (HookedEncoder for BERT) of the same weights, nothing folded,
    `hook_mlp_in` on."""
    from transformer_lens import HookedEncoder, HookedTransformer
    from transformer_lens import loading_from_pretrained as loading
    from transformer_lens.config import HookedTransformerConfig
    from transformer_lens.pretrained.weight_conversions import (
        convert_bert_weights,
        convert_gemma_weights,
    )

    if family in ("bert", "gemma", "gemma2"):
        cfg = HookedTransformerConfig(**_by_hand(family, model), use_hook_mlp_in=True)
        convert = convert_bert_weights if family == "bert" else convert_gemma_weights
        state = convert(model, cfg)
    else:  # read from the folder's config.json, as from_pretrained does
        cfg = loading.get_pretrained_model_config(str(folder), fold_ln=False, device="cpu")
        cfg.use_hook_mlp_in, cfg.tokenizer_name = True, None
        state = loading.get_pretrained_state_dict(str(folder), cfg, hf_model=model)
    if family == "bert":
        encoder = HookedEncoder(cfg, move_to_device=False)
        encoder.load_state_dict(state, strict=False)
        return encoder.eval()
    reference = HookedTransformer(cfg, move_to_device=False)
    reference.load_and_process_state_dict(
        state, fold_ln=False, center_writing_weights=False, center_unembed=False,
        fold_value_biases=False, refactor_factored_attn_matrices=False,
    )  # fmt: skip
    return reference.eval()


@pytest.mark.filterwarnings("ignore:Hooked.* is deprecated:DeprecationWarning")
@pytest.mark.parametrize("family", FAMILIES)
def test_each_standard_name_is_transformer_lens_hook_of_that_name(
    family: str, tmp_path_factory: pytest.TempPathFactory
) -> None:
    pytest.importorskip("transformer_lens")
    model = _hf_model(family).eval()
    folder = tmp_path_factory.mktemp("model")  # no family name in the path: TL reads it
    model.save_pretrained(folder)
    reference = _reference(family, model, folder)
    ids = torch.randint(0, VOCAB, (4, 7), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        kwargs = {"one_zero_attention_mask": torch.ones_like(ids)} if family == "bert" else {}
        _, cache = reference.run_with_cache(ids, **kwargs)

    batches = [{"input_ids": ids[:2]}, {"input_ids": ids[2:]}]
    dump = hookdump.dump(model, batches, tmp_path_factory.mktemp("d"), layers=["blocks.*.hook_*"])
    # Qwen 3 norms q and k before the rotary embedding: its hook_q, hook_k (before that norm)
    # are not named, its hook_rot_q, hook_rot_k are
    inside = ["v", "attn_scores", "pattern", "z", "rot_q", "rot_k"]
    inside += ["q", "k"] if family != "qwen3" else []
    mlp = ["mlp.hook_pre", "mlp.hook_pre_linear", "mlp.hook_post"]  # pre_linear: gated MLPs
    names = [f"blocks.{n}.{hook}" for n in range(LAYERS)
             for hook in [*(f"hook_{a}" for a in ALIASES), *(f"attn.hook_{i}" for i in inside),
                          *mlp]
             if f"blocks.{n}.{hook}" in cache]  # fmt: skip
    assert sorted(dump.keys()) == sorted(names)
    rotary, gated = "blocks.0.attn.hook_rot_q" in cache, "blocks.0.mlp.hook_pre_linear" in cache
    assert len(names) == LAYERS * (14 + 2 * rotary + gated - 2 * (family == "qwen3"))
    for name in names:
        got, expected = dump[name], cache[name]
        if name.endswith("attn_scores"):  # a masked score: -inf there, the lowest float here
            masked = expected == -torch.inf
            assert torch.all(got[masked] <= torch.finfo(got.dtype).min / 2), name
            got, expected = got[~masked], expected[~masked]
        torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5, msg=name)
        assert dump.info(name).standard_name == name
    # TransformerLens' hook_mlp_in is the stream before the second norm: resid_mid
    assert torch.equal(dump["blocks.1.hook_mlp_in"], dump["blocks.1.hook_resid_mid"])


def test_the_short_spelling_and_the_manifest(tmp_path: Path) -> None:
    """`resid_post.1` is `blocks.1.hook_resid_post`; the manifest records the module each
    comes from, and a key picked by its module's name gets its standard name too."""
    model = _hf_model("gpt2").eval()
    ids = torch.randint(0, VOCAB, (2, 5), generator=torch.Generator().manual_seed(2))
    layers = ["resid_post.1", "mlp_out", "transformer.h.0"]
    dump = hookdump.dump(model, [{"input_ids": ids}], tmp_path / "d", layers=layers)
    expected = {"blocks.1.hook_resid_post", "blocks.0.hook_mlp_out", "blocks.1.hook_mlp_out",
                "transformer.h.0"}  # fmt: skip
    assert set(dump.keys()) == expected
    tensors = json.loads((tmp_path / "d" / "manifest.json").read_text())["tensors"]
    assert tensors["blocks.1.hook_resid_post"]["module"] == "transformer.h.1"
    assert tensors["blocks.0.hook_mlp_out"]["module"] == "transformer.h.0.mlp"
    assert tensors["transformer.h.0"]["standard_name"] == "blocks.0.hook_resid_post"
    selection = json.loads((tmp_path / "d" / "manifest.json").read_text())["selection"]
    assert selection["standard_names"]["blocks.1.hook_mlp_out"] == "transformer.h.1.mlp"
    with torch.no_grad():
        hidden = model(ids, output_hidden_states=True).hidden_states
    torch.testing.assert_close(dump["transformer.h.0"], hidden[1], rtol=0, atol=0)
    torch.testing.assert_close(dump["blocks.1.hook_resid_post"],
                               model.transformer.h[1](hidden[1]), rtol=0, atol=0)  # fmt: skip
    # a module's own name, stored under its standard name, is named in the KeyError
    with pytest.raises(KeyError, match=r"module h\.1 is stored as blocks\.1\.hook_resid_post"):
        dump["h.1"]


def test_a_resnet_names_its_blocks_in_order(tmp_path: Path) -> None:
    """torchvision's ResNet-18: `blocks.N` counts layer1.0 .. layer4.1; only the stream
    names apply."""
    import torchvision

    model = torchvision.models.resnet18(weights=None).eval()
    images = torch.randn(2, 3, 64, 64, generator=torch.Generator().manual_seed(3))
    dump = hookdump.dump(model, [images], tmp_path / "d", layers=["blocks.*.hook_resid_post"])
    assert len(dump.keys()) == 8
    with hookdump.capture(model, layers=["layer2.0", "layer4.1"]) as cap, torch.no_grad():
        model(images)
    assert torch.equal(dump["blocks.2.hook_resid_post"], cap.tensors["layer2.0"])
    assert torch.equal(dump["blocks.7.hook_resid_post"], cap.tensors["layer4.1"])


def _assert_pre_norm_block(
    dump: Any, attention: Any, norm1: Any, norm2: Any, mlp: Any, act: Any
) -> None:
    """Block 1's names against the block's own sublayers: x + attention(norm1(x)), then
    + mlp(norm2(.)), the MLP's hidden layer before (`fc1`) and after `act`."""
    with torch.no_grad():
        pre = dump["blocks.1.hook_resid_pre"]
        attn = attention(norm1(pre))
        mid = pre + attn
        out = mlp(norm2(mid))
        hidden = mlp.fc1(norm2(mid))
    expected = {"hook_attn_out": attn, "hook_resid_mid": mid, "hook_mlp_in": mid,
                "hook_mlp_out": out, "hook_resid_post": mid + out,
                "mlp.hook_pre": hidden, "mlp.hook_post": act(hidden)}  # fmt: skip
    for name, value in expected.items():
        torch.testing.assert_close(dump[f"blocks.1.{name}"], value, msg=name)


def test_a_timm_vit_block_names_its_sublayers(tmp_path: Path) -> None:
    """timm's ViT: the stream is x + ls1(attn(norm1(x))), then + ls2(mlp(norm2(.)))."""
    timm = pytest.importorskip("timm")
    model = timm.create_model("vit_tiny_patch16_224", pretrained=False, img_size=32,
                              depth=2).eval()  # fmt: skip
    images = torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(4))
    dump = hookdump.dump(model, [images], tmp_path / "d", layers=["blocks.1.*hook_*"])
    block = model.blocks[1]
    _assert_pre_norm_block(dump, block.attn, block.norm1, block.norm2, block.mlp, block.mlp.act)


def test_standard_names_are_refused_in_one_line(gpt2: Path) -> None:
    result = invoke("run", f"hf:{gpt2}", "-l", "blocks.5.hook_resid_post", "-n", "1")
    assert_usage_error(result, "'blocks.5.hook_resid_post' matches no standard name",
                       "blocks 0 to 1")  # fmt: skip
    result = invoke("run", "resnet18", "-l", "blocks.*.hook_attn_out", "-n", "1")
    assert_usage_error(result, "matches no standard name")
    result = invoke("run", "alexnet", "-l", "resid_post", "-n", "1")
    assert_usage_error(result, "'resid_post' is a standard name", "no block of a family")
    # a pattern picks standard names only when it looks like one: `blocks.*` is no module
    result = invoke("run", f"hf:{gpt2}", "-l", "resid_post", "-l", "blocks.*", "-n", "1")
    assert_usage_error(result, "--layers 'blocks.*' matches no module of this model")
    result = invoke("run", f"hf:{gpt2}", "-l", "resid_post", "--capture", "grad", "-n", "1")
    assert_usage_error(result, "--capture grad is taken of modules selected by their own names")
    # a standard name mistyped (issue 57): the hint names the standard name it meant
    result = invoke("run", f"hf:{gpt2}", "-l", "resid_pots.1", "-n", "1")
    assert_usage_error(result, "'resid_pots.1' matches no module", "nearest: resid_post.1")


def test_a_token_dump_exports_under_its_standard_name(
    gpt2: Path, corpus: Path, tmp_path: Path
) -> None:
    """`run --per-token -l resid_post.1` then `export --to saelens` with no --hook-name:
    SAELens' column is `blocks.1.hook_resid_post`; so for the key `h.1` picked by name."""
    datasets = pytest.importorskip("datasets")
    for layer, key in (("resid_post.1", "blocks.1.hook_resid_post"), ("h.1", "h.1")):
        out = tmp_path / key
        result = invoke("run", f"hf:{gpt2}", "--text", str(corpus), "--context-size", "5",
                        "--per-token", "-l", layer, "-o", str(out), "-q")  # fmt: skip
        assert result.exit_code == 0, result.stderr
        result = invoke("export", str(out), str(tmp_path / f"sae-{key}"), "--to", "saelens",
                        "--keys", key)  # fmt: skip
        assert result.exit_code == 0, result.stderr
        loaded = datasets.load_from_disk(str(tmp_path / f"sae-{key}"))
        assert loaded.column_names == ["blocks.1.hook_resid_post", "token_ids"]


def test_a_transformers_vit_layer_names_its_sublayers(tmp_path: Path) -> None:
    """transformers' ViT is pre-norm: x + attention(layernorm_before(x)), then
    + mlp(layernorm_after(.))."""
    import transformers as t

    torch.manual_seed(5)
    config = t.ViTConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, image_size=32, patch_size=8)  # fmt: skip
    model = t.ViTModel(config).eval()
    images = torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(6))
    dump = hookdump.dump(model, [images], tmp_path / "d", layers=["blocks.1.*hook_*"])
    layer = model.layers[1]
    _assert_pre_norm_block(dump, lambda x: layer.attention(x)[0], layer.layernorm_before,
                           layer.layernorm_after, layer.mlp, layer.mlp.activation_fn)  # fmt: skip
    # and inside its attention: each head's output is its pattern times its values
    pattern, v = dump["blocks.1.attn.hook_pattern"], dump["blocks.1.attn.hook_v"]
    z = torch.einsum("bhts,bshd->bthd", pattern, v)
    torch.testing.assert_close(dump["blocks.1.attn.hook_z"], z, rtol=1e-5, atol=1e-6)


def test_layers_says_what_each_standard_name_is(gpt2: Path) -> None:
    result = invoke("layers", f"hf:{gpt2}", "-l", "resid_mid.1", "-l", "h.0")
    assert result.exit_code == 0, result.stderr
    rows = [" ".join(line.split()) for line in result.stdout.splitlines()]
    assert any(row.startswith("blocks.1.hook_resid_mid input of h.1.ln_2 64 64×32") for row in rows)
    assert any(row.startswith("h.0 GPT2Block") for row in rows)
    names = invoke("layers", f"hf:{gpt2}", "-l", "blocks.*.hook_attn_out", "--names")
    assert names.stdout.split() == ["blocks.0.hook_attn_out", "blocks.1.hook_attn_out"]
    listed = json.loads(invoke("layers", f"hf:{gpt2}", "-l", "mlp_out.0", "--json").stdout)
    assert listed == [{"name": "blocks.0.hook_mlp_out", "depth": 3, "class": "GPT2MLP",
                       "params": 32 * 128 + 128 + 128 * 32 + 32, "calls": 1,
                       "outputs": {"": [64, 32]}, "unbatched": [],
                       "module": "h.0.mlp", "side": "output"}]  # fmt: skip


class _Named(torch.nn.Module):
    """A model whose own modules carry standard names (a TransformerLens model's do)."""

    def __init__(self) -> None:
        super().__init__()
        self.blocks = torch.nn.ModuleList([torch.nn.Module()])
        self.blocks[0].hook_resid_post = torch.nn.Linear(3, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.blocks[0].hook_resid_post(x)


def test_a_module_of_that_name_is_taken_as_it_is(tmp_path: Path) -> None:
    model = _Named().eval()
    x = torch.randn(4, 3)
    dump = hookdump.dump(model, [x], tmp_path / "d", layers=["blocks.*.hook_resid_post"])
    assert dump.keys() == ["blocks.0.hook_resid_post"]
    assert dump.info("blocks.0.hook_resid_post").standard_name is None
    torch.testing.assert_close(dump["blocks.0.hook_resid_post"], model(x).detach())


def test_heads_export_to_saelens_flattened_as_it_flattens_them(
    gpt2: Path, corpus: Path, tmp_path: Path
) -> None:
    """`blocks.1.attn.hook_z` token rows are [heads, head_dim]; SAELens' own store flattens
    a head dimension to d_in = heads * head_dim, and so does the export (the norm scaling
    factor, which the per-feature statistics cannot give for flattened rows, is left out)."""
    datasets = pytest.importorskip("datasets")
    out = tmp_path / "d"
    result = invoke("run", f"hf:{gpt2}", "--text", str(corpus), "--context-size", "5",
                    "--per-token", "-l", "blocks.1.attn.hook_z", "-o", str(out), "-q")  # fmt: skip
    assert result.exit_code == 0, result.stderr
    dump = hookdump.load(out)
    rows = dump["blocks.1.attn.hook_z"]
    assert rows.shape[1:] == (2, 16)
    result = invoke("export", str(out), str(tmp_path / "sae"), "--to", "saelens")
    assert result.exit_code == 0, result.stderr
    assert "rows of shape [2, 16] written flattened to 32" in result.stderr
    loaded = datasets.load_from_disk(str(tmp_path / "sae")).with_format("torch")[:]
    torch.testing.assert_close(loaded["blocks.1.attn.hook_z"], rows.reshape(-1, 5, 32))
    marker = json.loads((tmp_path / "sae" / "hookdump-export.json").read_text())
    assert marker["statistics"]["blocks.1.attn.hook_z"]["norm_scaling_factor"] is None
