"""Block-scaled GEMM: torch 2.14's ``torch.nn.functional.scaled_mm`` on torch 2.13, on the CPU
and on any GPU, plus :func:`mm_quantized` for torchao's ``NVFP4Tensor`` / ``MXTensor``.

When to use: a matmul of FP8 or FP4 operands with their decoding scales, in any recipe torch
2.14 names: TensorWise, RowWise, BlockWise1x128/128x128 (DeepSeek), BlockWise1x32 (MXFP8,
MXFP4) and BlockWise1x16 (NVFP4, one or two levels), with NO_SWIZZLE or SWIZZLE_32_4_4 scales.

Every call is first checked and planned by :mod:`torchnext.gemm.scaled_plan` (the legal
recipe pairs and scale shapes below); this module picks the route for the plan.

Routes, chosen per call:

- TensorWise / RowWise on the CPU: torch's own algorithm (2.13 runs them) with its slow step
  replaced: torch decodes both float8 operands with ``.to(torch.float32)`` (5 ns per element),
  scales them, and multiplies in float32. Here a table decode in C does the decoding, the
  scaling and the row-major copy of ``mat_b`` in one pass (:mod:`torchnext.gemm.decode8_source`)
  and the same float32 GEMM follows, so the result is torch's bit for bit; measured 1.1 to
  2.3 times sooner (more where the weight is large and the rows few). Without the C kernels
  (no compiler), for empty operands and for scales of another form, torch's own call.
- CUDA: torch's native kernel where the device has the recipe (FP8 on sm89+, DeepSeek on sm90,
  MX/NVFP4 on sm100; scales are swizzled for it); a recipe the device refuses once goes to the
  Triton kernel (:mod:`torchnext.gemm.triton_scaled`) from then on, or, without Triton, to
  the emulation below.
- Everything else: exact emulation. Each operand is decoded to float32 block by block with
  its scales applied (exact, see :class:`ScaledOperand`), ``mat_b`` in chunks of rows (1 to
  16 MiB of float32) so a large weight is never decoded whole, and multiplied with float32 accumulation; the
  tensor-wise level of two-level NVFP4 multiplies the result (cuBLAS's alpha).

Scale layouts: NO_SWIZZLE scales are matrices in the operand's orientation, ``scale_a``
``[M, ceil(K/block)]`` and ``scale_b`` ``[ceil(K/block), N]`` (so torchao's ``w.t()`` passes
its ``scale.t()``), as RowWise's ``(M, 1)``/``(1, N)`` and DeepSeek's shapes are.
SWIZZLE_32_4_4 scales are torch 2.14's: contiguous, ``round_up(rows, 128) * round_up(G, 4)``
elements (:func:`torchnext.gemm.formats.swizzle_32_4_4` of ``[rows, G]``, rows = M or N).

What not to assume: torch 2.14.1 itself runs only TensorWise and RowWise on the CPU (it
refuses the block-wise recipes), so beyond those this is a superset of torch, not a copy.
``use_fast_accum`` is honoured only by native CUDA kernels. NaN scales raise instead of
poisoning the output (checking them costs one host synchronisation on a GPU).

Shape legend: ``M`` rows of the output, ``N`` its columns, ``K`` the contraction (unpacked),
``G`` scale groups along K.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from torchnext.errors import GemmInputError, GemmUnsupportedError
from torchnext.gemm import formats, gemv_cpu
from torchnext.gemm.formats import MXParts, NVFP4Parts
from torchnext.gemm.scaled_plan import FP4, ScaledPlan, check_nan_scales, plan_scaled_mm

__all__ = ["ScalingType", "SwizzleType", "mm_quantized", "scaled_mm"]

ScalingType = F.ScalingType
SwizzleType = F.SwizzleType

_OUT_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
_BIAS_DTYPES = _OUT_DTYPES
# mat_b is decoded in chunks of rows: about 1 MiB of float32 (cache-sized; measured fastest
# for decode shapes), or M rows when M is larger, so that a large GEMM is not cut into thin
# products that stream mat_a again for every chunk; never more than 16 MiB.
_CHUNK_BYTES = 1 << 20
_MAX_CHUNK_BYTES = 16 << 20
_WHOLE_A_BYTES = 64 << 20  # mat_a is decoded once when it fits, else per chunk of mat_b
_NATIVE_REFUSED: set[tuple[str, str]] = set()  # (device capability, recipe) torch refused
_torch_scaled_mm: Any = F.scaled_mm  # its stub types output_dtype without None

_S = ScalingType


def _emulate(plan: ScaledPlan, bias: Tensor | None, out_dtype: torch.dtype) -> Tensor:
    """float32 emulation: ``(deq(a) @ deq(b).T) * alpha + bias``, ``mat_b`` in chunks."""
    a, b = plan.a, plan.b
    m, n, k = a.rows, b.rows, a.k
    out_MN = torch.zeros(m, n, dtype=torch.float32, device=a.data.device)
    if m and n and k:
        whole_a = a.dequantize_rows(0, m) if m * k * 4 <= _WHOLE_A_BYTES else None
        step_n = max(1, min(max(_CHUNK_BYTES // (4 * k), m), _MAX_CHUNK_BYTES // (4 * k)))
        step_m = m if whole_a is not None else max(1, _WHOLE_A_BYTES // (4 * k))
        for n0 in range(0, n, step_n):
            b_nK = b.dequantize_rows(n0, min(n, n0 + step_n))
            for m0 in range(0, m, step_m):
                a_mK = (
                    whole_a if whole_a is not None else a.dequantize_rows(m0, min(m, m0 + step_m))
                )
                out_MN[m0 : m0 + a_mK.shape[0], n0 : n0 + b_nK.shape[0]] = a_mK @ b_nK.t()
    if plan.alpha is not None:
        out_MN.mul_(plan.alpha.to(out_MN.device))
    if bias is not None:
        out_MN.add_(bias.reshape(-1))
    return out_MN.to(out_dtype)


_FP8_TABLES: dict[torch.dtype, Tensor] = {}


def _light_cpu(
    mat_a: Tensor,
    mat_b: Tensor,
    scale_a: Any,
    scale_b: Any,
    bias: Tensor | None,
    dtype: torch.dtype,
) -> Tensor | None:
    """TensorWise/RowWise on the CPU as torch computes it (decode, scale, float32 GEMM, bias,
    cast), with the decode and scaling in one C pass; None where torch's own call should run
    (no C kernels, empty operands, scales of another form)."""
    sa = scale_a[0] if isinstance(scale_a, (list, tuple)) else scale_a
    sb = scale_b[0] if isinstance(scale_b, (list, tuple)) else scale_b
    (m, k), n = mat_a.shape, mat_b.shape[1]
    if not (m and k and n) or not isinstance(sa, Tensor) or not isinstance(sb, Tensor):
        return None  # torch returns zeros for K = 0 without the bias: its call keeps that
    if sa.dtype != torch.float32 or sb.dtype != torch.float32:
        return None
    tensorwise = sa.numel() == 1 and sb.numel() == 1
    if not tensorwise and (sa.numel() != m or sb.numel() != n):
        return None
    if torch.is_grad_enabled() and any(
        t is not None and t.requires_grad for t in (sa, sb, bias, mat_a, mat_b)
    ):
        return None  # torch's call has autograd's answer (its backward raises)
    kern = gemv_cpu.kernels()
    if kern is None:
        return None
    # torch decodes mat.contiguous(): its strides can differ from the canonical ones where a
    # dimension is 1 (a [K, 1] column of a transposed weight), and torch's GEMM then sums in
    # another order. The same strides here (same memory order, which decode8 writes).
    a_MK = torch.empty_like(mat_a.contiguous(), dtype=torch.float32)
    b_KN = torch.empty_like(mat_b.contiguous(), dtype=torch.float32)
    table_a, table_b = _fp8_table(mat_a.dtype), _fp8_table(mat_b.dtype)
    if tensorwise:  # torch: mat.to(float) * scale.item()
        kern.decode8(mat_a, table_a, a_MK, scale=float(sa.item()))
        kern.decode8(mat_b, table_b, b_KN, scale=float(sb.item()))
    else:  # torch: mat_a.to(float) * scale_a (M, 1), mat_b.to(float) * scale_b (1, N)
        kern.decode8(mat_a, table_a, a_MK, row_scale=sa.reshape(m).contiguous())
        kern.decode8(mat_b, table_b, b_KN, col_scale=sb.reshape(n).contiguous())
    out_MN = torch.mm(a_MK, b_KN)
    if bias is not None:
        out_MN.add_(bias)
    return out_MN.to(dtype)


def _fp8_table(dtype: torch.dtype) -> Tensor:
    """float32 [256]: the value of each byte as a ``dtype`` float8, by torch's own conversion."""
    table = _FP8_TABLES.get(dtype)
    if table is None:
        table = torch.arange(256, dtype=torch.uint8).view(dtype).float()
        _FP8_TABLES[dtype] = table
    return table


