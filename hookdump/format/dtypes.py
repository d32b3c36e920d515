"""The dtypes a dump holds: their names in the manifest and in safetensors, and sizes."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

# dtype names as the manifest writes them (torch's, less "torch.") -> safetensors' names
SAFETENSORS_DTYPES = {
    "float64": "F64",
    "float32": "F32",
    "float16": "F16",
    "bfloat16": "BF16",
    "int64": "I64",
    "int32": "I32",
    "int16": "I16",
    "int8": "I8",
    "uint8": "U8",
    "bool": "BOOL",
}
DTYPES = tuple(SAFETENSORS_DTYPES)
ITEMSIZE = {
    "float64": 8,
    "float32": 4,
    "float16": 2,
    "bfloat16": 2,
    "int64": 8,
    "int32": 4,
    "int16": 2,
    "int8": 1,
    "uint8": 1,
    "bool": 1,
}
DTYPE_OF_SAFETENSORS = {st: name for name, st in SAFETENSORS_DTYPES.items()}


def dtype_name(dtype: torch.dtype) -> str:
    """`torch.float32` -> `float32`."""
    return str(dtype).removeprefix("torch.")
