"""`hookdump run --generate` against `model.generate` alone, with the same batching (issue 45).

    python benchmarks/generate.py --reps 3
    PROMPTS=64 NEW_TOKENS=128 python benchmarks/generate.py --reps 3   # the issue's size

A GPT-2-small-shaped causal LM with random weights (12 layers, width 768) and a byte-level
BPE tokenizer trained here; prompts of up to 32 tokens (one document each), batches of 16,
greedy. Each run's loop (the model loaded, the prompts tokenized: `RunResult.timings`)
against `model.generate` on the same prompts, left-padded, in the same batches, tokenizing
counted: the ratio is what capture costs on top of generating. Four runs: one block
(`h.5`) and all 12, each with `--generate-capture prefill` (generate, then one forward over
prompt + response, hooked) and `decode` (the generating passes hooked, one more pass for
the last token). Steps are run in turns after a warm-up round; medians with min-max.

The default size (16 prompts, 32 new tokens) keeps a CPU run to minutes; the issue's
(64 prompts, 128 new tokens) is set by the environment, as above.
"""

from __future__ import annotations

import os
import statistics
import sys
from pathlib import Path
from typing import Any

import harness
import torch

sys.path.insert(0, str(Path(__file__).parent))
from text import synthetic_corpus

PROMPTS = int(os.environ.get("PROMPTS", "16"))
NEW_TOKENS = int(os.environ.get("NEW_TOKENS", "32"))
BATCH, PROMPT_TOKENS = 16, 32
SELECTIONS = {
    "one block": ["transformer.h.5"],
    "12 blocks": ["transformer.h.[0-9]", "transformer.h.1[01]"],
}


class Job:
    """The model folder, the prompts and the model built once for the reference."""

    def __init__(self, scratch: Path) -> None:
        import transformers
        from tokenizers import ByteLevelBPETokenizer

        self.scratch = scratch
        corpus = scratch / "corpus.txt"
        synthetic_corpus(corpus, 400, seed=0)
        self.prompts = scratch / "prompts.txt"
        lines = corpus.read_text().splitlines()[:PROMPTS]
        self.prompts.write_text("\n".join(lines) + "\n")
        self.folder = scratch / "gpt2"
        torch.manual_seed(0)
        config = transformers.GPT2Config(n_positions=PROMPT_TOKENS + NEW_TOKENS + 8)
        transformers.GPT2LMHeadModel(config).save_pretrained(self.folder)
        bpe = ByteLevelBPETokenizer()
        bpe.train([str(corpus)], vocab_size=4096, special_tokens=["<|endoftext|>"])
        fast = transformers.PreTrainedTokenizerFast(
            tokenizer_object=bpe._tokenizer, eos_token="<|endoftext|>"
        )
        fast.save_pretrained(self.folder)
        self.model = transformers.GPT2LMHeadModel.from_pretrained(self.folder).eval()
        self.tokenizer = transformers.AutoTokenizer.from_pretrained(self.folder)
        self.tokenizer.pad_token = self.tokenizer.eos_token
        self.tokenizer.padding_side = "left"

    def bare(self) -> None:
        """`model.generate` alone: the same prompts, batches and settings."""
        import transformers

        lines = self.prompts.read_text().splitlines()
        eos = self.tokenizer.eos_token_id
        config = transformers.GenerationConfig(
            max_new_tokens=NEW_TOKENS, do_sample=False, pad_token_id=eos, eos_token_id=[eos]
        )
        with torch.inference_mode():
            for at in range(0, len(lines), BATCH):
                batch = self.tokenizer(
                    lines[at : at + BATCH], return_tensors="pt", padding=True,
                    truncation=True, max_length=PROMPT_TOKENS,
                )  # fmt: skip
                self.model.generate(**batch, generation_config=config)

    def hookdump(self, layers: list[str], capture: str) -> float:
        from hookdump.engine.options import RunOptions
        from hookdump.engine.runner import run
        from hookdump.hooks.options import CaptureOptions
        from hookdump.hooks.tokens import TokenOptions
        from hookdump.inputs.generation import Generation
        from hookdump.inputs.samples import InputOptions
        from hookdump.inputs.text import TextOptions
        from hookdump.model.prepare import ModelOptions
        from hookdump.store.write.writer import DumpOptions

        options = RunOptions(
            ModelOptions(f"hf:{self.folder}"), CaptureOptions(layers=tuple(layers)),
            InputOptions(batch_size=BATCH), TextOptions(str(self.prompts),
                                                        max_length=PROMPT_TOKENS),
            TokenOptions(), Generation(NEW_TOKENS, capture=capture),  # type: ignore[arg-type]
            DumpOptions(self.scratch / "out", overwrite=True),
        )  # fmt: skip
        return run(options).timings["loop"]


def generation(job: Job, reps: int) -> dict[str, Any]:
    timed: dict[str, list[float]] = {name: [] for name in ["generate alone"]}
    steps = {"generate alone": job.bare}
    loops: dict[str, list[float]] = {}
    for selection, layers in SELECTIONS.items():
        for capture in ("prefill", "decode"):
            name = f"{selection}, {capture}"
            loops[name] = []
            steps[name] = lambda layers=layers, capture=capture, name=name: loops[name].append(
                job.hookdump(layers, capture)
            )
    seconds = harness.in_turns(steps, reps)
    timed["generate alone"] = seconds["generate alone"]
    bare = statistics.median(timed["generate alone"])
    found: dict[str, Any] = {
        "size": f"{PROMPTS} prompts of up to {PROMPT_TOKENS} tokens, {NEW_TOKENS} new tokens, "
        f"batches of {BATCH}, greedy",
        "generate alone s": _spread(timed["generate alone"]),
    }
    for name, values in loops.items():
        values = values[1:]  # the warm-up round's
        found[f"{name} s"] = _spread(values)
        found[f"{name} / generate alone"] = round(statistics.median(values) / bare, 3)
    return found


def _spread(values: list[float]) -> dict[str, float]:
    return {
        "median": round(statistics.median(values), 3),
        "min": round(min(values), 3),
        "max": round(max(values), 3),
    }


if __name__ == "__main__":
    harness.main(__doc__ or "", {"generation": generation}, Job)
