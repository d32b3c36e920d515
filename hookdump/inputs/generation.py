"""`--generate`: what the model writes for each prompt, as samples of prompt + response.

The options (`Generation`), the per-prompt sampler that makes the tokens independent of
the batch they are generated in, and the layouts: the prompts left-padded for `generate`,
then prompt + response right-padded as every text sample is (padding after the real
tokens), with the mask of the response's tokens.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from hookdump.choices import GENERATE_CAPTURES, GenerateCapture, choose
from hookdump.errors import HookdumpError, opt
from hookdump.format.keys import ATTENTION_MASK, INPUT_IDS
from hookdump.format.manifest import recipe
from hookdump.inputs.samples import Batch


@dataclass(frozen=True)
class Generation:
    """Generate a response to each prompt and dump prompt + response (`--generate`).

    Args:
        max_new_tokens: the most tokens generated for a prompt (fewer where EOS comes first;
            the EOS is kept).
        do_sample: sample the tokens (else greedy), each prompt seeded by the run's seed
            and its index, so its tokens do not depend on the batch it is in.
        temperature, top_p, top_k: the sampling's settings (None: 1.0, none, none).
        capture: `prefill` (generate, then one forward with the hooks over prompt +
            response) or `decode` (the values of the passes that produced the tokens).
    """

    max_new_tokens: int = field(metadata=recipe("generate"))
    do_sample: bool = field(default=False, metadata=recipe())
    temperature: float | None = field(default=None, metadata=recipe())
    top_p: float | None = field(default=None, metadata=recipe())
    top_k: int | None = field(default=None, metadata=recipe())
    capture: GenerateCapture = field(default="prefill", metadata=recipe("generate_capture"))

    def __post_init__(self) -> None:
        object.__setattr__(
            self, "capture", choose(self.capture, GENERATE_CAPTURES, "generate_capture")
        )
        if not isinstance(self.max_new_tokens, int) or self.max_new_tokens < 1:
            raise HookdumpError(
                f"{opt('generate')} {self.max_new_tokens!r}: give the most new tokens per "
                "prompt, a whole number of at least 1"
            )
        settings = {"temperature": self.temperature, "top_p": self.top_p, "top_k": self.top_k}
        given = [name for name, value in settings.items() if value is not None]
        if given and not self.do_sample:
            raise HookdumpError(
                f"{opt(given[0])} sets how tokens are sampled, and greedy decoding samples "
                f"none; add {opt('do_sample', True)}"
            )
        if self.temperature is not None and not self.temperature > 0:
            raise HookdumpError(f"{opt('temperature')} {self.temperature}: give a number > 0")
        if self.top_p is not None and not 0 < self.top_p <= 1:
            raise HookdumpError(f"{opt('top_p')} {self.top_p}: give a number in (0, 1]")
        if self.top_k is not None and self.top_k < 1:
            raise HookdumpError(f"{opt('top_k')} {self.top_k}: give a whole number >= 1")

    def as_json(self, seed: int) -> dict[str, Any]:
        """The manifest's `generation` object (the per-sequence list goes beside)."""
        return {
            "max_new_tokens": self.max_new_tokens,
            "do_sample": self.do_sample,
            "temperature": self.temperature,
            "top_p": self.top_p,
            "top_k": self.top_k,
            "capture": self.capture,
            "seed": seed if self.do_sample else None,
        }


def as_generation(value: int | Generation | None) -> Generation | None:
    """`generate=` as the Python door takes it: a number of new tokens, or the options."""
    if value is None or isinstance(value, Generation):
        return value
    if isinstance(value, bool) or not isinstance(value, int):
        raise HookdumpError(
            f"generate={value!r}: give the most new tokens per prompt (an int) or "
            "hookdump.Generation(...)"
        )
    return Generation(value)


def prompt_seed(seed: int, index: int) -> int:
    """The seed of prompt `index`'s sampling in a run seeded `seed`: a hash of both, of 32
    bits (a CPU generator's seed keeps no more)."""
    digest = hashlib.blake2b(f"{seed}:{index}".encode(), digest_size=4).digest()
    return int.from_bytes(digest, "little")


