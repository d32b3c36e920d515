"""A folder of per-sample safetensors written by hand (`hookdump import files`): each file one
sample, named for it, read and checked before a value of it is kept.

`--key NAME=KEY` names the file's tensor KEY as the dump's key NAME. With token ids (the
file's tensor mapped to `__token_ids__`, or a `--tokens` file: a JSON line `{"id",
"token_ids"}` per sample), each tensor is `[tokens, ...]` and its rows are token rows;
without, each tensor is the sample's one value.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import torch

from hookdump.errors import HookdumpError, opt, printable
from hookdump.format.dtypes import dtype_name
from hookdump.inputs.engine_files import BadEngineFile, checked_ids, load_tensors, request_id
from hookdump.inputs.finite import first_nonfinite

TOKEN_IDS = "__token_ids__"
SUFFIXES = (".safetensors",)
MAX_TOKENS_BYTES = 16 << 30  # a --tokens file: refused beyond
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*|[0-9]+")


@dataclass(frozen=True)
class Sample:
    """One file's sample: its id (the file's name), token ids (None: one value a key, not
    token rows) and values, in the order of the keys."""

    id: str
    path: Path
    token_ids: torch.Tensor | None
    tensors: tuple[torch.Tensor, ...]

    def values(self) -> list[torch.Tensor]:
        return list(self.tensors)


@dataclass(frozen=True)
class Keys:
    """`--key NAME=KEY`, checked: the dump's names in order, each file's tensor for it, and
    the tensor of token ids, if one is named."""

    names: tuple[str, ...]
    tensors: tuple[str, ...]
    token_ids: str | None = None

    @classmethod
    def parse(cls, pairs: list[str]) -> Keys:
        if not pairs:
            raise HookdumpError(
                f"say which tensors to import: {opt('key_map')} NAME=KEY, for each (the dump's key "
                f"NAME from the file's tensor KEY; {TOKEN_IDS}=KEY for its token ids)"
            )
        mapped: dict[str, str] = {}
        for pair in pairs:
            name, sep, key = pair.partition("=")
            name, key = name.strip(), key.strip()
            if not sep or not name or not key or name in mapped:
                raise HookdumpError(
                    f"{opt('key_map')} {printable(pair)!r} is not NAME=KEY of a new NAME; give one "
                    "per key, as blocks.3.hook_resid_post=layer3"
                )
            if name != TOKEN_IDS and not all(_NAME.fullmatch(p) for p in name.split(".")):
                raise HookdumpError(
                    f"{opt('key_map')} {printable(name)!r} is not a key's name: dotted words of "
                    "letters, digits and underscores, as blocks.3.hook_resid_post"
                )
            mapped[name] = key
        ids = mapped.pop(TOKEN_IDS, None)
        if not mapped:
            raise HookdumpError(f"{opt('key_map')} names only {TOKEN_IDS}: name a value too")
        return cls(tuple(mapped), tuple(mapped.values()), ids)


def read_tokens(path: Path) -> dict[str, torch.Tensor]:
    """A `--tokens` file: one JSON object a line, `{"id": ..., "token_ids": [...]}`; a line
    of any other shape is one error naming it."""
    where = printable(str(path))
    try:
        if path.stat().st_size > MAX_TOKENS_BYTES:
            raise HookdumpError(
                f"{opt('tokens')} {where} holds more than {MAX_TOKENS_BYTES:,} bytes"
            )
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise HookdumpError(f"cannot read {opt('tokens')} {where}: {exc}") from None
    found: dict[str, torch.Tensor] = {}
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            entry = json.loads(line)
            sample, ids = str(entry["id"]), entry["token_ids"]
            if not isinstance(ids, list) or not all(
                isinstance(i, int) and not isinstance(i, bool) and 0 <= i < 1 << 62 for i in ids
            ):
                raise ValueError("token_ids is not a list of token ids")
        except (ValueError, KeyError, TypeError) as exc:
            raise HookdumpError(
                f"{opt('tokens')} {where} line {number} is not "
                f'{{"id": ..., "token_ids": [...]}} ({printable(str(exc))[:80]})'
            ) from None
        found[sample] = torch.tensor(ids, dtype=torch.int64)
    return found


def read_sample(path: Path, keys: Keys, tokens: Mapping[str, torch.Tensor] | None) -> Sample:
    """One file's sample, checked: every tensor named, as many rows as tokens where there
    are token ids, every float finite."""
    where, sample = printable(str(path)), request_id(path)
    held = load_tensors(path, where)
    wanted = [*keys.tensors, *([keys.token_ids] if keys.token_ids else [])]
    missing = [key for key in wanted if key not in held]
    if missing:
        raise BadEngineFile(
            where, f" holds {', '.join(sorted(held)) or 'nothing'}, not {', '.join(missing)}"
        )
    ids = held[keys.token_ids] if keys.token_ids else _tokens_of(sample, tokens, where)
    values = tuple(held[key] for key in keys.tensors)
    if ids is not None:
        ids = checked_ids(ids, where, keys.token_ids or "its token ids")
        _rows_are_tokens(where, ids, values, keys)
    for name, value in zip(keys.names, values, strict=True):
        at = first_nonfinite(value) if value.is_floating_point() else -1
        if at >= 0:
            row = at // max(1, value[0].numel()) if value.dim() else 0
            raise BadEngineFile(where, f": {name}'s row {row} is not finite (NaN or infinity)")
    return Sample(sample, path, None if ids is None else ids.to(torch.int64), values)


def _tokens_of(
    sample: str, tokens: Mapping[str, torch.Tensor] | None, where: str
) -> torch.Tensor | None:
    if tokens is None:
        return None
    if sample not in tokens:
        raise BadEngineFile(where, f" is sample {sample!r}, which {opt('tokens')} does not list")
    return tokens[sample]


def _rows_are_tokens(
    where: str, ids: torch.Tensor, values: tuple[torch.Tensor, ...], keys: Keys
) -> None:
    for name, value in zip(keys.names, values, strict=True):
        if value.dim() == 0 or len(value) != len(ids):
            rows = len(value) if value.dim() else 0
            raise BadEngineFile(
                where,
                f" holds {rows} rows of {name} for {len(ids)} tokens: every token has one row",
            )


@dataclass
class SampleLayout:
    """Each key's row shape and dtype as the first file holds them (`names`: the keys):
    every file alike."""

    names: tuple[str, ...]
    first: list[tuple[torch.dtype, tuple[int, ...]]] | None = field(default=None)

    def check(self, sample: Sample) -> None:
        rows = sample.token_ids is not None
        held = [(v.dtype, tuple(v.shape[1:] if rows else v.shape)) for v in sample.tensors]
        if self.first is None:
            self.first = held
            return
        for name, now, then in zip(self.names, held, self.first, strict=True):
            if now != then:
                hint = (
                    ""
                    if rows
                    else f"; to import rows of any number, give the token ids ({opt('key_map')} "
                    f"{TOKEN_IDS}=KEY or {opt('tokens')} FILE)"
                )
                unit = " a row" if rows else ""
                raise BadEngineFile(
                    printable(str(sample.path)),
                    f" holds {name} of {dtype_name(now[0])} {list(now[1])}{unit} where the "
                    f"files before it hold {dtype_name(then[0])} {list(then[1])}{hint}",
                )
