"""Replacements for ``torch.cholesky`` and ``torch.qr``, removed in torch 2.14.

torch 2.14 turned ``torch.cholesky``/``torch.qr`` (and the Tensor methods) into stubs
that raise ``RuntimeError``, and removed ``aten::cholesky``/``aten::qr``. These
functions keep the **old argument conventions** and compute through ``torch.linalg``:

* ``cholesky(A, upper=False)``: ``upper=True`` returns ``linalg.cholesky(A).mH``;
* ``qr(A, some=True)``: ``some=True`` is ``mode='reduced'``, ``some=False`` is
  ``mode='complete'``.

Both accept ``out=`` like the old functions. What not to assume: errors are those of
``torch.linalg`` (``torch.linalg.LinAlgError`` for a non-positive-definite matrix).
"""

from __future__ import annotations

from typing import NamedTuple

import torch

__all__ = ["cholesky", "qr", "QRResult"]


class QRResult(NamedTuple):
    Q: torch.Tensor
    R: torch.Tensor


def _check(name: str, A: object) -> torch.Tensor:
    if not isinstance(A, torch.Tensor):
        raise TypeError(f"{name}: input must be a Tensor, got {type(A).__name__}")
    if A.dim() < 2:
        raise ValueError(
            f"{name}: input must have at least 2 dimensions, got shape {tuple(A.shape)}"
        )
    return A


def cholesky(
    input: torch.Tensor, upper: bool = False, *, out: torch.Tensor | None = None
) -> torch.Tensor:
    """Old ``torch.cholesky(A, upper)`` through ``torch.linalg.cholesky``."""
    A = _check("cholesky", input)
    if not isinstance(upper, bool):
        raise TypeError(f"cholesky: upper must be a bool, got {upper!r}")
    L = torch.linalg.cholesky(A)
    result = L.mH if upper else L
    if out is not None:
        out.resize_(result.shape)
        out.copy_(result)
        return out
    return result


def qr(
    input: torch.Tensor,
    some: bool = True,
    *,
    out: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> QRResult:
    """Old ``torch.qr(A, some)`` through ``torch.linalg.qr`` (``some`` -> ``mode``)."""
    A = _check("qr", input)
    if not isinstance(some, bool):
        raise TypeError(f"qr: some must be a bool, got {some!r}")
    mode = "reduced" if some else "complete"
    if out is not None:
        if not (isinstance(out, (tuple, list)) and len(out) == 2):
            raise TypeError("qr: out must be a (Q, R) pair of tensors")
        torch.linalg.qr(A, mode=mode, out=(out[0], out[1]))
        return QRResult(out[0], out[1])
    Q, R = torch.linalg.qr(A, mode=mode)
    return QRResult(Q, R)
