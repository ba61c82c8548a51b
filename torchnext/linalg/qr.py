"""``qr`` with torch.linalg's signature: batch-split LAPACK on the CPU, or Householder.

When to use: as ``torch.linalg.qr`` on large batches of small matrices. On the CPU the
batch is cut across threads (LAPACK's batched loop is serial); ``method="householder"``
runs a vectorised batched Householder QR in torch ops, on any device (useful where
the vendor library has no batched QR, and as an independent reference).

What not to assume: the signs of R's diagonal (and Q's columns) follow whichever
route ran; LAPACK's may be negative, the Householder route's are chosen so that
``R[j, j]`` has the opposite sign of the pivot entry, as in LAPACK.

Shape legend: ``B`` flattened batch, ``M`` rows, ``N`` columns, ``K = min(M, N)``.
"""

from __future__ import annotations

import torch

from torchnext.linalg._checks import check_dtype, check_matrix
from torchnext.linalg._out import QRResult, torch_result, write_out
from torchnext.linalg.dispatch import run_batch_split, run_batch_split_into, threads_for
from torchnext.linalg.spectral import plain_torch_needed

__all__ = ["qr", "householder_qr"]

_MODES = ("reduced", "complete", "r")


def householder_qr(a_BMN: torch.Tensor, mode: str = "reduced") -> tuple[torch.Tensor, torch.Tensor]:
    """Batched Householder QR in torch ops; same ``mode`` semantics as torch."""
    B, m, n = a_BMN.shape
    k = min(m, n)
    r = a_BMN.clone()
    real = r.real.dtype if r.is_complex() else r.dtype
    tiny = torch.finfo(real).tiny
    vs: list[torch.Tensor] = []
    taus: list[torch.Tensor] = []
    for j in range(k):
        x = r[:, j:, j]
        norm = torch.linalg.vector_norm(x, dim=-1)
        x0 = x[:, 0]
        mag0 = x0.abs()
        phase = torch.where(mag0 > 0, x0 * mag0.clamp_min(tiny).reciprocal(), torch.ones_like(x0))
        alpha = -phase * norm
        v = x.clone()
        v[:, 0] = x0 - alpha
        vnorm2 = (v.abs() ** 2).sum(-1)
        # tau = 2/||v||^2; a zero column (norm 0) gets tau = 0, i.e. the identity.
        tau = torch.where(vnorm2 > 0, 2.0 / vnorm2.clamp_min(tiny), torch.zeros_like(vnorm2))
        w = torch.einsum("bi,bij->bj", v.conj(), r[:, j:, j:])
        r[:, j:, j:] -= (tau[:, None] * v)[:, :, None] * w[:, None, :]
        vs.append(v)
        taus.append(tau)
    R = r.triu()
    if mode == "r":
        return torch.empty(0, dtype=r.dtype, device=r.device), R[:, :k, :] if m > n else R
    cols = m if mode == "complete" else k
    q = torch.eye(m, cols, dtype=r.dtype, device=r.device).expand(B, m, cols).clone()
    for j in reversed(range(k)):
        v, tau = vs[j], taus[j]
        w = torch.einsum("bi,bij->bj", v.conj(), q[:, j:, :])
        q[:, j:, :] -= (tau[:, None] * v)[:, :, None] * w[:, None, :]
    if mode == "reduced":
        R = R[:, :k, :]
    return q, R


def qr(
    A: torch.Tensor,
    mode: str = "reduced",
    *,
    method: str = "auto",
    out: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> QRResult:
    """QR decomposition ``A = Q R``; see ``torch.linalg.qr``.

    ``mode``: ``"reduced"`` (default), ``"complete"`` or ``"r"`` (Q empty). NaN entries
    propagate, as in torch. ``method``: ``"auto"``, ``"lapack"`` or ``"householder"``.
    """
    fn_name = "linalg.qr"
    check_matrix(fn_name, A)
    check_dtype(fn_name, A)
    if mode not in _MODES:
        raise RuntimeError(
            f"qr received unrecognized mode '{mode}' but expected one of 'reduced' "
            "(default), 'r', or 'complete'"
        )
    if method not in ("auto", "lapack", "householder"):
        raise ValueError(f"qr: method={method!r} is not one of 'auto', 'lapack', 'householder'")
    batch = A.shape[:-2]
    m, n = A.shape[-2], A.shape[-1]
    flat = A.reshape(-1, m, n) if A.numel() > 0 else A
    plain = plain_torch_needed(A)
    if method == "auto" and A.device.type == "mps" and min(m, n) <= 32:
        # MPS QR support varies across torch versions (CPU fallback at best); the
        # Householder route is pure tensor ops and stays on the device.
        method = "householder"
    chunks = threads_for(A.device, flat.shape[0]) if A.dim() > 2 and not plain else 1
    if method == "householder" and not plain:
        Q_, R_ = householder_qr(flat.reshape(-1, m, n), mode)
    elif plain or chunks == 1:
        res = torch.linalg.qr(A, mode=mode)
        Q_, R_ = res.Q, res.R
    elif mode == "r":
        Q_, R_ = run_batch_split(
            lambda x: tuple(torch.linalg.qr(x, mode=mode)), [flat], chunks=chunks
        )
    else:
        k = min(m, n) if mode == "reduced" else m
        Q_ = flat.new_empty(flat.shape[0], m, k)
        R_ = flat.new_empty(flat.shape[0], k, n)
        run_batch_split_into(
            lambda x, out: torch.linalg.qr(x, mode=mode, out=out), [flat], [Q_, R_], chunks=chunks
        )
    if mode != "r" and Q_.dim() == 3 and len(batch) != 1:
        Q_ = Q_.reshape(*batch, *Q_.shape[-2:])
    if R_.dim() == 3 and len(batch) != 1:
        R_ = R_.reshape(*batch, *R_.shape[-2:])
    if out is not None:
        write_out(fn_name, out, (Q_, R_))
        Q_, R_ = out
    return torch_result("linalg_qr", QRResult, (Q_, R_))
