"""Text input: documents from a corpus, tokenized ahead of the forward, as token-id batches.

The documents come from `inputs.corpus` in bounded pieces, and are tokenized on a thread
of their own, a few batches ahead, a piece at a time: memory stays bounded whatever the
corpus holds.

Two ways to make samples:
- packed (`context_size`): documents tokenized without special tokens (a piece at a
  time), joined with the EOS token after each; sample i is BOS then the next N - 1 tokens
  (`bos=False`: the next N); the last partial window is dropped; sample ids are window
  indices;
- one document per sample: tokenized as the tokenizer does by default (with its special
  tokens), truncated to `max_length` as `truncation=True` does (only the document's head
  is read and tokenized) and right-padded with the pad token (EOS without one); the
  attention mask marks the real tokens; sample ids are `FILE:LINE` (or a folder's paths).
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from hookdump.errors import HookdumpError, opt
from hookdump.format import recipe
from hookdump.inputs.corpus import PIECE, Progress, content_bytes, documents, text_files
from hookdump.inputs.samples import Batch, Feed, share_of
from hookdump.worker import prefetch

PREFETCH = 4  # batches tokenized ahead of the forward
LONGEST_HEAD = 1 << 22  # the most characters of a document read for one truncated sample


@dataclass(frozen=True)
class TextOptions:
    """How text becomes samples (see the module's docstring).

    Args:
        source: a `.txt` or `.jsonl` file, a folder of `.txt` files, or `-`.
        text_field: the document's field in each `.jsonl` object.
        tokenizer: a folder holding the tokenizer (None: the `hf:` model's).
        context_size: pack documents into windows of this many tokens (None: a document
            per sample).
        bos: packed windows start with the BOS token.
        max_length: a document sample's tokens (None: 128, or the model's positions if
            fewer).
        max_tokens: the most whole samples whose tokens (padding included) fit in this.
    """

    source: str = field(metadata=recipe("text"))
    text_field: str = field(default="text", metadata=recipe())
    tokenizer: str | None = field(default=None, metadata=recipe())
    context_size: int | None = field(default=None, metadata=recipe())
    bos: bool = field(default=True, metadata=recipe())
    max_length: int | None = field(default=None, metadata=recipe())
    max_tokens: int | None = field(default=None, metadata=recipe())


def sample_length(options: TextOptions, model_positions: int | None) -> int:
    """Every sample's tokens (padding included): the window, or the padded length."""
    if options.context_size is not None:
        return options.context_size
    return options.max_length or min(128, model_positions or 128)


def sample_limit(
    options: TextOptions, model_positions: int | None, num_samples: int | None = None
) -> int | None:
    """The most samples `num_samples` and `--max-tokens` allow (None: the whole corpus);
    every sample has the same number of tokens, so a token budget is a sample count."""
    limits = [num_samples] if num_samples is not None else []
    if options.max_tokens is not None:
        limits.append(options.max_tokens // sample_length(options, model_positions))
    return min(limits) if limits else None


def samples(
    options: TextOptions,
    tokenizer: Any,
    model_positions: int | None,
    *,
    first: int = 0,
    stop: int | None = None,
    progress: Progress | None = None,
    num_samples: int | None = None,
) -> Iterator[tuple[Any, list[int], int]]:
    """(sample id, token ids, real tokens) for samples `first:stop` of the corpus, in order,
    as many as the limits allow; samples before `first` are passed over (one document per
    sample: without tokenizing them)."""
    limit = sample_limit(options, model_positions, num_samples)
    if limit is not None:
        stop = limit if stop is None else min(stop, limit)
    progress = progress or Progress(None)
    if options.context_size is not None:
        made = _packed(options, tokenizer, progress)
    else:
        made = _per_document(options, tokenizer, model_positions, first, progress)
        first, stop = 0, None if stop is None else max(0, stop - first)
    yield from itertools.islice(made, first, stop)


def count_samples(
    options: TextOptions, tokenizer: Any, model_positions: int | None, num_samples: int | None
) -> int:
    """How many samples the corpus makes, within the limits: the documents are counted
    (one per sample), or the corpus is tokenized once (packed)."""
    if options.context_size is None:
        made: Iterator[Any] = documents(options.source, options.text_field)
    else:
        made = _packed(options, tokenizer, Progress(None))
    limit = sample_limit(options, model_positions, num_samples)
    return sum(1 for _ in itertools.islice(made, limit))


def _packed(
    options: TextOptions, tokenizer: Any, progress: Progress
) -> Iterator[tuple[Any, list[int], int]]:
    size = options.context_size or 0
    eos = tokenizer.eos_token_id
    bos = tokenizer.bos_token_id if tokenizer.bos_token_id is not None else eos
    if eos is None or (options.bos and bos is None):
        raise HookdumpError(
            f"{opt('context_size')} packs documents with the tokenizer's EOS token, and this "
            "tokenizer has none; give one document per sample instead"
        )
    take = size - 1 if options.bos else size
    stream: list[int] = []
    window = 0
    for document in documents(options.source, options.text_field, progress):
        for piece in itertools.chain(document.pieces, [None]):
            stream += [eos] if piece is None else _tokens(tokenizer, piece, special=False)
            start = 0
            while len(stream) - start >= take:
                ids = ([bos] if options.bos else []) + stream[start : start + take]
                start += take
                progress.count(1)
                yield window, ids, size
                window += 1
            del stream[:start]


def _per_document(
    options: TextOptions,
    tokenizer: Any,
    model_positions: int | None,
    first: int,
    progress: Progress,
) -> Iterator[tuple[Any, list[int], int]]:
    length = sample_length(options, model_positions)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    if pad is None:
        raise HookdumpError(
            f"{opt('text')}: the tokenizer has neither a pad nor an EOS token to pad samples "
            f"with; pack them with {opt('context_size')}"
        )
    progress.count(first)  # passed over, but read: the estimate counts them
    docs = documents(options.source, options.text_field, progress)
    for document in itertools.islice(docs, first, None):
        ids = _head(tokenizer, document.pieces, length)
        progress.count(1)
        yield document.id, ids + [pad] * (length - len(ids)), len(ids)


def _tokens(tokenizer: Any, text: str, special: bool, **truncation: Any) -> list[int]:
    # verbose=False: no warning that the text is longer than the model's positions (a
    # packed piece is; a document's head is cut to them)
    found = tokenizer(text, add_special_tokens=special, verbose=False, **truncation)
    ids: list[int] = found["input_ids"]
    return ids


def _head(tokenizer: Any, pieces: Iterator[str], length: int) -> list[int]:
    """The tokens of a document truncated to `length` (as `truncation=True` does), from as
    little of its head as holds them: the head is read in growing steps until its tokens
    (without special ones) reach `length` or the document ends (or `LONGEST_HEAD`
    characters were read: the rest of a document of whitespace is never read)."""
    head, ended, budget = "", False, max(PIECE, 16 * length)
    while True:
        while len(head) < budget and not ended:
            piece = next(pieces, None)
            ended = piece is None
            head += piece or ""
        enough = ended or budget >= LONGEST_HEAD
        if enough or len(_tokens(tokenizer, head, special=False)) >= length:
            return _tokens(tokenizer, head, special=True, truncation=True, max_length=length)
        budget *= 4


def text_feed(
    options: TextOptions,
    tokenizer: Any,
    *,
    model_positions: int | None = None,
    num_samples: int | None = None,
    done: list[Any] | None = None,
    tokenizer_files: list[Path] | None = None,
    share: tuple[int, int] | None = None,
) -> Feed:
    """The samples as a `Feed` of batches (`input_ids`, and `attention_mask` for document
    samples), tokenized on a thread a few batches ahead; `done`: the ids of the samples
    already dumped (resuming: the feed goes on after them); `share` (rank, world): a torchrun
    rank's contiguous slice of the samples, counted first when no limit gives their number
    (`feed.first` is the slice's first sample)."""
    ids: list[Any] = list(done or [])
    total = sample_limit(options, model_positions, num_samples)
    first, stop = 0, None
    if share is not None:
        if options.source == "-":
            raise HookdumpError(
                f"{opt('text')} - under torchrun: every rank would read its own standard "
                "input; give the corpus as a file or folder"
            )
        if total is None:
            total = count_samples(options, tokenizer, model_positions, num_samples)
        first, stop = share_of(total, share)
        total = stop - first
    corpus = text_files(options.source)
    progress = None
    if total is None and corpus:  # estimated from the corpus's size (none for stdin)
        progress = Progress(sum(content_bytes(path) for path in corpus))
    packed = options.context_size is not None

    def batches(batch_size: int) -> Iterator[Batch]:
        rows = len(done or [])  # resuming: the samples already in the dump are passed over
        made = samples(options, tokenizer, model_positions, first=first + rows, stop=stop,
                       progress=progress, num_samples=num_samples)  # fmt: skip
        for chunk in prefetch(_chunks(made, batch_size), PREFETCH, "hookdump-tokenize"):
            sample_ids, tokens, real = zip(*chunk, strict=True)
            ids.extend(sample_ids)
            yield _batch(torch.tensor(tokens), list(real), rows, packed)
            rows += len(chunk)

    return Feed(
        "text", total, ids, batches, first=first,
        files=corpus + list(tokenizer_files or []),
        special_ids=list(getattr(tokenizer, "all_special_ids", [])),
        estimate=progress.estimate if progress is not None else lambda: None,
    )  # fmt: skip


def _batch(tokens: torch.Tensor, real: list[int], start: int, packed: bool) -> Batch:
    positions = torch.arange(tokens.shape[1])
    mask = (positions[None, :] < torch.tensor(real)[:, None]).long()
    stored = {"__input_ids__": tokens}
    if not packed:
        stored["__attention_mask__"] = mask
    return Batch((), {"input_ids": tokens, "attention_mask": mask}, start,
                 start + tokens.shape[0], stored=stored)  # fmt: skip


def _chunks(items: Iterator[Any], size: int) -> Iterator[list[Any]]:
    chunk: list[Any] = []
    for item in items:
        chunk.append(item)
        if len(chunk) == size:
            yield chunk
            chunk = []
    if chunk:
        yield chunk