def _native_args(
    plan: ScaledPlan, mat_a: Tensor, mat_b: Tensor, given: dict[str, Any]
) -> dict[str, Any]:
    """Arguments for torch's own CUDA kernel: the layouts it wants (A row-major, B column-major,
    MX/NVFP4 scales swizzled), so a refusal means the device lacks the recipe."""
    mats = dict(mat_a=mat_a.contiguous(), mat_b=mat_b.t().contiguous().t())
    if plan.raw_scales is None:
        return {**mats, **given}
    sw = [formats.swizzle_32_4_4(s) for s in plan.raw_scales]
    rec = _S.BlockWise1x32 if plan.recipe == "mx" else _S.BlockWise1x16
    levels: Any = rec
    swizzles: Any = SwizzleType.SWIZZLE_32_4_4
    sa: Any = sw[0]
    sb: Any = sw[1]
    if plan.alpha is not None:  # two-level NVFP4: both sides two-level, the product is alpha
        levels, swizzles = [rec, _S.TensorWise], [swizzles, SwizzleType.NO_SWIZZLE]
        sa, sb = [sw[0], plan.alpha], [sw[1], torch.ones_like(plan.alpha)]
    return dict(**mats, scale_a=sa, scale_recipe_a=levels, scale_b=sb, scale_recipe_b=levels,
                swizzle_a=swizzles, swizzle_b=swizzles)  # fmt: skip


