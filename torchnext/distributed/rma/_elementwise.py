"""Element-level pieces that both sides of an RMA window share.

A request is checked at the origin before it is sent and again at the target before
it touches memory; both checks must apply the same rule and say the same thing, so
the rule lives here. The same holds for how an accumulate combines values and how a
tensor's bytes are handed to a socket. Used by the caller side
(:mod:`torchnext.distributed.rma.window`) and the serving side
(:mod:`torchnext.distributed.rma.server`) only.

What not to assume: :func:`bytes_of` views the tensor's memory (no copy), so the tensor
must be contiguous and on the CPU, and must outlive the view.
"""

from __future__ import annotations

from typing import Literal

import torch

from torchnext.errors import WindowError

__all__ = [
    "ACCUMULATE_CODES",
    "ACCUMULATE_NAMES",
    "AccumulateOp",
    "bytes_of",
    "check_region",
    "combine",
]

AccumulateOp = Literal["sum", "min", "max", "replace"]
ACCUMULATE_CODES: dict[str, int] = {"sum": 1, "min": 2, "max": 3, "replace": 4}
"""Wire code of each accumulate op (sent in a request header's ``acc_op`` byte)."""
ACCUMULATE_NAMES: dict[int, str] = {v: k for k, v in ACCUMULATE_CODES.items()}


def check_region(name: str, target: int, offset: int, n: int, size: int) -> None:
    """Raise :class:`WindowError` unless ``n`` elements at ``offset`` fit ``size``."""
    if not isinstance(offset, int) or offset < 0 or n < 0 or offset + n > size:
        raise WindowError(
            f"{name}: target_offset_nelems={offset!r} with {n} elements overruns rank {target}'s "
            f"window of {size} elements; need 0 <= offset and offset + n <= {size}"
        )


def bytes_of(t: torch.Tensor) -> memoryview:
    """The bytes of a contiguous CPU tensor, without a copy."""
    return t.reshape(-1).view(torch.uint8).numpy().data


def combine(region: torch.Tensor, src: torch.Tensor, op: str) -> None:
    """Apply accumulate ``op`` of ``src`` into ``region`` in place."""
    if op == "sum":
        region.add_(src)
    elif op == "min":
        torch.minimum(region, src, out=region)
    elif op == "max":
        torch.maximum(region, src, out=region)
    else:
        region.copy_(src)
