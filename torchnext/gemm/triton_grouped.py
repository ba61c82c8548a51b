"""One Triton kernel for grouped GEMM on every GPU: a persistent tile scheduler over groups.

What it is: :func:`grouped_mm_triton` runs the four forms of
:func:`torchnext.gemm.grouped.grouped_mm` (groups of rows, of columns, along the contraction,
or a plain batch) in one launch. Like the grouped-GEMM Triton tutorial, a fixed number of
programs walks the tiles of every group in turn; unlike it, the groups come from the
``offs`` tensor on the device, so the host never reads the group sizes and launches before
knowing them. Rows (columns) past ``offs[-1]`` form one more pseudo-group whose tiles are
written as zeros, so the output needs no separate fill.

When to use it: :func:`~torchnext.gemm.grouped.grouped_mm` calls it on CUDA devices where
torch has no grouped kernel of its own (anything but sm90/sm100 bfloat16). Call it directly
only with inputs that function has already checked: here only the layout facts the kernel
relies on are checked.

What not to assume: Triton is optional (``pip install torchnext[gpu]``); importing this
module does not import it, the first launch does. float32 inputs are multiplied in IEEE
float32 unless ``torch.set_float32_matmul_precision`` allowed TF32, as torch's ``mm`` does. On the CPU the kernel
runs only under Triton's interpreter (``TRITON_INTERPRET=1`` set before Triton is imported),
which is how the tests check it.
"""

from __future__ import annotations

import importlib.util
from functools import cache
from typing import Any

import torch
from torch import Tensor

from torchnext.errors import GemmInputError, GemmUnsupportedError

__all__ = ["triton_available", "grouped_mm_triton", "kernel", "KERNEL_DTYPES"]

# Shape legend: G groups, M rows, K contraction, N columns; a_GMK / a_MK is mat_a, b_GKN /
# b_KN mat_b, c_GMN / c_MN the output, offs_G the groups' end offsets, bias_GN / bias_N.

KERNEL_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
"""Operand dtypes the kernel takes (Triton's ``tl.dot`` has no float64 on GPUs)."""

# Which dimension ``offs`` cuts, as the kernel's JAGGED constant.
_JAGGED = {"3d3d": 0, "2d3d": 1, "3d2d": 2, "2d2d": 3}


def triton_available() -> bool:
    """Whether Triton can be imported here (it is not imported to find out)."""
    return importlib.util.find_spec("triton") is not None


