"""Standard names: TransformerLens' hook names (`blocks.5.hook_resid_post`) for the blocks of
the model families hookdump knows, each a module's first input or the first tensor of its
output (`Site`).

The blocks are numbered in the order the model registers them, so `blocks.N` is the N-th
block of the model (a ResNet's `layer1.0` is `blocks.0`, its `layer2.0` the next after
`layer1`'s last). A short spelling, `resid_post.5` (`resid_post` alone: every block),
stands for `blocks.5.hook_resid_post`.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from hookdump.format.keys import ROOT, module_type_name

if TYPE_CHECKING:
    from torch import nn

Side = Literal["input", "output"]
ALIASES = ("resid_pre", "attn_out", "resid_mid", "mlp_in", "mlp_out", "resid_post")
# alias -> (the module's path under the block, "" for the block; which side of it)
Layout = Mapping[str, tuple[str, Side]]


def _layout(
    attn_out: str, second_norm: str, mlp_out: str, resid_post: tuple[str, Side] = ("", "output")
) -> Layout:
    """A block's names: x + attn_out, then + mlp_out. `attn_out` and `mlp_out` are the
    outputs of those modules, `resid_mid` the input of the norm before the MLP (so is
    TransformerLens' `hook_mlp_in`: before the norm, not the MLP's own input)."""
    return {
        "resid_pre": ("", "input"),
        "attn_out": (attn_out, "output"),
        "resid_mid": (second_norm, "input"),
        "mlp_in": (second_norm, "input"),
        "mlp_out": (mlp_out, "output"),
        "resid_post": resid_post,
    }


_LLAMA = _layout("self_attn", "post_attention_layernorm", "mlp")
# Gemma 2: each sublayer's output is normalised before it is added to the stream
_SANDWICH = _layout(
    "post_attention_layernorm", "pre_feedforward_layernorm", "post_feedforward_layernorm"
)
# BERT is post-norm: TransformerLens' stream is the sums before each LayerNorm, so
# `resid_post` is not the block's output (that is the next block's `resid_pre`)
_BERT = _layout(
    "attention.output.dense",
    "attention.output.LayerNorm",
    "output.dense",
    ("output.LayerNorm", "input"),
)
_RESIDUAL: Layout = {"resid_pre": ("", "input"), "resid_post": ("", "output")}

# a block's class name (qualified by its module where the bare name is too common) -> layout
LAYOUTS: dict[str, Layout] = {
    "GPT2Block": _layout("attn", "ln_2", "mlp"),
    "LlamaDecoderLayer": _LLAMA,
    "MistralDecoderLayer": _LLAMA,
    "Qwen2DecoderLayer": _LLAMA,
    "Qwen3DecoderLayer": _LLAMA,
    "GemmaDecoderLayer": _LLAMA,
    "Gemma2DecoderLayer": _SANDWICH,
    "BertLayer": _BERT,
    "ViTLayer": _layout("attention", "layernorm_after", "mlp"),
    "timm.models.vision_transformer.Block": _layout("ls1", "norm2", "ls2"),
    "torchvision.models.resnet.BasicBlock": _RESIDUAL,
    "torchvision.models.resnet.Bottleneck": _RESIDUAL,
    "timm.models.resnet.BasicBlock": _RESIDUAL,
    "timm.models.resnet.Bottleneck": _RESIDUAL,
}
FAMILIES = "GPT-2, Llama, Mistral, Qwen 2 and 3, Gemma 1 and 2, BERT, ViT, timm's ViT and ResNet"

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
            if module in modules:
                name = f"blocks.{number}.hook_{alias}"
                sites[name] = Site(name, module, side)
    return sites


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
    called with (positional 0 or `hidden_states`), or its output's first tensor."""
    if kind == "input" and part in ("0", "hidden_states"):
        return names.get((module, "input"))
    if kind == "output" and part in (None, "0"):
        return names.get((module, "output"))
    return None
