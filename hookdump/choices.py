"""The domain's choices, named once: each a `Literal` that mypy follows through the CLI, the
library and the manifest, with its values as a tuple for checks and messages, and a parser
that turns a string from the command line (or a caller) into one, or one clear error."""

from __future__ import annotations

from typing import Literal, TypeVar, get_args

from hookdump.errors import HookdumpError, opt

Reduction = Literal["none", "mean", "max", "flatten", "first", "last"]
AttentionKind = Literal["pattern", "scores", "q", "k", "v", "z", "q_pre_rope", "k_pre_rope"]
# inside a mixture-of-experts block: what its router gives (`--capture routing`), and the
# router's probabilities over every expert (TransformerLens' `mlp.hook_expert_weights`)
RoutingKind = Literal["router_logits", "topk_ids", "topk_weights", "router_probs"]
CaptureKind = Literal["output", "input", "grad", "ops", "routing", AttentionKind]
# what the manifest's `kind` says of a key
TensorKind = Literal[
    "output", "input", "grad_output", "grad_input", "op", "tokens", AttentionKind, RoutingKind
]
ExportTarget = Literal["hf", "saelens", "npy", "routing"]
# what a manifest records of each shard: its CRC32C (the default), or its SHA-256
ChecksumKind = Literal["crc32c", "sha256"]
DiffStatus = Literal["match", "differ", "only in A", "only in B", "shape", "dtype"]
# where `--generate` takes its values: one forward over prompt + response, or the passes
# that produced the tokens
GenerateCapture = Literal["prefill", "decode"]

REDUCTIONS: tuple[Reduction, ...] = get_args(Reduction)
GENERATE_CAPTURES: tuple[GenerateCapture, ...] = get_args(GenerateCapture)
ATTENTION_KINDS: tuple[AttentionKind, ...] = get_args(AttentionKind)
ROUTING_KINDS: tuple[RoutingKind, ...] = ("router_logits", "topk_ids", "topk_weights")
ROUTER_VALUES: tuple[RoutingKind, ...] = get_args(RoutingKind)
CAPTURE_KINDS: tuple[CaptureKind, ...] = (
    "output",
    "input",
    "grad",
    "ops",
    "routing",
    *ATTENTION_KINDS,
)
TENSOR_KINDS: tuple[TensorKind, ...] = (
    "output",
    "input",
    "grad_output",
    "grad_input",
    "op",
    "tokens",
    *ATTENTION_KINDS,
    *ROUTER_VALUES,
)
EXPORT_TARGETS: tuple[ExportTarget, ...] = get_args(ExportTarget)
CHECKSUMS: tuple[ChecksumKind, ...] = get_args(ChecksumKind)

C = TypeVar("C", bound=str)


def choose(value: object, choices: tuple[C, ...], option: str, what: str | None = None) -> C:
    """`value` as one of `choices` (the same string, typed), else an error naming the
    option and every choice."""
    for choice in choices:
        if value == choice:
            return choice
    said = f"is not {what}; give one of" if what else "is not one of"
    raise HookdumpError(f"{opt(option)} {value!r} {said} {', '.join(choices)}")


def parse_reduction(value: object) -> Reduction:
    return choose(value, REDUCTIONS, "reduce")


def parse_export_target(value: object) -> ExportTarget:
    return choose(value, EXPORT_TARGETS, "to", "a format")


def parse_checksum(value: object) -> ChecksumKind:
    return choose(value, CHECKSUMS, "checksum", "a checksum hookdump records")
