"""Vectorised batched Jacobi eigh (two-sided) and SVD (one-sided), any device, real or complex.

When to use: small matrices (n <= 32) in large batches on devices whose vendor
library is slow for them or absent (MPS, CUDA without Triton), complex input for
which the unrolled CPU kernel does not exist, or as an independent reference. Each
sweep uses the round-robin parallel ordering: the n/2 rotations of a round touch
disjoint row/column pairs, so a whole round is a handful of batched gathers and
elementwise ops over the ``(B, n, n)`` tensor.

What not to assume: on the CPU this streams the whole batch through memory several
times per round, so it loses to LAPACK from n ~ 8 up (see :mod:`dispatch`). Complex
Hermitian rotations are reduced to real ones by the phase of the pivot entry.

Shape legend: ``B`` batch, ``M`` rows, ``N`` columns / order, ``K`` pairs per round.
"""

from __future__ import annotations

import torch

from torchnext.linalg._info import IterInfo
from torchnext.linalg._ordering import round_robin
from torchnext.linalg.unrolled import complete_columns

__all__ = ["eigh_jacobi", "svd_jacobi", "MAX_SWEEPS"]

MAX_SWEEPS = 20
"""Sweep cap; quadratic convergence means 5-8 sweeps for n <= 32 in practice."""


