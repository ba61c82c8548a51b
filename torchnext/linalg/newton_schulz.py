"""Matmul-only iterations with per-matrix convergence: polar factor and SPD square root.

When to use: the fast paths of :func:`~torchnext.linalg.polar` and
:func:`~torchnext.linalg.matrix_sqrth` for well-conditioned input. They cost only
batched matmuls, which (unlike LAPACK's batched loops) use every CPU thread and the
GPU's tensor cores. Each iteration also yields the convergence measure for free
(``X^H X`` resp. ``Z Y`` is needed for the next step anyway), so each matrix leaves
the active set as soon as it has converged, and the ones that would need too many
iterations are reported as unconverged for the caller's fallback.

What not to assume: these are *accurate* iterations (residual ~ n*eps at exit), not
Muon's fixed 5-step quintic, whose output has singular values anywhere in
[0.7, 1.2]. Ill-conditioned or rank-deficient matrices come back unconverged.

Polar: scaled cubic Newton-Schulz, ``X <- X (1.5 a I - 0.5 a^3 X^H X)`` with
``a = sqrt(3 / (1 + l + l^2))`` for the lower bound ``l`` of the singular values
(Chen & Chow's equioscillating scaling), which maps [l, 1] into [l', 1] with
l' ~ 2.6 l, then plain Newton-Schulz once l ~ 1.
SPD square root: Higham's coupled Newton-Schulz on ``A/s``, with the same scaling.
Both normalise by the cheapest tight upper bound of the largest singular value.

Shape legend: ``B`` batch, ``M`` rows, ``N`` columns.
"""

from __future__ import annotations

import math

import torch

from torchnext.linalg._info import IterInfo

__all__ = ["polar_newton_schulz", "sqrth_newton_schulz", "scaled_schedule"]


def _affine_(g: torch.Tensor, c_eye: float, c_g: float) -> torch.Tensor:
    """``G <- c_eye I + c_g G`` in place (scale, then bump the diagonal)."""
    g.mul_(c_g)
    g.diagonal(dim1=-2, dim2=-1).add_(c_eye)
    return g


def _affine(g: torch.Tensor, c_eye: float, c_g: float) -> torch.Tensor:
    """``c_eye I + c_g G`` as a new tensor."""
    return _affine_(g.clone(), c_eye, c_g)


def _residual_(g: torch.Tensor) -> torch.Tensor:
    """``||G - I||_F`` per matrix, leaving ``G - I`` in ``g`` (no temporary)."""
    g.diagonal(dim1=-2, dim2=-1).sub_(1)
    return torch.linalg.vector_norm(g.flatten(-2), dim=-1)


def _finish_all(
    last: torch.Tensor,
    out: torch.Tensor,
    active: torch.Tensor,
    whole: bool,
    conv_B: torch.Tensor,
    iters_B: torch.Tensor,
    k: int,
) -> torch.Tensor:
    """Record every active matrix as converged at step ``k`` with result ``last``.

    Returns the output: ``last`` itself while the active set is still the whole batch in
    order (no scatter), else ``out`` with ``last`` scattered into the active rows.
    """
    conv_B[active] = True
    iters_B[active] = k
    if whole:
        return last
    out[active] = last
    return out


def scaled_schedule(l0: float) -> list[float]:
    """Scaling factors ``a_k`` for the scaled cubic iteration from lower bound ``l0``."""
    alphas = []
    low = l0
    while low < 0.98:
        a = math.sqrt(3.0 / (1.0 + low + low * low))
        alphas.append(a)
        low = 1.5 * a * low - 0.5 * a**3 * low**3
    return alphas


