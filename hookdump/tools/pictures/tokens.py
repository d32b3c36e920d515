"""The words of a text sample, for the pictures: each position's token as its tokenizer
writes it (`convert_tokens_to_string`, so GPT-2's `Ġheads` and SentencePiece's `▁heads`
are ` heads`), with whitespace
made visible, and which positions are padding.

Whitespace is shown one way everywhere: a space as `·`, a newline as `↵`, a tab as `→`, and
a token that writes nothing as `∅`. The tokenizer is the one the dump's manifest names
(read from its files, never any code of its folder run); without it, the ids are shown.
"""

from __future__ import annotations

import codecs
import functools
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hookdump.errors import printable
from hookdump.format.keys import ATTENTION_MASK, INPUT_IDS, POSITION, RESPONSE, SAMPLE, TOKEN_IDS

_METASPACE = "\u2581"  # "▁": SentencePiece's (and Metaspace's) word start
_VISIBLE = str.maketrans({" ": "·", "\n": "↵", "\t": "→", "\r": "↵"})


@dataclass(frozen=True)
class Tokens:
    """A sample's positions: each one's token, and whether it is a real token (not padding)."""

    strings: list[str]
    real: list[bool]

    @property
    def padding(self) -> int:
        return self.real.count(False)


def visible(text: str) -> str:
    """`text` with its whitespace drawn (see the module's docstring)."""
    return text.translate(_VISIBLE) if text else "∅"


def sample_tokens(dump: Any, sample: int) -> Tokens | None:
    """The tokens of sample `sample` of a dump that keeps the ids it fed (None otherwise)."""
    if INPUT_IDS not in dump:
        return None
    ids = [int(i) for i in dump.row(INPUT_IDS, sample).tolist()]
    real = [True] * len(ids)
    if ATTENTION_MASK in dump:
        real = [bool(m) for m in dump.row(ATTENTION_MASK, sample).tolist()][: len(ids)]
    return Tokens(written(dump, ids), real)


def row_token(dump: Any, row: int) -> tuple[str, Any, int, bool] | None:
    """A token row's token (drawn visible), the id of its sequence, its position, and whether
    it is the model's response (`__response__`; None: the dump's rows are not tokens)."""
    if not dump.manifest.token_rows or TOKEN_IDS not in dump:
        return None
    token = written(dump, [int(dump.row(TOKEN_IDS, row))])[0]
    sequence = int(dump.row(SAMPLE, row)) if SAMPLE in dump else None
    ids = dump.manifest.sample_ids
    named = ids[sequence] if ids is not None and sequence is not None else sequence
    position = int(dump.row(POSITION, row)) if POSITION in dump else -1
    response = RESPONSE in dump and bool(dump.row(RESPONSE, row))
    return token, named, position, response


def decoded(dump: Any, ids: list[int]) -> str:
    """`ids` as their tokenizer writes them together (control characters escaped), or the ids
    where the dump names no tokenizer that can be read."""
    folder = (dump.manifest.get("input") or {}).get("tokenizer")
    tokenizer = _tokenizer(str(folder)) if folder and Path(folder).is_dir() else None
    if tokenizer is not None:
        try:
            return printable(as_text(tokenizer, ids))
        except Exception:  # a tokenizer that cannot write these ids: the ids will do
            pass
    return " ".join(map(str, ids))


def as_text(tokenizer: Any, ids: list[int]) -> str:
    """`ids` written together; bytes that are not whole UTF-8 characters (a byte-level
    token alone, a character cut at the end of a response) shown as `<0xBA>`, not as the
    replacement character the tokenizer writes for them."""
    text = str(tokenizer.decode(ids))
    if "\ufffd" not in text:
        return text
    pieces = [str(piece) for piece in tokenizer.convert_ids_to_tokens(ids)]
    byte_of = _byte_of()
    if all(ch in byte_of for piece in pieces for ch in piece):  # GPT-2's byte alphabet
        raw = bytes(byte_of[ch] for piece in pieces for ch in piece)
        return raw.decode("utf-8", errors=_SHOWN_BYTES)
    # token by token: those that write the replacement character as they are (`<0xBA>`)
    return "".join(
        piece if "\ufffd" in (alone := str(tokenizer.decode([i]))) else alone
        for i, piece in zip(ids, pieces, strict=True)
    )


def _shown_bytes(error: UnicodeError) -> tuple[str | bytes, int]:
    if not isinstance(error, UnicodeDecodeError):
        raise error
    cut = error.object[error.start : error.end]
    return "".join(f"<0x{b:02X}>" for b in cut), error.end


_SHOWN_BYTES = "hookdump-shown-bytes"
codecs.register_error(_SHOWN_BYTES, _shown_bytes)


@functools.cache
def _byte_of() -> dict[str, int]:
    """GPT-2's byte-level alphabet, a character for each byte (its `bytes_to_unicode`)."""
    kept = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1)]
    kept += range(ord("®"), ord("ÿ") + 1)
    codes, extra = {b: b for b in kept}, 0
    for b in range(256):
        if b not in codes:
            codes[b], extra = 256 + extra, extra + 1
    return {chr(code): b for b, code in codes.items()}


def written(dump: Any, ids: list[int]) -> list[str]:
    """Each id as its tokenizer writes it, whitespace visible; the ids themselves where the
    dump names no tokenizer that can be read."""
    folder = (dump.manifest.get("input") or {}).get("tokenizer")
    tokenizer = _tokenizer(str(folder)) if folder and Path(folder).is_dir() else None
    if tokenizer is None:
        return [str(i) for i in ids]
    try:
        pieces = tokenizer.convert_ids_to_tokens(ids)
        return [visible(_piece(tokenizer, piece)) for piece in pieces]
    except Exception:  # a tokenizer that cannot write these ids: the ids will do
        return [str(i) for i in ids]


def _piece(tokenizer: Any, piece: str) -> str:
    """One token as its tokenizer writes it. SentencePiece's space marker (`▁the`) is
    dropped when a token is written alone (as at the start of a text), so it is put back:
    a space, drawn as GPT-2's `Ġthe` is."""
    text = str(tokenizer.convert_tokens_to_string([piece]))
    if piece.startswith(_METASPACE) and not text.startswith(" "):
        text = " " + text
    return text


@functools.lru_cache(maxsize=4)
def _tokenizer(folder: str) -> Any:
    try:
        from hookdump.model.zoo import load_tokenizer

        return load_tokenizer(folder, folder)[0]
    except Exception:  # a tokenizer that will not load: the ids will do
        return None
