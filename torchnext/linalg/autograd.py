"""Backward formulas for ``polar`` and ``matrix_sqrth`` (absent from torch 2.13).

When to use: the public functions wrap their forward in these ``autograd.Function``s
whenever the input requires grad, so any forward route (Newton-Schulz, QDWH, SVD,
eigh, Jacobi) shares one backward. Both backwards are written in the eigenbasis of
a Hermitian positive (semi-)definite factor and only ever divide by *sums* of its
eigenvalues, so they stay finite at repeated singular values/eigenvalues (where an
SVD- or eigh-composed backward divides by differences and returns inf/NaN).

What not to assume: the polar backward needs full column rank (it divides by
``sigma_i + sigma_j`` and, for tall A, by ``sigma_i``), as torch 2.14 documents; the
``matrix_sqrth`` backward needs A positive definite. Double backward is not provided.

Shape legend: ``M`` rows, ``N`` columns; batch dimensions lead and broadcast.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

__all__ = ["PolarFunction", "SqrthFunction", "polar_backward", "sqrth_backward"]

PolarImpl = Callable[[torch.Tensor], tuple[torch.Tensor, torch.Tensor]]
SqrthImpl = Callable[[torch.Tensor], torch.Tensor]


def polar_backward(
    U: torch.Tensor, H: torch.Tensor, gU: torch.Tensor | None, gH: torch.Tensor | None
) -> torch.Tensor:
    """Gradient w.r.t. tall ``A = U H`` (m >= n) from the gradients of ``U`` and ``H``.

    With ``H = V diag(s) V^H`` and ``W = U V`` (so ``A = W diag(s) V^H``): the H-part
    enters through ``H = U^H A``; the U-part is ``W [F o (M - M^H)] V^H`` with
    ``M = W^H G V``, ``F_ij = 1/(s_i + s_j)``, plus ``(I - U U^H) G H^{-1}`` when m > n.
    """
    A = U @ H
    G = gU if gU is not None else torch.zeros_like(U)
    gA = torch.zeros_like(A)
    if gH is not None:
        G = G + A @ gH.mH
        gA = gA + U @ gH
    s, V = torch.linalg.eigh(H)
    s = s.clamp_min(0)
    W = U @ V
    M = W.mH @ G @ V
    F = 1.0 / (s[..., :, None] + s[..., None, :])
    gA = gA + W @ ((M - M.mH) * F.to(M.dtype)) @ V.mH
    if U.shape[-2] > U.shape[-1]:
        h_inv = (V * (1.0 / s).to(V.dtype)[..., None, :]) @ V.mH
        gA = gA + (G - U @ (U.mH @ G)) @ h_inv
    return gA


def sqrth_backward(X: torch.Tensor, gX: torch.Tensor) -> torch.Tensor:
    """Gradient w.r.t. Hermitian ``A`` of ``X = A^{1/2}``: a Loewner matrix in X's eigenbasis.

    ``gA = Q [(Q^H gX Q) o L] Q^H`` with ``L_ij = 1/(mu_i + mu_j)``, ``mu`` = eig(X).
    """
    mu, Q = torch.linalg.eigh(X)
    L = 1.0 / (mu[..., :, None] + mu[..., None, :])
    return Q @ ((Q.mH @ gX @ Q) * L.to(Q.dtype)) @ Q.mH


class PolarFunction(torch.autograd.Function):
    """``(U, H) = impl(A)`` for tall ``A`` with :func:`polar_backward` as its backward."""

    @staticmethod
    def forward(ctx: Any, A: torch.Tensor, impl: PolarImpl) -> tuple[torch.Tensor, torch.Tensor]:
        with torch.no_grad():
            U, H = impl(A)
        ctx.save_for_backward(U, H)
        return U, H

    @staticmethod
    def backward(ctx: Any, gU: torch.Tensor | None, gH: torch.Tensor | None) -> tuple[Any, ...]:
        U, H = ctx.saved_tensors
        return polar_backward(U, H, gU, gH), None


class SqrthFunction(torch.autograd.Function):
    """``X = impl(A)`` for Hermitian ``A`` with :func:`sqrth_backward` as its backward."""

    @staticmethod
    def forward(ctx: Any, A: torch.Tensor, impl: SqrthImpl) -> torch.Tensor:
        with torch.no_grad():
            X = impl(A)
        ctx.save_for_backward(X)
        return X

    @staticmethod
    def backward(ctx: Any, gX: torch.Tensor) -> tuple[Any, ...]:
        (X,) = ctx.saved_tensors
        return sqrth_backward(X, gX), None
