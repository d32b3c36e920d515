"""`--chat` (issue 45): conversations rendered with the tokenizer's chat template; without
`--generate`, `__response__` marks the assistant turns' tokens (checked against the turns
tokenized one by one); with it, the template's generation prompt is added and the generated
tokens are the response (checked against transformers' own `generate`)."""

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

CONVERSATIONS = [
    [
        {"role": "system", "content": "the model"},
        {"role": "user", "content": "the cat sat"},
        {"role": "assistant", "content": "on the mat"},
        {"role": "user", "content": "a dog"},
        {"role": "assistant", "content": "ran in the park"},
    ],
    [{"role": "user", "content": "hooks dump"}, {"role": "assistant", "content": "activations"}],
]


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny_causal_lm(tmp_path_factory.mktemp("chat") / "lm", chat=True)


def _corpus(path: Path, conversations: list[list[dict[str, str]]]) -> Path:
    path.write_text("".join(json.dumps({"messages": c}) + "\n" for c in conversations))
    return path


def _expected(tokenizer: object, conversation: list[dict[str, str]]) -> tuple[list[int], list[int]]:
    """The template's turns tokenized one by one: `[CLS] role` and `[SEP]` are the template's,
    the content between them the message's (the assistant's, with its end of turn, marked)."""
    ids: list[int] = []
    mask: list[int] = []
    for message in conversation:
        turn = message["role"] == "assistant"
        for text, marked in ((f"[CLS] {message['role']}", 0), (message["content"], turn),
                             ("[SEP]", turn)):  # fmt: skip
            tokens = tokenizer(text, add_special_tokens=False)["input_ids"]  # type: ignore[operator]
            ids += tokens
            mask += [int(marked)] * len(tokens)
    return ids, mask


def test_the_assistants_tokens_are_the_response(model: Path, tmp_path: Path) -> None:
    corpus = _corpus(tmp_path / "chats.jsonl", CONVERSATIONS)
    out = tmp_path / "d"
    result = CliRunner().invoke(app, ["run", f"hf:{model}", "--text", str(corpus), "--chat",
                                      "--per-token", "--layers", "transformer.h.0",
                                      "--out", str(out), "-q"])  # fmt: skip
    assert result.exit_code == 0, result.output
    dump = hookdump.load(out)
    tokenizer = transformers.AutoTokenizer.from_pretrained(model)
    samples = dump["__sample__"]
    for index, conversation in enumerate(CONVERSATIONS):
        ids, mask = _expected(tokenizer, conversation)
        assert dump["__token_ids__"][samples == index].tolist() == ids
        assert dump["__response__"][samples == index].tolist() == mask
    assert dump["__response__"].dtype == torch.uint8
    assert dump.manifest["recipe"]["chat"] is True


def test_with_generate_the_generated_tokens_are_the_response(model: Path, tmp_path: Path) -> None:
    asked = [c[:-1] for c in CONVERSATIONS]  # each ends with the user's turn
    corpus = _corpus(tmp_path / "chats.jsonl", asked)
    out = tmp_path / "d"
    result = CliRunner().invoke(app, ["run", f"hf:{model}", "--text", str(corpus), "--chat",
                                      "--generate", "4", "--layers", "transformer.h.0",
                                      "--out", str(out), "-q"])  # fmt: skip
    assert result.exit_code == 0, result.output
    dump = hookdump.load(out)
    tokenizer = transformers.AutoTokenizer.from_pretrained(model)
    lm = transformers.AutoModelForCausalLM.from_pretrained(model).eval()
    samples = dump["__sample__"]
    for index, conversation in enumerate(asked):
        prompt = _expected(tokenizer, conversation)[0]
        prompt += tokenizer("[CLS] assistant", add_special_tokens=False)["input_ids"]
        eos = tokenizer.eos_token_id
        made = lm.generate(torch.tensor([prompt]), max_new_tokens=4, do_sample=False,
                           eos_token_id=eos, pad_token_id=eos)  # fmt: skip
        out_ids = made[0, len(prompt) :].tolist()
        if eos in out_ids:
            out_ids = out_ids[: out_ids.index(eos) + 1]
        assert dump["__token_ids__"][samples == index].tolist() == prompt + out_ids
        want = [0] * len(prompt) + [1] * len(out_ids)
        assert dump["__response__"][samples == index].tolist() == want


@pytest.mark.parametrize(
    ("case", "said"),
    [
        ("no template", "has none"),
        ("ends with the assistant", "ends with an assistant turn"),
        ("not jsonl", ".jsonl"),
        ("not messages", "no conversation"),
    ],
)
def test_refusals_are_one_line(model: Path, tmp_path: Path, case: str, said: str) -> None:
    folder = model
    corpus = _corpus(tmp_path / "chats.jsonl", CONVERSATIONS)
    if case == "no template":
        folder = tiny_causal_lm(tmp_path / "plain")
    elif case == "not jsonl":
        corpus = tmp_path / "chats.txt"
        corpus.write_text("the cat\n")
    elif case == "not messages":
        corpus.write_text(json.dumps({"messages": "the cat"}) + "\n")
    out = tmp_path / "d"
    result = CliRunner().invoke(app, ["run", f"hf:{folder}", "--text", str(corpus), "--chat",
                                      "--generate", "3", "--out", str(out)])  # fmt: skip
    assert result.exit_code == 2, result.output
    assert result.stderr.startswith("Error: ") and said in result.stderr, result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
    assert not out.exists()
