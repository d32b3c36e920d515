"""Reading dumps: `hookdump.load(DIR)` gives every key's rows across shards, in sample order."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open

from hookdump.dump_writer import FORMAT, MANIFEST
from hookdump.errors import HookdumpError, did_you_mean


class Dump:
    """A dump on disk, read lazily: only the shards a key needs are opened."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        manifest_path = self.path / MANIFEST
        if not self.path.is_dir():
            raise HookdumpError(f"{self.path} is not a folder; give the dump's folder")
        if not manifest_path.is_file():
            raise HookdumpError(
                f"{self.path} has no {MANIFEST}: not a dump, or its run did not finish"
            )
        try:
            self.manifest: dict[str, Any] = json.loads(manifest_path.read_text())
        except (OSError, ValueError) as exc:
            raise HookdumpError(f"{manifest_path} is not readable JSON: {exc}") from None
        if self.manifest.get("format") != FORMAT:
            raise HookdumpError(
                f"{manifest_path} has format {self.manifest.get('format')!r}; this hookdump "
                f"reads {FORMAT!r}"
            )

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

    def iter_shards(self, keys: list[str] | None = None) -> Iterator[dict[str, torch.Tensor]]:
        """Each shard's tensors (or only `keys`), in sample order."""
        for shard in self.manifest["shards"]:
            with safe_open(str(self.path / shard["file"]), framework="pt") as f:
                yield {k: f.get_tensor(k) for k in (keys or self.keys())}

    def __repr__(self) -> str:
        state = "" if self.complete else ", incomplete"
        return f"Dump({str(self.path)!r}, {len(self)} keys, {self.num_samples} samples{state})"


def load(path: str | Path) -> Dump:
    """Open the dump in folder `path` (its manifest is read now, tensors when asked for)."""
    return Dump(path)
