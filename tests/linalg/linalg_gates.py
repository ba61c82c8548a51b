"""Accuracy gates and input families shared by the linalg tests.

Gates follow the issue: Frobenius norms computed in float64 (complex128), maximum
over the batch, in units of ``n * eps(dtype)``.
"""

from __future__ import annotations

import torch

GATE_ORTH = 10.0
GATE_RECON = 10.0
GATE_CHOL = 2.0
GATE_QDWH_ORTH = 2.0

REAL = (torch.float32, torch.float64)
ALL = (torch.float32, torch.float64, torch.complex64, torch.complex128)


def eps_of(dtype: torch.dtype) -> float:
    real = torch.empty(0, dtype=dtype).real.dtype
    return torch.finfo(real).eps


def _wide(x: torch.Tensor) -> torch.Tensor:
    return x.to(torch.complex128) if x.is_complex() else x.to(torch.float64)


def orth_neps(Q: torch.Tensor, dtype: torch.dtype) -> float:
    """max_b ||Q^H Q - I||_F / (n eps) for the smaller side n (columns or rows)."""
    q = _wide(Q)
    if q.shape[-2] < q.shape[-1]:
        q = q.mH
    n = q.shape[-1]
    if n == 0 or q.numel() == 0:
        return 0.0
    gram = q.mH @ q - torch.eye(n, dtype=q.dtype)
    return float(torch.linalg.matrix_norm(gram).max()) / (n * eps_of(dtype))


def recon_neps(A: torch.Tensor, B: torch.Tensor, dtype: torch.dtype) -> float:
    """max_b ||A - B||_F / ||A||_F / (n eps); zero matrices count absolutely."""
    a, b = _wide(A), _wide(B)
    n = max(a.shape[-1], a.shape[-2])
    if a.numel() == 0:
        return 0.0
    den = torch.linalg.matrix_norm(a).clamp_min(1.0 if float(a.abs().max()) == 0 else 1e-300)
    return float((torch.linalg.matrix_norm(a - b) / den).max()) / (n * eps_of(dtype))


def prescribed(
    batch: int, m: int, n: int, sigma: torch.Tensor, dtype: torch.dtype, *, gen: torch.Generator
) -> torch.Tensor:
    """Matrices with singular values ``sigma`` (length min(m, n)) and random vectors."""
    work = torch.complex128 if dtype.is_complex else torch.float64
    k = min(m, n)
    u, _ = torch.linalg.qr(torch.randn(batch, m, k, dtype=work, generator=gen))
    v, _ = torch.linalg.qr(torch.randn(batch, n, k, dtype=work, generator=gen))
    return ((u * sigma.to(work)) @ v.mH).to(dtype)


def families(
    batch: int, m: int, n: int, dtype: torch.dtype, *, seed: int = 0
) -> dict[str, torch.Tensor]:
    """The issue's input families for general (non-Hermitian) matrices."""
    gen = torch.Generator().manual_seed(seed)
    k = min(m, n)
    eps = eps_of(dtype)
    out = {"gauss": torch.randn(batch, m, n, dtype=dtype, generator=gen)}
    if k >= 2:
        out["cond_1/eps"] = prescribed(
            batch,
            m,
            n,
            torch.logspace(0, -torch.log10(torch.tensor(eps)).item(), k, dtype=torch.float64),
            dtype,
            gen=gen,
        )
        out["cond_1e3"] = prescribed(
            batch, m, n, torch.linspace(1e3, 1, k, dtype=torch.float64), dtype, gen=gen
        )
        rank = torch.ones(k, dtype=torch.float64)
        rank[k // 2 :] = 0
        out["rank_deficient"] = prescribed(batch, m, n, rank, dtype, gen=gen)
        rep = torch.ones(k, dtype=torch.float64)
        rep[: k // 2] = 2.0
        out["repeated"] = prescribed(batch, m, n, rep, dtype, gen=gen)
    out["zero"] = torch.zeros(batch, m, n, dtype=dtype)
    return out


def hermitian_families(
    batch: int, n: int, dtype: torch.dtype, *, seed: int = 0
) -> dict[str, torch.Tensor]:
    """Hermitian inputs: Gaussian, repeated eigenvalues, wide spread, zero, indefinite."""
    gen = torch.Generator().manual_seed(seed)
    g = torch.randn(batch, n, n, dtype=dtype, generator=gen)
    work = torch.complex128 if dtype.is_complex else torch.float64
    q, _ = torch.linalg.qr(torch.randn(batch, n, n, dtype=work, generator=gen))
    lam = torch.ones(n, dtype=torch.float64)
    lam[: n // 2] = -3.0
    rep = ((q * lam.to(work)) @ q.mH).to(dtype)
    spread = ((q * torch.logspace(0, -6, n, dtype=torch.float64).to(work)) @ q.mH).to(dtype)
    return {
        "gauss": g + g.mH,
        "repeated": 0.5 * (rep + rep.mH),
        "spread": 0.5 * (spread + spread.mH),
        "zero": torch.zeros(batch, n, n, dtype=dtype),
    }


def spd(
    batch: int, n: int, dtype: torch.dtype, *, seed: int = 0, shift: float = 1.0
) -> torch.Tensor:
    """``X X^H / n + shift I``: the anchors' SPD family (condition number <= ~5)."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(batch, n, n, dtype=dtype, generator=gen)
    return x @ x.mH / n + shift * torch.eye(n, dtype=dtype)
