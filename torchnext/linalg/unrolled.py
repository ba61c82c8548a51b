"""Unrolled Jacobi eigh and SVD for tiny real matrices (n <= 8) over a large batch.

When to use: a big batch (thousands) of tiny real matrices on the CPU, where
LAPACK's per-matrix call overhead dominates (``torch.linalg.eigh`` spends ~3.7 us on
each 4x4). Here every matrix entry is its own contiguous length-``B`` vector, so a
Jacobi rotation is a few dozen elementwise torch ops over the whole batch, with no
gathers, no temporaries of matrix size and a working set that stays in cache.

What not to assume: the op count grows like n^3 per sweep, so beyond n ~ 8-12 LAPACK
wins; the dispatcher measures the crossover, not this module. Complex input is not
handled here (the vectorised :mod:`torchnext.linalg.jacobi` is). No autograd: callers
wrap the results (see :mod:`torchnext.linalg.autograd`).

Shape legend: ``B`` flattened batch, ``M`` rows, ``N`` columns / order.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch

from torchnext.linalg._info import IterInfo
from torchnext.linalg._ordering import round_robin

__all__ = ["eigh_unrolled", "svd_unrolled", "flush_denormals", "MAX_SWEEPS"]

MAX_SWEEPS = 16
"""Sweep cap; Jacobi converges quadratically, 4-7 sweeps are typical for n <= 8."""

Vec = torch.Tensor  # one matrix entry over the batch, shape (B,)


_DENORMAL = torch.tensor([1e-39], dtype=torch.float32)


@contextlib.contextmanager
def flush_denormals() -> Iterator[None]:
    """Flush subnormals to zero on this thread for the block, then restore the mode.

    Jacobi drives off-diagonal entries to zero quadratically; their squares become
    subnormal and every elementwise op touching them runs 3-6x slower on x86. The
    previous mode is probed (a subnormal times one is zero iff flushing is on) because
    torch offers a setter but no getter.
    """
    was_on = bool((_DENORMAL * 1.0).item() == 0.0)
    if was_on or not torch.set_flush_denormal(True):
        yield
        return
    try:
        yield
    finally:
        torch.set_flush_denormal(False)


def _pairs(n: int) -> list[tuple[int, int]]:
    """Round-robin order (see :mod:`._ordering`), flattened for sequential rotations."""
    return [pair for rnd in round_robin(n) for pair in rnd]


def _rotation(d: Vec, apq: Vec, tiny: float) -> tuple[Vec, Vec, Vec]:
    """(t, c, s) zeroing the off-diagonal of [[x, apq], [apq, x + d]].

    ``t = sign(d) 2 apq / (|d| + hypot(d, 2 apq))`` is the smaller root of the
    rotation quadratic; ``tiny`` keeps 0/0 (already diagonal, equal entries) at t = 0.
    """
    apq2 = apq + apq
    # sqrt(d^2 + apq2^2) instead of hypot (unvectorised on CPU, ~30x slower): inputs
    # are pre-scaled to max|a| = 1, so the squares cannot overflow.
    root = torch.addcmul(d * d, apq2, apq2).sqrt_()
    den = d.abs().add_(root).add_(tiny)
    # |t| <= 1 in exact arithmetic; when both squares underflow (pivots ~1e-20 of the
    # pre-scaled matrix, flushed to zero) the quotient can exceed it.
    t = (apq2 / torch.copysign(den, d)).clamp_(-1.0, 1.0)
    c = (t * t).add_(1.0).rsqrt_()
    s = t * c
    return t, c, s


def _max_abs_scale(a_BMN: torch.Tensor) -> torch.Tensor:
    scale_B = a_BMN.abs().amax(dim=(-2, -1))
    return torch.where(scale_B > 0, scale_B, torch.ones_like(scale_B))


def _eigh_unrolled(
    a_BNN: torch.Tensor, *, lower: bool = True, tol: float | None = None
) -> tuple[torch.Tensor, torch.Tensor, IterInfo]:
    """Eigenvalues (ascending) and eigenvectors of real symmetric ``a_BNN``.

    Reads only the lower (``lower=True``) or upper triangle. Returns ``(L_BN, V_BNN,
    info)``; ``info.residual`` is the final ``off(A)/||A||_F`` per matrix.
    """
    B, n = a_BNN.shape[0], a_BNN.shape[-1]
    dtype = a_BNN.dtype
    if n < 2:
        info = IterInfo(
            iters=torch.zeros(B, dtype=torch.int32),
            converged=torch.ones(B, dtype=torch.bool),
            residual=torch.zeros(B, dtype=dtype),
        )
        return a_BNN.reshape(B, n).clone(), torch.ones_like(a_BNN), info
    eps = torch.finfo(dtype).eps
    # off(A) at rounding level is ~eps*||A|| per entry: ask for n times that, not less
    # (repeated eigenvalues otherwise stall at the floor for many sweeps).
    tol = eps * n if tol is None else tol
    tiny = torch.finfo(dtype).tiny
    scale_B = _max_abs_scale(a_BNN)
    # (N*N, B): row k*n+j is entry (k, j) of every matrix, contiguous over the batch.
    tri = a_BNN.tril() if lower else a_BNN.triu()
    flat = (tri / scale_B[:, None, None]).reshape(B, n * n).t().contiguous()
    a: list[list[Vec]] = [[flat[0]] * n for _ in range(n)]
    for i in range(n):
        for j in range(i, n):
            entry = flat[j * n + i] if lower else flat[i * n + j]
            a[i][j] = entry
            a[j][i] = entry
    zero = torch.zeros(B, dtype=dtype)
    one = torch.ones(B, dtype=dtype)
    v: list[list[Vec]] = [[one if i == j else zero for j in range(n)] for i in range(n)]
    diag_NB = torch.stack([a[i][i] for i in range(n)])
    offd_KB = torch.stack([a[i][j] for i in range(n) for j in range(i + 1, n)])
    norm2_B = (diag_NB * diag_NB).sum(0) + 2 * (offd_KB * offd_KB).sum(0)
    thr_B = norm2_B * (tol * tol)
    pairs = _pairs(n)
    sweeps = 0
    off2_B = torch.zeros(B, dtype=dtype)
    converged = True
    for sweep in range(1, MAX_SWEEPS + 1):
        sweeps = sweep
        for p, q in pairs:
            apq = a[p][q]
            t, c, s = _rotation(a[q][q] - a[p][p], apq, tiny)
            tapq = t * apq
            a[p][p] = a[p][p] - tapq
            a[q][q] = a[q][q] + tapq
            a[p][q] = a[q][p] = zero
            for k in range(n):
                if k == p or k == q:
                    continue
                akp, akq = a[k][p], a[k][q]
                nkp = torch.addcmul(c * akp, s, akq, value=-1.0)
                nkq = torch.addcmul(s * akp, c, akq)
                a[k][p] = a[p][k] = nkp
                a[k][q] = a[q][k] = nkq
            for i in range(n):
                vip, viq = v[i][p], v[i][q]
                v[i][p] = torch.addcmul(c * vip, s, viq, value=-1.0)
                v[i][q] = torch.addcmul(s * vip, c, viq)
        off_KB = torch.stack([a[i][j] for i in range(n) for j in range(i + 1, n)])
        off2_B = (off_KB * off_KB).sum(0)
        # NaN matrices count as done: more sweeps cannot fix them (NaN propagates).
        converged = not bool((off2_B > thr_B).any().item())
        if converged:
            break
    # Batch-last assembly as in the SVD: V_NNB[j, i] = V[i, j] of every matrix.
    L_NB, order_NB = torch.sort(torch.stack([a[i][i] for i in range(n)]), dim=0)
    v_NNB = torch.stack([v[i][j] for j in range(n) for i in range(n)]).view(n, n, B)
    v_NNB = torch.gather(v_NNB, 0, order_NB[:, None, :].expand(n, n, B))
    V_BNN = v_NNB.permute(2, 1, 0).contiguous()
    L_BN = L_NB.t().contiguous()
    residual_B = (off2_B / torch.where(norm2_B > 0, norm2_B, 1.0)).sqrt()
    conv_B = off2_B <= thr_B
    info = IterInfo(
        iters=torch.full((B,), sweeps, dtype=torch.int32), converged=conv_B, residual=residual_B
    )
    return L_BN * scale_B[:, None], V_BNN, info


def _svd_unrolled(
    a_BMN: torch.Tensor, *, tol: float | None = None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, IterInfo]:
    """Reduced SVD of real ``a_BMN`` with M >= N by one-sided (Hestenes) Jacobi.

    Returns ``(U_BMN, S_BN, Vh_BNN, info)`` with ``S`` descending. Columns of ``U``
    whose singular value is at the rounding floor are completed to an orthonormal set
    by a Householder QR of just the affected matrices (the failure mode of forming
    ``U = AV / sigma`` that broke torch 2.14's MPS kernel).
    """
    B, m, n = a_BMN.shape
    dtype = a_BMN.dtype
    eps = torch.finfo(dtype).eps
    tol = (eps * m**0.5) if tol is None else tol
    tiny = torch.finfo(dtype).tiny
    scale_B = _max_abs_scale(a_BMN)
    flat = (a_BMN / scale_B[:, None, None]).reshape(B, m * n).t().contiguous()
    # col[j][i]: entry (i, j); one-sided Jacobi works on columns only.
    col: list[list[Vec]] = [[flat[i * n + j] for i in range(m)] for j in range(n)]
    zero = torch.zeros(B, dtype=dtype)
    one = torch.ones(B, dtype=dtype)
    v: list[list[Vec]] = [[one if i == j else zero for i in range(n)] for j in range(n)]
    pairs = _pairs(n)
    tol2 = tol * tol
    sweeps = 0
    worst_B = torch.zeros(B, dtype=dtype)
    converged = n < 2
    for sweep in range(1, MAX_SWEEPS + 1):
        sweeps = sweep
        if n < 2:
            break
        # Refresh squared column norms once a sweep; within it they are updated exactly.
        norm2 = [_dot(cj, cj) for cj in col]
        worst_B = torch.zeros(B, dtype=dtype)
        # Early sweeps never pass the test; skip its 4 ops per rotation there.
        track = sweep >= max(2, n // 2)
        for p, q in pairs:
            cp, cq = col[p], col[q]
            gamma = _dot(cp, cq)
            alpha, beta = norm2[p], norm2[q]
            if track:
                ratio = (gamma * gamma).div_((alpha * beta).add_(tiny))
                worst_B = torch.maximum(worst_B, ratio)
            else:
                worst_B = torch.full_like(worst_B, float("inf"))
            t, c, s = _rotation(beta - alpha, gamma, tiny)
            tg = t * gamma
            norm2[p] = alpha - tg
            norm2[q] = beta + tg
            col[p] = [torch.addcmul(c * x, s, y, value=-1.0) for x, y in zip(cp, cq, strict=True)]
            col[q] = [torch.addcmul(s * x, c, y) for x, y in zip(cp, cq, strict=True)]
            vp, vq = v[p], v[q]
            v[p] = [torch.addcmul(c * x, s, y, value=-1.0) for x, y in zip(vp, vq, strict=True)]
            v[q] = [torch.addcmul(s * x, c, y) for x, y in zip(vp, vq, strict=True)]
        converged = not bool((worst_B > tol2).any().item())
        if converged:
            break
    # Assemble batch-last (contiguous stacks of the entry vectors, sort and gather
    # along dim 0), then one transposing copy to torch's (B, M, N) layout.
    sigma_NB = torch.stack([_dot(cj, cj) for cj in col]).sqrt_()
    S_NB, order_NB = torch.sort(sigma_NB, dim=0, descending=True)
    w_NMB = torch.stack([x for cj in col for x in cj]).view(n, m, B)
    v_NNB = torch.stack([x for vj in v for x in vj]).view(n, n, B)
    w_NMB = torch.gather(w_NMB, 0, order_NB[:, None, :].expand(n, m, B))
    v_NNB = torch.gather(v_NNB, 0, order_NB[:, None, :].expand(n, n, B))
    safe_NB = torch.where(S_NB > 0, S_NB, torch.ones_like(S_NB))
    U_BMN = (w_NMB / safe_NB[:, None, :]).permute(2, 1, 0).contiguous()
    Vh_BNN = v_NNB.permute(2, 0, 1).contiguous()
    S_BN = S_NB.t().contiguous()
    floor_B = S_BN[:, -1] <= S_BN[:, 0] * (eps * m) if n > 0 else torch.zeros(B, dtype=torch.bool)
    U_BMN = complete_columns(U_BMN, floor_B)
    info = IterInfo(
        iters=torch.full((B,), sweeps, dtype=torch.int32),
        converged=worst_B <= tol2,
        residual=worst_B.sqrt(),
    )
    return U_BMN, S_BN * scale_B[:, None], Vh_BNN, info


def eigh_unrolled(
    a_BNN: torch.Tensor, *, lower: bool = True, tol: float | None = None
) -> tuple[torch.Tensor, torch.Tensor, IterInfo]:
    """Eigenvalues (ascending) and eigenvectors of real symmetric ``a_BNN``.

    Reads only the lower (``lower=True``) or upper triangle. Returns ``(L_BN, V_BNN,
    info)``; ``info.residual`` is the final ``off(A)/||A||_F`` per matrix.
    """
    with flush_denormals():
        return _eigh_unrolled(a_BNN, lower=lower, tol=tol)


def svd_unrolled(
    a_BMN: torch.Tensor, *, tol: float | None = None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, IterInfo]:
    """Reduced SVD of real ``a_BMN`` (M >= N): ``(U_BMN, S_BN, Vh_BNN, info)``.

    ``S`` is descending; ``info.residual`` is the largest cosine between two columns
    seen in the last sweep.
    """
    with flush_denormals():
        return _svd_unrolled(a_BMN, tol=tol)


def _dot(x: list[Vec], y: list[Vec]) -> Vec:
    acc = x[0] * y[0]
    for xi, yi in zip(x[1:], y[1:], strict=True):
        acc = torch.addcmul(acc, xi, yi)
    return acc


def complete_columns(U_BMN: torch.Tensor, flagged_B: torch.Tensor) -> torch.Tensor:
    """Orthonormalise the columns of the flagged matrices by Householder QR.

    Columns that are already orthonormal come back unchanged (up to rounding); zero
    columns are replaced by an orthonormal completion. Only the flagged matrices pay.
    """
    idx = torch.nonzero(flagged_B).flatten()
    if idx.numel() == 0:
        return U_BMN
    q_BMN, r_BNN = torch.linalg.qr(U_BMN[idx])
    diag_BN = torch.diagonal(r_BNN, dim1=-2, dim2=-1)
    sign_BN = torch.where(diag_BN.real < 0, -1.0, 1.0).to(q_BMN.dtype)
    out = U_BMN.clone()
    out[idx] = q_BMN * sign_BN[:, None, :]
    return out
