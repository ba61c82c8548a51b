"""eigh and svd: accuracy gates on every route, dtype and input family; layouts; out=."""

from __future__ import annotations

import pytest
import torch
from linalg_gates import (
    ALL,
    GATE_ORTH,
    GATE_RECON,
    families,
    hermitian_families,
    orth_neps,
    recon_neps,
)

import torchnext.linalg as tl


def _eigh_recon(L: torch.Tensor, V: torch.Tensor) -> torch.Tensor:
    return (V * L[..., None, :].to(V.dtype)) @ V.mH


def _svd_recon(U: torch.Tensor, S: torch.Tensor, Vh: torch.Tensor) -> torch.Tensor:
    k = S.shape[-1]
    return (U[..., :k] * S[..., None, :].to(U.dtype)) @ Vh[..., :k, :]


@pytest.mark.parametrize("dtype", ALL)
@pytest.mark.parametrize("n", [1, 2, 3, 4, 7, 12])
@pytest.mark.parametrize("method", ["jacobi", "lapack", "auto"])
def test_eigh_gates(dtype: torch.dtype, n: int, method: str) -> None:
    for name, A in hermitian_families(24, n, dtype).items():
        L, V = tl.eigh(A, method=method)
        assert L.dtype == A.real.dtype and V.shape == A.shape
        assert bool((L[..., 1:] >= L[..., :-1]).all()), name
        assert orth_neps(V, dtype) <= GATE_ORTH, (name, orth_neps(V, dtype))
        assert recon_neps(A, _eigh_recon(L, V), dtype) <= GATE_RECON, name
        ref = torch.linalg.eigvalsh(A)
        scale = float(A.abs().max()) + 1.0
        assert float((L - ref).abs().max()) <= 50 * n * scale * torch.finfo(ref.dtype).eps


@pytest.mark.parametrize("dtype", ALL)
@pytest.mark.parametrize("shape", [(1, 1), (2, 2), (4, 4), (5, 3), (3, 5), (8, 8), (12, 12)])
@pytest.mark.parametrize("method", ["jacobi", "lapack", "auto"])
def test_svd_gates(dtype: torch.dtype, shape: tuple[int, int], method: str) -> None:
    m, n = shape
    for name, A in families(24, m, n, dtype).items():
        U, S, Vh = tl.svd(A, full_matrices=False, method=method)
        assert bool((S[..., :-1] >= S[..., 1:]).all()), name
        assert orth_neps(U, dtype) <= GATE_ORTH, (name, orth_neps(U, dtype))
        assert orth_neps(Vh, dtype) <= GATE_ORTH, (name, orth_neps(Vh, dtype))
        assert recon_neps(A, _svd_recon(U, S, Vh), dtype) <= GATE_RECON, name


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("n", [2, 4])
def test_auto_large_batch_takes_unrolled_route(dtype: torch.dtype, n: int) -> None:
    gen = torch.Generator().manual_seed(1)
    A = torch.randn(4096, n, n, dtype=dtype, generator=gen)
    L, V = tl.eigh(A + A.mT)
    assert orth_neps(V, dtype) <= GATE_ORTH
    assert recon_neps(A + A.mT, _eigh_recon(L, V), dtype) <= GATE_RECON
    U, S, Vh = tl.svd(A)
    assert orth_neps(U, dtype) <= GATE_ORTH and orth_neps(Vh, dtype) <= GATE_ORTH
    assert recon_neps(A, _svd_recon(U, S, Vh), dtype) <= GATE_RECON


def test_full_matrices_and_shapes_match_torch() -> None:
    A = torch.randn(3, 5, 2)
    for full in (True, False):
        mine = tl.svd(A, full_matrices=full, method="jacobi")
        ref = torch.linalg.svd(A, full_matrices=full)
        assert [t.shape for t in mine] == [t.shape for t in ref]
        torch.testing.assert_close(mine.S, ref.S, rtol=1e-5, atol=1e-5)
    assert type(tl.svd(A)) is torch.return_types.linalg_svd
    assert type(tl.eigh(A[..., :2, :])) is torch.return_types.linalg_eigh


@pytest.mark.parametrize("method", ["jacobi", "auto"])
def test_layouts_noncontiguous_broadcast_multibatch(method: str) -> None:
    base = torch.randn(6, 4, 4, dtype=torch.float64)
    cases = {
        "transposed": base.mT,
        "strided": torch.randn(6, 8, 8, dtype=torch.float64)[:, ::2, ::2],
        "broadcast": torch.randn(4, 4, dtype=torch.float64).expand(3, 2, 4, 4),
        "multibatch": torch.randn(2, 3, 4, 4, dtype=torch.float64),
    }
    for name, A in cases.items():
        H = A + A.mT
        L, V = tl.eigh(H, method=method)
        assert V.shape == H.shape and L.shape == H.shape[:-1], name
        assert recon_neps(H, _eigh_recon(L, V), torch.float64) <= GATE_RECON, name
        U, S, Vh = tl.svd(A, method=method)
        assert recon_neps(A, _svd_recon(U, S, Vh), torch.float64) <= GATE_RECON, name


def test_uplo_reads_one_triangle() -> None:
    A = torch.randn(5, 3, 3, dtype=torch.float64)
    for uplo in ("L", "U"):
        tri = A.tril() if uplo == "L" else A.triu()
        garbage = tri + 100 * (A.triu(1) if uplo == "L" else A.tril(-1))
        L, _ = tl.eigh(garbage, UPLO=uplo, method="jacobi")
        torch.testing.assert_close(L, torch.linalg.eigvalsh(tri, UPLO=uplo))


def test_out_tensors_are_filled_and_returned() -> None:
    A = torch.randn(4, 3, 3)
    H = A + A.mT
    L, V = torch.empty(0), torch.empty(0)
    res = tl.eigh(H, method="jacobi", out=(L, V))
    assert res.eigenvalues is L and L.shape == (4, 3)
    with pytest.raises(RuntimeError, match="Expected out tensor to have dtype float"):
        tl.eigh(H, out=(torch.empty(0, dtype=torch.float64), torch.empty(0)))


def test_nan_propagates_in_eigh_and_raises_in_svd() -> None:
    A = torch.randn(3, 4, 4)
    A[1, 2, 1] = float("nan")
    L, _ = tl.eigh(A + A.mT, method="jacobi")
    assert bool(L[1].isnan().all()) and bool(L[0].isfinite().all())
    from torchnext.errors import LinAlgInputError

    with pytest.raises(LinAlgInputError, match="batch index 7") as info:
        tl.svd(torch.randn(4096, 3, 3).index_fill_(0, torch.tensor([7]), float("inf")))
    assert info.value.batch_index == 7
    for method in ("jacobi", "lapack", "auto"):
        with pytest.raises(LinAlgInputError, match="batch index 1"):
            tl.svd(A, method=method)
