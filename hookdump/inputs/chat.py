"""`--chat`: conversations rendered with the tokenizer's chat template, and which of their
tokens are the assistant's (the response mask speculative-decoding trainers take as their
loss mask).

Where the template marks the assistant's turns with `{% generation %}` blocks, their
characters are those blocks', and the mask is transformers'
`return_assistant_tokens_mask`. Otherwise an assistant turn's characters are those its
message adds to the rendered conversation: from the end of the conversation before it,
rendered with the generation prompt, to the end of the conversation up to it (its content
and the template's end of turn); that holds for templates that render a conversation's head
the same whatever follows, as chat templates do, and one that does not is refused in one
line rather than guessed at. Either way a token is the assistant's when its characters (the
fast tokenizer's offsets) overlap such a span: byte-level BPE puts the space after a header
like `assistant: ` into the answer's first token, which is the answer's.
"""

from __future__ import annotations

import functools
import json
from typing import Any

from hookdump.errors import HookdumpError, opt
from hookdump.inputs.chat_template import ChatTemplate

WINDOW_CHARS = 64  # characters per token in the window a long conversation is tokenized in


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
) -> tuple[list[int], list[int], bool]:
    """The tokens of conversation `raw` (its messages' JSON), for each 1 where it is the
    assistant's, and whether it had more than `length` tokens. `generation_prompt`
    (`--generate`): the template's opening of the assistant's turn is added, no token is
    the response yet, and a conversation longer than `length` keeps its last tokens (the
    turn to answer); else its first, as documents do."""
    messages: list[dict[str, str]] = json.loads(raw)
    if generation_prompt and messages[-1]["role"] == "assistant":
        raise HookdumpError(
            f"{opt('text')}: {where} ends with an assistant turn, and {opt('generate')} writes "
            "the next one; end each conversation with the turn to answer"
        )
    template = _template(tokenizer)
    rendered = template.render(messages, generation_prompt, where)
    ids, offsets, cut = _tokens(tokenizer, rendered.text, length, keep_last=generation_prompt)
    if generation_prompt:
        return ids, [0] * len(ids), cut
    if template.has_generation:  # as transformers' return_assistant_tokens_mask
        spans = rendered.spans
    else:  # only the turns that start within the tokens kept are rendered alone
        spans = _assistant_spans(template, messages, rendered.text, where, offsets[-1][1])
    return ids, _overlapping(offsets, spans), cut


def _template(tokenizer: Any) -> ChatTemplate:
    """The tokenizer's chat template, compiled once (`name_or_path` names it)."""
    where = str(getattr(tokenizer, "name_or_path", "") or "the model")
    return _compiled(str(tokenizer.chat_template), where)


@functools.lru_cache(maxsize=8)
def _compiled(source: str, where: str) -> ChatTemplate:
    return ChatTemplate(source, where)


def _tokens(
    tokenizer: Any, text: str, length: int, keep_last: bool
) -> tuple[list[int], list[tuple[int, int]], bool]:
    """The first (`keep_last`: last) `length` tokens of `text` with their characters, and
    whether it has more. A long
    text is tokenized in a window of its characters first (a token spans a few characters,
    so a window of WINDOW_CHARS per token kept holds them): its memory is bounded as plain
    text's is, and the whole text is tokenized only where the window holds too few."""
    window = length * WINDOW_CHARS + 64
    if len(text) > window:
        piece = text[-window:] if keep_last else text[:window]
        ids, offsets = _tokenize(tokenizer, piece)
        if len(ids) > length + 8:  # only the tokens at the window's cut can differ
            if keep_last:
                shift = len(text) - window
                kept = [(a + shift, b + shift) for a, b in offsets[-length:]]
                return ids[-length:], kept, True
            return ids[:length], offsets[:length], True
    ids, offsets = _tokenize(tokenizer, text)
    part = slice(-length, None) if keep_last else slice(None, length)
    return ids[part], offsets[part] or [(0, 0)], len(ids) > length


def _tokenize(tokenizer: Any, text: str) -> tuple[list[int], list[tuple[int, int]]]:
    found = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True, verbose=False)
    return list(found["input_ids"]), [(int(a), int(b)) for a, b in found["offset_mapping"]]


def _overlapping(offsets: list[tuple[int, int]], spans: list[tuple[int, int]]) -> list[int]:
    """1 for each token whose characters overlap a span (as transformers marks a template's
    generation blocks): a token that begins before an assistant turn's characters, as
    byte-level BPE's ' jumps' after a header ending in a space does, is the turn's."""
    return [
        int(any(start < b and end > a for a, b in spans) and end > start) for start, end in offsets
    ]


def _assistant_spans(
    template: ChatTemplate, messages: list[dict[str, str]], text: str, where: str, upto: int
) -> list[tuple[int, int]]:
    """The characters of `text` (the whole conversation rendered) each assistant turn adds:
    from the end of the conversation before it, rendered with the generation prompt, to the
    end of the conversation up to it. Turns that start past character `upto` (the last
    token kept) are not rendered: a long conversation costs its kept part, not its square."""
    spans = []
    for index, message in enumerate(messages):
        if message["role"] != "assistant":
            continue
        before = template.render(messages[:index], True, where).text
        if len(before) >= upto:
            break
        upto_turn = template.render(messages[: index + 1], False, where).text
        if not (upto_turn.startswith(before) and text.startswith(upto_turn)):
            raise HookdumpError(
                f"{opt('chat', True)}: the tokenizer's chat template renders the turns of "
                f"{where} differently alone than in the whole conversation, so the assistant's "
                "tokens cannot be told; give a template that renders a conversation's head the "
                "same whatever follows, or marks the assistant's turns with {% generation %}"
            )
        spans.append((len(before), len(upto_turn)))
    return spans