def _cuda_key(device: torch.device) -> str:
    major, minor = torch.cuda.get_device_capability(device)
    return f"cuda:{major}.{minor}"


def _triton_available() -> bool:
    return importlib.util.find_spec("triton") is not None


def scaled_mm(
    mat_a: Tensor,
    mat_b: Tensor,
    scale_a: Tensor | Sequence[Tensor],
    scale_recipe_a: Any,
    scale_b: Tensor | Sequence[Tensor],
    scale_recipe_b: Any,
    swizzle_a: Any = None,
    swizzle_b: Any = None,
    bias: Tensor | None = None,
    output_dtype: torch.dtype | None = torch.bfloat16,
    contraction_dim: Sequence[int] = (),
    use_fast_accum: bool = False,
) -> Tensor:
    """torch 2.14's ``F.scaled_mm``: ``(dequant(mat_a) @ dequant(mat_b) + bias).to(output_dtype)``.

    Equivalent (exact up to float32 accumulation order) to::

        A = elem(mat_a) * expand(scale_a)      # [M, K], each scale over its block of A
        B = elem(mat_b) * expand(scale_b)      # [K, N]
        out = (A.double() @ B.double()) * tensorwise_levels + bias

    ``mat_a [M, K]`` / ``mat_b [K, N]`` are float8 (``[M, K/2]`` / ``[K/2, N]`` for
    float4_e2m1fn_x2, two K values per byte, low nibble first). Scales and recipes are single
    values or lists (two-level NVFP4 ``[BlockWise1x16, TensorWise]``); see the module
    docstring for the legal pairs and the scale shapes. ``output_dtype`` is float32, bfloat16 or
    float16 (TensorWise/RowWise also float8 or None, as torch). ``contraction_dim`` may be ``()``
    or ``(1, 0)``. Raises :class:`GemmInputError` for malformed arguments (shapes, scale dtypes
    and shapes, NaN scales) and :class:`GemmUnsupportedError` for pairs no route runs.
    """
    if tuple(contraction_dim) not in ((), (1, 0)):
        raise GemmUnsupportedError(
            f"contraction_dim={tuple(contraction_dim)}; only () and (1, 0) (mat_a [M, K] @ "
            f"mat_b [K, N]) are supported; pass mat_a.t() or mat_b.t() instead (a free view)"
        )
    plan = plan_scaled_mm(
        mat_a, mat_b, scale_a, scale_recipe_a, scale_b, scale_recipe_b, swizzle_a, swizzle_b
    )
    light = plan.recipe in ("tensorwise", "rowwise")
    allowed = _OUT_DTYPES + ((torch.float8_e4m3fn, torch.float8_e5m2, None) if light else ())
    if output_dtype not in allowed:
        raise GemmUnsupportedError(
            f"output_dtype={output_dtype} for {plan.recipe}; expected one of {list(allowed)}; "
            f"pass torch.bfloat16 (torch's default) or torch.float32"
        )
    device = mat_a.device
    tensors = [("mat_b", mat_b), ("bias", bias)] + [
        (f"scale_{side}", s)
        for side, s in (("a", plan.a.scales), ("b", plan.b.scales), ("a/b", plan.alpha))
    ]
    for name, t in tensors:
        if t is not None and t.device != device:
            raise GemmInputError(
                f"{name} is on {t.device}; expected mat_a's device {device}; move it with .to()"
            )
    n = mat_b.shape[1]
    if bias is not None and (bias.numel() != n or bias.dtype not in _BIAS_DTYPES):
        raise GemmInputError(
            f"bias has shape {tuple(bias.shape)} and dtype {bias.dtype}; expected {n} elements "
            f"(the output's columns) of one of {list(_BIAS_DTYPES)}"
        )
    check_nan_scales(plan)
    out_dtype = output_dtype if output_dtype is not None else mat_a.dtype
    # torch's wrapper wants lists, not tuples, for multi-valued arguments.
    names = ("scale_a", "scale_recipe_a", "scale_b", "scale_recipe_b", "swizzle_a", "swizzle_b")
    values = (scale_a, scale_recipe_a, scale_b, scale_recipe_b, swizzle_a, swizzle_b)
    given = {k: list(v) if isinstance(v, tuple) else v for k, v in zip(names, values, strict=True)}
    if light and device.type == "cpu":
        ours = _light_cpu(mat_a, mat_b, scale_a, scale_b, bias, out_dtype)
        if ours is not None:
            return ours
        return _torch_scaled_mm(
            mat_a,
            mat_b,
            **given,
            bias=bias,
            output_dtype=output_dtype,
            use_fast_accum=use_fast_accum,
        )
    if device.type == "cuda":
        key = (_cuda_key(device), plan.recipe)
        if key not in _NATIVE_REFUSED:
            args = _native_args(plan, mat_a, mat_b, given)
            try:
                return _torch_scaled_mm(
                    **args, bias=bias, output_dtype=output_dtype, use_fast_accum=use_fast_accum
                )
            except (RuntimeError, NotImplementedError, ValueError):
                _NATIVE_REFUSED.add(key)  # this device lacks the recipe: stop asking
        if _triton_available() and "fnuz" not in plan.a.fmt + plan.b.fmt:
            from torchnext.gemm import triton_scaled

            return triton_scaled.scaled_mm_triton(
                plan.a, plan.b, alpha=plan.alpha, bias=bias, out_dtype=out_dtype
            )
    return _emulate(plan, bias, out_dtype)


