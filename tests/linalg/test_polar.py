"""polar: 2.14 contract, sides and shapes, every method, accuracy gates, info."""

from __future__ import annotations

import pytest
import torch
from linalg_gates import (
    ALL,
    GATE_ORTH,
    GATE_QDWH_ORTH,
    GATE_RECON,
    families,
    orth_neps,
    recon_neps,
)

import torchnext.linalg as tl

METHODS = ("auto", "qdwh", "newton_schulz", "svd")


def _herm_psd(H: torch.Tensor) -> None:
    torch.testing.assert_close(H, H.mH, rtol=0, atol=float(H.abs().max()) * 1e-5 + 1e-12)
    lam = torch.linalg.eigvalsh(H.to(torch.complex128 if H.is_complex() else torch.float64))
    assert float(lam.min()) >= -1e-4 * max(1.0, float(lam.max()))


@pytest.mark.parametrize("dtype", ALL)
@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("shape", [(1, 1), (3, 3), (6, 4), (4, 6), (9, 9)])
@pytest.mark.parametrize("side", ["right", "left"])
def test_polar_gates(dtype: torch.dtype, method: str, shape: tuple[int, int], side: str) -> None:
    m, n = shape
    for name, A in families(16, m, n, dtype).items():
        U, H = tl.polar(A, side=side, method=method)  # type: ignore[arg-type]
        k = min(m, n)
        assert U.shape == A.shape
        assert H.shape[-1] == (n if side == "right" else m)
        if name not in ("rank_deficient", "zero"):
            gate = GATE_QDWH_ORTH if method != "svd" else GATE_ORTH
            assert orth_neps(U, dtype) <= gate, (name, orth_neps(U, dtype))
        else:
            # U is not unique here, but every route must still return an isometry.
            assert orth_neps(U, dtype) <= GATE_ORTH, (name, orth_neps(U, dtype))
        rec = U @ H if side == "right" else H @ U
        assert recon_neps(A, rec, dtype) <= GATE_RECON * (2 if k == 1 else 1), name
        _herm_psd(H)


def test_matches_svd_definition_exactly_for_method_svd() -> None:
    A = torch.randn(5, 6, 4, dtype=torch.float64)
    U, H = tl.polar(A, method="svd")
    W, S, Vh = torch.linalg.svd(A, full_matrices=False)
    torch.testing.assert_close(U, W @ Vh)
    torch.testing.assert_close(H, Vh.mH @ torch.diag_embed(S) @ Vh)


def test_methods_agree() -> None:
    A = torch.randn(32, 7, 5, dtype=torch.float64)
    ref = tl.polar(A, method="svd")
    for method in ("auto", "qdwh", "newton_schulz"):
        U, H = tl.polar(A, method=method)  # type: ignore[arg-type]
        torch.testing.assert_close(U, ref.U, rtol=1e-9, atol=1e-9)
        torch.testing.assert_close(H, ref.H, rtol=1e-9, atol=1e-9)


def test_heavy_tailed_gaussian_batch_leaves_no_matrix_unconverged() -> None:
    # A few thousand Gaussian 12x12 float32 matrices include condition numbers ~1e5+.
    gen = torch.Generator().manual_seed(3)
    A = torch.randn(3000, 12, 12, generator=gen)
    for method in ("qdwh", "newton_schulz", "auto"):
        U, H, info = tl.polar(A, method=method, return_info=True)  # type: ignore[arg-type]
        assert orth_neps(U, torch.float32) <= GATE_QDWH_ORTH, method
        assert recon_neps(A, U @ H, torch.float32) <= GATE_RECON, method
        assert info.iters.shape == (3000,) and info.converged.dtype == torch.bool
    _, _, info = tl.polar(A, method="qdwh", return_info=True)
    assert float(info.converged.float().mean()) > 0.99
    assert int(info.iters.max()) <= 12


def test_info_reports_fallback_for_rank_deficient() -> None:
    A = torch.randn(4, 5, 5, dtype=torch.float64)
    A[2] = 0
    A[3, :, 0] = A[3, :, 1]
    U, H, info = tl.polar(A, method="newton_schulz", return_info=True)
    assert info.converged.tolist() == [True, True, False, False]
    assert orth_neps(U, torch.float64) <= GATE_ORTH
    torch.testing.assert_close(U @ H, A)


def test_batch_shapes_layouts_and_out() -> None:
    A = torch.randn(2, 3, 5, 4).mT  # non-contiguous, wide after transpose
    U, H = tl.polar(A, side="left")
    assert U.shape == (2, 3, 4, 5) and H.shape == (2, 3, 4, 4)
    B = torch.randn(5, 3).expand(2, 5, 3)
    U2, H2 = tl.polar(B)
    torch.testing.assert_close(U2[0], U2[1])
    outU, outH = torch.empty(0), torch.empty(0)
    res = tl.polar(torch.randn(4, 3), out=(outU, outH))
    assert res[0] is outU and outH.shape == (3, 3)
    empty = tl.polar(torch.randn(3, 0))
    assert empty[0].shape == (3, 0) and empty[1].shape == (0, 0)


def test_zero_matrix_gives_identity_like_torch_214() -> None:
    U, H = tl.polar(torch.zeros(2, 2))
    torch.testing.assert_close(U.abs(), torch.eye(2))
    torch.testing.assert_close(H, torch.zeros(2, 2))
