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
  tokens; `bos=True` puts BOS first where they do not), truncated to `max_length` as
  `truncation=True` does (only the document's head is read and tokenized) and right-padded
  with the pad token (EOS without one) to `max_length`, or, `dynamic`, to the batch's
  longest document; the attention mask marks the real tokens; sample ids are `FILE:LINE`
  (or a folder's paths). `sort_by_length` orders each window of `SORT_WINDOW` documents
  longest first, so that a batch holds documents of about one length (less padding); the
  order depends on the corpus alone, so resuming and torchrun slices count samples in it.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from hookdump.errors import HookdumpError, opt
from hookdump.format.keys import ATTENTION_MASK, INPUT_IDS, RESPONSE
from hookdump.format.manifest import recipe
from hookdump.format.rows import SampleIds
from hookdump.inputs.chat import check_template, conversation_tokens
from hookdump.inputs.corpus import (
    PIECE,
    Document,
    ReadProgress,
    content_bytes,
    documents,
    text_files,
)
from hookdump.inputs.samples import Batch, Ends, Feed, TextTally, share_of
from hookdump.worker import prefetch

# a sample: its id, token ids, how many are real, and which are the response (or None)
Sample = tuple[Any, list[int], int, list[int] | None]
PREFETCH = 4  # batches tokenized ahead of the forward
LONGEST_HEAD = 1 << 22  # the most characters of a document read for one truncated sample
SORT_WINDOW = 1024  # documents sorted by length together (held tokenized at once)


@dataclass(frozen=True)
class TextOptions:
    """How text becomes samples (see the module's docstring).

    Args:
        source: a `.txt` or `.jsonl` file, a folder of `.txt` files, or `-`.
        text_field: the document's field in each `.jsonl` object.
        tokenizer: a folder holding the tokenizer (None: the `hf:` model's).
        context_size: pack documents into windows of this many tokens (None: a document
            per sample).
        bos: samples start with the BOS token (None: packed windows do, documents keep
            the tokenizer's own template).
        max_length: a document sample's most tokens (None: 128, or the model's positions if
            fewer).
        max_tokens: the most whole samples whose tokens (padded to `max_length`) fit in this.
        sort_by_length: documents of about one length are batched together.
        chat: each document is a conversation (a `.jsonl` field of messages) rendered with
            the tokenizer's chat template (`inputs.chat`).
    """

    source: str = field(metadata=recipe("text"))
    text_field: str = field(default="text", metadata=recipe())
    tokenizer: str | None = field(default=None, metadata=recipe())
    context_size: int | None = field(default=None, metadata=recipe())
    bos: bool | None = field(default=None, metadata=recipe())
    max_length: int | None = field(default=None, metadata=recipe())
    max_tokens: int | None = field(default=None, metadata=recipe())
    sort_by_length: bool = field(default=False, metadata=recipe())
    chat: bool = field(default=False, metadata=recipe())
    # conversations end with the opening of the assistant's turn (set by --generate)
    generation_prompt: bool = False

    @property
    def packed(self) -> bool:
        return self.context_size is not None

    @property
    def starts_with_bos(self) -> bool:
        """Whether samples get a BOS token of hookdump's (packed: unless `bos=False`)."""
        return self.bos if self.bos is not None else self.packed


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
    progress: ReadProgress | None = None,
    num_samples: int | None = None,
    cuts: TextTally | None = None,
) -> Iterator[Sample]:
    """(sample id, token ids, real tokens, response mask) for samples `first:stop` of the
    corpus, in order, as many as the limits allow; samples before `first` are passed over
    (one document per sample: without tokenizing them). The response mask: a conversation's
    assistant tokens (`chat`), None for other samples. `cuts`: count the documents cut."""
    limit = sample_limit(options, model_positions, num_samples)
    if limit is not None:
        stop = limit if stop is None else min(stop, limit)
    progress = progress or ReadProgress(None)
    if options.context_size is not None:
        made = _packed(options, tokenizer, progress)
    else:
        made = _per_document(options, tokenizer, model_positions, first, progress, cuts)
        first, stop = 0, None if stop is None else max(0, stop - first)
    yield from itertools.islice(made, first, stop)


def count_samples(
    options: TextOptions, tokenizer: Any, model_positions: int | None, num_samples: int | None
) -> int:
    """How many samples the corpus makes, within the limits: the documents are counted
    (one per sample), or the corpus is tokenized once (packed)."""
    if options.context_size is None:
        made: Iterator[Any] = documents(options.source, options.text_field, chat=options.chat)
    else:
        made = _packed(options, tokenizer, ReadProgress(None))
    limit = sample_limit(options, model_positions, num_samples)
    return sum(1 for _ in itertools.islice(made, limit))


def _packed(options: TextOptions, tokenizer: Any, progress: ReadProgress) -> Iterator[Sample]:
    size = options.context_size or 0
    eos = tokenizer.eos_token_id
    if eos is None:
        raise HookdumpError(
            f"{opt('context_size')} packs documents with the tokenizer's EOS token, and this "
            "tokenizer has none; give one document per sample instead"
        )
    bos = _bos(options, tokenizer)
    take = size - len(bos)
    stream: list[int] = []
    window = 0
    for document in documents(options.source, options.text_field, progress):
        for piece in itertools.chain(document.pieces, [None]):
            stream += [eos] if piece is None else _tokens(tokenizer, piece, special=False)
            start = 0
            while len(stream) - start >= take:
                ids = bos + stream[start : start + take]
                start += take
                progress.count(1)
                yield window, ids, size, None
                window += 1
            del stream[:start]


def _per_document(
    options: TextOptions,
    tokenizer: Any,
    model_positions: int | None,
    first: int,
    progress: ReadProgress,
    cuts: TextTally | None = None,
) -> Iterator[Sample]:
    length = sample_length(options, model_positions)
    bos = _bos(options, tokenizer)
    window = SORT_WINDOW if options.sort_by_length else 1
    passed = first - first % window  # whole windows before `first` are not tokenized
    progress.count(passed)  # passed over, but read: the estimate counts them
    found = documents(options.source, options.text_field, progress, options.chat)
    docs = itertools.islice(found, passed, None)
    drop = first - passed

    def tokens(document: Document) -> tuple[list[int], list[int] | None]:
        if options.chat:
            raw = "".join(document.pieces)
            prompt = options.generation_prompt
            ids, response, cut = conversation_tokens(tokenizer, raw, document.id, length, prompt)
        else:
            ids, cut = _head(tokenizer, document.pieces, length, bos, tell=cuts is not None)
            response = None
        if cuts is not None:
            cuts.count_prompt(cut)
        return ids, response

    while group := [(d.id, *tokens(d)) for d in itertools.islice(docs, window)]:
        if options.sort_by_length:
            group.sort(key=lambda made: -len(made[1]))  # stable: ties keep corpus order
        progress.count(len(group))
        for sample_id, ids, response in group[drop:]:
            yield sample_id, ids, len(ids), response
        drop = 0


def _bos(options: TextOptions, tokenizer: Any) -> list[int]:
    """The BOS token samples start with (the tokenizer's BOS, else its EOS), if they do."""
    if not options.starts_with_bos:
        return []
    bos = tokenizer.bos_token_id if tokenizer.bos_token_id is not None else tokenizer.eos_token_id
    if bos is None:
        raise HookdumpError(
            f"{opt('bos', True)}: the tokenizer has neither a BOS nor an EOS token to start "
            f"samples with; leave {opt('bos', True)} out"
        )
    return [bos]


def _tokens(tokenizer: Any, text: str, special: bool, **truncation: Any) -> list[int]:
    # verbose=False: no warning that the text is longer than the model's positions (a
    # packed piece is; a document's head is cut to them)
    found = tokenizer(text, add_special_tokens=special, verbose=False, **truncation)
    ids: list[int] = found["input_ids"]
    return ids


def _head(
    tokenizer: Any, pieces: Iterator[str], length: int, bos: list[int], tell: bool = False
) -> tuple[list[int], bool]:
    """The tokens of a document truncated to `length` (as `truncation=True` does), from as
    little of its head as holds them: the head is read in growing steps until its tokens
    (without special ones) reach `length` or the document ends (or `LONGEST_HEAD`
    characters were read: the rest of a document of whitespace is never read). `bos`: put
    first unless the tokenizer's template already starts with it. `tell`: also whether the
    document had more tokens (else False: finding out costs a tokenization more)."""
    head, ended, budget = "", False, max(PIECE, 16 * length)
    while True:
        while len(head) < budget and not ended:
            piece = next(pieces, None)
            ended = piece is None
            head += piece or ""
        enough = ended or budget >= LONGEST_HEAD
        if enough or len(_tokens(tokenizer, head, special=False)) >= length:
            ids = _tokens(tokenizer, head, special=True, truncation=True, max_length=length)
            whole = ids if ids[:1] == bos else bos + ids
            cut = tell and (
                not ended
                or len(whole) > length
                or len(_tokens(tokenizer, head, special=True)) > len(ids)
            )
            return whole[:length], cut
        budget *= 4


def text_feed(
    options: TextOptions,
    tokenizer: Any,
    *,
    model_positions: int | None = None,
    num_samples: int | None = None,
    done: Sequence[Any] | None = None,
    tokenizer_files: list[Path] | None = None,
    share: tuple[int, int] | None = None,
    dynamic: bool = False,
) -> Feed:
    """The samples as a `Feed` of batches (`input_ids`, and `attention_mask` for document
    samples), tokenized on a thread a few batches ahead; `dynamic`: document batches are
    padded to their longest document, not to `max_length`; `done`: the ids of the samples
    already dumped (resuming: the feed goes on after them); `share` (rank, world): a torchrun
    rank's contiguous slice of the samples, counted first when no limit gives their number
    (`feed.first` is the slice's first sample)."""
    ends = _ends(options, tokenizer)
    ids = SampleIds(done or [])  # window numbers stay a count
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
        progress = ReadProgress(sum(content_bytes(path) for path in corpus))
    width = None if dynamic else sample_length(options, model_positions)
    # packed windows hold no padding, and cut no document
    tally = None if options.packed else TextTally(sample_length(options, model_positions))

    def batches(batch_size: int) -> Iterator[Batch]:
        rows = len(done or [])  # resuming: the samples already in the dump are passed over
        made = samples(
            options,
            tokenizer,
            model_positions,
            first=first + rows,
            stop=stop,
            progress=progress,
            num_samples=num_samples,
            cuts=tally if options.generation_prompt else None,
        )
        for chunk in prefetch(_chunks(made, batch_size), PREFETCH, "hookdump-tokenize"):
            sample_ids, tokens, real, responses = zip(*chunk, strict=True)
            ids.extend(sample_ids)
            batch = _batch(tokens, width or max(real), ends.pad, rows, options.packed, responses)
            if tally is not None:
                tally.count(sum(real), batch.kwargs["input_ids"].numel())
            yield batch
            rows += len(chunk)

    return Feed(
        "text",
        total,
        ids,
        batches,
        first=first,
        tally=tally,
        width=sample_length(options, model_positions),
        files=corpus + list(tokenizer_files or []),
        special_ids=list(getattr(tokenizer, "all_special_ids", [])),
        estimate=progress.estimate if progress is not None else lambda: None,
        ends=ends,
    )


def _ends(options: TextOptions, tokenizer: Any) -> Ends:
    """The tokens samples are padded with (the tokenizer's pad token, else its EOS) and end
    at, checked for what `options` need; with `chat`, the chat template checked too."""
    if options.chat:
        check_template(tokenizer, options.tokenizer or "the model")
    ends = Ends.of(tokenizer)
    if ends.pad is None and not options.packed:
        raise HookdumpError(
            f"{opt('text')}: the tokenizer has neither a pad nor an EOS token to pad samples "
            f"with; pack them with {opt('context_size')}"
        )
    return ends


def _batch(
    samples: tuple[list[int], ...],
    width: int,
    pad: int | None,
    start: int,
    packed: bool,
    responses: tuple[list[int] | None, ...],
) -> Batch:
    """Samples' ids right-padded to `width` with `pad`, with the mask of the real ones (and
    of the assistant's, for conversations)."""
    tokens = torch.tensor([ids + [pad] * (width - len(ids)) for ids in samples])
    real = torch.tensor([len(ids) for ids in samples])
    mask = (torch.arange(width)[None, :] < real[:, None]).long()
    stored = {INPUT_IDS: tokens}
    if not packed:
        stored[ATTENTION_MASK] = mask
    response = None
    if any(r is not None for r in responses):
        response = torch.tensor([(r or []) + [0] * (width - len(r or [])) for r in responses])
        stored[RESPONSE] = response.to(torch.uint8)  # per sample; --per-token: per token
    return Batch(
        (),
        {"input_ids": tokens, "attention_mask": mask},
        start,
        start + tokens.shape[0],
        stored=stored,
        response=response,
    )


def _chunks(items: Iterator[Any], size: int) -> Iterator[list[Any]]:
    chunk: list[Any] = []
    for item in items:
        chunk.append(item)
        if len(chunk) == size:
            yield chunk
            chunk = []
    if chunk:
        yield chunk
