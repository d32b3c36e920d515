"""`--capture routing` against the same run without it (issue 48): seconds per dump, in one
process, the two in turns.

    python benchmarks/routing.py [--reps 5]

The job: a small Mixtral shape (4 layers, width 1024 or `--width 256`, 8 experts, top 2,
random weights) on
16 windows of 128 tokens in batches of 4, the output of every MoE block (`mlp`) as token
rows written to a dump; then the same with `--capture output,routing` (each block's router
logits, chosen experts and weights beside it). The target: routing costs at most 1.05
times the run without it. The bare forward passes are timed too.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
from pathlib import Path

import torch
import transformers
from harness import in_turns

import hookdump

SEQUENCES, TOKENS, BATCH = 16, 128, 4
WIDTHS = {"256": (256, 512), "1024": (1024, 2048)}  # --width: hidden, each expert's MLP


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--width", choices=list(WIDTHS), default="1024")
    args = parser.parse_args()
    hidden, inner = WIDTHS[args.width]
    torch.manual_seed(0)
    config = transformers.MixtralConfig(
        vocab_size=4096, hidden_size=hidden, intermediate_size=inner, num_hidden_layers=4,
        num_attention_heads=8, num_key_value_heads=4, num_local_experts=8,
        num_experts_per_tok=2, max_position_embeddings=TOKENS,
    )  # fmt: skip
    model = transformers.MixtralForCausalLM(config).eval()
    ids = torch.randint(0, 4096, (SEQUENCES, TOKENS), generator=torch.Generator().manual_seed(0))
    mask = torch.ones_like(ids)
    batches = [
        {"input_ids": ids[i : i + BATCH], "attention_mask": mask[i : i + BATCH]}
        for i in range(0, SEQUENCES, BATCH)
    ]
    scratch = Path(tempfile.mkdtemp(prefix="hookdump-routing-"))

    def bare() -> None:
        with torch.no_grad():
            for batch in batches:
                model(**batch)

    def dump(capture: list[str]) -> None:
        hookdump.dump(model, batches, scratch / "d", layers=["model.layers.*.mlp"],
                      capture=capture, per_token=True, overwrite=True)  # fmt: skip

    seconds = in_turns(
        {
            "forward passes alone": bare,
            "dump, mlp outputs": lambda: dump(["output"]),
            "dump, mlp outputs and routing": lambda: dump(["output", "routing"]),
        },
        args.reps,
    )
    median = {name: statistics.median(values) for name, values in seconds.items()}
    print(json.dumps({
        "job": f"Mixtral shape, 4 layers of width {hidden}, 8 experts, {SEQUENCES} x {TOKENS} "
        "tokens",
        "seconds (median, min-max)": {
            name: f"{median[name]:.3f} ({min(v):.3f}-{max(v):.3f})" for name, v in seconds.items()
        },
        "routing / without": round(
            median["dump, mlp outputs and routing"] / median["dump, mlp outputs"], 3
        ),
    }, indent=2))  # fmt: skip


if __name__ == "__main__":
    main()
