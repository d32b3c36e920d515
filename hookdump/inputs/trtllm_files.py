"""TensorRT-LLM's hidden states, several requests to a file, read and checked row by row.

The `SaveHiddenStates` speculative decoding mode (read from
`tensorrt_llm/_torch/speculative/save_hidden_state.py`) writes `{file_prefix}_{iter}.pt`
with `torch.save` every `write_interval` requests: a list of dicts, one per request, of `id`
(the engine's count of requests, from 1), `input_ids` `[tokens]` (int64), `hidden_state`
`[tokens, hidden]`, the last layer of `layers_to_capture`, and, with more than one layer,
`aux_hidden_states`, the other layers side by side in their order (`[tokens, hidden *
(layers - 1)]`; all of them, the last too, where the user asked for layer -1 as well:
`hidden * layers`). `layers_to_capture` is sorted with -1 (the last layer's state after the
final norm) moved to the end; layer N's value is `hidden_states + residual` after decoder
layer N, the residual stream leaving it. Read with `torch.load(weights_only=True)`: no code
in a file runs, and a file is mapped, not read whole.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from hookdump.errors import HookdumpError, opt, printable
from hookdump.format.dtypes import dtype_name
from hookdump.inputs.engine_files import BadEngineFile, Request, checked_request, checked_size

SUFFIXES = (".pt",)


def read_requests(path: Path, layers: int) -> list[Request]:
    """The requests of one `.pt` file, each checked: `layers` of the hidden state rows."""
    where = printable(str(path))
    checked_size(path, where)
    try:
        saved = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except Exception as exc:  # the loader's: RuntimeError, UnpicklingError, OSError (a cut map)
        first = str(exc).strip().splitlines()[0][:160] if str(exc).strip() else type(exc).__name__
        raise BadEngineFile(where, f" is not a whole torch.save file ({first})") from None
    if not isinstance(saved, list) or not all(isinstance(entry, dict) for entry in saved):
        raise BadEngineFile(
            where,
            f" holds a {type(saved).__name__}, not the list of requests SaveHiddenStates saves",
        )
    prefix = path.name.removesuffix(".pt").rpartition("_")[0] or path.name.removesuffix(".pt")
    return [_request(entry, path, where, prefix, layers) for entry in saved]


def _request(entry: dict[str, Any], path: Path, where: str, prefix: str, layers: int) -> Request:
    number = entry.get("id")
    if not isinstance(number, int) or isinstance(number, bool):
        raise BadEngineFile(where, f" holds a request whose id is {type(number).__name__}, not int")
    at = f"{where} (request {number})"
    ids, last, aux = (
        entry.get("input_ids"),
        entry.get("hidden_state"),
        entry.get("aux_hidden_states"),
    )
    if not isinstance(last, torch.Tensor):
        raise BadEngineFile(at, " holds no hidden_state tensor")
    if last.dim() != 2 or not last.is_floating_point() or last.shape[1] == 0:
        raise BadEngineFile(
            at,
            f": hidden_state is {dtype_name(last.dtype)} {list(last.shape)}, not floats "
            "[tokens, hidden]",
        )
    rows, width = last.shape
    side = 0 if aux is None else _side_by_side(aux, last, at)
    if aux is not None and side == layers and torch.equal(aux[:, -width:], last):
        hidden = aux.reshape(rows, layers, width)  # the last layer in aux too (-1 asked for)
    elif side + 1 == layers:
        hidden = last[:, None]
        if aux is not None and side:
            hidden = torch.cat([aux.reshape(rows, side, width), hidden], dim=1)
    else:
        raise HookdumpError(
            f"{at} holds {side + 1} layers, and {opt('layer_ids')} names {layers}: give the ids "
            "of every layer it captured (layers_to_capture, -1 last)"
        )
    return checked_request(f"{prefix}-{number}", path, at, ids, hidden, "input_ids")


def _side_by_side(aux: Any, last: torch.Tensor, at: str) -> int:
    """How many layers `aux_hidden_states` holds side by side, each as wide as `last`."""
    if (
        not isinstance(aux, torch.Tensor)
        or aux.dim() != 2
        or aux.dtype != last.dtype
        or len(aux) != len(last)
        or aux.shape[1] % last.shape[1]
    ):
        shape = list(aux.shape) if isinstance(aux, torch.Tensor) else type(aux).__name__
        raise BadEngineFile(
            at,
            f": aux_hidden_states is {shape}, not [{len(last)}, {last.shape[1]} * layers] of "
            f"{dtype_name(last.dtype)} beside hidden_state",
        )
    return aux.shape[1] // last.shape[1]
