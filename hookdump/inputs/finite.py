"""Whether a tensor of floats holds a NaN or an infinity, in one compiled read of its bits
(numba): no temporary tensor (`torch.isfinite` makes a mask as large as the values, and a
fresh page costs more than the test on this kind of machine), and it stops at the first."""

from __future__ import annotations

import numba
import numpy as np
import torch

# a float's exponent bits, all set in an infinity or a NaN only
_EXPONENT = {
    torch.bfloat16: (torch.int16, 0x7F80),
    torch.float16: (torch.int16, 0x7C00),
    torch.float32: (torch.int32, 0x7F800000),
    torch.float64: (torch.int64, 0x7FF0000000000000),
}


@numba.njit(cache=True, nogil=True)
def _first_with_all(bits: np.ndarray, mask: int) -> int:  # pragma: no cover - compiled
    for index in range(bits.size):
        if bits[index] & mask == mask:
            return index
    return -1


def first_nonfinite(values: torch.Tensor) -> int:
    """The flat index of the first NaN or infinity in `values` (floats on the CPU), or -1."""
    found = _EXPONENT.get(values.dtype)
    if found is None or values.device.type != "cpu":
        bad = (~torch.isfinite(values)).flatten().nonzero()
        return int(bad[0]) if len(bad) else -1
    as_int, mask = found
    bits = values.contiguous().view(as_int).numpy().reshape(-1)
    return int(_first_with_all(bits, mask))