def polar_newton_schulz(
    a_BMN: torch.Tensor, *, l0: float = 1e-2, extra_iters: int = 8
) -> tuple[torch.Tensor, IterInfo]:
    """Polar factor ``U`` of tall ``a_BMN`` (M >= N) and per-matrix convergence info.

    A matrix converges when ``||X^H X - I||_F <= sqrt(eps)/4``, after which one more
    step takes it to rounding level. Matrices still above 1 after the scaled phase,
    or unconverged ``extra_iters`` plain steps later, are returned unconverged (their
    rows of ``U`` are unspecified). ``info.residual`` is the last measured
    ``||X^H X - I||_F`` (before the final step).
    """
    B, m, n = a_BMN.shape
    real = a_BMN.real.dtype if a_BMN.is_complex() else a_BMN.dtype
    eps = torch.finfo(real).eps
    done_tol = 0.25 * math.sqrt(eps)  # the final step then lands well below eps
    # sigma_max <= min(||A||_F, sqrt(||A||_1 ||A||_inf)): the tighter the bound, the
    # larger the smallest scaled singular value and the fewer steps.
    mag = a_BMN.abs()
    hoelder = (mag.sum(-2).amax(-1) * mag.sum(-1).amax(-1)).sqrt()
    norm_B = torch.minimum(torch.linalg.matrix_norm(a_BMN), hoelder)
    x = a_BMN / norm_B.clamp_min(torch.finfo(real).tiny)[:, None, None].to(a_BMN.dtype)
    out = torch.empty_like(x)
    iters_B = torch.zeros(B, dtype=torch.int32, device=x.device)
    conv_B = torch.zeros(B, dtype=torch.bool, device=x.device)
    resid_B = torch.full((B,), float("inf"), dtype=real, device=x.device)
    active = torch.arange(B, device=x.device)
    whole = True  # active is still arange(B): results can be written without scatter
    # Every product goes into a buffer allocated once per active-set size: a fresh
    # multi-megabyte tensor per GEMM costs page faults that, on the CPU, can take as
    # long as the GEMM itself.
    x_next = torch.empty_like(x)
    xtx = x.new_empty(B, n, n)
    alphas = scaled_schedule(l0)
    k = 0
    while active.numel() > 0 and k < len(alphas) + extra_iters:
        a = alphas[k] if k < len(alphas) else 1.0
        torch.matmul(x.mH, x, out=xtx)
        k += 1
        # The update factor is 1.5a I - 0.5a^3 X^H X; below it is built from
        # D = X^H X - I (which the plain phase measures) as (1.5a - 0.5a^3) I - 0.5a^3 D.
        c_eye, c_g = 1.5 * a - 0.5 * a**3, -0.5 * a**3
        if k <= len(alphas):
            xtx.diagonal(dim1=-2, dim2=-1).sub_(1)
        else:
            # Plain phase: measure, retire the converged, drop the hopeless.
            r_b = _residual_(xtx)
            resid_B[active] = r_b
            fin = r_b <= done_tol
            hopeless = (r_b > 1.0) | ~torch.isfinite(r_b)
            keep = ~(fin | hopeless)
            if bool(fin.all()):
                # Usual case: the whole active set finishes together; no gathers.
                last = torch.matmul(x, _affine_(xtx, 1.0, -0.5), out=x_next)
                out = _finish_all(last, out, active, whole, conv_B, iters_B, k)
                active = active[:0]
                break
            if bool(fin.any()):
                out[active[fin]] = x[fin] @ _affine(xtx[fin], 1.0, -0.5)
                conv_B[active[fin]] = True
                iters_B[active[fin]] = k
            iters_B[active[hopeless]] = k
            if not bool(keep.all()):
                whole = False
                active, x, xtx = active[keep], x[keep], xtx[keep]
                if active.numel() == 0:
                    break
                x_next = torch.empty_like(x)
        torch.matmul(x, _affine_(xtx, c_eye, c_g), out=x_next)
        x, x_next = x_next, x
    iters_B[active] = k
    return out, IterInfo(iters=iters_B, converged=conv_B, residual=resid_B)


# The square root's fast path is meant for condition numbers up to ~10: with
# s / lambda_max <= 1.1 that puts sqrt(lambda_min / s) above 0.3. Worse-conditioned
# matrices still converge, in extra plain steps; those that do not within the budget
# are reported unconverged (the caller falls back to eigh).
SQRTH_L0 = 0.3


