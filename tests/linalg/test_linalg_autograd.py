"""Autograd: gradcheck in float64 (real and complex) for every public function."""

from __future__ import annotations

from collections.abc import Callable

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


def _jacobian(fn: Callable[[torch.Tensor], torch.Tensor], A: torch.Tensor) -> torch.Tensor:
    """d fn / d A, with complex tensors seen as pairs of reals (so the Jacobian is real)."""
    if not A.is_complex():
        return torch.autograd.functional.jacobian(fn, A)  # type: ignore[return-value]

    def real_fn(x: torch.Tensor) -> torch.Tensor:
        return torch.view_as_real(fn(torch.view_as_complex(x)))

    return torch.autograd.functional.jacobian(real_fn, torch.view_as_real(A))  # type: ignore[return-value]


def _sqrt_of_hermitian_part(x: torch.Tensor) -> torch.Tensor:
    lam, Q = torch.linalg.eigh(0.5 * (x + x.mH))
    return (Q * lam.sqrt()[..., None, :].to(Q.dtype)) @ Q.mH


@pytest.mark.parametrize("method", ["auto", "eigh", "newton_schulz"])
@pytest.mark.parametrize("dtype", [torch.float64, torch.complex128])
def test_matrix_sqrth_gradient_of_a_general_input_is_hermitian_as_in_214(
    method: str, dtype: torch.dtype
) -> None:
    # torch 2.14's matrix_sqrth reads the lower triangle, but its gradient is the
    # Hermitian representer (as eigh's is): the Hermitian part of the gradient with
    # respect to the Hermitian matrix it read. A gradient on the lower triangle only
    # would make a learned symmetric matrix non-symmetric after one step.
    gen = torch.Generator().manual_seed(3)
    X = torch.randn(2, 4, 4, dtype=dtype, generator=gen)
    spd = X @ X.mH / 4 + torch.eye(4, dtype=dtype)
    A = spd + 0.1 * torch.randn(2, 4, 4, dtype=dtype, generator=gen)  # not Hermitian
    lower = torch.ones(4, 4, dtype=torch.bool).tril()
    H = torch.where(lower, A, A.mH)
    H.diagonal(dim1=-2, dim2=-1).copy_(H.diagonal(dim1=-2, dim2=-1).real)
    ours = _jacobian(lambda a: tl.matrix_sqrth(a, method=method), A)  # type: ignore[arg-type,return-value]
    reference = _jacobian(_sqrt_of_hermitian_part, H)
    torch.testing.assert_close(ours, reference, rtol=1e-7, atol=1e-12)

    A_param = A.clone().requires_grad_()
    G = torch.randn(2, 4, 4, dtype=dtype, generator=gen)
    (tl.matrix_sqrth(A_param, method=method) * G.conj()).real.sum().backward()  # type: ignore[union-attr]
    grad = A_param.grad
    if grad is None:
        raise AssertionError("matrix_sqrth produced no gradient")
    torch.testing.assert_close(grad, grad.mH, rtol=0, atol=1e-13)


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
