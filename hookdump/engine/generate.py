"""`--generate`: each batch of prompts through the model's own `generate`, and the rows the
token rows select from.

`prefill` generates with the hooks off, then hands the batch loop prompt + response,
right-padded, for one forward under the hooks. `decode` generates under the hooks: each
pass's values are kept (`hooks.steps.DecodeSteps`), one more pass reads the last token, and
the batch loop takes the passes joined, over the left-padded layout `generate` used.

Greedy unless sampling is asked for; sampling draws each prompt's tokens from a generator
seeded by the run's seed and the prompt's index (`inputs.generation.PerPromptSampler`), so
that the tokens are the same whatever the batch size, and after `--resume`. Of the model's
own generation config, what greedy decoding reads (a repetition penalty, say) is kept; its
sampling settings are not: the run's are.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from hookdump.errors import HookdumpError, opt
from hookdump.hooks.capture import Hooks
from hookdump.hooks.steps import DecodeSteps
from hookdump.inputs.generation import (
    Generation,
    PerPromptSampler,
    Sequences,
    left_padded,
    real_tokens,
    sequence_batch,
)
from hookdump.inputs.samples import Batch, takes_position_ids


def check_generates(module: nn.Module, label: str) -> None:
    """A model `generate` can extend: a causal language model (one line, else)."""
    can = getattr(module, "can_generate", None)
    config = getattr(module, "config", None)
    if not callable(can) or not can():
        name = type(module).__name__
        hint = (
            f"; save the model as {name.removesuffix('Model')}LMHeadModel or with "
            "AutoModelForCausalLM"
            if name.endswith("Model")
            else ""
        )
        raise HookdumpError(
            f"{opt('generate')} needs a model that generates text, and {label} is a "
            f"{name}, which has no language-model head{hint}"
        )
    if getattr(config, "is_encoder_decoder", False):
        raise HookdumpError(
            f"{opt('generate')}: {label} is an encoder-decoder model; hookdump generates with "
            "decoder-only (causal) language models"
        )


@dataclass(frozen=True)
class Generated:
    """A batch of prompts, generated: what the token rows select from, and the sequences."""

    batch: Batch
    sequences: Sequences
    pads: torch.Tensor  # decode: each sequence's left padding in `batch`
    prompt_width: int


class Generator:
    """Generates each batch of prompts (see the module's docstring)."""

    def __init__(
        self,
        generation: Generation,
        module: nn.Module,
        hooks: Hooks,
        *,
        pad: int,
        eos: set[int],
        seed: int,
        first_sample: int,
        steps: DecodeSteps | None,
    ) -> None:
        self.generation, self.module, self.hooks, self.steps = generation, module, hooks, steps
        self.pad, self.eos, self.seed, self.first = pad, eos, seed, first_sample

    @property
    def decodes(self) -> bool:
        """Whether the values come from the passes that generate (no forward follows)."""
        return self.steps is not None

    def run(self, prompts: Batch) -> Generated:
        ids, mask = prompts.kwargs["input_ids"], prompts.kwargs["attention_mask"]
        real = real_tokens(ids, mask)
        left, left_mask = left_padded(real, self.pad, ids.device)
        limit = self.generation.max_new_tokens
        if not self.decodes:
            with self.hooks.detached():
                out = self._generate(prompts, left, left_mask)
            made = Sequences.cut(real, out.sequences[:, left.shape[1] :].cpu(), self.eos, limit)
            whole = made.batch(prompts, self.pad, ids.device)
            return Generated(whole, made, torch.zeros(prompts.rows, dtype=torch.long), 0)
        handle = self.module.register_forward_pre_hook(self._next_pass)
        try:
            out = self._generate(prompts, left, left_mask)
            self._last_pass(out, left_mask)
        finally:
            handle.remove()
        generated = out.sequences[:, left.shape[1] :]
        made = Sequences.cut(real, generated.cpu(), self.eos, limit)
        kept = torch.zeros_like(generated)
        for row, tokens in enumerate(made.responses):
            kept[row, : len(tokens)] = 1
        whole_mask = torch.cat([left_mask, kept], dim=1)
        response = torch.cat([torch.zeros_like(left_mask), kept], dim=1)
        layout = sequence_batch(prompts, out.sequences, whole_mask, response)
        pads = (left_mask == 0).sum(1)
        return Generated(layout, made, pads, left.shape[1])

    def flush(self, generated: Generated) -> None:
        """Decode: hand the passes' values on, joined."""
        if self.steps is not None:
            self.steps.flush(generated.pads, generated.prompt_width)

    def _generate(self, prompts: Batch, ids: torch.Tensor, mask: torch.Tensor) -> Any:
        from transformers import GenerationConfig, LogitsProcessorList

        g = self.generation
        config = GenerationConfig(
            max_new_tokens=g.max_new_tokens,
            min_new_tokens=0,
            do_sample=False,
            num_beams=1,
            pad_token_id=self.pad,
            eos_token_id=sorted(self.eos) or None,
            use_cache=True,
            return_dict_in_generate=True,
        )
        processors = LogitsProcessorList()
        if g.do_sample:
            index = range(self.first + prompts.start, self.first + prompts.stop)
            processors.append(PerPromptSampler(g, self.seed, list(index)))
        return self.module.generate(  # type: ignore[operator]
            input_ids=ids,
            attention_mask=mask,
            generation_config=config,
            logits_processor=processors,
            **self._every_logit(),
        )

    def _every_logit(self) -> dict[str, int]:
        """Decode under hooks on the LM head (or the whole model): its first pass computes
        every prompt position's logits, as a forward over the sequence does (`generate`
        asks for the last position's alone), so decode gives prefill's rows there too."""
        if not self.decodes:
            return {}
        get_head = getattr(self.module, "get_output_embeddings", None)
        head = get_head() if callable(get_head) else None
        hooked = self.hooks.modules.values()
        if not any(m is self.module or (head is not None and m is head) for m in hooked):
            return {}
        takes = _parameters(self.module)
        for name in ("logits_to_keep", "num_logits_to_keep"):  # transformers' names in turn
            if name in takes:
                return {name: 0}
        return {}

    def _next_pass(self, module: nn.Module, args: Any) -> None:
        self.hooks.clear()  # each pass counts its calls afresh: its keys are the first pass's

    def _last_pass(self, out: Any, prompt_mask: torch.Tensor) -> None:
        """One more pass, reading the last token generated (none reads it in `generate`)."""
        sequence = out.sequences
        added = sequence.shape[1] - prompt_mask.shape[1]
        mask = torch.cat([prompt_mask, prompt_mask.new_ones(len(sequence), added)], dim=1)
        takes = _parameters(self.module)
        cache = getattr(out, "cache", None) or getattr(out, "past_key_values", None)
        kwargs: dict[str, Any] = {
            "input_ids": sequence[:, -1:],
            "attention_mask": mask,
            # transformers 5 renamed `past_key_values` to `cache`
            ("cache" if "cache" in takes else "past_key_values"): cache,
            "use_cache": True,
        }
        if takes_position_ids(self.module):
            kwargs["position_ids"] = (mask.cumsum(-1) - 1).clamp(min=0)[:, -1:]
        if "cache_position" in takes:
            kwargs["cache_position"] = torch.tensor([mask.shape[1] - 1], device=mask.device)
        self.module(**kwargs)


def _parameters(module: nn.Module) -> set[str]:
    try:
        return set(inspect.signature(module.forward).parameters)
    except (TypeError, ValueError):
        return set()