def sqrth_newton_schulz(
    a_BNN: torch.Tensor, *, l0: float = SQRTH_L0, extra_iters: int = 8
) -> tuple[torch.Tensor, IterInfo, torch.Tensor]:
    """Principal square root of Hermitian positive-definite ``a_BNN`` by coupled NS.

    ``Y0 = A/s, Z0 = I`` with ``s = min(||A||_F, ||A||_inf)``; ``T = a (3I - a^2 Z Y)/2``,
    ``Y <- Y T``, ``Z <- T Z``; ``Y -> (A/s)^{1/2}``. On each eigenvalue ``x = lambda/s``
    the map is Newton-Schulz on ``sqrt(x)``, so the polar iteration's scaling ``a_k``
    (from the assumed lower bound ``l0`` on ``sqrt(lambda_min/s)``) applies unchanged. A
    matrix converges when ``||Z Y - I||_F <= sqrt(eps)/4`` (one more step follows).
    Unconverged matrices (indefinite ones, whose x stays <= 0, or too ill-conditioned
    for the budget) are flagged; their rows are unspecified.

    Returns ``(X, info, recon_B)`` with ``recon_B = ||X X - A||_F / ||A||_F`` per matrix
    (the caller's accuracy gate; computed here, in a buffer the loop no longer needs).
    """
    B, n, _ = a_BNN.shape
    real = a_BNN.real.dtype if a_BNN.is_complex() else a_BNN.dtype
    eps = torch.finfo(real).eps
    done_tol = 0.25 * math.sqrt(eps)  # the final step then lands well below eps
    # lambda_max <= min(||A||_F, ||A||_inf) for Hermitian A; the tighter the bound, the
    # larger the smallest scaled eigenvalue and the fewer steps.
    fro = torch.linalg.matrix_norm(a_BNN)
    row = a_BNN.abs().sum(-1).amax(-1)  # ||A||_inf; matrix_norm(ord=inf) is ~10x slower here
    s_B = torch.minimum(fro, row).clamp_min(torch.finfo(real).tiny)
    y = a_BNN / s_B[:, None, None].to(a_BNN.dtype)
    out = torch.empty_like(y)
    iters_B = torch.zeros(B, dtype=torch.int32, device=y.device)
    conv_B = torch.zeros(B, dtype=torch.bool, device=y.device)
    resid_B = torch.full((B,), float("inf"), dtype=real, device=y.device)
    active = torch.arange(B, device=y.device)
    whole = True  # active is still arange(B): results can be written without scatter
    sqrt_s = s_B.sqrt()
    alphas = scaled_schedule(l0)
    budget = len(alphas) + extra_iters
    # Products go into buffers allocated once per active-set size (see the polar loop).
    zy, y_next, z = torch.empty_like(y), torch.empty_like(y), torch.empty_like(y)
    z_next = torch.empty_like(y)
    if not alphas:  # no scaled phase: start from Z0 = I explicitly
        z.zero_().diagonal(dim1=-2, dim2=-1).fill_(1)
    k = 0
    while active.numel() > 0 and k < budget:
        a = alphas[k] if k < len(alphas) else 1.0
        k += 1
        # T = 1.5a I - 0.5a^3 ZY, built from D = ZY - I (which the plain phase
        # measures) as (1.5a - 0.5a^3) I - 0.5a^3 D.
        c_eye, c_g = 1.5 * a - 0.5 * a**3, -0.5 * a**3
        if k == 1 and alphas:
            # Z0 = I: ZY = Y0, and Z1 = T1 goes straight into Z's buffer.
            torch.mul(y, c_g, out=z)
            z.diagonal(dim1=-2, dim2=-1).add_(1.5 * a)
            torch.matmul(y, z, out=y_next)
            y, y_next = y_next, y
            continue
        torch.matmul(z, y, out=zy)
        if k <= len(alphas):
            zy.diagonal(dim1=-2, dim2=-1).sub_(1)
        else:
            r_b = _residual_(zy)
            resid_B[active] = r_b
            fin = r_b <= done_tol
            hopeless = ~torch.isfinite(r_b) | (r_b > 1.0)
            if bool(fin.all()):
                # Usual case: the whole active set finishes together; no gathers.
                last = torch.matmul(y, _affine_(zy, 1.0, -0.5), out=y_next)
                last.mul_(sqrt_s[active][:, None, None].to(y.dtype))
                done = _finish_all(last, out, active, whole, conv_B, iters_B, k)
                if done is not out:  # the loop buffer became the output; reuse the other
                    out, y_next = done, out
                active = active[:0]
                break
            if bool(fin.any()):
                idx = active[fin]
                last = y[fin] @ _affine(zy[fin], 1.0, -0.5)
                out[idx] = last * sqrt_s[idx][:, None, None].to(y.dtype)
                conv_B[idx] = True
                iters_B[idx] = k
            iters_B[active[hopeless]] = k
            keep = ~(fin | hopeless)
            if not bool(keep.all()):
                whole = False
                active, y, zy, z = active[keep], y[keep], zy[keep], z[keep]
                if active.numel() == 0:
                    break
                y_next, z_next = torch.empty_like(y), torch.empty_like(y)
        # Y <- Y T and Z <- T Z are plain GEMMs.
        t = _affine_(zy, c_eye, c_g)
        torch.matmul(y, t, out=y_next)
        torch.matmul(t, z, out=z_next)
        y, y_next, z, z_next = y_next, y, z_next, z
    iters_B[active] = k
    # Reconstruction residual, in a loop buffer when one of full size is free.
    scratch = y_next if y_next.shape[0] == B and y_next is not out else torch.empty_like(out)
    torch.matmul(out, out, out=scratch)
    scratch.sub_(a_BNN)
    recon_B = torch.linalg.matrix_norm(scratch) / fro.clamp_min(torch.finfo(real).tiny)
    return out, IterInfo(iters=iters_B, converged=conv_B, residual=resid_B), recon_B
