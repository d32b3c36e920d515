"""`--chat`: conversations rendered with the tokenizer's chat template, and which of their
tokens are the assistant's (the response mask speculative-decoding trainers take as their
loss mask).

An assistant turn's characters are those its message adds to the rendered conversation:
from the end of the conversation before it, rendered with the generation prompt, to the end
of the conversation up to it (its content and the template's end of turn). A token is the
assistant's when its characters (the fast tokenizer's offsets) lie in such a span. That
holds for templates that render a conversation's head the same whatever follows, as chat
templates do; one that does not is refused in one line rather than guessed at.
"""

from __future__ import annotations

import json
from typing import Any

from hookdump.errors import HookdumpError, opt


def check_template(tokenizer: Any, where: str) -> None:
    """`--chat` needs a tokenizer with a chat template, and a fast one (for the offsets)."""
    if not getattr(tokenizer, "chat_template", None):
        raise HookdumpError(
            f"{opt('chat', True)} renders conversations with the tokenizer's chat template, "
            f"and the tokenizer of {where} has none; give {opt('tokenizer')} FOLDER whose "
            "tokenizer_config.json has a chat_template"
        )
    if not getattr(tokenizer, "is_fast", False):
        raise HookdumpError(
            f"{opt('chat', True)} needs a fast tokenizer (tokenizer.json) to tell the "
            f"assistant's tokens; the tokenizer of {where} is a slow one"
        )


def conversation_tokens(
    tokenizer: Any, raw: str, where: str, length: int, generation_prompt: bool
) -> tuple[list[int], list[int]]:
    """The tokens of conversation `raw` (its messages' JSON) and, for each, 1 where it is the
    assistant's. `generation_prompt` (`--generate`): the template's opening of the
    assistant's turn is added, no token is the response yet, and a conversation longer than
    `length` keeps its last tokens (the turn to answer); else its first, as documents do."""
    messages: list[dict[str, str]] = json.loads(raw)
    if generation_prompt and messages[-1]["role"] == "assistant":
        raise HookdumpError(
            f"{opt('text')}: {where} ends with an assistant turn, and {opt('generate')} writes "
            "the next one; end each conversation with the turn to answer"
        )
    text = _render(tokenizer, messages, generation_prompt)
    spans = [] if generation_prompt else _assistant_spans(tokenizer, messages, text, where)
    found = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True, verbose=False)
    ids: list[int] = found["input_ids"]
    mask = [
        int(any(a <= start and end <= b for a, b in spans) and end > start)
        for start, end in found["offset_mapping"]
    ]
    if len(ids) > length:
        cut = slice(-length, None) if generation_prompt else slice(None, length)
        ids, mask = ids[cut], mask[cut]
    return ids, mask


def _render(tokenizer: Any, messages: list[dict[str, str]], generation_prompt: bool) -> str:
    if not messages:
        return ""
    text: str = tokenizer.apply_chat_template(
        messages, tokenize=False, add_generation_prompt=generation_prompt
    )
    return text


def _assistant_spans(
    tokenizer: Any, messages: list[dict[str, str]], text: str, where: str
) -> list[tuple[int, int]]:
    """The characters of `text` (the whole conversation rendered) each assistant turn adds."""
    spans = []
    for index, message in enumerate(messages):
        if message["role"] != "assistant":
            continue
        before = _render(tokenizer, messages[:index], True)
        upto = _render(tokenizer, messages[: index + 1], False)
        if not (upto.startswith(before) and text.startswith(upto)):
            raise HookdumpError(
                f"{opt('chat', True)}: the tokenizer's chat template renders the turns of "
                f"{where} differently alone than in the whole conversation, so the assistant's "
                "tokens cannot be told; give a template that renders a conversation's head the "
                "same whatever follows"
            )
        spans.append((len(before), len(upto)))
    return spans
