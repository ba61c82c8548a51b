"""torch 2.14.1's exact ``torch.linalg.polar`` and ``torch.linalg.matrix_sqrth`` contracts.

When to use: to install these as ``torch.linalg.polar`` / ``torch.linalg.matrix_sqrth``
on torch 2.13, where code written for 2.14 expects exactly 2.14's signatures
(``polar(A, *, out=None)``, ``matrix_sqrth(A)``), outputs and errors, including
2.14's refusal of wide matrices in ``polar`` (``torchnext.linalg.polar`` accepts them).

What not to assume: the numbers are computed by torchnext's routes, so they agree
with 2.14.1 within the accuracy gates (orthogonality and reconstruction within a
few n*eps), not bit for bit; NaN input to ``polar`` raises torchnext's
``LinAlgInputError`` (a ``RuntimeError``, as 2.14's ``LinAlgError`` is).
"""

from __future__ import annotations

from typing import cast

import torch

from torchnext.linalg._checks import check_matrix
from torchnext.linalg.polar import PolarResult
from torchnext.linalg.polar import polar as _polar
from torchnext.linalg.sqrth import matrix_sqrth as _matrix_sqrth

__all__ = ["polar", "matrix_sqrth"]


def polar(A: torch.Tensor, *, out: tuple[torch.Tensor, torch.Tensor] | None = None) -> PolarResult:
    """``torch.linalg.polar`` of torch 2.14.1: right polar ``A = U H`` with m >= n."""
    check_matrix("linalg.polar", A)
    if A.dtype.is_floating_point or A.dtype.is_complex:
        m, n = A.shape[-2], A.shape[-1]
        if m < n:
            raise RuntimeError(
                "linalg.polar: input must have at least as many rows as columns, "
                f"but got {m} by {n} matrices"
            )
    return cast(PolarResult, _polar(A, out=out))


def matrix_sqrth(A: torch.Tensor) -> torch.Tensor:
    """``torch.linalg.matrix_sqrth`` of torch 2.14.1 (lower triangle, clamps negatives)."""
    X = _matrix_sqrth(A)
    if not isinstance(X, torch.Tensor):
        raise TypeError("matrix_sqrth: internal route returned a non-tensor")
    return X
