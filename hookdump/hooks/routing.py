"""Inside mixture-of-experts blocks: `--capture routing` for the selected MoE blocks of a
transformers model, from the block's own router.

transformers' MoE blocks (Mixtral, Qwen2-MoE, Qwen3-MoE, OLMoE, DeepSeek-V3, GPT-OSS, ...)
route through a router module of their own (`gate` or `router`, a `...TopKRouter`) whose
forward returns `(router_logits, top_k_weights, top_k_index)` over the block's tokens
flattened: the logits before any softmax, the weights the block multiplies the chosen
experts' outputs by (after its own normalisation) and the experts chosen, in the model's
order. A forward hook on the router takes the three as they are, and they are handed over
as `[B, T, ...]` by the shape of the block's input (a pre-hook notes it), so token rows and
padding work as for any output. A shared expert (Qwen2-MoE) is no part of the routing.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Any

import torch
from torch import nn

from hookdump.choices import ROUTING_KINDS
from hookdump.errors import HookdumpError, nearest, opt

# what a transformers top-k router's forward returns, in order
_ROUTER_GIVES: tuple[str, ...] = ("router_logits", "topk_weights", "topk_ids")
RoutingSeen = Callable[[str, str, torch.Tensor], None]  # (module, kind, [B, T, ...] value)


def router_of(module: nn.Module) -> nn.Module | None:
    """The top-k router of a transformers MoE block (a child of it), or the module itself
    if it is one; None for any other module."""
    if _is_router(module):
        return module
    return next((child for child in module.children() if _is_router(child)), None)


def _is_router(module: nn.Module) -> bool:
    return type(module).__name__.lower().endswith("topkrouter")


def is_moe_block(module: nn.Module) -> bool:
    """A transformers MoE block: one holding a top-k router (not the router itself)."""
    return not _is_router(module) and router_of(module) is not None


def moe_blocks(model: nn.Module) -> list[str]:
    """The qualified names of the model's MoE blocks."""
    return [name for name, module in model.named_modules() if is_moe_block(module)]


def check_selection(
    model: nn.Module, modules: Mapping[str, nn.Module], kinds: Sequence[str]
) -> None:
    """`routing` asked of modules that are not MoE blocks (a dense layer, a decoder layer):
    one line naming the first and the MoE blocks nearest it."""
    if "routing" not in kinds:
        return
    dense = [name for name, module in modules.items() if router_of(module) is None]
    if not dense:
        return
    found = moe_blocks(model)
    if not found:
        raise HookdumpError(
            f"{opt('capture')} routing needs the mixture-of-experts blocks of a transformers "
            "model (a block with a top-k router, as Mixtral, Qwen2-MoE, Qwen3-MoE and OLMoE "
            "have); this model has none"
        )
    near = nearest(dense[0], found, 3) or found[:3]
    raise HookdumpError(
        f"{opt('capture')} routing: {dense[0]!r} is not a mixture-of-experts block (no router "
        f"of its own: a dense layer, or one that holds the block); the nearest MoE blocks: "
        f"{', '.join(near)} (select them with {opt('layers')})"
    )


class RoutingTap:
    """While active (`with`), each MoE block of `modules` hands its router's logits, chosen
    experts and their weights to `seen` (by the block's name), shaped `[B, T, ...]`."""

    def __init__(
        self, modules: Mapping[str, nn.Module], seen: RoutingSeen, probs: Collection[str] = ()
    ) -> None:
        """`probs`: the blocks whose router's softmax over every expert is handed over too
        (`router_probs`: TransformerLens' `mlp.hook_expert_weights`)."""
        self._blocks = {n: (m, r) for n, m in modules.items() if (r := router_of(m)) is not None}
        self._seen = seen
        self._probs = frozenset(probs)
        self._shapes: dict[str, torch.Size] = {}  # block -> its input's shape, this call
        self._handles: list[Any] = []
        self._checked: set[str] = set()  # blocks whose router was seen to give logits

    def __enter__(self) -> RoutingTap:
        try:
            for name, (block, router) in self._blocks.items():
                if router is not block:
                    self._handles.append(
                        block.register_forward_pre_hook(self._noted(name), with_kwargs=True)
                    )
                self._handles.append(router.register_forward_hook(self._routed(name)))
        except BaseException:
            self.__exit__()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles.clear()
        self._shapes.clear()

    def _noted(self, name: str) -> Callable[..., None]:
        def hook(module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
            states = args[0] if args else kwargs.get("hidden_states")
            if isinstance(states, torch.Tensor):
                self._shapes[name] = states.shape

        return hook

    def _routed(self, name: str) -> Callable[..., None]:
        def hook(module: nn.Module, args: tuple[Any, ...], output: Any) -> None:
            if not isinstance(output, tuple) or len(output) < 3:
                return  # not a top-k router's (logits, weights, experts)
            shape = self._shapes.get(name)
            if shape is None and args and isinstance(args[0], torch.Tensor):
                shape = args[0].shape  # the router selected itself
            lead = tuple(shape[:-1]) if shape is not None and len(shape) >= 2 else None
            given = dict(zip(_ROUTER_GIVES, output[:3], strict=True))
            logits = given["router_logits"]
            if name not in self._checked and isinstance(logits, torch.Tensor):
                _refuse_probabilities(name, module, logits)
                self._checked.add(name)
            if name in self._probs and isinstance(logits, torch.Tensor):
                given["router_probs"] = logits.float().softmax(-1)
            for kind in (*ROUTING_KINDS, "router_probs"):  # logits, ids, weights: the contract's
                value = given.get(kind)
                if isinstance(value, torch.Tensor):
                    rows = value.reshape(*lead, value.shape[-1]) if lead else value
                    self._seen(name, kind, rows)

        return hook


def _refuse_probabilities(name: str, router: nn.Module, logits: torch.Tensor) -> None:
    """A router that returns probabilities where its logits belong (some transformers
    releases' routers did): every value non-negative and each token's summing to 1. They
    are refused, not written as `router_logits`."""
    if logits.shape[-1] < 2 or not logits.numel() or not logits.is_floating_point():
        return
    values = logits.detach().float()
    if bool((values >= 0).all()) and bool(((values.sum(-1) - 1).abs() <= 1e-3).all()):
        raise HookdumpError(
            f"{opt('capture')} routing: the router of {name} ({type(router).__name__}) returns "
            "probabilities (non-negative, each token's summing to 1) where its logits belong; "
            "they are not written as router_logits: upgrade transformers, or capture this "
            "model without routing"
        )
