"""The one way in for every input source: `open_feed` turns what a run reads (`Source`:
Python batches, a corpus, token ids, images, tensor files or random input) into a `Feed`
of `Batch`es, each carrying its rows' ids and the inputs skipped before it.

A new source is a module of its own in `inputs/` and one branch here.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hookdump.errors import HookdumpError, opt
from hookdump.inputs.files import open_input
from hookdump.inputs.python import PythonData, python_feed
from hookdump.inputs.samples import (
    Feed,
    InputOptions,
    SampleForm,
    random_batches,
    share_of,
    takes_position_ids,
)
from hookdump.inputs.text import TextOptions, text_feed
from hookdump.inputs.token_ids import TokenModel, token_input
from hookdump.model.loading import LoadedModel
from hookdump.model.zoo import has_tokenizer, load_tokenizer


@dataclass(frozen=True)
class Source:
    """What a run reads: Python `data` if given, else `text` (a corpus), else token ids in
    `input.source` under `per_token` without text, else `input` (images, tensor files,
    random input). `per_token`: rows are tokens (a corpus is then padded per batch);
    `skip_special_tokens`: token ids need the tokenizer's special ids."""

    input: InputOptions
    text: TextOptions | None = None
    per_token: bool = False
    skip_special_tokens: bool = False
    data: PythonData | None = None
    generate: int = 0  # --generate: new tokens after each prompt (they need positions too)


@dataclass(frozen=True)
class Place:
    """Where a feed starts: `seed` (of random input), `done` (ids of the samples already
    dumped: resuming goes on after them), `share` (rank, world: a torchrun rank's slice)."""

    seed: int = 0
    done: Sequence[Any] = ()
    share: tuple[int, int] | None = None


def open_feed(
    source: Source, model: LoadedModel, form: Callable[[], SampleForm], place: Place = Place()
) -> Feed:
    """The samples `source` names, for `model`. `form`: the model's input form, worked out
    only when a source needs it (random input, images)."""
    if source.data is not None:
        given = dataclasses.replace(source.data, position_ids=takes_position_ids(model.module))
        return python_feed(given, source.input.num_samples, place.done)
    if source.text is not None:
        return _text_feed(source, source.text, model, place)
    if source.per_token:
        return _token_feed(source, model, place)
    return _input_feed(source.input, model, form, place)


def _input_feed(
    options: InputOptions, model: LoadedModel, form: Callable[[], SampleForm], place: Place
) -> Feed:
    done = place.done
    if options.source != "random":
        return open_input(
            options, form=form, transforms=model.transforms, done=done, share=place.share
        )
    total = options.num_samples if options.num_samples is not None else options.batch_size
    first, stop = share_of(total, place.share)

    def batches(batch_size: int) -> Any:
        return random_batches(form(), stop - first, batch_size, place.seed, len(done), first)

    return Feed("random", stop - first, range(first, stop), batches)


def _text_feed(source: Source, text: TextOptions, model: LoadedModel, place: Place) -> Feed:
    folder = text.tokenizer or model.about.get("folder")
    if folder is None and model.family not in ("custom", "tokens"):
        raise HookdumpError(
            f"{opt('text')} feeds text to a language model, and {opt('model')} {model.spec} is "
            f"a torchvision {model.family} model that takes images; give it {opt('input')} "
            "images, or give a language model (an hf: folder) for the text"
        )
    if folder is None:
        raise HookdumpError(
            f"{opt('text')} needs a tokenizer: an hf: model folder that has one, or "
            f"{opt('tokenizer')} PATH"
        )
    room = None if model.positions is None else model.positions - source.generate
    for name, value in (("context_size", text.context_size), ("max_length", text.max_length)):
        if value is not None and room is not None and value > room:
            more = f" and {opt('generate')} {source.generate} new tokens" if source.generate else ""
            raise HookdumpError(
                f"{opt(name)} {value}{more} is more tokens than {model.spec} takes in a "
                f"sample ({model.positions} positions); give at most {room}"
            )
    if room is not None and room < 1:
        raise HookdumpError(
            f"{opt('generate')} {source.generate} is more new tokens than {model.spec} takes in "
            f"a sample ({model.positions} positions); give fewer"
        )
    if source.generate and text.max_length is None and room is not None and room < 128:
        text = dataclasses.replace(text, max_length=room)  # prompts leave room for the rest
    if source.generate:
        text = dataclasses.replace(text, generation_prompt=True)
    tokenizer, files = load_tokenizer(folder, model.spec, given=bool(text.tokenizer))
    positions = model.input_shape[0] if model.family == "tokens" and model.input_shape else None
    return text_feed(
        text,
        tokenizer,
        model_positions=positions,
        num_samples=source.input.num_samples,
        done=place.done,
        tokenizer_files=files,
        share=place.share,
        dynamic=source.per_token,  # token rows: padding is never written
    )


def _token_feed(source: Source, model: LoadedModel, place: Place) -> Feed:
    """Pre-tokenized input for token rows; special ids from the model folder's tokenizer,
    asked for only by `skip_special_tokens`."""
    if model.family != "tokens":
        raise HookdumpError(
            f"{opt('input')} {source.input.source} with {opt('per_token', True)} feeds token "
            f"ids to a Hugging Face language model (hf:FOLDER); {model.spec} is not one"
        )
    special: list[int] = []
    files: list[Path] = []
    if source.skip_special_tokens:
        folder = model.about.get("folder")
        if folder is None or not has_tokenizer(Path(folder)):
            raise HookdumpError(
                f"{opt('skip_special_tokens', True)} needs the tokenizer's special ids, and "
                f"{model.spec} has no tokenizer files; leave {opt('skip_special_tokens', True)} "
                "out"
            )
        tokenizer, files = load_tokenizer(folder, model.spec, given=False)
        special = list(tokenizer.all_special_ids)
    takes = TokenModel(model.vocab, model.positions, takes_position_ids(model.module))
    return token_input(
        source.input.source,
        takes,
        limit=source.input.num_samples,
        done=place.done,
        share=place.share,
        special_ids=special,
        tokenizer_files=files,
    )
