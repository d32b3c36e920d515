"""Attention patterns at one layer against the whole model in eager: tokens/s, in one
process.

    python benchmarks/attention.py            # 5 interleaved repetitions
    python benchmarks/attention.py --reps 3

The job: a GPT-2-small-shaped model (12 layers, 768 wide, 12 heads, random weights) on 8
windows of 128 tokens. Each repetition runs: the model as it is (SDPA); the model under
`hookdump.capture(..., capture="pattern")` at one layer of 12 (`transformer.h.5.attn`),
keeping the pattern (a copy, as a run keeps it); and the same model switched whole to
eager attention with `output_attentions=True`, the way to get patterns without hookdump.
"""

from __future__ import annotations

import argparse
import json
import statistics
from collections.abc import Callable

import torch
import transformers
from harness import in_turns

import hookdump

TOKENS = (8, 128)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=5)
    args = parser.parse_args()
    torch.manual_seed(0)
    config = transformers.GPT2Config(n_positions=TOKENS[1])
    model = transformers.GPT2LMHeadModel(config).eval()
    eager = transformers.GPT2LMHeadModel(config).eval()
    eager.load_state_dict(model.state_dict())
    eager.config._attn_implementation = "eager"
    ids = torch.randint(0, config.vocab_size, TOKENS, generator=torch.Generator().manual_seed(0))

    def sdpa() -> None:
        with torch.no_grad():
            model(input_ids=ids)

    def one_layer() -> None:
        layers = ["transformer.h.5.attn"]
        with hookdump.capture(model, layers=layers, capture="pattern"), torch.no_grad():
            model(input_ids=ids)

    def whole_eager() -> None:
        with torch.no_grad():
            eager(input_ids=ids, output_attentions=True)

    steps: dict[str, Callable[[], None]] = {
        "sdpa, no capture": sdpa,
        "pattern at 1 of 12 layers": one_layer,
        "whole model eager, output_attentions": whole_eager,
    }
    seconds = in_turns(steps, args.reps)
    tokens = TOKENS[0] * TOKENS[1]
    print(json.dumps({
        "job": f"GPT-2-small shape, {TOKENS[0]} x {TOKENS[1]} tokens",
        "tokens/s": {
            name: f"{tokens / statistics.median(values):.0f} "
                  f"({tokens / max(values):.0f}-{tokens / min(values):.0f})"
            for name, values in seconds.items()
        },
    }, indent=2))  # fmt: skip


if __name__ == "__main__":
    main()
