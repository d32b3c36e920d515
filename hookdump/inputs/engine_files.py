"""Hidden states a serving engine wrote, one file per request, found, read and checked row by
row before a row of them is kept.

vLLM's hidden-states connectors (the `extract_hidden_states` speculative method; read from
`vllm/distributed/kv_transfer/kv_connector/v1/example_hidden_states_connector.py` and the
online connector's writer): one `<request id>.safetensors` per request, under the storage
path or a folder of it (`base/`, one per LoRA adapter), zstd-compressed as
`.safetensors.zst` by the online connector, holding `hidden_states` `[tokens, layers,
hidden]` (the layers in the order of `eagle_aux_hidden_state_layer_ids`; layer N's is the
residual stream entering decoder layer N) and `token_ids` `[tokens]`. While the example
connector writes a file, it holds an exclusive `flock` on `<file>.lock`: such a file is
left for a later import, never read half-written.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load as load_safetensors
from safetensors.torch import load_file

from hookdump.errors import HookdumpError, opt, printable
from hookdump.format.dtypes import dtype_name
from hookdump.inputs.finite import first_nonfinite

SUFFIXES = (".safetensors", ".safetensors.zst")
_DIGITS = re.compile(r"(\d+)")
MAX_FILE_BYTES = 64 << 30  # one request's file, decompressed: refused beyond
CHUNK_BYTES = 64 << 20


class BadEngineFile(HookdumpError):
    """A file that is not what the engine writes, named with what is wrong."""

    def __init__(self, where: str, problem: str) -> None:
        super().__init__(f"{where}{problem}")
        self.problem = problem.removeprefix(":").strip()  # without the file's name


@dataclass(frozen=True)
class Request:
    """One request's rows: its id (the file's name), its token ids `[tokens]` and hidden
    states `[tokens, layers, hidden]`."""

    id: str
    path: Path
    token_ids: torch.Tensor
    hidden: torch.Tensor

    def values(self) -> list[torch.Tensor]:
        """Each layer's rows, `[tokens, hidden]`."""
        return list(self.hidden.unbind(1))


@dataclass
class Layout:
    """What every file of one import holds alike: layers, width, dtype (set by the first)."""

    layers: int | None = None
    width: int | None = None
    dtype: torch.dtype = torch.float32  # the first file's, once `layers` is set

    def check(self, request: Request) -> None:
        _, layers, width = request.hidden.shape
        if self.layers is None:
            self.layers, self.width, self.dtype = layers, width, request.hidden.dtype
            return
        where = printable(str(request.path))
        if layers != self.layers:
            raise BadEngineFile(
                where, f" holds {layers} layers where the files before it hold {self.layers}"
            )
        if width != self.width:
            raise BadEngineFile(
                where, f" holds rows {width} wide where the files before it hold {self.width}"
            )
        if request.hidden.dtype != self.dtype:
            raise BadEngineFile(
                where,
                f" holds {dtype_name(request.hidden.dtype)} where the files before it hold "
                f"{dtype_name(self.dtype)}",
            )


def request_files(source: Path, suffixes: tuple[str, ...] = SUFFIXES) -> list[Path]:
    """The files named `*<suffix>` under `source` (a folder, searched down; or one file),
    in the natural order of their paths (`data_2.pt` before `data_10.pt`)."""
    if source.is_file():
        return [source]
    if not source.is_dir():
        raise HookdumpError(f"{printable(str(source))} does not exist; give the engine's folder")
    found = [
        path
        for path in source.rglob("*")
        if path.name.endswith(suffixes) and not path.name.startswith(".") and path.is_file()
    ]
    return sorted(found, key=lambda p: _natural(p.relative_to(source).as_posix()))


def _natural(text: str) -> list[str | int]:
    """`text` with its runs of digits as numbers (a run falls at every odd place)."""
    return [int(part) if index % 2 else part for index, part in enumerate(_DIGITS.split(text))]


def request_id(path: Path) -> str:
    """The request a file holds: its name, less the suffix."""
    return path.name.removesuffix(".zst").removesuffix(".safetensors")


