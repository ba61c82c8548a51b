"""Triton GEMV for 4-bit weights (NVFP4, MXFP4, int4) on any GPU Triton runs on.

When to use: through :func:`torchnext.gemm.gemv.linear`, which takes this route for a CUDA
:class:`~torchnext.gemm.quantized_weight.QuantizedWeight` and at most 8 rows of ``x``; call
:func:`q4_gemv` directly only to test it. Following the Triton matmul tutorial's shape:
:func:`q4_gemv` checks its operands, allocates the output, launches :func:`q4_gemv_kernel`.

One program owns ``BLOCK_N`` weight rows and one row of ``x``; it walks K in ``BLOCK_P``
packed bytes (``2 * BLOCK_P`` elements), decodes both nibbles of each byte through a 16-entry
table (held in L1), multiplies by the block scales decoded in registers (e4m3 and e8m0 from
their bits, so no float8 type is needed on the device) and accumulates in float32. The
full-precision weight never exists, in memory or in a tile beyond ``BLOCK_N x 2 BLOCK_P``.

What not to assume: this module imports Triton at import time, so only the route that runs
it imports it (``import torchnext.gemm`` never does). Tested on the CPU under Triton's
interpreter (``TRITON_INTERPRET=1``), where the same code runs on CPU tensors; the GPU timing
bars are measured only where a GPU is present.

Shape legend: ``M`` rows of x, ``N`` weight rows, ``K`` columns, ``P = K/2`` packed bytes,
``G = K/group`` scale groups.
"""

from __future__ import annotations

import os
from typing import no_type_check

import torch
import triton
import triton.language as tl
from torch import Tensor

from torchnext.errors import GemmInputError
from torchnext.gemm.quantized_weight import QuantizedWeight

__all__ = ["q4_gemv", "q4_gemv_kernel", "q4_gemv_rows"]

BLOCK_N = 32
BLOCK_P = 64


@triton.jit
@no_type_check  # Triton's DSL is not expressible in mypy's types
def _scale(s_ptr, idx, mask, KIND: tl.constexpr):
    # KIND: 0 e4m3 (as value * 2**-8, the CPU kernels' convention), 1 e8m0, else a float.
    if KIND == 0:
        b = tl.load(s_ptr + idx, mask=mask, other=0).to(tl.int32)
        e = (b >> 3) & 15
        mant = b & 7
        normal = (((e + 112) << 23) | (mant << 20)).to(tl.float32, bitcast=True)
        sub = mant.to(tl.float32) * 0.00000762939453125  # mant * 2**-17
        mag = tl.where(e == 0, sub, normal)
        return tl.where((b & 0x80) != 0, -mag, mag)
    elif KIND == 1:
        b = tl.load(s_ptr + idx, mask=mask, other=1).to(tl.int32)
        return tl.where(b == 0, 0x400000, b << 23).to(tl.float32, bitcast=True)
    else:
        return tl.load(s_ptr + idx, mask=mask, other=0).to(tl.float32)


@triton.jit
@no_type_check
def q4_gemv_kernel(
    x_ptr,
    codes_ptr,
    scales_ptr,
    zeros_ptr,
    vals_ptr,
    out_ptr,
    N,
    P,
    G,
    out_scale,
    GROUP: tl.constexpr,
    KIND: tl.constexpr,
    HAS_ZERO: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_P: tl.constexpr,
):
    """``out[m, n] = out_scale * sum_k x[m, k] * (vals[code] * scale + zero)``."""
    pid_n = tl.program_id(0)
    m = tl.program_id(1)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    n_ok = rn < N
    acc = tl.zeros([BLOCK_N], dtype=tl.float32)
    for p0 in range(0, P, BLOCK_P):
        rp = p0 + tl.arange(0, BLOCK_P)
        p_ok = rp < P
        ok = n_ok[:, None] & p_ok[None, :]
        byte = tl.load(codes_ptr + rn[:, None] * P + rp[None, :], mask=ok, other=0).to(tl.int32)
        v_lo = tl.load(vals_ptr + (byte & 15))
        v_hi = tl.load(vals_ptr + (byte >> 4))
        x_lo = tl.load(x_ptr + m * 2 * P + 2 * rp, mask=p_ok, other=0.0)
        x_hi = tl.load(x_ptr + m * 2 * P + 2 * rp + 1, mask=p_ok, other=0.0)
        sidx = rn[:, None] * G + (2 * rp[None, :]) // GROUP
        part = (v_lo * x_lo[None, :] + v_hi * x_hi[None, :]) * _scale(scales_ptr, sidx, ok, KIND)
        if HAS_ZERO:
            part += _scale(zeros_ptr, sidx, ok, KIND) * (x_lo + x_hi)[None, :]
        acc += tl.sum(part, axis=1)
    tl.store(out_ptr + m * N + rn, acc * out_scale, mask=n_ok)


def _byte_view(t: Tensor) -> Tensor:
    return t.view(torch.uint8) if t.element_size() == 1 else t


def q4_gemv_rows(
    x_MK: Tensor,
    codes_NP: Tensor,
    scales_NG: Tensor,
    zeros_NG: Tensor | None,
    kind: int,
    values: tuple[float, ...],
    out_scale: float,
    group: int,
) -> Tensor:
    """``out_scale * x_MK @ W.T`` (float32 ``[M, N]``) for a row-major 4-bit weight.

    ``W[n, k] = values[code] * scale(n, k // group) + zero(n, k // group)``, codes packed two
    per byte (low nibble first), scales read as :data:`~torchnext.gemm.gemv_cpu.SCALE_KINDS`.
    """
    m, k = x_MK.shape
    n, p = codes_NP.shape
    if x_MK.dtype != torch.float32 or 2 * p != k or k % group:
        raise GemmInputError(
            f"x_MK is {x_MK.dtype} [{m}, {k}] for codes [{n}, {p}] and group {group}; expected "
            f"float32 x with K = 2 * {p} divisible by the group"
        )
    interpreting = os.environ.get("TRITON_INTERPRET") == "1"
    if x_MK.device.type != "cuda" and not interpreting:
        raise GemmInputError(
            f"x_MK.device={x_MK.device}; expected a CUDA tensor (the CPU has its own kernels)"
        )
    out_MN = torch.empty((m, n), dtype=torch.float32, device=x_MK.device)
    vals = torch.tensor(values, dtype=torch.float32, device=x_MK.device)
    scales = _byte_view(scales_NG.contiguous())
    zeros = scales if zeros_NG is None else _byte_view(zeros_NG.contiguous())
    grid = (triton.cdiv(n, BLOCK_N), m)
    q4_gemv_kernel[grid](
        x_MK.contiguous(),
        codes_NP.contiguous(),
        scales,
        zeros,
        vals,
        out_MN,
        n,
        p,
        k // group,
        out_scale,
        GROUP=group,
        KIND=kind,
        HAS_ZERO=zeros_NG is not None,
        BLOCK_N=BLOCK_N,
        BLOCK_P=BLOCK_P,
    )
    return out_MN


def q4_gemv(x_MK: Tensor, w: QuantizedWeight) -> Tensor:
    """``x_MK @ w.dequantize().T`` in float32 (``[M, N]``) with the Triton kernel."""
    return q4_gemv_rows(
        x_MK,
        w.codes_rows(),
        w.scales_rows(),
        w.zeros_rows(),
        w.scale_kind,
        w.VALUES,
        w.out_scale,
        w.block_size,
    )
