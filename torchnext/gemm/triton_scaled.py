# mypy: disable-error-code="no-untyped-def"
"""The block-scaled Triton GEMM behind :func:`torchnext.gemm.scaled_mm` on GPUs without a
native kernel for the recipe: FP8 TensorWise/RowWise, DeepSeek 1x128/128x128, MXFP8/MXFP4
(1x32, e8m0) and NVFP4 (1x16, e4m3, optional tensor-wise level).

When to use: through ``scaled_mm`` (which routes here on CUDA when torch refuses the recipe);
call :func:`scaled_mm_triton` directly only with operands ``scaled_mm`` validated. Importing
this module imports Triton (the ``[gpu]`` extra); ``import torchnext.gemm`` does not.

The kernel follows Triton's matmul tutorial (grouped tile order, one output tile per program)
and treats each operand's scales by where they change along K:

- ``PRE``: blocks smaller than the K tile (MX 32, NVFP4 16). Each loaded tile is decoded and
  multiplied by its scales before the dot; the products are exact in bfloat16 (FP4 x e4m3
  needs 6 significant bits, FP8 x a power of two 4), so the dot loses nothing. For MX both
  sides, ``tl.dot_scaled`` takes the raw e8m0 scales instead where this Triton has it.
- ``TILE``: blocks as long as whole K tiles (1x128, 128x128): the tile's dot is scaled once.
- ``ROW``: one scale per row (RowWise), applied in the epilogue; TensorWise folds into alpha.

What not to assume: FP8 data is decoded from its bits in the kernel (exact, NaN kept), so GPUs
without FP8 conversion instructions run it; the native FP8 dot is used only on sm89+ when no
side needs ``PRE`` scaling. Under ``TRITON_INTERPRET=1`` (the CPU tests) the dot runs in
float32 because the interpreter cannot multiply bfloat16; everything else is the same code.

Shape legend: ``M`` output rows, ``N`` output columns, ``K`` contraction (unpacked), ``G``
scale groups along K, ``R`` rows of an operand (M for a, N for b).
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl
from torch import Tensor

from torchnext.gemm.formats import ScaledOperand

__all__ = ["scaled_mm_triton", "tile_config"]

NONE, PRE, TILE, ROW = 0, 1, 2, 3
DOT_BF16, DOT_F32, DOT_FP8, DOT_SCALED = 0, 1, 2, 3
_FMT_CODE = {"e4m3": 0, "e5m2": 1, "e2m1": 2}


@triton.jit
def _fp8_bits_to_f32(byte, E5M2: tl.constexpr):
    """float8 bits (int32 0..255) -> float32, exact; NaN and inf kept."""
    if E5M2:
        e = (byte >> 2) & 31
        m = byte & 3
        normal = (((e + 112) << 23) | (m << 21)).to(tl.float32, bitcast=True)
        sub = m.to(tl.float32) * 1.52587890625e-05  # m * 2**-16
        mag = tl.where(e == 0, sub, normal)
        mag = tl.where(e == 31, tl.where(m == 0, float("inf"), float("nan")), mag)
    else:
        e = (byte >> 3) & 15
        m = byte & 7
        normal = (((e + 120) << 23) | (m << 20)).to(tl.float32, bitcast=True)
        sub = m.to(tl.float32) * 0.001953125  # m * 2**-9
        mag = tl.where(e == 0, sub, normal)
        mag = tl.where((byte & 0x7F) == 0x7F, float("nan"), mag)
    return tl.where(byte >= 128, -mag, mag)


@triton.jit
def _e2m1_to_f32(code):
    """e2m1 code (int32 0..15) -> float32 (E2M1_VALUES[code]), without a table."""
    e = (code >> 1) & 3
    half = (code & 1).to(tl.float32) * 0.5
    mag = tl.where(e == 0, half, tl.where(e == 1, 1.0 + half, (1.0 + half) * (2.0 * e - 2.0)))
    return tl.where(code >= 8, -mag, mag)


@triton.jit
def _load_tile(ptr, rows, k0, R, K, s_r, s_k, FMT: tl.constexpr, RAW: tl.constexpr,
               BLOCK_R: tl.constexpr, BLOCK_K: tl.constexpr):  # fmt: skip
    """Rows ``rows`` x K range ``k0 + [0, BLOCK_K)``: float32, or the raw bytes if RAW."""
    if FMT == 2:  # e2m1, two codes per byte along K
        kp = k0 // 2 + tl.arange(0, BLOCK_K // 2)
        mask = (rows[:, None] < R) & (kp[None, :] < K // 2)
        byte = tl.load(ptr + rows[:, None] * s_r + kp[None, :] * s_k, mask=mask, other=0)
        if RAW:
            return byte
        code = byte.to(tl.int32)
        pair = tl.join(_e2m1_to_f32(code & 15), _e2m1_to_f32(code >> 4))
        return tl.reshape(pair, (BLOCK_R, BLOCK_K))
    kk = k0 + tl.arange(0, BLOCK_K)
    mask = (rows[:, None] < R) & (kk[None, :] < K)
    byte = tl.load(ptr + rows[:, None] * s_r + kk[None, :] * s_k, mask=mask, other=0)
    if RAW:
        return byte
    return _fp8_bits_to_f32(byte.to(tl.int32), FMT == 1)


@triton.jit
def _scale_vec(sptr, rows, g, R, ss_r, ss_g, RB: tl.constexpr):
    """float32 scales of ``rows`` at group ``g`` (1.0 past the last row)."""
    return tl.load(sptr + (rows // RB) * ss_r + g * ss_g, mask=rows < R, other=1.0)


@triton.jit
def _pre_scale(v, sptr, rows, k0, R, G, ss_r, ss_g, RB: tl.constexpr, KB: tl.constexpr,
               BLOCK_R: tl.constexpr, BLOCK_K: tl.constexpr):  # fmt: skip
    g = k0 // KB + tl.arange(0, BLOCK_K // KB)
    mask = (rows[:, None] < R) & (g[None, :] < G)
    s = tl.load(sptr + (rows // RB)[:, None] * ss_r + g[None, :] * ss_g, mask=mask, other=0.0)
    v3 = tl.reshape(v, (BLOCK_R, BLOCK_K // KB, KB)) * s[:, :, None]
    return tl.reshape(v3, (BLOCK_R, BLOCK_K))


@triton.jit
def scaled_mm_kernel(
    a_ptr, b_ptr, out_ptr, sa_ptr, sb_ptr, bias_ptr,
    M, N, K, GA, GB,
    s_am, s_ak, s_bn, s_bk, s_om, s_on,
    ss_ar, ss_ag, ss_br, ss_bg,
    alpha,
    FMT_A: tl.constexpr, FMT_B: tl.constexpr, NAME_A: tl.constexpr, NAME_B: tl.constexpr,
    MODE_A: tl.constexpr, MODE_B: tl.constexpr,
    RB_A: tl.constexpr, KB_A: tl.constexpr, RB_B: tl.constexpr, KB_B: tl.constexpr,
    DOT: tl.constexpr, RAW: tl.constexpr, HAS_BIAS: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
):  # fmt: skip
    """``out[M, N] = alpha * sum_k A[m, k] B[n, k] (+ bias[n])`` with A, B block-scaled ``[R, K]``."""
    pid = tl.program_id(0)
    tiles_m = tl.cdiv(M, BLOCK_M)
    tiles_n = tl.cdiv(N, BLOCK_N)
    per_group = GROUP_M * tiles_n
    first_m = (pid // per_group) * GROUP_M
    size_m = min(tiles_m - first_m, GROUP_M)
    pid_m = first_m + (pid % per_group) % size_m
    pid_n = (pid % per_group) // size_m
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        a = _load_tile(a_ptr, rm, k0, M, K, s_am, s_ak, FMT_A, RAW, BLOCK_M, BLOCK_K)
        b = _load_tile(b_ptr, rn, k0, N, K, s_bn, s_bk, FMT_B, RAW, BLOCK_N, BLOCK_K)
        if DOT == 3:
            g = k0 // 32 + tl.arange(0, BLOCK_K // 32)
            ma = (rm[:, None] < M) & (g[None, :] < GA)
            mb = (rn[:, None] < N) & (g[None, :] < GB)
            sa = tl.load(sa_ptr + rm[:, None] * ss_ar + g[None, :] * ss_ag, mask=ma, other=127)
            sb = tl.load(sb_ptr + rn[:, None] * ss_br + g[None, :] * ss_bg, mask=mb, other=127)
            acc = tl.dot_scaled(a, sa, NAME_A, tl.trans(b), sb, NAME_B, acc)
        else:
            if MODE_A == 1:
                a = _pre_scale(a, sa_ptr, rm, k0, M, GA, ss_ar, ss_ag, RB_A, KB_A, BLOCK_M, BLOCK_K)
            if MODE_B == 1:
                b = _pre_scale(b, sb_ptr, rn, k0, N, GB, ss_br, ss_bg, RB_B, KB_B, BLOCK_N, BLOCK_K)
            if DOT == 2:
                ta = a.to(tl.float8e5 if FMT_A == 1 else tl.float8e4nv, bitcast=True)
                tb = b.to(tl.float8e5 if FMT_B == 1 else tl.float8e4nv, bitcast=True)
                part = tl.dot(ta, tl.trans(tb))
            elif DOT == 1:
                part = tl.dot(a, tl.trans(b), input_precision="ieee")
            else:
                part = tl.dot(a.to(tl.bfloat16), tl.trans(b.to(tl.bfloat16)))
            if MODE_A == 2:
                part = part * _scale_vec(sa_ptr, rm, k0 // KB_A, M, ss_ar, ss_ag, RB_A)[:, None]
            if MODE_B == 2:
                part = part * _scale_vec(sb_ptr, rn, k0 // KB_B, N, ss_br, ss_bg, RB_B)[None, :]
            acc += part
    if MODE_A == 3:
        acc = acc * _scale_vec(sa_ptr, rm, 0, M, ss_ar, ss_ag, RB_A)[:, None]
    if MODE_B == 3:
        acc = acc * _scale_vec(sb_ptr, rn, 0, N, ss_br, ss_bg, RB_B)[None, :]
    acc = acc * alpha
    if HAS_BIAS:
        acc += tl.load(bias_ptr + rn, mask=rn < N, other=0.0).to(tl.float32)[None, :]
    mask = (rm[:, None] < M) & (rn[None, :] < N)
    out = out_ptr + rm[:, None] * s_om + rn[None, :] * s_on
    tl.store(out, acc.to(out_ptr.dtype.element_ty), mask=mask)


def _interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def _mode(op: ScaledOperand, block_k: int) -> int:
    if op.scales is None or op.k_block >= op.k and op.row_block >= op.rows:
        return NONE  # tensor-wise: folded into alpha
    if op.k_block >= op.k:
        return ROW
    if op.k_block < block_k:
        return PRE
    return TILE


def tile_config(m: int, n: int, k_block: int) -> tuple[int, int, int, int, int]:
    """``(BLOCK_M, BLOCK_N, BLOCK_K, num_warps, num_stages)`` for a problem (a fixed table).

    BLOCK_K divides the 1x128 blocks so those scale once per tile; small M (decode) takes a
    narrow M tile. Under the interpreter the tiles are small, to keep the CPU tests short.
    """
    if _interpreting():
        return 16, 32, 64 if k_block % 64 == 0 or k_block <= 32 else 32, 1, 1
    bm = 16 if m <= 16 else (64 if m <= 64 else 128)
    return bm, 128, 128 if k_block % 128 == 0 or k_block <= 32 else 64, 4 if bm < 128 else 8, 3


def scaled_mm_triton(
    a: ScaledOperand,
    b: ScaledOperand,
    *,
    alpha: Tensor | None,
    bias: Tensor | None,
    out_dtype: torch.dtype,
    use_dot_scaled: bool | None = None,
) -> Tensor:
    """``out[M, N] = (deq(a) @ deq(b).T) * alpha + bias`` for operands ``scaled_mm`` validated.

    ``use_dot_scaled``: ``None`` takes ``tl.dot_scaled`` for MX operands where Triton has it;
    ``False`` forces the decode-and-scale path (the tests run both).
    """
    m, n, k = a.rows, b.rows, a.k
    kb = min(a.k_block if a.scales is not None else k, b.k_block if b.scales is not None else k)
    bm, bn, bk, warps, stages = tile_config(m, n, max(kb, 1))
    mode_a, mode_b = _mode(a, bk), _mode(b, bk)
    scalar = 1.0 if alpha is None else float(alpha)
    for op, mode in ((a, mode_a), (b, mode_b)):
        if mode == NONE and op.scales is not None:
            scalar *= float(op.scales.reshape(-1)[0])
    mx = a.raw_scales is not None and b.raw_scales is not None and a.k_block == b.k_block == 32
    dot_scaled = mx and (use_dot_scaled is None or use_dot_scaled) and hasattr(tl, "dot_scaled")
    if dot_scaled:
        dot = DOT_SCALED
    elif _interpreting():
        dot = DOT_F32
    elif (
        PRE not in (mode_a, mode_b)
        and a.fmt == b.fmt != "e2m1"
        and torch.cuda.get_device_capability(a.data.device) >= (8, 9)
    ):
        dot = DOT_FP8
    else:
        dot = DOT_BF16
    store_dtype = (
        out_dtype
        if out_dtype in (torch.float32, torch.bfloat16, torch.float16)
        else (torch.float32)
    )
    out_MN = torch.empty(m, n, dtype=store_dtype, device=a.data.device)
    if m == 0 or n == 0:
        return out_MN.to(out_dtype)
    placeholder = out_MN  # an unused pointer argument (its constexpr branch never reads it)
    if dot_scaled:
        sa_t, sb_t = a.raw_scales.view(torch.uint8), b.raw_scales.view(torch.uint8)  # type: ignore[union-attr]
    else:
        sa_t = a.scales if a.scales is not None else placeholder
        sb_t = b.scales if b.scales is not None else placeholder
    ga = sa_t.shape[1] if sa_t is not placeholder else 1
    gb = sb_t.shape[1] if sb_t is not placeholder else 1
    a_data, b_data = a.data.view(torch.uint8), b.data.view(torch.uint8)
    grid = (triton.cdiv(m, bm) * triton.cdiv(n, bn),)
    scaled_mm_kernel[grid](
        a_data, b_data, out_MN, sa_t, sb_t, bias if bias is not None else placeholder,
        m, n, k, ga, gb,
        a_data.stride(0), a_data.stride(1), b_data.stride(0), b_data.stride(1),
        out_MN.stride(0), out_MN.stride(1),
        sa_t.stride(0), sa_t.stride(1) if sa_t.dim() > 1 else 0,
        sb_t.stride(0), sb_t.stride(1) if sb_t.dim() > 1 else 0,
        scalar,
        FMT_A=_FMT_CODE[a.fmt], FMT_B=_FMT_CODE[b.fmt], NAME_A=a.fmt, NAME_B=b.fmt, MODE_A=mode_a, MODE_B=mode_b,
        RB_A=a.row_block, KB_A=max(a.k_block, 1), RB_B=b.row_block, KB_B=max(b.k_block, 1),
        DOT=dot, RAW=dot in (DOT_FP8, DOT_SCALED), HAS_BIAS=bias is not None,
        BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, GROUP_M=8, num_warps=warps, num_stages=stages,
    )  # fmt: skip
    return out_MN.to(out_dtype)