def grouped_mm_triton(
    mat_a: Tensor,
    mat_b: Tensor,
    offs: Tensor | None = None,
    *,
    bias: Tensor | None = None,
    out_dtype: torch.dtype | None = None,
    blocks: tuple[int, int, int] | None = None,
    programs: int | None = None,
) -> Tensor:
    """``grouped_mm(mat_a, mat_b, offs=offs, bias=bias, out_dtype=out_dtype)`` in one launch.

    Equivalent Python, for the 2-D x 3-D form (the other forms cut N or K instead of M)::

        out = empty(M, N)
        for tile in range(programs)...:     # each program takes every programs-th tile
            g, rows, cols = tile's group and block; rows within offs[g-1]..offs[g]
            out[rows, cols] = mat_a[rows] @ mat_b[g][:, cols] + bias[g, cols]
        out[offs[-1]:] = 0                   # the tail pseudo-group

    ``blocks`` is (BLOCK_M, BLOCK_N, BLOCK_K), each a power of two >= 16; ``programs`` the
    number of persistent programs (default: the device's multiprocessor count). Both
    default to choices for the device; the tests pass small ones to the interpreter.
    """
    # -- check
    mode = {(2, 3): "2d3d", (3, 3): "3d3d", (2, 2): "2d2d", (3, 2): "3d2d"}.get(
        (mat_a.dim(), mat_b.dim())
    )
    if mode is None or mat_a.shape[-1] != mat_b.shape[-2]:
        raise GemmInputError(
            f"grouped_mm_triton: mat_a {tuple(mat_a.shape)} and mat_b {tuple(mat_b.shape)}; "
            "expected 2-D/3-D operands with equal contraction sizes. Check with grouped_mm."
        )
    if mat_a.dtype not in KERNEL_DTYPES or mat_b.dtype != mat_a.dtype:
        raise GemmUnsupportedError(
            f"grouped_mm_triton: dtypes {mat_a.dtype} x {mat_b.dtype}; expected one of "
            f"{list(KERNEL_DTYPES)} for both. Use grouped_mm, which routes float64 elsewhere."
        )
    if (offs is None) != (mode == "3d3d"):
        raise GemmInputError(
            f"grouped_mm_triton: offs is {'None' if offs is None else 'given'} for {mode}; "
            "expected offs exactly when an operand is 2-D."
        )
    jagged = _JAGGED[mode]
    groups = mat_a.shape[0] if mode == "3d3d" else int(offs.shape[0])  # type: ignore[union-attr]
    M = mat_a.shape[-2] if mode != "2d2d" else mat_a.shape[0]
    N = mat_b.shape[-1]
    K = mat_a.shape[-1]
    # -- allocate
    shape = {"2d3d": (M, N), "3d2d": (M, N), "3d3d": (groups, M, N), "2d2d": (groups, M, N)}
    out = torch.empty(shape[mode], dtype=out_dtype or mat_a.dtype, device=mat_a.device)
    if out.numel() == 0:
        return out
    if groups == 0:
        return out.zero_()
    bm, bn, bk = blocks or _default_blocks(mat_a, M, N, groups)
    if programs is None:
        programs = _default_programs(mat_a.device)
    # Tiles upper bound, without reading offs: every group may add one partial block.
    tiles_m = -(-M // bm) + (groups if jagged == 1 else 0)
    tiles_n = -(-N // bn) + (groups if jagged == 2 else 0)
    per_group = 1 if jagged in (1, 2) else groups
    programs = max(1, min(programs, tiles_m * tiles_n * per_group))
    # -- launch
    a3 = mat_a if mat_a.dim() == 3 else mat_a.unsqueeze(0).expand(1, *mat_a.shape)
    b3 = mat_b if mat_b.dim() == 3 else mat_b.unsqueeze(0).expand(1, *mat_b.shape)
    c3 = out if out.dim() == 3 else out.unsqueeze(0)
    s_ag = a3.stride(0) if mat_a.dim() == 3 else 0
    s_bg = b3.stride(0) if mat_b.dim() == 3 else 0
    s_cg = c3.stride(0) if out.dim() == 3 else 0
    if bias is not None:
        x = bias.to(out.dtype)
        s_xg, s_xn = (x.stride(0), x.stride(1)) if x.dim() == 2 else (0, x.stride(0))
    else:
        x, s_xg, s_xn = out, 0, 0  # never read: HAS_BIAS is False
    ends = offs if offs is not None else torch.zeros(1, dtype=torch.int32, device=out.device)
    # 8 warps for 128x128 tiles (the matmul tutorial's choice); the interpreter takes none.
    launch = {"num_warps": 8 if bm * bn >= 128 * 128 else 4, "num_stages": 3}
    if mat_a.device.type != "cuda":
        launch = {}
    kernel()[(programs,)](
        a3, b3, c3, x, ends,
        groups, M, N, K,
        s_ag, a3.stride(1), a3.stride(2),
        s_bg, b3.stride(1), b3.stride(2),
        s_cg, c3.stride(1), c3.stride(2),
        s_xg, s_xn,
        JAGGED=jagged,
        HAS_BIAS=bias is not None,
        # float32 follows torch's own matmul setting: IEEE unless TF32 was allowed.
        IEEE=mat_a.dtype == torch.float32 and torch.get_float32_matmul_precision() == "highest",
        # Triton 3.9's interpreter misreads bfloat16 tiles in tl.dot; widen them there (the
        # products are exact in float32, so the numerics are the GPU's).
        WIDEN=mat_a.device.type != "cuda" and mat_a.dtype == torch.bfloat16,
        BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk,
        **launch,
    )  # fmt: skip
    return out


def _default_blocks(a: Tensor, M: int, N: int, groups: int) -> tuple[int, int, int]:
    if a.device.type != "cuda":  # the interpreter: small tiles keep it quick
        return 16, 16, 16
    rows = M // max(1, groups) if a.dim() == 2 else M  # typical rows per group
    bk = 32 if a.dtype == torch.float32 else 64
    return (64 if rows <= 64 else 128), 128, bk


def _default_programs(device: torch.device) -> int:
    if device.type != "cuda":
        return 4
    count: int = torch.cuda.get_device_properties(device).multi_processor_count
    return count


@cache
def kernel() -> Any:
    """The jitted kernel, built on first use (the one place Triton is imported)."""
    import triton
    import triton.language as tl

    # Triton's DSL has no Python types (pointers, constexprs): untyped on purpose.
    @triton.jit  # type: ignore[misc]
    def grouped_mm_kernel(  # type: ignore[no-untyped-def]
        a_ptr, b_ptr, c_ptr, bias_ptr, offs_ptr,
        G, M, N, K,
        s_ag, s_am, s_ak,
        s_bg, s_bk, s_bn,
        s_cg, s_cm, s_cn,
        s_xg, s_xn,
        JAGGED: tl.constexpr,  # 0: batched, 1: offs cut M, 2: offs cut N, 3: offs cut K
        HAS_BIAS: tl.constexpr,
        IEEE: tl.constexpr,
        WIDEN: tl.constexpr,
        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    ):  # fmt: skip
        pid = tl.program_id(0)
        stride = tl.num_programs(0)
        tile = pid
        first = 0  # the global index of group g's first tile
        start = 0  # where group g starts along the jagged dimension
        # Cutting M or N leaves a tail past offs[-1]: one more pseudo-group, written as zeros.
        TAIL: tl.constexpr = 1 if (JAGGED == 1 or JAGGED == 2) else 0
        for g in range(G + TAIL):
            real = g < G
            m_lo = 0
            m_hi = M
            n_lo = 0
            n_hi = N
            k_lo = 0
            k_hi = K
            if JAGGED != 0:
                end = tl.load(offs_ptr + tl.minimum(g, G - 1))
                if JAGGED == 1:
                    end = tl.where(real, end, M)
                    m_lo = start
                    m_hi = end
                if JAGGED == 2:
                    end = tl.where(real, end, N)
                    n_lo = start
                    n_hi = end
                if JAGGED == 3:
                    k_lo = start
                    k_hi = end
                start = end
            if TAIL == 1:
                k_hi = tl.where(real, k_hi, k_lo)  # the tail multiplies nothing
            tiles_n = tl.cdiv(n_hi - n_lo, BLOCK_N)
            count = tl.cdiv(m_hi - m_lo, BLOCK_M) * tiles_n
            gi = tl.minimum(g, G - 1).to(tl.int64)
            bias_hi = tl.where(real, n_hi, n_lo)  # the tail adds no bias
            while tile >= first and tile < first + count:
                local = tile - first
                rm = m_lo + (local // tiles_n) * BLOCK_M + tl.arange(0, BLOCK_M)
                rn = n_lo + (local % tiles_n) * BLOCK_N + tl.arange(0, BLOCK_N)
                rk = tl.arange(0, BLOCK_K)
                rm64 = rm.to(tl.int64)
                rn64 = rn.to(tl.int64)
                acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
                for kb in range(0, tl.cdiv(k_hi - k_lo, BLOCK_K)):
                    kk = k_lo + kb * BLOCK_K + rk
                    kk64 = kk.to(tl.int64)
                    a = tl.load(
                        a_ptr + gi * s_ag + rm64[:, None] * s_am + kk64[None, :] * s_ak,
                        mask=(rm[:, None] < m_hi) & (kk[None, :] < k_hi),
                        other=0.0,
                    )
                    b = tl.load(
                        b_ptr + gi * s_bg + kk64[:, None] * s_bk + rn64[None, :] * s_bn,
                        mask=(kk[:, None] < k_hi) & (rn[None, :] < n_hi),
                        other=0.0,
                    )
                    if WIDEN:
                        a = a.to(tl.float32)
                        b = b.to(tl.float32)
                    if IEEE or WIDEN:
                        acc = tl.dot(a, b, acc, input_precision="ieee")
                    else:
                        acc = tl.dot(a, b, acc)
                if HAS_BIAS:
                    x = tl.load(bias_ptr + gi * s_xg + rn64 * s_xn, mask=rn < bias_hi, other=0.0)
                    acc += x[None, :].to(tl.float32)
                c = c_ptr + gi * s_cg + rm64[:, None] * s_cm + rn64[None, :] * s_cn
                tl.store(
                    c,
                    acc.to(c_ptr.dtype.element_ty),
                    mask=(rm[:, None] < m_hi) & (rn[None, :] < n_hi),
                )
                tile += stride
            first += count

    return grouped_mm_kernel
