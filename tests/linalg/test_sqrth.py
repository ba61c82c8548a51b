"""matrix_sqrth: 2.14 semantics (lower triangle, clamping, NaN), check_pd, NS fast path."""

from __future__ import annotations

import pytest
import torch
from linalg_gates import ALL, GATE_RECON, eps_of, recon_neps, spd

import torchnext.linalg as tl
from torchnext.errors import NotPositiveDefiniteError


@pytest.mark.parametrize("dtype", ALL)
@pytest.mark.parametrize("n", [1, 2, 5, 8, 16])
@pytest.mark.parametrize("method", ["auto", "eigh", "newton_schulz"])
def test_square_root_gate(dtype: torch.dtype, n: int, method: str) -> None:
    for A in (spd(32, n, dtype), spd(32, n, dtype, shift=1e-3)):
        X = tl.matrix_sqrth(A, method=method)  # type: ignore[arg-type]
        assert isinstance(X, torch.Tensor) and X.shape == A.shape
        assert recon_neps(A, X @ X, dtype) <= GATE_RECON
        torch.testing.assert_close(
            X, X.mH, rtol=0, atol=10 * n * eps_of(dtype) * float(X.abs().max())
        )


def test_reads_lower_triangle_and_clamps_like_214() -> None:
    A = torch.tensor([[4.0, 100.0], [0.0, -1.0]])
    torch.testing.assert_close(tl.matrix_sqrth(A), torch.tensor([[2.0, 0.0], [0.0, 0.0]]))
    B = torch.tensor([[1.0, 2.0], [2.0, 1.0]])
    torch.testing.assert_close(tl.matrix_sqrth(B), torch.full((2, 2), 0.75**0.5))
    nan = tl.matrix_sqrth(torch.full((2, 2), float("nan")))
    assert bool(torch.isnan(nan).all())


def test_check_pd_names_the_batch_index() -> None:
    A = spd(5, 3, torch.float64)
    A[3] = -A[3]
    with pytest.raises(NotPositiveDefiniteError, match="batch index 3") as err:
        tl.matrix_sqrth(A, check_pd=True)
    assert err.value.batch_index == 3
    with pytest.raises(NotPositiveDefiniteError):
        tl.matrix_sqrth(A, check_pd=True, method="newton_schulz")
    assert isinstance(tl.matrix_sqrth(A), torch.Tensor)


def test_newton_schulz_falls_back_on_hard_matrices() -> None:
    A = spd(8, 6, torch.float64)
    gen = torch.Generator().manual_seed(0)
    q, _ = torch.linalg.qr(torch.randn(6, 6, dtype=torch.float64, generator=gen))
    A[5] = (q * torch.logspace(0, -14, 6, dtype=torch.float64)) @ q.mT
    X, info = tl.matrix_sqrth(A, method="newton_schulz", return_info=True)
    assert bool(info.converged[:5].all()) and not bool(info.converged[5])
    assert recon_neps(A, X @ X, torch.float64) <= GATE_RECON


def test_batch_layouts() -> None:
    A = spd(6, 4, torch.float64).reshape(2, 3, 4, 4)
    X = tl.matrix_sqrth(A.mT)  # symmetric, so the transpose is the same matrix
    assert X.shape == (2, 3, 4, 4)
    torch.testing.assert_close(X @ X, A)
    Y = tl.matrix_sqrth(spd(1, 4, torch.float64)[0].expand(3, 4, 4))
    torch.testing.assert_close(Y[0], Y[2])
