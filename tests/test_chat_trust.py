"""`--chat` made trustworthy (issue 54, items 1.1, 1.2, 3.5, 3.6 and the text parts of 3.7):
the answer's first token marked whatever the tokenizer does with the space before it; the
mask equal to transformers' where the template marks its generation blocks; per-sample dumps
carry `__response__`; templates bounded in time and size, their errors one line; a long
conversation costs its kept tokens, not their square."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from clitools import assert_usage_error, invoke

import hookdump
from hookdump.errors import HookdumpError
from hookdump.inputs import chat, chat_template

transformers = pytest.importorskip("transformers")
tokenizers = pytest.importorskip("tokenizers")

# the shape of Llama-2 / Vicuna / Alpaca templates: a header that ends in a space
SPACED = ("{% for m in messages %}<s>{{ m['role'] }}: {{ m['content'] }}</s>{% endfor %}"
          "{% if add_generation_prompt %}<s>assistant: {% endif %}")  # fmt: skip
# ChatML with generation blocks, and the newline after the block the model never writes
CHATML = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n"
    "{% if m['role'] == 'assistant' %}{% generation %}{{ m['content'] }}<|im_end|>"
    "{% endgeneration %}{% else %}{{ m['content'] }}<|im_end|>{% endif %}\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
TEXT = [f"the quick brown fox jumps over the lazy dog {i} times" for i in range(50)]
CONVERSATION = [
    {"role": "user", "content": "the quick brown fox"},
    {"role": "assistant", "content": "jumps over the lazy dog"},
    {"role": "user", "content": "again"},
    {"role": "assistant", "content": "times"},
]
SPECIAL = ["<unk>", "<s>", "</s>", "<pad>", "<|im_start|>", "<|im_end|>"]


def _tokenizer(kind: str, template: str) -> Any:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    bpe = Tokenizer(models.BPE(unk_token="<unk>"))
    if kind == "byte_level":
        bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        bpe.decoder = decoders.ByteLevel()
        alphabet = pre_tokenizers.ByteLevel.alphabet()
    else:  # SentencePiece's way: spaces as ▁, kept at the start of the next word
        bpe.pre_tokenizer = pre_tokenizers.Metaspace(prepend_scheme="never")
        bpe.decoder = decoders.Metaspace(prepend_scheme="never")
        alphabet = []
    bpe.train_from_iterator(TEXT * 4, trainers.BpeTrainer(
        vocab_size=300, special_tokens=SPECIAL, initial_alphabet=alphabet))  # fmt: skip
    fast = transformers.PreTrainedTokenizerFast(
        tokenizer_object=bpe, unk_token="<unk>", bos_token="<s>", eos_token="</s>",
        pad_token="<pad>", additional_special_tokens=["<|im_start|>", "<|im_end|>"],
    )  # fmt: skip
    fast.chat_template = template
    return fast


def _marked(tokenizer: Any, conversation: list[dict[str, str]], length: int = 512) -> str:
    ids, mask, _ = chat.conversation_tokens(tokenizer, json.dumps(conversation), "line 1",
                                            length, False)  # fmt: skip
    return "|".join(tokenizer.decode([i]) for i, m in zip(ids, mask, strict=True) if m)


@pytest.mark.parametrize("kind", ["byte_level", "metaspace"])
def test_the_answers_first_token_is_marked_after_a_header_ending_in_a_space(kind: str) -> None:
    """The space after 'assistant: ' goes into the answer's first token (' jumps', '▁jumps'),
    which begins before the turn's characters: it is the answer's all the same."""
    tokenizer = _tokenizer(kind, SPACED)
    marked = _marked(tokenizer, CONVERSATION)
    tokens = marked.split("|")
    assert tokens[0].strip() == "jumps", marked
    joined = "".join(tokenizer.decode([i]) for i in tokenizer(
        "jumps over the lazy dog</s>", add_special_tokens=False)["input_ids"])  # fmt: skip
    assert "".join(t.strip() for t in tokens).startswith(joined.replace(" ", "")), marked
    assert "times" in tokens[-2] and tokens[-1] == "</s>"
    assert "again" not in marked and "user" not in marked and "assistant" not in marked


@pytest.mark.parametrize("kind", ["byte_level", "metaspace"])
def test_with_generation_blocks_the_mask_is_transformers_own(kind: str) -> None:
    tokenizer = _tokenizer(kind, CHATML)
    ids, mask, _ = chat.conversation_tokens(tokenizer, json.dumps(CONVERSATION), "line 1", 512,
                                            False)  # fmt: skip
    want = tokenizer.apply_chat_template(CONVERSATION, tokenize=True, return_dict=True,
                                         return_assistant_tokens_mask=True)  # fmt: skip
    assert ids == list(want["input_ids"])
    assert mask == list(want["assistant_masks"])
    end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    ends = [i for i, (t, m) in enumerate(zip(ids, mask, strict=True)) if t == end and m]
    assert len(ends) == 2 and all(mask[i + 1 : i + 2] != [1] for i in ends)  # nor the newline


def test_a_message_of_text_parts_is_its_text_and_other_parts_are_one_line(tmp_path: Path) -> None:
    from hookdump.inputs.corpus import _messages

    parts = [{"role": "user", "content": [{"type": "text", "text": "the "},
                                          {"type": "text", "text": "fox"}]}]  # fmt: skip
    assert _messages(parts, "line 1", "messages") == [{"role": "user", "content": "the fox"}]
    image = [{"role": "user", "content": [{"type": "image_url", "image_url": "x"}]}]
    with pytest.raises(HookdumpError, match="message 0 of line 1 has a part of type 'image_url'"):
        _messages(image, "line 1", "messages")


@pytest.mark.parametrize(
    ("template", "said"),
    [
        (
            "{% for i in range(99999) %}{% for j in range(99999) %}{% endfor %}{% endfor %}",
            "took longer than",
        ),
        ("{{ 'x' * 4000000000 }}", "builds a value of 4,000,000,000 items"),
        ("{{ raise_exception('template says no') }}", "failed on line 1: template says no"),
        ("{% for m in messages %}{{ m['content'] }", "cannot be read"),
        ("{{ cycler.__init__.__globals__.os.popen('touch PWNED').read() }}", "failed on line 1"),
        ("{% include '/etc/passwd' %}", "failed on line 1"),
        ("{% macro f(n) %}{{ f(n) }}{% endmacro %}{{ f(1) }}", "line 1"),
        ("{% for i in range(99999) %}{{ 'x' * 99999 }}{% endfor %}", "characters"),
    ],
)
def test_a_hostile_template_is_one_line_bounded_in_time_and_size(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, template: str, said: str
) -> None:
    monkeypatch.setattr(chat_template, "RENDER_SECONDS", 1.0)
    monkeypatch.setattr(chat_template, "MOST_CHARS", 1 << 20)
    monkeypatch.chdir(tmp_path)
    tokenizer = _tokenizer("byte_level", template + "{% for m in messages %}{{ m['content'] }}"
                           "{% endfor %}")  # fmt: skip
    with pytest.raises(HookdumpError) as caught:
        _marked(tokenizer, CONVERSATION)
    line = str(caught.value)
    assert "\n" not in line and "the chat template of" in line and said in line, line
    assert not (tmp_path / "PWNED").exists()


def test_a_long_conversation_renders_only_its_kept_turns(monkeypatch: pytest.MonkeyPatch) -> None:
    """2,000 turns, 64 tokens kept: the turns past them are not rendered alone (each such
    render is the conversation up to a turn: all of them would be quadratic)."""
    tokenizer = _tokenizer("byte_level", SPACED)
    renders: list[int] = []
    real = chat_template.ChatTemplate.render

    def counted(self: Any, messages: list[dict[str, str]], *args: Any) -> Any:
        renders.append(len(messages))
        return real(self, messages, *args)

    monkeypatch.setattr(chat_template.ChatTemplate, "render", counted)
    turns = [{"role": ("user", "assistant")[i % 2], "content": f"the dog {i}"} for i in range(2000)]
    ids, mask, cut = chat.conversation_tokens(tokenizer, json.dumps(turns), "line 1", 64, False)
    assert cut
    assert len(ids) == 64 and sum(mask) > 0
    assert len(renders) < 30 and max(renders[1:]) < 30, renders


def test_a_huge_message_is_tokenized_in_a_window(monkeypatch: pytest.MonkeyPatch) -> None:
    tokenizer = _tokenizer("byte_level", SPACED)
    seen: list[int] = []
    real = chat._tokenize

    def recorded(tok: Any, text: str) -> Any:
        seen.append(len(text))
        return real(tok, text)

    monkeypatch.setattr(chat, "_tokenize", recorded)
    huge = [{"role": "user", "content": "the fox " * 1_000_000},
            {"role": "assistant", "content": "jumps"}]  # fmt: skip
    ids, _, cut = chat.conversation_tokens(tokenizer, json.dumps(huge), "line 1", 64, False)
    assert cut
    assert len(ids) == 64 and max(seen) <= 64 * chat.WINDOW_CHARS + 64
    whole = tokenizer(tokenizer.apply_chat_template(huge, tokenize=False),
                      add_special_tokens=False)["input_ids"]  # fmt: skip
    assert ids == whole[:64]  # the window's first tokens are the whole text's


@pytest.fixture(scope="module")
def llama(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("chat") / "llama"
    tokenizer = _tokenizer("byte_level", SPACED)
    tokenizer.save_pretrained(folder)
    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
        bos_token_id=1, eos_token_id=2, pad_token_id=3,
    )  # fmt: skip
    transformers.LlamaForCausalLM(config).save_pretrained(folder)
    return folder


def test_a_per_sample_dump_of_conversations_has_the_response_mask(
    llama: Path, tmp_path: Path
) -> None:
    corpus = tmp_path / "chats.jsonl"
    corpus.write_text(json.dumps({"messages": CONVERSATION}) + "\n"
                      + json.dumps({"messages": CONVERSATION[:2]}) + "\n")  # fmt: skip
    args = ["run", f"hf:{llama}", "--text", str(corpus), "--chat", "--layers", "resid_post.1",
            "-q"]  # fmt: skip
    assert invoke(*args, "-o", str(tmp_path / "s")).exit_code == 0
    assert invoke(*args, "--per-token", "-o", str(tmp_path / "t")).exit_code == 0
    per_sample, per_token = hookdump.load(tmp_path / "s"), hookdump.load(tmp_path / "t")
    response, real = per_sample["__response__"], per_sample["__attention_mask__"].bool()
    assert response.dtype == torch.uint8 and response.shape == real.shape
    assert torch.equal(response[real], per_token["__response__"])
    assert int(response[~real].sum()) == 0 and int(response.sum()) > 0


def test_a_template_error_in_a_run_is_one_line(llama: Path, tmp_path: Path) -> None:
    folder = tmp_path / "bad"
    folder.mkdir()
    for file in llama.iterdir():
        (folder / file.name).write_bytes(file.read_bytes())
    config = json.loads((folder / "tokenizer_config.json").read_text())
    config["chat_template"] = "{{ raise_exception('template says no') }}"
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    (folder / "chat_template.jinja").unlink(missing_ok=True)
    corpus = tmp_path / "chats.jsonl"
    corpus.write_text(json.dumps({"messages": CONVERSATION}) + "\n")
    result = invoke("run", f"hf:{folder}", "--text", str(corpus), "--chat", "--layers",
                    "resid_post.1", "-q", "-o", str(tmp_path / "d"))  # fmt: skip
    assert_usage_error(result, "the chat template of", "template says no")
