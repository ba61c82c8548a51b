"""qr (LAPACK split and Householder) and cholesky: gates, modes, errors with batch index."""

from __future__ import annotations

import pytest
import torch
from linalg_gates import ALL, GATE_CHOL, GATE_ORTH, GATE_RECON, families, orth_neps, recon_neps, spd

import torchnext.linalg as tl
from torchnext.errors import NotPositiveDefiniteError


@pytest.mark.parametrize("dtype", ALL)
@pytest.mark.parametrize("shape", [(1, 1), (4, 4), (7, 3), (3, 7), (12, 12)])
@pytest.mark.parametrize("method", ["auto", "lapack", "householder"])
def test_qr_gates(dtype: torch.dtype, shape: tuple[int, int], method: str) -> None:
    m, n = shape
    for name, A in families(16, m, n, dtype).items():
        Q, R = tl.qr(A, method=method)
        ref = torch.linalg.qr(A)
        assert Q.shape == ref.Q.shape and R.shape == ref.R.shape
        assert orth_neps(Q, dtype) <= GATE_ORTH, (name, orth_neps(Q, dtype))
        assert recon_neps(A, Q @ R, dtype) <= GATE_RECON, name
        torch.testing.assert_close(R, R.triu())


@pytest.mark.parametrize("mode", ["reduced", "complete", "r"])
@pytest.mark.parametrize("method", ["auto", "householder"])
def test_qr_modes_match_torch_shapes(mode: str, method: str) -> None:
    A = torch.randn(3, 6, 4, dtype=torch.float64)
    Q, R = tl.qr(A, mode=mode, method=method)
    ref = torch.linalg.qr(A, mode=mode)
    assert Q.shape == ref.Q.shape and R.shape == ref.R.shape
    torch.testing.assert_close(R.abs(), ref.R.abs())
    if mode == "complete":
        assert orth_neps(Q, torch.float64) <= GATE_ORTH


def test_qr_large_batch_split_matches_torch() -> None:
    A = torch.randn(4096, 5, 5, dtype=torch.float64)
    Q, R = tl.qr(A)
    torch.testing.assert_close(Q @ R, A)
    assert orth_neps(Q, torch.float64) <= GATE_ORTH


@pytest.mark.parametrize("dtype", ALL)
@pytest.mark.parametrize("n", [1, 3, 8, 16])
@pytest.mark.parametrize("upper", [False, True])
def test_cholesky_gate(dtype: torch.dtype, n: int, upper: bool) -> None:
    A = spd(4096 if n == 3 else 16, n, dtype)
    L = tl.cholesky(A, upper=upper)
    rec = L.mH @ L if upper else L @ L.mH
    assert recon_neps(A, rec, dtype) <= GATE_CHOL
    torch.testing.assert_close(L, L.triu() if upper else L.tril())


@pytest.mark.parametrize("batch", [6, 5000])
def test_cholesky_not_pd_names_index_and_minor(batch: int) -> None:
    A = spd(batch, 4, torch.float64)
    A[batch - 2, 2, 2] = -5.0
    with pytest.raises(NotPositiveDefiniteError, match=f"batch index {batch - 2}") as err:
        tl.cholesky(A)
    assert err.value.batch_index == batch - 2
    assert "minor of order 3" in str(err.value)
    nan = spd(3, 3, torch.float64)
    nan[1, 0, 0] = float("nan")
    with pytest.raises(NotPositiveDefiniteError, match="batch index 1"):
        tl.cholesky(nan)


def test_cholesky_out() -> None:
    out = torch.empty(0)
    res = tl.cholesky(spd(2, 3, torch.float32), out=out)
    assert res is out and out.shape == (2, 3, 3)