# --------------------------------------------------------------------------- torchao operands


def _operand(t: object, side: str, other: object) -> NVFP4Parts | MXParts:
    """``t`` as parts with K last (``[M, K]`` for a, ``[N, K]`` for b)."""
    if isinstance(t, (NVFP4Parts, MXParts)):
        return t
    if _is_torchao(t):
        ao: Any = t
        if ao.dim() != 2:
            raise GemmInputError(f"{side} is {ao.dim()}-D; expected a 2-D operand")
        transposed = ao.qdata.stride(-2) < ao.qdata.stride(-1)
        if transposed != (side == "b"):
            raise GemmInputError(
                f"{side} is a torchao tensor quantized along its "
                f"{'rows' if transposed else 'columns'}; expected blocks along K (a: [M, K] as "
                f"quantized; b: w.t() of a weight w [N, K] quantized along K)"
            )
        return formats.from_torchao(ao)
    if isinstance(t, Tensor) and t.dtype in (torch.float32, torch.bfloat16, torch.float16):
        x = t if side == "a" else t.t()
        ref = other if isinstance(other, (NVFP4Parts, MXParts)) else formats.from_torchao(other)  # type: ignore[arg-type]
        if isinstance(ref, NVFP4Parts):
            return formats.quantize_nvfp4(x.contiguous())
        return formats.quantize_mx(x.contiguous(), ref.elem_dtype, block_size=ref.block_size)
    raise GemmInputError(
        f"{side} is {type(t).__name__}; expected an NVFP4Tensor/MXTensor (torchao), NVFP4Parts/"
        f"MXParts, or a float32/bfloat16/float16 tensor quantized to the other operand's format"
    )


