"""The table of module names per model family (docs/models.md), checked against the models
themselves (tiny configs, random weights): every name it gives exists, N and K being 0."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import timm
import torchvision
import transformers
from torch import nn

MODELS_PAGE = Path(__file__).parent.parent / "docs" / "models.md"
SMALL = {"num_hidden_layers": 1, "hidden_size": 32, "intermediate_size": 64,
         "num_attention_heads": 2, "vocab_size": 64}  # fmt: skip


def _models() -> dict[str, nn.Module]:
    gpt2 = transformers.GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=64)
    llama = transformers.LlamaConfig(**SMALL, num_key_value_heads=1)
    bert = transformers.BertConfig(**SMALL)
    vit = transformers.ViTConfig(**{k: v for k, v in SMALL.items() if k != "vocab_size"},
                                 image_size=32, patch_size=8)  # fmt: skip
    return {
        "`GPT2Model`": transformers.GPT2Model(gpt2),
        "`GPT2LMHeadModel`": transformers.GPT2LMHeadModel(gpt2),
        "`LlamaForCausalLM`": transformers.LlamaForCausalLM(llama),
        "`BertModel`": transformers.BertModel(bert),
        "`BertForMaskedLM`": transformers.BertForMaskedLM(bert),
        "`ViTModel`": transformers.ViTModel(vit),
        "`timm:vit_*`": timm.create_model("vit_tiny_patch16_224", pretrained=False, depth=1),
        "torchvision `resnet*`": torchvision.models.resnet18(),
    }


def _table() -> dict[str, list[str]]:
    text = MODELS_PAGE.read_text()
    start = text.index("| saved as | blocks | attention | MLP |")
    rows = {}
    for line in text[start:].splitlines()[2:]:
        if not line.startswith("|"):
            break
        cells = [c.strip() for c in line.strip("|").split("|")]
        rows[cells[0]] = [name for c in cells[1:] for name in re.findall(r"^`([^`]+)`", c)]
    return rows


@pytest.mark.filterwarnings("ignore")
def test_every_name_in_the_readmes_table_is_the_models_own() -> None:
    table = _table()
    models = _models()
    assert set(table) == set(models)
    for family, names in table.items():
        real = {name for name, _ in models[family].named_modules()}
        for name in names:
            assert name.replace(".N", ".0").replace("K.", "1.") in real, (family, name)
