"""Inside attention: `--capture pattern,scores,q,k,v,z` for the selected attention modules of
a transformers model, from the real model, with every other layer on its fast path.

transformers' attention modules look their attention function up per call by the name in
`config._attn_implementation`. While a `AttentionTap` is active, that name is "hookdump",
registered here: for a selected module it runs the model's own eager attention (on the
mask the model made for its usual implementation, turned additive) and hands over the
values; for every other module it calls the implementation the model had. The outputs are
the same as without hookdump, within float rounding (eager against SDPA).
"""

from __future__ import annotations

import functools
import inspect
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
from torch import nn

from hookdump.choices import ATTENTION_KINDS
from hookdump.errors import HookdumpError, nearest, opt
from hookdump.hooks.rotary import unrotated

NAME = "hookdump"
AttentionSeen = Callable[[str, str, torch.Tensor], None]  # (module, kind, [B, ...] value)

# the taps active now: a selected module (by id) -> (its name, the tap); a config (by id) ->
# the implementation it had
_SELECTED: dict[int, tuple[str, AttentionTap]] = {}
_ORIGINAL: dict[int, str] = {}


_LOOKS_UP: dict[type, bool] = {}  # an nn.Module class -> whether its forward looks it up


def _uses_attention_functions(cls: type[nn.Module]) -> bool:
    if cls not in _LOOKS_UP:
        try:
            _LOOKS_UP[cls] = "ALL_ATTENTION_FUNCTIONS" in inspect.getsource(cls.forward)
        except (OSError, TypeError):
            _LOOKS_UP[cls] = False
    return _LOOKS_UP[cls]


def is_attention(module: nn.Module) -> bool:
    """A transformers attention module that looks its attention function up by name."""
    config = getattr(module, "config", None)
    return hasattr(config, "_attn_implementation") and _uses_attention_functions(type(module))


def attention_modules(model: nn.Module) -> list[str]:
    """The qualified names of the model's attention modules (see `is_attention`)."""
    return [name for name, module in model.named_modules() if is_attention(module)]


def check_selection(model: nn.Module, modules: dict[str, nn.Module], kinds: Sequence[str]) -> None:
    """Attention kinds asked for a selection that holds no attention module: one line."""
    if any(kind in ATTENTION_KINDS for kind in kinds) and not any(
        is_attention(m) for m in modules.values()
    ):
        raise _none_selected(model, list(modules), kinds)


class AttentionTap:
    """While active (`with`), each attention module of `modules` reports its `kinds` (by
    module name) to `seen`; `tokens`: patterns and scores come as `[B, T, heads, T]` (a row
    per query token); `repeat_kv_heads`: keys and values of grouped-query attention come
    with a head per query head."""

    def __init__(
        self,
        modules: Mapping[str, nn.Module],
        kinds: Mapping[str, Sequence[str]],
        seen: AttentionSeen,
        tokens: bool = False,
        repeat_kv_heads: bool = False,
    ) -> None:
        self._modules = {n: m for n, m in modules.items() if kinds.get(n) and is_attention(m)}
        self._kinds = {name: tuple(kinds[name]) for name in self._modules}
        self._seen = seen
        self._tokens = tokens
        self.repeat_kv_heads = repeat_kv_heads
        self._configs: dict[int, Any] = {}
        # `q_pre_rope`, `k_pre_rope`: each module's rotary embedding, taken by a pre-hook
        self._rotary: dict[int, Any] = {}
        self._handles: list[Any] = []

    def __enter__(self) -> AttentionTap:
        _register()
        try:
            for name, module in self._modules.items():
                _SELECTED[id(module)] = (name, self)
                config: Any = module.config
                if id(config) not in self._configs:
                    self._configs[id(config)] = config
                    _ORIGINAL[id(config)] = config._attn_implementation
                    config._attn_implementation = NAME
                if {"q_pre_rope", "k_pre_rope"} & set(self._kinds[name]):
                    self._handles.append(
                        module.register_forward_pre_hook(self._take_rotary, with_kwargs=True)
                    )
        except BaseException:
            self.__exit__()
            raise
        return self

    def _take_rotary(self, module: nn.Module, args: Any, kwargs: dict[str, Any]) -> None:
        self._rotary[id(module)] = kwargs.get("position_embeddings")

    def rotary(self, module: nn.Module) -> Any:
        """The module's rotary embedding (cos, sin) in this forward, or None."""
        return self._rotary.get(id(module))

    def __exit__(self, *exc: object) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles.clear()
        self._rotary.clear()
        for module in self._modules.values():
            _SELECTED.pop(id(module), None)
        for key, config in self._configs.items():
            config._attn_implementation = _ORIGINAL.pop(key)
        self._configs.clear()

    def report(self, name: str, values: dict[str, Callable[[], torch.Tensor]]) -> None:
        """Hand over the kinds asked for (`values`: how to make each)."""
        for kind in self._kinds[name]:
            value = values[kind]()
            if kind in ("pattern", "scores") and self._tokens:
                value = value.transpose(1, 2)
            self._seen(name, kind, value)