def _rotation(
    app: torch.Tensor, aqq: torch.Tensor, apq: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(c, s, w)`` with J = [[c, s], [-s conj(w), c conj(w)]] diagonalising
    [[app, apq], [conj(apq), aqq]]; ``w = apq/|apq|`` (1 where apq = 0)."""
    mag = apq.abs()
    real = mag.dtype
    tiny = torch.finfo(real).tiny
    if apq.is_complex():
        # Multiply by a real reciprocal (complex division squares |apq| and underflows
        # for the tiny pivots of the last sweeps); below `tiny` the phase is unreliable
        # (|w| != 1 would make J non-unitary) and the rotation is the identity anyway.
        ok = mag > tiny
        w = torch.where(ok, apq * torch.where(ok, mag, 1.0).reciprocal(), torch.ones_like(apq))
    else:
        w = torch.where(apq < 0, -torch.ones_like(apq), torch.ones_like(apq))
    d = aqq - app
    den = d.abs() + torch.sqrt(d * d + 4 * mag * mag) + tiny
    # |t| <= 1 exactly; the squares above can underflow for pivots near the floor.
    t = (2 * mag / torch.where(d < 0, -den, den)).clamp(-1.0, 1.0)
    c = torch.rsqrt(1 + t * t)
    return c, t * c, w


def _apply_cols(
    x_BMN: torch.Tensor,
    p_K: torch.Tensor,
    q_K: torch.Tensor,
    c_BK: torch.Tensor,
    s_BK: torch.Tensor,
    w_BK: torch.Tensor,
) -> torch.Tensor:
    """``X <- X J`` on the column pairs (p, q)."""
    xp = x_BMN[:, :, p_K]
    xq = x_BMN[:, :, q_K]
    c, s, wc = c_BK[:, None, :], s_BK[:, None, :], w_BK.conj()[:, None, :]
    new_p = xp * c - xq * (s * wc)
    new_q = xp * s + xq * (c * wc)
    out = x_BMN.clone()
    out[:, :, p_K] = new_p.to(out.dtype)
    out[:, :, q_K] = new_q.to(out.dtype)
    return out


def eigh_jacobi(
    a_BNN: torch.Tensor, *, lower: bool = True, tol: float | None = None
) -> tuple[torch.Tensor, torch.Tensor, IterInfo]:
    """Ascending eigenvalues and eigenvectors of Hermitian ``a_BNN`` (one triangle read).

    Returns ``(L_BN, V_BNN, info)``; ``info.residual`` is ``off(A)/||A||_F``.
    """
    B, n = a_BNN.shape[0], a_BNN.shape[-1]
    real = a_BNN.real.dtype if a_BNN.is_complex() else a_BNN.dtype
    eps = torch.finfo(real).eps
    # off(A) at rounding level is ~eps*||A|| per entry: ask for n times that, not less
    # (repeated eigenvalues otherwise stall at the floor for many sweeps).
    tol = eps * n if tol is None else tol
    tri = a_BNN.tril() if lower else a_BNN.triu()
    strict = tri.tril(-1) if lower else tri.triu(1)
    diag = torch.diagonal(tri, dim1=-2, dim2=-1).real
    a = strict + strict.mH + torch.diag_embed(diag).to(a_BNN.dtype)
    scale_B = a.abs().amax(dim=(-2, -1)).clamp_min(torch.finfo(real).tiny)
    a = a / scale_B[:, None, None]
    v = torch.eye(n, dtype=a.dtype, device=a.device).expand(B, n, n).clone()
    norm_B = torch.linalg.matrix_norm(a)
    rounds = [
        (
            torch.tensor([p for p, _ in r], device=a.device),
            torch.tensor([q for _, q in r], device=a.device),
        )
        for r in round_robin(n)
        if r
    ]
    off_B = torch.zeros(B, dtype=real, device=a.device)
    sweeps = 0
    eye = torch.eye(n, dtype=torch.bool, device=a.device)
    for sweep in range(1, MAX_SWEEPS + 1):
        sweeps = sweep
        for p_K, q_K in rounds:
            app = a[:, p_K, p_K].real
            aqq = a[:, q_K, q_K].real
            apq = a[:, p_K, q_K]
            c, s, w = _rotation(app, aqq, apq)
            a = _apply_cols(a, p_K, q_K, c, s, w)
            a = _apply_cols(a.mH, p_K, q_K, c, s, w).mH
            # The pivots are zero in exact arithmetic; storing the rounding noise would
            # keep off(A) above eps*||A|| forever for n >= 8.
            a[:, p_K, q_K] = 0
            a[:, q_K, p_K] = 0
            v = _apply_cols(v, p_K, q_K, c, s, w)
        off_B = torch.linalg.vector_norm(a.masked_fill(eye, 0), dim=(-2, -1))
        if not bool((off_B > tol * norm_B).any().item()):  # NaN counts as done
            break
    L_BN, order_BN = torch.sort(torch.diagonal(a, dim1=-2, dim2=-1).real, dim=-1)
    V_BNN = torch.gather(v, -1, order_BN[:, None, :].expand(B, n, n))
    info = IterInfo(
        iters=torch.full((B,), sweeps, dtype=torch.int32, device=a.device),
        converged=off_B <= tol * norm_B,
        residual=off_B / norm_B.clamp_min(torch.finfo(real).tiny),
    )
    return L_BN * scale_B[:, None], V_BNN, info


def svd_jacobi(
    a_BMN: torch.Tensor, *, tol: float | None = None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, IterInfo]:
    """Reduced SVD of ``a_BMN`` (M >= N) by one-sided Jacobi: ``(U, S, Vh, info)``.

    ``S`` descending; numerically rank-deficient matrices get their ``U`` completed to
    orthonormal columns. ``info.residual`` is the largest column cosine of the last sweep.
    """
    B, m, n = a_BMN.shape
    real = a_BMN.real.dtype if a_BMN.is_complex() else a_BMN.dtype
    eps = torch.finfo(real).eps
    tol = eps * m**0.5 if tol is None else tol
    scale_B = a_BMN.abs().amax(dim=(-2, -1)).clamp_min(torch.finfo(real).tiny)
    a = a_BMN / scale_B[:, None, None]
    v = torch.eye(n, dtype=a.dtype, device=a.device).expand(B, n, n).clone()
    rounds = [
        (
            torch.tensor([p for p, _ in r], device=a.device),
            torch.tensor([q for _, q in r], device=a.device),
        )
        for r in round_robin(n)
        if r
    ]
    worst_B = torch.zeros(B, dtype=real, device=a.device)
    sweeps = 0
    tiny = torch.finfo(real).tiny
    for sweep in range(1, MAX_SWEEPS + 1):
        sweeps = sweep
        if n < 2:
            break
        worst_B = torch.zeros(B, dtype=real, device=a.device)
        for p_K, q_K in rounds:
            ap, aq = a[:, :, p_K], a[:, :, q_K]
            alpha = (ap.abs() ** 2).sum(1)
            beta = (aq.abs() ** 2).sum(1)
            gamma = (ap.conj() * aq).sum(1)
            cos = gamma.abs() / torch.sqrt(alpha * beta).clamp_min(tiny)
            worst_B = torch.maximum(worst_B, cos.amax(dim=-1))
            c, s, w = _rotation(alpha, beta, gamma)
            a = _apply_cols(a, p_K, q_K, c, s, w)
            v = _apply_cols(v, p_K, q_K, c, s, w)
        if not bool((worst_B > tol).any().item()):
            break
    sigma_BN = torch.linalg.vector_norm(a, dim=-2)
    S_BN, order_BN = torch.sort(sigma_BN, dim=-1, descending=True)
    a = torch.gather(a, -1, order_BN[:, None, :].expand(B, m, n))
    V_BNN = torch.gather(v, -1, order_BN[:, None, :].expand(B, n, n))
    U_BMN = a / torch.where(S_BN > 0, S_BN, torch.ones_like(S_BN))[:, None, :].to(a.dtype)
    if n > 0:
        flagged_B = (S_BN[:, -1] <= S_BN[:, 0] * (eps * m)) | ~torch.isfinite(S_BN).all(-1)
        U_BMN = complete_columns(U_BMN, flagged_B)
    info = IterInfo(
        iters=torch.full((B,), sweeps, dtype=torch.int32, device=a.device),
        converged=worst_B <= tol,
        residual=worst_B,
    )
    return U_BMN, S_BN * scale_B[:, None], V_BNN.mH, info
