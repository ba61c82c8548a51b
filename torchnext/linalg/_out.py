"""``out=`` handling shared by the public functions, following torch's rules.

torch.linalg functions accept ``out=`` tensors of the result dtype: a wrong dtype is
a ``RuntimeError`` with torch's wording, a wrong shape is resized, and the returned
value is the ``out`` object itself. Do not assume ``out`` may alias the input.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple, TypeVar

import torch

R = TypeVar("R", bound=tuple[torch.Tensor, ...])


class EighResult(NamedTuple):
    """Typing view of ``torch.return_types.linalg_eigh`` (what is returned at run time)."""

    eigenvalues: torch.Tensor
    eigenvectors: torch.Tensor


class SVDResult(NamedTuple):
    """Typing view of ``torch.return_types.linalg_svd``."""

    U: torch.Tensor
    S: torch.Tensor
    Vh: torch.Tensor


class QRResult(NamedTuple):
    """Typing view of ``torch.return_types.linalg_qr``."""

    Q: torch.Tensor
    R: torch.Tensor


def torch_result(name: str, view: type[R], values: tuple[torch.Tensor, ...]) -> R:
    """torch's own named-tuple type ``torch.return_types.<name>`` holding ``values``.

    Returning torch's type keeps ``type(result)`` and pickling identical to
    ``torch.linalg``; ``view`` only tells the type checker which fields exist.
    """
    native = getattr(torch.return_types, name, None)
    if native is None:
        return view(*values)
    result: R = native(values)
    return result


__all__ = ["write_out", "EighResult", "SVDResult", "QRResult", "torch_result"]

_NAMES = {
    torch.float32: "float",
    torch.float64: "double",
    torch.complex64: "c10::complex<float>",
    torch.complex128: "c10::complex<double>",
    torch.float16: "c10::Half",
    torch.bfloat16: "c10::BFloat16",
}


def write_out(
    fn: str, out: Sequence[torch.Tensor], results: Sequence[torch.Tensor]
) -> tuple[torch.Tensor, ...]:
    """Copy ``results`` into ``out`` (resizing where needed) and return ``out``."""
    if len(out) != len(results):
        raise TypeError(f"{fn}: out= takes {len(results)} tensors, got {len(out)}")
    for dst, src in zip(out, results, strict=True):
        if not isinstance(dst, torch.Tensor):
            raise TypeError(f"{fn}: out= must hold tensors, got {type(dst).__name__}")
        if dst.dtype != src.dtype:
            raise RuntimeError(
                f"Expected out tensor to have dtype {_NAMES.get(src.dtype, src.dtype)}, "
                f"but got {_NAMES.get(dst.dtype, dst.dtype)} instead"
            )
        if dst.device != src.device:
            raise RuntimeError(
                f"{fn}: Expected out tensor to be on device {src.device}, but got {dst.device}"
            )
    for dst, src in zip(out, results, strict=True):
        if dst.shape != src.shape:
            dst.resize_(src.shape)
        dst.copy_(src)
    return tuple(out)