@functools.cache
def _register() -> None:
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS

    AttentionInterface.register(NAME, _attention)
    # the masks are made for the implementation the model had (see `_mask`)
    ALL_MASK_ATTENTION_FUNCTIONS.register(NAME, _mask_as_before)


def _mask_as_before(*args: Any, **kwargs: Any) -> Any:
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS

    config = kwargs.get("config")
    before = _ORIGINAL.get(id(config), "sdpa") if config is not None else "sdpa"
    return ALL_MASK_ATTENTION_FUNCTIONS[before](*args, **kwargs)


def _eager(module: nn.Module) -> Callable[..., Any]:
    function: Callable[..., Any] = sys.modules[type(module).__module__].eager_attention_forward
    return function


def _attention(
    module: nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    **kwargs: Any,
) -> Any:
    selected = _SELECTED.get(id(module))
    if selected is None:  # a layer not selected: the implementation the model had
        before = _ORIGINAL.get(id(getattr(module, "config", None)), "sdpa")
        from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

        function = _eager(module) if before == "eager" else ALL_ATTENTION_FUNCTIONS[before]
        return function(module, query, key, value, attention_mask, **kwargs)
    name, tap = selected
    weighs = _ORIGINAL.get(id(getattr(module, "config", None))) == "eager"
    mask = _additive(module, query, key, attention_mask)
    output, pattern = _eager(module)(module, query, key, value, mask, **kwargs)
    unturned = functools.cache(lambda: unrotated(name, module, query, key, tap.rotary(module)))
    heads = query.shape[1] if tap.repeat_kv_heads else key.shape[1]
    tap.report(
        name,
        {
            "pattern": lambda: pattern,
            "scores": lambda: _scores(
                query, key, mask, kwargs.get("scaling"), kwargs.get("softcap")
            ),
            "q": lambda: query.transpose(1, 2),
            "k": lambda: _repeated(key, heads).transpose(1, 2),
            "v": lambda: _repeated(value, heads).transpose(1, 2),
            "z": lambda: output,
            "q_pre_rope": lambda: unturned()[0].transpose(1, 2),
            "k_pre_rope": lambda: _repeated(unturned()[1], heads).transpose(1, 2),
        },
    )
    # the weights go on only where the model's own implementation hands them on (eager;
    # sdpa and flash give None): its output is what it would be without the tap
    return output, pattern if weighs else None


def _scores(
    query: torch.Tensor,
    key: torch.Tensor,
    mask: torch.Tensor | None,
    scaling: float | None,
    softcap: float | None = None,
) -> torch.Tensor:
    """The scores the softmax takes: q·kᵀ (keys repeated for grouped-query heads), scaled,
    soft-capped where the model caps its attention logits (Gemma 2: cap * tanh(s / cap), as
    its eager attention does) and masked; made only when asked for."""
    keys = _repeated(key, query.shape[1])
    scores = torch.matmul(query, keys.transpose(2, 3)) * (scaling or query.shape[-1] ** -0.5)
    if softcap:
        scores = torch.tanh(scores / softcap) * softcap
    return scores if mask is None else scores + mask[:, :, :, : keys.shape[-2]]


def _repeated(states: torch.Tensor, heads: int) -> torch.Tensor:
    """`[B, kv_heads, T, D]` keys or values with each head repeated for the `heads` query
    heads that share it (transformers' `repeat_kv`: query head h reads key head
    h // (heads // kv_heads))."""
    groups = heads // states.shape[1]
    return states.repeat_interleave(groups, dim=1) if groups > 1 else states


def _additive(
    module: nn.Module, query: torch.Tensor, key: torch.Tensor, mask: torch.Tensor | None
) -> torch.Tensor | None:
    """The mask the model made for its usual implementation, as eager attention takes it:
    added to the scores (a boolean one: 0 where attended, the lowest value elsewhere; none,
    for a causal module: causal)."""
    lowest = torch.finfo(query.dtype).min
    if mask is None:
        queries, keys = query.shape[2], key.shape[2]
        if not getattr(module, "is_causal", True) or queries == 1:
            return None
        hidden = torch.ones(queries, keys, dtype=torch.bool, device=query.device)
        hidden = hidden.triu(keys - queries + 1)
        return torch.zeros(hidden.shape, dtype=query.dtype, device=query.device).masked_fill(
            hidden, lowest
        )[None, None]
    if mask.dtype == torch.bool:
        return torch.zeros(mask.shape, dtype=query.dtype, device=mask.device).masked_fill(
            ~mask, lowest
        )
    return mask


def _none_selected(model: nn.Module, selected: list[str], kinds: Sequence[str]) -> HookdumpError:
    what = f"{opt('capture')} {','.join(k for k in kinds if k in ATTENTION_KINDS)}"
    found = attention_modules(model)
    if not found:
        return HookdumpError(
            f"{what} needs the attention modules of a transformers model (an hf: model, or one "
            "whose attention goes through transformers' attention functions); this model has "
            "none"
        )
    near = (nearest(selected[0], found, 3) if selected else []) or found[:3]
    return HookdumpError(
        f"{what} applies to attention modules, and the selection holds none; the nearest: "
        f"{', '.join(near)} (select them with {opt('layers')})"
    )
