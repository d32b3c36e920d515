"""Reading dumps: `hookdump.load(DIR)` gives every key's rows across shards, in sample order."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import safetensors
import torch
from safetensors import safe_open

from hookdump.capturing import parse_key
from hookdump.dump_writer import FORMAT, MANIFEST
from hookdump.errors import HookdumpError, did_you_mean


class Dump:
    """A dump on disk, read lazily: only the shards a key needs are opened."""

    def __init__(self, path: str | Path) -> None:
        path = Path(path)
        if path.is_file() and path.suffix == ".safetensors":
            self.path = path.parent
            self.manifest: dict[str, Any] = _manifest_of_file(path)
            return
        self.path = path
        manifest_path = path / MANIFEST
        if not path.exists():
            raise HookdumpError(f"{path} does not exist; give a dump folder or a .safetensors file")
        if not path.is_dir():
            raise HookdumpError(f"{path} is not a dump folder or a .safetensors file")
        if not manifest_path.is_file():
            raise HookdumpError(
                f"{path} has no {MANIFEST}: not a dump, or its run stopped before its first shard"
            )
        try:
            self.manifest = json.loads(manifest_path.read_text())
        except (OSError, ValueError) as exc:
            raise HookdumpError(f"{manifest_path} is not readable JSON: {exc}") from None
        if self.manifest.get("format") != FORMAT:
            raise HookdumpError(
                f"{manifest_path} has format {self.manifest.get('format')!r}; this hookdump "
                f"reads {FORMAT!r}"
            )

    @classmethod
    def of_manifest(cls, folder: Path, manifest: dict[str, Any]) -> Dump:
        """The dump in `folder` as `manifest` describes it (a torchrun rank's own part)."""
        dump = cls.__new__(cls)
        dump.path, dump.manifest = folder, manifest
        return dump

    @property
    def complete(self) -> bool:
        return bool(self.manifest.get("complete"))

    @property
    def num_samples(self) -> int:
        return int(self.manifest["num_samples"])

    @property
    def tensors(self) -> dict[str, dict[str, Any]]:
        """Per-key metadata from the manifest (module, kind, call, per-sample shape, dtype)."""
        return self.manifest["tensors"]

    def keys(self) -> list[str]:
        """The keys in forward order."""
        return list(self.tensors)

    def __contains__(self, key: object) -> bool:
        return key in self.tensors

    def __iter__(self) -> Iterator[str]:
        return iter(self.tensors)

    def __len__(self) -> int:
        return len(self.tensors)

    def __getitem__(self, key: str) -> torch.Tensor:
        """All samples of `key`, in order, as one tensor `[num_samples, *shape]`."""
        if key not in self.tensors:
            raise KeyError(f"{key!r} is not in {self.path}{did_you_mean(key, self.tensors)}")
        parts = [shard[key] for shard in self.iter_shards(keys=[key])]
        return parts[0] if len(parts) == 1 else torch.cat(parts)

    def row(self, key: str, index: int) -> torch.Tensor:
        """Sample `index` of `key`, read from the one shard that holds it."""
        if key not in self.tensors:
            raise KeyError(f"{key!r} is not in {self.path}{did_you_mean(key, self.tensors)}")
        for shard in self.shards:
            if shard["start"] <= index < shard["stop"]:
                with safe_open(str(self.path / shard["file"]), framework="pt") as f:
                    return f.get_slice(key)[index - shard["start"]]
        raise IndexError(f"sample {index} is not in {self.path} ({self.num_samples} samples)")

    @property
    def shards(self) -> list[dict[str, Any]]:
        """The shard files with their `start`/`stop` rows, in sample order."""
        return self.manifest["shards"]

    def iter_shards(self, keys: list[str] | None = None) -> Iterator[dict[str, torch.Tensor]]:
        """Each shard's tensors (or only `keys`), in sample order."""
        for shard in self.shards:
            path = self.path / shard["file"]
            try:
                with safe_open(str(path), framework="pt") as f:
                    tensors = {k: f.get_tensor(k) for k in (keys or self.keys())}
            except (OSError, safetensors.SafetensorError) as exc:
                raise HookdumpError(f"cannot read shard {path}: {exc}") from None
            yield tensors

    def __repr__(self) -> str:
        state = "" if self.complete else ", incomplete"
        return f"Dump({str(self.path)!r}, {len(self)} keys, {self.num_samples} samples{state})"


def load(path: str | Path) -> Dump:
    """Open a dump folder or one .safetensors file (metadata now, tensors when asked for)."""
    return Dump(path)


def _manifest_of_file(path: Path) -> dict[str, Any]:
    """A manifest for a lone safetensors file: keys parsed, rows from dim 0."""
    try:
        with safe_open(str(path), framework="pt") as f:
            meta = f.metadata() or {}
            shapes = {k: f.get_slice(k).get_shape() for k in f.keys()}  # noqa: SIM118
            dtypes = {k: f.get_slice(k).get_dtype() for k in f.keys()}  # noqa: SIM118
    except (OSError, safetensors.SafetensorError) as exc:
        raise HookdumpError(f"cannot read {path} as safetensors: {exc}") from None
    rows = {shape[0] if shape else 0 for shape in shapes.values()}
    start = int(meta.get("start", 0))
    num_rows = max(rows, default=0)
    tensors = {}
    for key, shape in shapes.items():
        module, kind, part, call = parse_key(key)
        tensors[key] = {
            "module": module,
            "module_type": None,
            "kind": kind,
            "call": call,
            "part": part,
            "shape": list(shape[1:]),
            "dtype": _DTYPES.get(dtypes[key], dtypes[key].lower()),
        }
    return {
        "format": FORMAT,
        "complete": True,
        "num_samples": num_rows,
        "tensors": tensors,
        "shards": [{"file": path.name, "start": start, "stop": start + num_rows}],
    }


_DTYPES = {"F64": "float64", "F32": "float32", "F16": "float16", "BF16": "bfloat16",
           "I64": "int64", "I32": "int32", "I16": "int16", "I8": "int8", "U8": "uint8",
           "BOOL": "bool"}  # fmt: skip
