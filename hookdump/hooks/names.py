"""Standard names: TransformerLens' hook names (`blocks.5.hook_resid_post`,
`blocks.5.attn.hook_z`, `blocks.5.mlp.hook_post`) for the blocks of the model families
hookdump knows, each a module's first input, the first tensor of its output, or a value
inside its attention (`Site`).

The blocks are numbered in the order the model registers them, so `blocks.N` is the N-th
block of the model (a ResNet's `layer1.0` is `blocks.0`, its `layer2.0` the next after
`layer1`'s last). A short spelling, `resid_post.5` (`resid_post` alone: every block),
stands for `blocks.5.hook_resid_post`.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from hookdump.choices import ATTENTION_KINDS, ROUTER_VALUES, AttentionKind, RoutingKind
from hookdump.format.keys import ROOT, module_type_name
from hookdump.hooks.attention import is_attention
from hookdump.hooks.routing import router_of

if TYPE_CHECKING:
    from torch import nn

# a module's input or output, an attention kind of an attention module (`hooks.attention`),
# or what the router of a mixture-of-experts block gives (`hooks.routing`)
Side = Literal["input", "output", AttentionKind, RoutingKind]
ALIASES = ("resid_pre", "attn_out", "resid_mid", "mlp_in", "mlp_out", "resid_post")
# name under the block (`hook_resid_pre`, `attn.hook_z`) -> (the module's path under the
# block, "" for the block itself; which of its values)
Layout = Mapping[str, tuple[str, Side]]


def _layout(
    attn_out: str, second_norm: str, mlp_out: str, resid_post: tuple[str, Side] = ("", "output")
) -> Layout:
    """A block's names: x + attn_out, then + mlp_out. `attn_out` and `mlp_out` are the
    outputs of those modules, `resid_mid` the input of the norm before the MLP (so is
    TransformerLens' `hook_mlp_in`: before the norm, not the MLP's own input)."""
    return {
        "hook_resid_pre": ("", "input"),
        "hook_attn_out": (attn_out, "output"),
        "hook_resid_mid": (second_norm, "input"),
        "hook_mlp_in": (second_norm, "input"),
        "hook_mlp_out": (mlp_out, "output"),
        "hook_resid_post": resid_post,
    }


def _attention(path: str, rotary: bool = False, qk_norm: bool = False) -> Layout:
    """The names inside attention module `path` (a transformers one, see `hooks.attention`):
    `hook_q`, `hook_k` before the rotary embedding and `hook_rot_q`, `hook_rot_k` after it
    (only a rotary model has those), keys and values with the key-value heads. With a norm
    of q and k (Qwen 3), TransformerLens' `hook_q` and `hook_k` are the projections before
    it, which hookdump does not take (`q_pre_rope` is after it): not named."""
    names: dict[str, tuple[str, Side]] = {
        "attn.hook_v": (path, "v"),
        "attn.hook_attn_scores": (path, "scores"),
        "attn.hook_pattern": (path, "pattern"),
        "attn.hook_z": (path, "z"),
    }
    if not qk_norm:
        names |= {
            "attn.hook_q": (path, "q_pre_rope" if rotary else "q"),
            "attn.hook_k": (path, "k_pre_rope" if rotary else "k"),
        }
    if rotary:
        names |= {"attn.hook_rot_q": (path, "q"), "attn.hook_rot_k": (path, "k")}
    return names


def _mlp(pre: str, post: str, pre_linear: str | None = None) -> Layout:
    """The names inside an MLP: `mlp.hook_pre`, the output of its first projection (the
    gate's, in a gated MLP, whose other projection is `mlp.hook_pre_linear`), and
    `mlp.hook_post`, the input of its last projection (after the activation)."""
    names: dict[str, tuple[str, Side]] = {"mlp.hook_pre": (pre, "output")}
    if pre_linear is not None:
        names["mlp.hook_pre_linear"] = (pre_linear, "output")
    return names | {"mlp.hook_post": (post, "input")}


_GATED = _mlp("mlp.gate_proj", "mlp.down_proj", "mlp.up_proj")
_LLAMA = {
    **_layout("self_attn", "post_attention_layernorm", "mlp"),
    **_attention("self_attn", rotary=True),
    **_GATED,
}
# Gemma 2: each sublayer's output is normalised before it is added to the stream
_SANDWICH = {
    **_layout(
        "post_attention_layernorm", "pre_feedforward_layernorm", "post_feedforward_layernorm"
    ),
    **_attention("self_attn", rotary=True),
    **_GATED,
}
# BERT is post-norm: TransformerLens' stream is the sums before each LayerNorm, so
# `resid_post` is not the block's output (that is the next block's `resid_pre`)
_BERT = {
    **_layout(
        "attention.output.dense",
        "attention.output.LayerNorm",
        "output.dense",
        ("output.LayerNorm", "input"),
    ),
    **_attention("attention.self"),
    **_mlp("intermediate.dense", "output.dense"),
}
_RESIDUAL: Layout = {"hook_resid_pre": ("", "input"), "hook_resid_post": ("", "output")}

# a mixture-of-experts block (`mlp`, with a router of its own): its stream names as Llama's,
# and TransformerLens' names inside its MoE component: `hook_expert_indices`, the experts each
# token chose (`[k]`), and `hook_expert_weights`, the router's softmax over every expert
# (`[experts]`, float32, before the top k). A dense layer between MoE layers has no router,
# so no such names (`standard_sites`).
_MOE = {
    **_layout("self_attn", "post_attention_layernorm", "mlp"),
    "mlp.hook_expert_indices": ("mlp", "topk_ids"),
    "mlp.hook_expert_weights": ("mlp", "router_probs"),
}

# a block's class name (qualified by its module where the bare name is too common) -> layout
LAYOUTS: dict[str, Layout] = {
    "GPT2Block": {
        **_layout("attn", "ln_2", "mlp"),
        **_attention("attn"),
        **_mlp("mlp.c_fc", "mlp.c_proj"),
    },
    "LlamaDecoderLayer": _LLAMA,
    "MistralDecoderLayer": _LLAMA,
    "Qwen2DecoderLayer": _LLAMA,
    "Qwen3DecoderLayer": {
        **_layout("self_attn", "post_attention_layernorm", "mlp"),
        **_attention("self_attn", rotary=True, qk_norm=True),
        **_GATED,
    },
    "GemmaDecoderLayer": _LLAMA,
    "Gemma2DecoderLayer": _SANDWICH,
    "BertLayer": _BERT,
    "ViTLayer": {
        **_layout("attention", "layernorm_after", "mlp"),
        **_attention("attention"),
        **_mlp("mlp.fc1", "mlp.fc2"),
    },
    "timm.models.vision_transformer.Block": {
        **_layout("ls1", "norm2", "ls2"),
        **_mlp("mlp.fc1", "mlp.fc2"),
    },
    "MixtralDecoderLayer": _MOE,
    "Qwen2MoeDecoderLayer": _MOE,
    "Qwen3MoeDecoderLayer": _MOE,
    "OlmoeDecoderLayer": _MOE,
    "torchvision.models.resnet.BasicBlock": _RESIDUAL,
    "torchvision.models.resnet.Bottleneck": _RESIDUAL,
    "timm.models.resnet.BasicBlock": _RESIDUAL,
    "timm.models.resnet.Bottleneck": _RESIDUAL,
}
FAMILIES = (
    "GPT-2, Llama, Mistral, Qwen 2 and 3, Gemma 1 and 2, BERT, ViT, timm's ViT, ResNet, and the "
    "mixture-of-experts Mixtral, Qwen2-MoE, Qwen3-MoE and OLMoE"
)

_SHORT = re.compile(rf"^({'|'.join(ALIASES)})(?:\.(.+))?$")


@dataclass(frozen=True)
class Site:
    """A standard name and where its value is: the first input of `module` (its hidden
    states) or the first tensor of its output."""

    name: str
    module: str
    side: Side


def spelled_out(pattern: str) -> str:
    """`resid_post.5` as `blocks.5.hook_resid_post` (`resid_post`: every block); any other
    pattern as it is."""
    short = _SHORT.match(pattern)
    if short is None:
        return pattern
    return f"blocks.{short[2] or '*'}.hook_{short[1]}"


def short_names(sites: Iterable[str]) -> list[str]:
    """The short forms (`resid_post.5`) of standard names (`blocks.5.hook_resid_post`)
    that have one, for "did you mean" hints."""
    found = []
    for name in sites:
        _, number, hook = name.split(".", 2)
        alias = hook.removeprefix("hook_")
        if alias in ALIASES:
            found.append(f"{alias}.{number}")
    return found


def looks_standard(pattern: str) -> bool:
    """Whether a pattern names standard names rather than modules."""
    return "hook_" in pattern or _SHORT.match(pattern) is not None


def layout_of(module: nn.Module) -> Layout | None:
    """The standard names of a block of a known family (None for any other module)."""
    name = module_type_name(module)
    return LAYOUTS.get(name) or LAYOUTS.get(f"{type(module).__module__}.{name}")


def standard_sites(modules: Mapping[str, nn.Module]) -> dict[str, Site]:
    """Every standard name of a model, given its modules by name in registration order."""
    sites: dict[str, Site] = {}
    blocks = [(name, layout_of(m)) for name, m in modules.items()]
    for number, (block, layout) in enumerate((b, lay) for b, lay in blocks if lay is not None):
        for alias, (path, side) in layout.items():
            module = block if not path else f"{block}.{path}" if block != ROOT else path
            if module in modules and _has(modules[module], side):
                name = f"blocks.{number}.{alias}"
                sites[name] = Site(name, module, side)
    return sites


def _has(module: nn.Module, side: Side) -> bool:
    """Whether `module` has the value `side`: an input and an output always; an attention
    kind if it is an attention module, routing if it is a mixture-of-experts block."""
    if side in ATTENTION_KINDS:
        return is_attention(module)
    if side in ROUTER_VALUES:
        return router_of(module) is not None
    return True


def first_names(sites: Mapping[str, Site]) -> dict[tuple[str, Side], str]:
    """(module, side) -> the first standard name of that value (`resid_mid` before
    `mlp_in`), for the keys a selection by module name makes."""
    found: dict[tuple[str, Side], str] = {}
    for site in sites.values():
        found.setdefault((site.module, site.side), site.name)
    return found


def name_of(
    names: Mapping[tuple[str, Side], str], module: str, kind: str, part: str | None
) -> str | None:
    """The standard name of a key's value (`first_names`): the hidden states a module is
    called with (positional 0 or `hidden_states`), its output's first tensor, or a value
    inside its attention."""
    if kind == "input" and part in ("0", "hidden_states"):
        return names.get((module, "input"))
    if kind == "output" and part in (None, "0"):
        return names.get((module, "output"))
    if (kind in ATTENTION_KINDS or kind in ROUTER_VALUES) and part is None:
        return names.get((module, kind))
    return None
