"""Writing dumps: safetensors shards, then `manifest.json`, each file replaced atomically."""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file

from hookdump.capturing import KeyInfo
from hookdump.errors import HookdumpError

FORMAT = "hookdump/1"
MANIFEST = "manifest.json"
DEFAULT_SHARD_BYTES = 1 << 30


def _default_file_mode() -> int:
    umask = os.umask(0)  # reading the umask means setting it; put it straight back
    os.umask(umask)
    return 0o666 & ~umask


_FILE_MODE = _default_file_mode()
_DUMP_FILE = re.compile(r"^(manifest\.json|shard-\d+\.safetensors)(\.tmp)?$")


def dtype_name(dtype: torch.dtype) -> str:
    """`torch.float32` -> `float32`."""
    return str(dtype).removeprefix("torch.")


def check_out_dir(out: Path, overwrite: bool) -> None:
    """Refuse an `--out` that cannot take a dump; touches nothing."""
    if out.exists() and not out.is_dir():
        raise HookdumpError(f"--out {out} is a file; give a folder (new or empty)")
    if not out.is_dir():
        return
    present = sorted(p.name for p in out.iterdir())
    if not present:
        return
    if not overwrite:
        raise HookdumpError(
            f"--out {out} exists and is not empty; pass --overwrite to replace the dump in "
            "it, or choose another folder"
        )
    foreign = [name for name in present if not _DUMP_FILE.match(name)]
    if foreign:
        raise HookdumpError(
            f"--out {out} holds files that are not part of a hookdump dump "
            f"({', '.join(foreign[:3])}{', ...' if len(foreign) > 3 else ''}); --overwrite "
            "only replaces dumps, so choose another folder"
        )


