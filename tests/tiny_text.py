"""Shared by the language-model tests: a tokenizer trained here, and Ctrl-C in a batch."""

from __future__ import annotations

from pathlib import Path

import pytest

CORPUS = [
    "the cat sat on the mat",
    "",
    "a dog ran in the park and the cat sat",
    "hooks dump activations of the model",
    "the park",
]


def save_tokenizer(folder: Path, cls_sep: bool) -> None:
    """A word-level tokenizer trained on CORPUS, saved as a model folder keeps one: with an
    EOS token and no pad token (GPT-2's trap), or with [CLS]/[SEP]/[PAD] and a template
    post-processor (BERT's)."""
    import transformers
    from tokenizers import Tokenizer, models, pre_tokenizers, processors, trainers

    specials = ["[UNK]", "[PAD]", "[CLS]", "[SEP]", "[EOS]"]
    tokenizer = Tokenizer(models.WordLevel(unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer.train_from_iterator(CORPUS, trainers.WordLevelTrainer(special_tokens=specials))
    if cls_sep:
        tokenizer.post_processor = processors.TemplateProcessing(
            single="[CLS] $A [SEP]", special_tokens=[("[CLS]", 2), ("[SEP]", 3)]
        )
    fast = transformers.PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, unk_token="[UNK]", eos_token="[EOS]",
        **({"pad_token": "[PAD]", "cls_token": "[CLS]", "sep_token": "[SEP]"} if cls_sep else {}),
    )  # fmt: skip
    fast.save_pretrained(folder)


def ctrl_c_in_batch(monkeypatch: pytest.MonkeyPatch, n: int) -> None:
    """Act as if Ctrl-C were pressed in the n-th forward of more than one row (from 1);
    `monkeypatch.undo()` or the test's end puts the forward back."""
    import hookdump.engine.loop as loop

    calls = {"n": 0}
    real_forward = loop.forward

    def forward_then_ctrl_c(cap, module, batch, label):  # type: ignore[no-untyped-def]
        if batch.rows > 1:
            calls["n"] += 1
            if calls["n"] == n:
                raise KeyboardInterrupt
        return real_forward(cap, module, batch, label)

    monkeypatch.setattr(loop, "forward", forward_then_ctrl_c)


def tiny_gpt2(folder: Path, seed: int = 0, **config: object) -> Path:
    """A 2-layer GPT-2 with random weights (`config` overrides its sizes) and the CORPUS
    word-level tokenizer (EOS, no pad token), saved as a model folder."""
    import torch
    import transformers

    torch.manual_seed(seed)
    sizes = {"n_layer": 2, "n_embd": 32, "n_head": 2, "vocab_size": 32, **config}
    transformers.GPT2Model(transformers.GPT2Config(**sizes)).save_pretrained(folder)
    save_tokenizer(folder, cls_sep=False)
    return folder


def tiny_bert(folder: Path, seed: int = 1, masked_lm: bool = False, **config: object) -> Path:
    """A 2-layer BERT (or BertForMaskedLM) with random weights and the CORPUS tokenizer with
    [CLS]/[SEP]/[PAD] and a template post-processor, saved as a model folder."""
    import torch
    import transformers

    torch.manual_seed(seed)
    sizes = {"num_hidden_layers": 2, "hidden_size": 32, "num_attention_heads": 2,
             "intermediate_size": 64, "vocab_size": 32, **config}  # fmt: skip
    model = transformers.BertForMaskedLM if masked_lm else transformers.BertModel
    model(transformers.BertConfig(**sizes)).save_pretrained(folder)
    save_tokenizer(folder, cls_sep=True)
    return folder


def tiny_bpe_gpt2(folder: Path, corpus: list[str], vocab_size: int, seed: int = 7) -> Path:
    """GPT-2's usual setup, small: a byte-level BPE tokenizer trained on `corpus` (EOS
    `<|endoftext|>`, no pad token) and a 1-layer GPT-2 of 64 positions, saved as a model
    folder."""
    import torch
    import transformers
    from tokenizers import ByteLevelBPETokenizer

    bpe = ByteLevelBPETokenizer()
    bpe.train_from_iterator(corpus, vocab_size=vocab_size, special_tokens=["<|endoftext|>"])
    fast = transformers.PreTrainedTokenizerFast(tokenizer_object=bpe._tokenizer,
                                                eos_token="<|endoftext|>")  # fmt: skip
    fast.save_pretrained(folder)
    torch.manual_seed(seed)
    config = transformers.GPT2Config(n_layer=1, n_embd=16, n_head=2, n_positions=64,
                                     vocab_size=vocab_size + 20)  # fmt: skip
    transformers.GPT2Model(config).save_pretrained(folder)
    return folder


# a chat template of the usual shape (each turn: role, content, end of turn), in words the
# CORPUS tokenizer knows; `add_generation_prompt` opens the assistant's turn
CHAT_TEMPLATE = (
    "{% for m in messages %}[CLS] {{ m['role'] }} {{ m['content'] }} [SEP] {% endfor %}"
    "{% if add_generation_prompt %}[CLS] assistant {% endif %}"
)


def tiny_causal_lm(folder: Path, family: str = "gpt2", seed: int = 0, chat: bool = False) -> Path:
    """A 2-layer causal language model with random weights (GPT-2, or a Llama with
    grouped-query attention) and the CORPUS tokenizer (EOS, no pad token), saved as a model
    folder; `chat`: the tokenizer has `CHAT_TEMPLATE`."""
    import torch
    import transformers

    torch.manual_seed(seed)
    if family == "gpt2":
        config: object = transformers.GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=32,
                                                 n_positions=64)  # fmt: skip
        model: object = transformers.GPT2LMHeadModel(config)
    else:
        config = transformers.LlamaConfig(
            vocab_size=32, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
        )  # fmt: skip
        model = transformers.LlamaForCausalLM(config)
    model.eval().save_pretrained(folder)  # type: ignore[attr-defined]
    save_tokenizer(folder, cls_sep=False)
    if chat:
        tokenizer = transformers.AutoTokenizer.from_pretrained(folder)
        tokenizer.chat_template = CHAT_TEMPLATE
        tokenizer.save_pretrained(folder)
    return folder
