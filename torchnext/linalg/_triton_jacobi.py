"""Triton kernels for batched Jacobi eigh and SVD of real matrices with n <= 32 (CUDA).

When to use: through :func:`torchnext.linalg.eigh` / ``svd`` on CUDA, which route
here for n <= 32 when Triton is importable. One program owns one matrix, following
the MAGMA/MLX "one small matrix per thread block" pattern: the matrix lives in a
global-memory workspace that stays in L1/L2, each round of the round-robin parallel
ordering is one fused two-sided (eigh) or one-sided (SVD) update of the whole
padded block, and the sweep loop exits per matrix once its own stopping test holds.

What not to assume: real float32/float64 only (complex goes to the vectorised torch
Jacobi); eigenvalues/singular values come out unsorted and the Python wrappers sort
them. Triton is imported lazily, so this module imports without it; the tests run
the kernels on the CPU under ``TRITON_INTERPRET=1``.

Shape legend: ``B`` batch, ``M`` rows, ``N`` columns, ``R`` rounds, ``P`` padded size.
"""

from __future__ import annotations

import functools
import importlib.util
from types import ModuleType
from typing import Any

import torch

from torchnext.linalg._info import IterInfo
from torchnext.linalg._ordering import round_robin

__all__ = ["triton_available", "eigh_triton", "svd_triton", "MAX_N"]

MAX_N = 32
"""Largest order the kernels take (a 32x32 block per program)."""

_MAX_SWEEPS = 20


def triton_available() -> bool:
    """Whether Triton can be imported (it is an optional ``[gpu]`` extra)."""
    return importlib.util.find_spec("triton") is not None


def _partner_table(n: int, pad: int, device: torch.device) -> tuple[torch.Tensor, int]:
    """``(R, P)`` int32: the partner of index i in round r (i itself when idle)."""
    rounds = round_robin(n)
    table = torch.arange(pad, dtype=torch.int32).repeat(max(len(rounds), 1), 1)
    for r, pairs in enumerate(rounds):
        for p, q in pairs:
            table[r, p] = q
            table[r, q] = p
    return table.to(device), max(len(rounds), 1)


@functools.cache
def _kernels() -> tuple[Any, Any]:
    from torchnext.linalg import _triton_kernels

    return _triton_kernels.eigh_kernel, _triton_kernels.svd_kernel


def _triton() -> ModuleType:
    import triton

    return triton


def eigh_triton(
    a_BNN: torch.Tensor, *, lower: bool = True
) -> tuple[torch.Tensor, torch.Tensor, IterInfo]:
    """Ascending eigenvalues and eigenvectors of real symmetric ``a_BNN`` (n <= 32)."""
    B, n = a_BNN.shape[0], a_BNN.shape[-1]
    if n > MAX_N or a_BNN.is_complex():
        raise ValueError(
            f"eigh_triton: needs real matrices with n <= {MAX_N}; got n={n}, {a_BNN.dtype}"
        )
    eigh_kernel, _ = _kernels()
    dtype = a_BNN.dtype
    finfo = torch.finfo(dtype)
    tri = a_BNN.tril(-1) if lower else a_BNN.triu(1)
    sym = tri + tri.mT + torch.diag_embed(torch.diagonal(a_BNN, dim1=-2, dim2=-1))
    scale_B = sym.abs().amax(dim=(-2, -1)).clamp_min(finfo.tiny)
    work = (sym / scale_B[:, None, None]).contiguous()
    v = torch.eye(n, dtype=dtype, device=work.device).expand(B, n, n).contiguous()
    pad = max(2, _triton().next_power_of_2(n))
    table, rounds = _partner_table(n, pad, work.device)
    sweeps = torch.zeros(B, dtype=torch.int32, device=work.device)
    off = torch.zeros(B, dtype=dtype, device=work.device)
    if B > 0:
        eigh_kernel[(B,)](
            work,
            v,
            sweeps,
            off,
            table,
            n,
            rounds,
            finfo.eps * n,
            finfo.tiny,
            P=pad,
            MAX_SWEEPS=_MAX_SWEEPS,
        )
    L_BN, order_BN = torch.sort(torch.diagonal(work, dim1=-2, dim2=-1), dim=-1)
    V_BNN = torch.gather(v, -1, order_BN[:, None, :].expand(B, n, n))
    info = IterInfo(iters=sweeps, converged=off <= finfo.eps * n, residual=off)
    return L_BN * scale_B[:, None], V_BNN, info


def svd_triton(
    a_BMN: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, IterInfo]:
    """Reduced SVD of real ``a_BMN`` with N <= M <= 32: ``(U, S, Vh, info)``."""
    from torchnext.linalg.unrolled import complete_columns

    B, m, n = a_BMN.shape
    if m > MAX_N or n > m or a_BMN.is_complex():
        raise ValueError(
            f"svd_triton: needs real matrices with n <= m <= {MAX_N}; got {m}x{n}, {a_BMN.dtype}"
        )
    _, svd_kernel = _kernels()
    dtype = a_BMN.dtype
    finfo = torch.finfo(dtype)
    tol = finfo.eps * m**0.5
    scale_B = a_BMN.abs().amax(dim=(-2, -1)).clamp_min(finfo.tiny)
    work = (a_BMN / scale_B[:, None, None]).contiguous()
    v = torch.eye(n, dtype=dtype, device=work.device).expand(B, n, n).contiguous()
    tr = _triton()
    pad_n = max(2, tr.next_power_of_2(n))
    pad_m = max(2, tr.next_power_of_2(m))
    table, rounds = _partner_table(n, pad_n, work.device)
    sweeps = torch.zeros(B, dtype=torch.int32, device=work.device)
    worst = torch.zeros(B, dtype=dtype, device=work.device)
    if B > 0 and n > 1:
        svd_kernel[(B,)](
            work,
            v,
            sweeps,
            worst,
            table,
            m,
            n,
            rounds,
            tol,
            finfo.tiny,
            PM=pad_m,
            P=pad_n,
            MAX_SWEEPS=_MAX_SWEEPS,
        )
    sigma_BN = torch.linalg.vector_norm(work, dim=-2)
    S_BN, order_BN = torch.sort(sigma_BN, dim=-1, descending=True)
    w = torch.gather(work, -1, order_BN[:, None, :].expand(B, m, n))
    V_BNN = torch.gather(v, -1, order_BN[:, None, :].expand(B, n, n))
    U_BMN = w / torch.where(S_BN > 0, S_BN, torch.ones_like(S_BN))[:, None, :]
    if n > 0:
        U_BMN = complete_columns(U_BMN, S_BN[:, -1] <= S_BN[:, 0] * (finfo.eps * m))
    info = IterInfo(iters=sweeps, converged=worst <= tol, residual=worst)
    return U_BMN, S_BN * scale_B[:, None], V_BNN.mT, info
