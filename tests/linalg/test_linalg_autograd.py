"""Autograd: gradcheck in float64 (real and complex) for every public function."""

from __future__ import annotations

import pytest
import torch
from torch.autograd import gradcheck

import torchnext.linalg as tl


def _x(*shape: int, dtype: torch.dtype = torch.float64) -> torch.Tensor:
    return torch.randn(*shape, dtype=dtype, requires_grad=True)


@pytest.mark.parametrize("method", ["auto", "qdwh", "newton_schulz", "svd"])
@pytest.mark.parametrize("shape", [(3, 3), (2, 4, 3), (2, 3, 4)])
@pytest.mark.parametrize("side", ["right", "left"])
def test_polar_gradcheck(method: str, shape: tuple[int, ...], side: str) -> None:
    assert gradcheck(lambda a: tuple(tl.polar(a, side=side, method=method)), (_x(*shape),))  # type: ignore[arg-type]


def test_polar_gradcheck_complex_and_repeated_singular_values() -> None:
    assert gradcheck(lambda a: tuple(tl.polar(a)), (_x(2, 4, 3, dtype=torch.complex128),))
    # An orthogonal input has all singular values equal: an SVD-composed backward
    # divides by zero there, ours divides by sums only.
    q, _ = torch.linalg.qr(torch.randn(3, 3, dtype=torch.float64))
    assert gradcheck(lambda a: tuple(tl.polar(a)), (q.clone().requires_grad_(),))


@pytest.mark.parametrize("method", ["auto", "newton_schulz"])
@pytest.mark.parametrize("dtype", [torch.float64, torch.complex128])
def test_matrix_sqrth_gradcheck(method: str, dtype: torch.dtype) -> None:
    eye = torch.eye(3, dtype=dtype)
    assert gradcheck(
        lambda p: tl.matrix_sqrth(p @ p.mH + eye, method=method), (_x(2, 3, 3, dtype=dtype),)
    )  # type: ignore[arg-type]


def test_matrix_sqrth_gradient_is_that_of_the_lower_triangle() -> None:
    # The function reads only the lower triangle, so a raw (non-symmetric) gradcheck
    # must pass too: the upper triangle gets zero gradient.
    a = torch.randn(3, 3, dtype=torch.float64)
    base = (a @ a.mT + torch.eye(3, dtype=torch.float64)).requires_grad_()
    assert gradcheck(lambda A: tl.matrix_sqrth(A), (base,))


@pytest.mark.parametrize("dtype", [torch.float64, torch.complex128])
def test_decompositions_gradcheck(dtype: torch.dtype) -> None:
    def eigh_fn(a: torch.Tensor) -> torch.Tensor:
        L, V = tl.eigh(a + a.mH)
        return L + (V.abs() ** 2).sum(-2)  # gauge-invariant use of V

    assert gradcheck(eigh_fn, (_x(2, 3, 3, dtype=dtype),))

    def svd_fn(a: torch.Tensor) -> torch.Tensor:
        U, S, Vh = tl.svd(a, full_matrices=False)
        return S.to(a.dtype).sum(-1)[..., None, None] * (U @ Vh)

    assert gradcheck(svd_fn, (_x(2, 4, 3, dtype=dtype),))
    assert gradcheck(lambda a: tuple(tl.qr(a)), (_x(2, 4, 3, dtype=dtype),))
    eye = torch.eye(3, dtype=dtype)
    assert gradcheck(lambda p: tl.cholesky(p @ p.mH + eye), (_x(2, 3, 3, dtype=dtype),))