def will_need(path: Path) -> None:
    """Ask the kernel to read `path` ahead, while the files before it are checked and
    written (best effort: a file that cannot be opened is met when it is read)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_WILLNEED)
    except OSError:
        pass
    finally:
        os.close(fd)


def being_written(path: Path) -> bool:
    """Whether the engine is writing `path` now: another process holds the exclusive lock
    on its `.lock` companion (the example connector's)."""
    lock = path.with_name(path.name.removesuffix(".zst") + ".lock")
    try:
        fd = os.open(lock, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return False  # no lock: written whole (or by a writer that renames into place)
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)  # a shared lock taken here goes with it
    return False


def read_request(path: Path, layers: int) -> Request:
    """One request's file, decompressed if it is `.zst`, checked: `hidden_states`
    `[tokens, layers, hidden]` of floats and `token_ids` `[tokens]` of integers, as many rows
    as tokens, every value finite."""
    where = printable(str(path))
    tensors = load_tensors(path, where)
    if "hidden_states" not in tensors or "token_ids" not in tensors:
        keys = ", ".join(sorted(tensors)) or "nothing"
        raise BadEngineFile(where, f" holds {keys}, not hidden_states and token_ids")
    hidden, ids = tensors["hidden_states"], tensors["token_ids"]
    if hidden.dim() != 3 or not hidden.is_floating_point():
        raise BadEngineFile(
            where,
            f": hidden_states is {dtype_name(hidden.dtype)} {list(hidden.shape)}, not floats "
            "[tokens, layers, hidden]",
        )
    if hidden.shape[1] != layers:
        raise HookdumpError(
            f"{where} holds {hidden.shape[1]} layers, and {opt('layer_ids')} names {layers}: "
            "give the ids of every layer it holds"
        )
    return checked_request(request_id(path), path, where, ids, hidden)


def checked_size(path: Path, where: str) -> None:
    """A file that can be read, and no larger than MAX_FILE_BYTES."""
    try:
        size = path.stat().st_size
    except OSError as exc:
        raise BadEngineFile(where, f" cannot be read: {exc.strerror or exc}") from None
    if size > MAX_FILE_BYTES:
        raise BadEngineFile(where, f" holds more than {MAX_FILE_BYTES:,} bytes; refused")


def load_tensors(path: Path, where: str) -> dict[str, torch.Tensor]:
    """A safetensors file's tensors, decompressed if it is `.zst`, else mapped (each tensor
    copied once, from the page cache); a file cut short or not one is one line."""
    checked_size(path, where)
    try:
        if path.name.endswith(".zst"):
            return load_safetensors(_decompressed(path))
        return load_file(path)
    except OSError as exc:
        raise BadEngineFile(where, f" cannot be read: {exc.strerror or exc}") from None
    except (SafetensorError, ValueError) as exc:
        raise BadEngineFile(where, f" is not a whole safetensors file ({exc})") from None


def checked_ids(ids: object, where: str, name: str) -> torch.Tensor:
    """Token ids `ids` (the file's `name`) as `[tokens]` of integers, else one line."""
    if (
        not isinstance(ids, torch.Tensor)
        or ids.dim() != 1
        or ids.is_floating_point()
        or ids.dtype == torch.bool
    ):
        what = (
            f"{dtype_name(ids.dtype)} {list(ids.shape)}" if isinstance(ids, torch.Tensor) else "not"
        )
        raise BadEngineFile(where, f": {name} is {what}, not integers [tokens]")
    return ids


def checked_request(
    rid: str, path: Path, where: str, ids: object, hidden: torch.Tensor, ids_name: str = "token_ids"
) -> Request:
    """Request `rid` of the file `path` (`where`, in messages): its token ids `ids`
    `[tokens]` of integers (the file's `ids_name`) and as many rows of `hidden`
    `[tokens, layers, hidden]`, every value finite."""
    ids = checked_ids(ids, where, ids_name)
    if len(hidden) != len(ids):
        raise BadEngineFile(
            where,
            f" holds {len(hidden)} rows of hidden states for {len(ids)} tokens: "
            "every token has one row",
        )
    at = first_nonfinite(hidden)
    if at >= 0:
        token, layer = (
            at // (hidden.shape[1] * hidden.shape[2]),
            at // hidden.shape[2] % hidden.shape[1],
        )
        raise BadEngineFile(
            where,
            f": token {token}'s hidden state in the file's layer {layer} (counted from "
            "0) is not finite (NaN or infinity)",
        )
    return Request(rid, path, ids.to(torch.int64), hidden)


def _decompressed(path: Path) -> bytes:
    """A `.zst` file's bytes, decompressed (never more than MAX_FILE_BYTES)."""
    where = printable(str(path))
    try:
        import zstandard
    except ImportError:
        raise HookdumpError(
            f"{where} is zstd-compressed: pip install 'hookdump[zstd]' to read it"
        ) from None
    try:
        with path.open("rb") as file:
            reader = zstandard.ZstdDecompressor().stream_reader(file)
            with contextlib.closing(reader):
                return _whole(reader.read, where)
    except Exception as exc:  # zstandard's ZstdError: not a whole frame
        if type(exc).__name__ == "ZstdError":
            raise BadEngineFile(where, f" is not a whole zstd frame ({exc})") from None
        raise


def _whole(read: Callable[[int], bytes], where: str) -> bytes:
    """Everything `read` gives, in chunks (a read of the limit at once would take that
    much memory whatever the file holds), refused beyond MAX_FILE_BYTES."""
    chunks, size = [], 0
    while chunk := read(CHUNK_BYTES):
        size += len(chunk)
        if size > MAX_FILE_BYTES:
            raise BadEngineFile(where, f" holds more than {MAX_FILE_BYTES:,} bytes; refused")
        chunks.append(chunk)
    return b"".join(chunks)