def _is_torchao(t: object) -> bool:
    cls = type(t)
    return cls.__module__.startswith("torchao.") and cls.__name__ in ("NVFP4Tensor", "MXTensor")


def _args_of(parts: NVFP4Parts | MXParts, side: str) -> tuple[Tensor, list[Tensor], list[Any]]:
    fp4 = isinstance(parts, NVFP4Parts) or parts.elem_dtype == FP4
    mat = parts.qdata.view(FP4) if fp4 else parts.qdata
    scales = [parts.scales]
    if isinstance(parts, NVFP4Parts):
        recipes: list[Any] = [_S.BlockWise1x16]
        if parts.per_tensor_scale is not None:
            scales.append(parts.per_tensor_scale.reshape(()))
            recipes.append(_S.TensorWise)
    elif parts.block_size == 32:
        recipes = [_S.BlockWise1x32]
    else:
        raise GemmUnsupportedError(
            f"{side} has MX block_size={parts.block_size}; scaled GEMM runs block size 32 "
            f"(BlockWise1x32); quantize with block_size=32"
        )
    if side == "b":
        mat, scales[0] = mat.t(), scales[0].t()
    return mat, scales, recipes


def mm_quantized(
    a: object, b: object, *, bias: Tensor | None = None, output_dtype: torch.dtype = torch.bfloat16
) -> Tensor:
    """``dequantize(a) @ dequantize(b) + bias`` as a block-scaled GEMM (:func:`scaled_mm`).

    ``a`` is ``[M, K]``, ``b`` is ``[K, N]``: each a torchao ``NVFP4Tensor``/``MXTensor``
    (``b`` as torchao's transposed weight ``w.t()``), an :class:`NVFP4Parts`/:class:`MXParts`
    with K last (for ``b`` that is the weight ``[N, K]``, since parts carry no transposition),
    or a float tensor, which is quantized to the other operand's format first (one-level
    NVFP4, or MX with the same element type), as torchao's dynamic activation quantization.
    Equivalent to ``torch.mm(deq(a), deq(b)) + bias`` within float32 accumulation.
    """
    if (
        isinstance(a, Tensor)
        and not _is_torchao(a)
        and isinstance(b, Tensor)
        and not _is_torchao(b)
    ):
        raise GemmInputError(
            "a and b are both plain tensors; expected at least one quantized operand "
            "(NVFP4Tensor, MXTensor, NVFP4Parts, MXParts); use torch.mm for plain tensors"
        )
    pa = _operand(a, "a", b)
    pb = _operand(b, "b", pa)
    mat_a, scales_a, rec_a = _args_of(pa, "a")
    mat_b, scales_b, rec_b = _args_of(pb, "b")
    return scaled_mm(
        mat_a, mat_b, scales_a, rec_a, scales_b, rec_b, bias=bias, output_dtype=output_dtype
    )
