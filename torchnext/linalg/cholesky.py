"""``cholesky`` with torch.linalg's signature, batch-split on the CPU, typed errors.

When to use: as ``torch.linalg.cholesky``. A matrix that is not Hermitian positive
definite (NaN entries included) raises
:class:`~torchnext.errors.NotPositiveDefiniteError` whose message and
``batch_index`` name the first offending matrix of the flattened batch and the order
of the leading minor that failed (what ``cholesky_ex``'s ``info`` reports).

What not to assume: only the selected triangle is read (lower unless ``upper=True``),
as in torch; symmetry is not checked.

Shape legend: ``B`` flattened batch, ``N`` order.
"""

from __future__ import annotations

import torch

from torchnext.linalg._checks import check_dtype, check_square, raise_not_pd
from torchnext.linalg._out import write_out
from torchnext.linalg.dispatch import run_batch_split, threads_for
from torchnext.linalg.spectral import plain_torch_needed

__all__ = ["cholesky"]


def cholesky(
    A: torch.Tensor, *, upper: bool = False, out: torch.Tensor | None = None
) -> torch.Tensor:
    """Cholesky factor ``L`` (``A = L L^H``) or ``U`` (``A = U^H U`` if ``upper``)."""
    fn_name = "linalg.cholesky"
    check_square(fn_name, A)
    check_dtype(fn_name, A)
    n = A.shape[-1]
    flat = A.reshape(-1, n, n)
    plain = plain_torch_needed(A)
    chunks = threads_for(A.device, flat.shape[0]) if A.dim() > 2 and not plain else 1
    if plain or chunks == 1:
        L, info = torch.linalg.cholesky_ex(A, upper=upper)
    else:
        L_, info_ = run_batch_split(
            lambda x: tuple(torch.linalg.cholesky_ex(x, upper=upper)), [flat], chunks=chunks
        )
        L, info = L_.reshape(A.shape), info_
    if info.numel() > 0 and not torch.compiler.is_compiling():
        raise_not_pd(fn_name, info)
    if out is not None:
        write_out(fn_name, (out,), (L,))
        return out
    return L
