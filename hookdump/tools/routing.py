"""`hookdump export --to routing`: the experts each token was routed to, per sequence, as the
engines' routing replay takes them (SGLang's `return_routed_experts`, int32 `[tokens,
layers, top_k]`; TensorRT-LLM's `(seq_len - 1, num_moe_layers, top_k)`; tunix's `-1` for a
slot the trainer must not replay).

One safetensors file: `routed_experts`, int32 `[tokens, moe_layers, top_k]`, every
sequence's tokens one after another, token t of sequence i at row `offsets[i] + t` (its
position); `offsets`, int64 `[sequences + 1]`; the metadata names the MoE blocks in their
order (`layers`), the sequences (`sample_ids`) and `completion_only`. A slot is -1 where no
expert is to be replayed: a position the dump holds no row of, and, with
`completion_only`, the prompt's tokens.
"""

from __future__ import annotations

import json
import os
import uuid
from fnmatch import fnmatchcase
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import save_file

from hookdump.errors import HookdumpError, opt, printable
from hookdump.format.keys import POSITION, RESPONSE, SAMPLE
from hookdump.store.read.dump import Dump
from hookdump.tools.experts import checked_ids, experts_of

FORMAT = "hookdump-routing"
CHOSEN = ":topk_ids"  # a MoE block's chosen experts, per token: `M:topk_ids` [rows, top_k]


def routing_keys(dump: Dump, patterns: list[str]) -> list[str]:
    """The chosen-experts keys of `dump` (those `patterns` pick, if any), in forward order."""
    found = [key for key in dump if key.endswith(CHOSEN)]
    if patterns:
        found = [key for key in found if any(fnmatchcase(key, p) for p in patterns)]
    if not found:
        raise HookdumpError(
            f"{dump.path} holds no chosen experts{' of ' + opt('keys') if patterns else ''} "
            f"(keys M{CHOSEN}); dump the MoE blocks with {opt('capture')} routing and "
            f"{opt('per_token', True)}"
        )
    return found


def routed_experts(
    dump: Dump, keys: list[str], completion_only: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """`routed_experts` `[tokens, len(keys), top_k]` and `offsets` `[sequences + 1]` of a
    token-row dump, -1 where a slot is not to be replayed."""
    if not dump.manifest.token_rows or SAMPLE not in dump or POSITION not in dump:
        raise HookdumpError(
            f"{dump.path} does not hold token rows; routing is exported per token: dump with "
            f"{opt('per_token', True)}"
        )
    widths = {tuple(dump.manifest.tensors[key]["shape"]) for key in keys}
    if len(widths) != 1 or len(next(iter(widths))) != 1:
        raise HookdumpError(
            f"the MoE blocks of {dump.path} choose different numbers of experts "
            f"({', '.join(str(list(w)) for w in sorted(widths))}); export them apart with "
            f"{opt('keys')}"
        )
    sample, position = dump[SAMPLE].long(), dump[POSITION].long()
    sequences = max(dump.manifest.samples_fed, int(sample.max()) + 1 if len(sample) else 0)
    if len(sample) and (int(sample.min()) < 0 or int(position.min()) < 0):
        raise HookdumpError(f"{dump.path} holds a negative sample or position; it is damaged")
    lengths = torch.zeros(sequences, dtype=torch.long).scatter_reduce(
        0, sample, position + 1, "amax"
    )
    offsets = torch.cat([torch.zeros(1, dtype=torch.long), lengths.cumsum(0)])
    target = offsets[sample] + position
    replayed = torch.ones(len(sample), dtype=torch.bool)
    if completion_only:
        if RESPONSE not in dump:
            raise HookdumpError(
                f"{dump.path} does not mark which tokens are the completion ({RESPONSE}); "
                f"dump with {opt('generate')} or {opt('chat', True)}, or export without "
                f"{opt('completion_only', True)}"
            )
        replayed = dump[RESPONSE].bool()
    top_k = next(iter(widths))[0]
    routed = torch.full((int(offsets[-1]), len(keys), top_k), -1, dtype=torch.int32)
    for layer, key in enumerate(keys):
        chosen = checked_ids(dump[key], experts_of(dump, key), key, str(dump.path))
        routed[target[replayed], layer] = chosen[replayed].to(torch.int32)
    return routed, offsets


def write_routing(
    dump: Dump, out: Path, keys: list[str], completion_only: bool, overwrite: bool
) -> int:
    """Write the routing of `keys` to the file `out` (made whole beside it, then renamed
    into place; an existing one replaced only with `overwrite`, and only if it is an earlier
    routing export); the sequences written."""
    _check_out(out, overwrite)
    routed, offsets = routed_experts(dump, keys, completion_only)
    metadata = {
        "format": FORMAT,
        "dump": str(dump.path),
        "layers": json.dumps(keys),
        "sample_ids": json.dumps(dump.sample_ids),
        "completion_only": json.dumps(completion_only),
    }
    temp = out.parent / f".{out.name}.export-{uuid.uuid4().hex[:8]}"
    try:
        save_file({"routed_experts": routed, "offsets": offsets}, temp, metadata=metadata)
        os.replace(temp, out)
    except OSError as exc:
        temp.unlink(missing_ok=True)
        raise HookdumpError(
            f"writing the routing to {printable(str(out))} failed: {exc.strerror or exc}"
        ) from None
    except BaseException:
        temp.unlink(missing_ok=True)
        raise
    return len(offsets) - 1


def _check_out(out: Path, overwrite: bool) -> None:
    where = printable(str(out))
    if out.is_dir():
        raise HookdumpError(f"{opt('out')} {where} is a folder; routing is one file: name it")
    if not out.parent.is_dir():
        raise HookdumpError(f"{opt('out')} {where}: its folder does not exist; make it first")
    if not out.exists() and not out.is_symlink():
        return
    if not overwrite:
        raise HookdumpError(
            f"{opt('out')} {where} exists; {opt('overwrite', True)} replaces an earlier routing "
            "export"
        )
    if out.is_symlink() or not _is_routing(out):
        raise HookdumpError(
            f"{opt('out')} {where} is not an earlier routing export; it is left as it is: "
            "choose another name"
        )


def _is_routing(path: Path) -> bool:
    try:
        with safe_open(str(path), "pt") as file:
            return (file.metadata() or {}).get("format") == FORMAT
    except (SafetensorError, OSError, ValueError):
        return False