class PerPromptSampler:
    """A logits processor that samples each row's next token with the row's own generator
    (temperature, then top-k, then top-p, as transformers' warpers do) and leaves only that
    token possible, so that greedy decoding picks it: a prompt's tokens depend on the run's
    seed and its index, never on the prompts beside it."""

    def __init__(self, generation: Generation, seed: int, prompts: Sequence[int]) -> None:
        self.generation = generation
        self.generators = [torch.Generator().manual_seed(prompt_seed(seed, i)) for i in prompts]

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> Any:
        g = self.generation
        logits = scores.float() / (g.temperature or 1.0)
        if g.top_k is not None and g.top_k < logits.shape[-1]:
            kth = torch.topk(logits, g.top_k, dim=-1).values[:, -1:]
            logits = logits.masked_fill(logits < kth, -torch.inf)
        if g.top_p is not None and g.top_p < 1:
            ordered, order = logits.sort(dim=-1, descending=True)
            probs = ordered.softmax(-1)
            beyond = probs.cumsum(-1) - probs > g.top_p  # the first token always stays
            logits = logits.scatter(-1, order, ordered.masked_fill(beyond, -torch.inf))
        cdf = logits.softmax(-1).double().cumsum(-1)
        draws = torch.stack(
            [torch.rand((), generator=gen, dtype=torch.float64) for gen in self.generators]
        )
        chosen = (cdf < draws.to(cdf.device)[:, None] * cdf[:, -1:]).sum(-1)
        chosen = chosen.clamp(max=logits.shape[-1] - 1)
        only = torch.full_like(scores, -torch.inf)
        return only.scatter_(-1, chosen[:, None], 0.0)


def real_tokens(ids: torch.Tensor, mask: torch.Tensor) -> list[list[int]]:
    """Each prompt's real tokens (`mask` 1), whichever side it was padded on."""
    return [
        [t for t, m in zip(row, kept, strict=True) if m]
        for row, kept in zip(ids.tolist(), mask.tolist(), strict=True)
    ]


def left_padded(
    prompts: list[list[int]], pad: int, device: torch.device
) -> tuple[torch.Tensor, ...]:
    """Prompts' tokens at the right end of one width (padding first), as batched
    generation needs them; their ids and mask."""
    width = max(len(p) for p in prompts)
    ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompts], device=device)
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts], device=device)
    return ids, mask


def sequence_batch(
    prompts: Batch, ids: torch.Tensor, mask: torch.Tensor, response: torch.Tensor
) -> Batch:
    """The sequences made of a batch of `prompts` (`[B, T]` ids, mask and response mask) as
    a batch of the prompts' rows: what the token rows select from."""
    return Batch(
        (),
        {"input_ids": ids, "attention_mask": mask},
        prompts.start,
        prompts.stop,
        stored={INPUT_IDS: ids, ATTENTION_MASK: mask},
        ids=prompts.ids,
        skipped=prompts.skipped,
        response=response,
    )


@dataclass(frozen=True)
class Sequences:
    """What generation made of a batch of prompts: each prompt's real tokens, the tokens
    generated for it (up to and including EOS), and why it stopped."""

    prompts: list[list[int]]
    responses: list[list[int]]
    stops: list[str]  # "eos" or "length"

    @classmethod
    def cut(
        cls, prompts: list[list[int]], generated: torch.Tensor, eos: set[int], limit: int
    ) -> Sequences:
        """`generated` `[B, n]` (what followed the prompts) cut after each row's first EOS."""
        responses, stops = [], []
        for row in generated[:, :limit].tolist():
            end = next((i for i, token in enumerate(row) if token in eos), None)
            responses.append(row if end is None else row[: end + 1])
            stops.append("length" if end is None else "eos")
        return cls(prompts, responses, stops)

    def batch(self, prompts: Batch, pad: int, device: torch.device) -> Batch:
        """Prompt + response of each sequence right-padded, as a batch of the prompts' rows,
        with the mask of the response's tokens (`Batch.response`)."""
        rows = [p + r for p, r in zip(self.prompts, self.responses, strict=True)]
        width = max(len(row) for row in rows)
        ids = torch.tensor([row + [pad] * (width - len(row)) for row in rows], device=device)
        mask = torch.zeros_like(ids)
        response = torch.zeros_like(ids)
        for i, (p, r) in enumerate(zip(self.prompts, self.responses, strict=True)):
            mask[i, : len(p) + len(r)] = 1
            response[i, len(p) : len(p) + len(r)] = 1
        return sequence_batch(prompts, ids, mask, response)

    def record(self) -> tuple[tuple[int, str], ...]:
        """Each sequence's tokens generated and why it stopped (`Rows.generated`: the
        manifest's `generated` list)."""
        return tuple((len(r), stop) for r, stop in zip(self.responses, self.stops, strict=True))