def write_json(path: Path, data: Mapping[str, Any]) -> None:
    """Write JSON through a temporary file, so a reader never sees half of it."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data, indent=2) + "\n")
    os.replace(tmp, path)


class DumpWriter:
    """Collects batches of captured tensors and writes them as shards of about `shard_bytes`.

    The folder is prepared (an old dump removed, with `overwrite`) only when the first shard
    is written, so a run that fails before its first batch leaves `out` as it was.
    """

    def __init__(
        self,
        out: Path,
        overwrite: bool = False,
        shard_bytes: int = DEFAULT_SHARD_BYTES,
    ) -> None:
        check_out_dir(out, overwrite)
        self.out = out
        self.overwrite = overwrite
        self.shard_bytes = shard_bytes
        self.tensors: dict[str, dict[str, Any]] = {}
        self.shards: list[dict[str, Any]] = []
        self.fields: dict[str, Any] = {}  # the rest of the manifest: model, command, versions
        self.num_samples = 0
        self._pending: list[dict[str, torch.Tensor]] = []
        self._pending_bytes = 0
        self._pending_start = 0
        self._prepared = False

    def add(
        self, tensors: dict[str, torch.Tensor], start: int, stop: int, info: Mapping[str, KeyInfo]
    ) -> None:
        """Queue rows `start:stop` of every key; writes a shard once enough is queued."""
        if start != self.num_samples:
            raise ValueError(f"batches out of order: expected row {self.num_samples}, got {start}")
        self._check_keys(tensors, start, info)
        if not self._pending:
            self._pending_start = start
        self._pending.append(tensors)
        self._pending_bytes += sum(t.numel() * t.element_size() for t in tensors.values())
        self.num_samples = stop
        if self._pending_bytes >= self.shard_bytes:
            self.flush()

    def _check_keys(
        self, tensors: dict[str, torch.Tensor], start: int, info: Mapping[str, KeyInfo]
    ) -> None:
        if not self.tensors:
            for key, tensor in tensors.items():
                meta = info[key]
                self.tensors[key] = {
                    "module": meta.module,
                    "module_type": meta.module_type,
                    "kind": meta.kind,
                    "call": meta.call,
                    "part": meta.part,
                    "shape": list(tensor.shape[1:]),
                    "dtype": dtype_name(tensor.dtype),
                }
            return
        if tensors.keys() != self.tensors.keys():
            missing = sorted(self.tensors.keys() - tensors.keys())
            extra = sorted(tensors.keys() - self.tensors.keys())
            raise HookdumpError(
                f"the keys changed at sample {start} (missing: {missing[:3]}, new: {extra[:3]}): "
                "the model's control flow depends on its input; --exclude those modules"
            )
        for key, tensor in tensors.items():
            if list(tensor.shape[1:]) != self.tensors[key]["shape"]:
                raise HookdumpError(
                    f"{key!r} changed its per-sample shape from {self.tensors[key]['shape']} to "
                    f"{list(tensor.shape[1:])} at sample {start}; --exclude that module"
                )

    def flush(self) -> None:
        """Write what is queued as one shard, then a manifest marked incomplete."""
        if not self._pending:
            return
        self._prepare()
        batches, self._pending, self._pending_bytes = self._pending, [], 0
        keys = batches[0].keys()
        if len(batches) == 1:
            merged = {k: t.contiguous() for k, t in batches[0].items()}
        else:
            merged = {k: torch.cat([b[k] for b in batches]) for k in keys}
        start, stop = self._pending_start, self.num_samples
        name = f"shard-{len(self.shards):05d}.safetensors"
        path = self.out / name
        tmp = path.with_name(name + ".tmp")
        meta = {"format": FORMAT, "start": str(start), "stop": str(stop)}
        try:
            save_file(merged, str(tmp), metadata=meta)
            os.chmod(
                tmp, _FILE_MODE
            )  # safetensors creates 0600; a dump is as shareable as any file
            os.replace(tmp, path)
        except OSError as exc:
            tmp.unlink(missing_ok=True)
            raise HookdumpError(f"writing {path} failed: {exc.strerror or exc}") from None
        self.shards.append({"file": name, "start": start, "stop": stop})
        self.write_manifest(complete=False)

    def _prepare(self) -> None:
        if self._prepared:
            return
        check_out_dir(self.out, self.overwrite)  # again: the folder may have changed meanwhile
        self.out.mkdir(parents=True, exist_ok=True)
        # the manifest goes first, so a half-removed dump never reads as complete
        (self.out / MANIFEST).unlink(missing_ok=True)
        for old in sorted(self.out.iterdir()):
            old.unlink()
        self._prepared = True

    def manifest(self, complete: bool) -> dict[str, Any]:
        """The manifest for what has been written so far."""
        return {
            "format": FORMAT,
            "complete": complete,
            "num_samples": self.shards[-1]["stop"] if self.shards else 0,
            **self.fields,
            "tensors": self.tensors,
            "shards": self.shards,
        }

    def write_manifest(self, complete: bool) -> dict[str, Any]:
        """Write `manifest.json` (after every shard it lists is on disk) and return it.

        Incomplete manifests (`complete: false`) list the shards finished so far.
        """
        self._prepare()
        manifest = self.manifest(complete)
        write_json(self.out / MANIFEST, manifest)
        return manifest

    def finish(self) -> dict[str, Any]:
        """Write the last shard, then the complete manifest."""
        self.flush()
        return self.write_manifest(complete=True)


_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]?i?b?)?\s*$", re.IGNORECASE)
_UNITS = {"": 1, "k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12}


def parse_size(text: str) -> int:
    """'2GB' -> 2e9 bytes, '512MiB' -> 512 * 2**20, '1000' -> 1000."""
    match = _SIZE.match(text)
    if not match:
        raise HookdumpError(f"--shard-size {text!r} is not a size; write e.g. 2GB or 512MiB")
    number, unit = float(match.group(1)), (match.group(2) or "").lower()
    prefix = unit[:1] if unit[:1] in "kmgt" else ""
    scale = 1024 ** "kmgt".index(prefix) * 1024 if "i" in unit and prefix else _UNITS[prefix]
    size = int(number * scale)
    if size < 1:
        raise HookdumpError(f"--shard-size {text!r} must be at least one byte")
    return size
