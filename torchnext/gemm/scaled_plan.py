"""The argument check and plan of a block-scaled GEMM: which recipe a ``scaled_mm`` call is.

:func:`plan_scaled_mm` validates ``scaled_mm``'s operands, scales, recipes and swizzles
(torch 2.14's rules) and returns a :class:`ScaledPlan`: the recipe's name and both operands as
:class:`~torchnext.gemm.elements.ScaledOperand` ``[rows, K]`` with float32 scales, plus the
tensor-wise level (``alpha``) and the raw MX/NVFP4 block scales. Every route of
:func:`torchnext.gemm.scaled_mm` (torch's kernel, the Triton kernel, the CPU emulation) starts
from one plan; :func:`check_nan_scales` then refuses NaN scales.

When to use: inside the scaled-GEMM routes, or to test a route against another on the same
plan. Call :func:`torchnext.gemm.scaled_mm` to multiply.

What not to assume: a plan holds views of the caller's tensors (no copy); swizzled scales are
unswizzled into the plan, and the plan does not check NaN (that costs a host synchronisation
on a GPU, so :func:`check_nan_scales` is a separate call).

Shape legend: ``M`` rows of the output, ``N`` its columns, ``K`` the contraction (unpacked),
``G`` scale groups along K, ``R`` rows of an operand (``M`` for a, ``N`` for b).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from torchnext.errors import GemmInputError, GemmUnsupportedError
from torchnext.gemm import formats
from torchnext.gemm.elements import ScaledOperand

__all__ = ["FP4", "ScaledPlan", "check_nan_scales", "plan_scaled_mm"]

_FP8 = {
    torch.float8_e4m3fn: "e4m3",
    torch.float8_e5m2: "e5m2",
    torch.float8_e4m3fnuz: "e4m3fnuz",
    torch.float8_e5m2fnuz: "e5m2fnuz",
}
FP4 = torch.float4_e2m1fn_x2
"""The packed FP4 dtype (two e2m1 codes per byte) that ``scaled_mm`` takes."""

_S = F.ScalingType
_Z = F.SwizzleType
_NVFP4_2LVL = (_S.BlockWise1x16, _S.TensorWise)
_DEEPSEEK = {
    (_S.BlockWise1x128, _S.BlockWise128x128),
    (_S.BlockWise1x128, _S.BlockWise1x128),
    (_S.BlockWise128x128, _S.BlockWise1x128),
}
_BLOCK = {_S.BlockWise1x128: (1, 128), _S.BlockWise128x128: (128, 128)}
_LIGHT = ((_S.TensorWise,), (_S.RowWise,))  # the recipes torch 2.13 runs on the CPU


@dataclass(frozen=True)
class ScaledPlan:
    """One ``scaled_mm`` call, checked: its recipe, operands and scales."""

    recipe: str  # "tensorwise" "rowwise" "deepseek" "mx" "nvfp4"
    a: ScaledOperand
    b: ScaledOperand
    alpha: Tensor | None  # product of the tensor-wise (second-level) scales
    raw_scales: tuple[Tensor, Tensor] | None  # MX/NVFP4 block scales, [rows, G] unswizzled


def _ceil(a: int, b: int) -> int:
    return -(-a // b)


def _listed(value: Any) -> list[Any]:
    if value is None:
        return []
    return list(value) if isinstance(value, (list, tuple)) else [value]


def _check_mat(t: object, side: str) -> str:
    name = f"mat_{side}"
    if not isinstance(t, Tensor) or t.dim() != 2:
        shape = tuple(t.shape) if isinstance(t, Tensor) else type(t).__name__
        raise GemmInputError(
            f"{name} is {shape}; expected a 2-D float8 or float4_e2m1fn_x2 tensor; reshape "
            f"batched operands to 2-D"
        )
    if t.dtype == FP4:
        return "e2m1"
    if t.dtype not in _FP8:
        raise GemmInputError(
            f"{name}.dtype={t.dtype}; expected a float8 dtype or torch.float4_e2m1fn_x2; "
            f"quantize it first (torchnext.gemm.formats.quantize_mx / quantize_nvfp4)"
        )
    return _FP8[t.dtype]


def _check_scale(
    s: object, side: str, what: str, dtype: torch.dtype, shape: tuple[int, ...] | None, numel: int
) -> Tensor:
    """``shape`` exact when given, else only ``numel`` (and contiguity: swizzled layouts)."""
    name = f"scale_{side}"
    if not isinstance(s, Tensor):
        raise GemmInputError(f"{name} is {type(s).__name__}; expected a {dtype} tensor ({what})")
    if s.dtype != dtype:
        raise GemmInputError(
            f"{name}.dtype={s.dtype}; expected {dtype} for {what}; convert or re-quantize it"
        )
    if shape is not None and tuple(s.shape) != shape and not (shape == () and s.numel() == 1):
        raise GemmInputError(
            f"{name}.shape={tuple(s.shape)}; expected {shape} for {what}; build the scales in "
            f"that shape (see torchnext.gemm.scaled's scale layouts)"
        )
    if shape is None and (s.numel() != numel or not s.is_contiguous()):
        raise GemmInputError(
            f"{name} has {s.numel()} elements (contiguous: {s.is_contiguous()}); expected "
            f"{numel} contiguous elements for {what}; swizzle [rows, groups] scales with "
            f"torchnext.gemm.formats.swizzle_32_4_4"
        )
    return s


def _float_side(
    side: str, data: Tensor, fmt: str, k: int, rows: int, scale: object, recipe: Any
) -> ScaledOperand:
    """An FP8 operand with float32 scales: TensorWise, RowWise, BlockWise1x128 or 128x128."""
    if recipe == _S.TensorWise:
        s = _check_scale(scale, side, "TensorWise", torch.float32, (), 1)
        return ScaledOperand(data, fmt, k, s.reshape(1, 1), max(rows, 1), max(k, 1))
    row_block, k_block = _BLOCK.get(recipe, (1, max(k, 1)))  # RowWise: one block per row
    shape = (_ceil(rows, row_block), max(1, _ceil(k, k_block)))
    shape = shape if side == "a" else (shape[1], shape[0])
    s = _check_scale(scale, side, recipe.name, torch.float32, shape, 0)
    return ScaledOperand(data, fmt, k, s if side == "a" else s.t(), row_block, k_block)


def _block_side(
    side: str,
    data: Tensor,
    fmt: str,
    k: int,
    rows: int,
    scale: object,
    recipe: Any,
    swizzle: Any,
    block: int,
    dtype: torch.dtype,
) -> tuple[ScaledOperand, Tensor]:
    """An MX / NVFP4 operand and its [rows, G] scales (``data`` already as ``[rows, K]``)."""
    groups = _ceil(k, block)
    what = f"{recipe.name} with {swizzle.name}"
    if swizzle == _Z.SWIZZLE_32_4_4:
        numel = _ceil(rows, 128) * 128 * _ceil(groups, 4) * 4
        s = _check_scale(scale, side, what, dtype, None, numel)
        s_RG = formats.unswizzle_32_4_4(s, rows, groups)
    else:
        shape = (rows, groups) if side == "a" else (groups, rows)
        s = _check_scale(scale, side, what, dtype, shape, 0)
        s_RG = s if side == "a" else s.t()
    operand = ScaledOperand(data, fmt, k, s_RG.to(torch.float32), 1, block, s_RG)
    return operand, s_RG


def plan_scaled_mm(
    mat_a: Tensor,
    mat_b: Tensor,
    scale_a: Any,
    recipe_a: Any,
    scale_b: Any,
    recipe_b: Any,
    swizzle_a: Any,
    swizzle_b: Any,
) -> ScaledPlan:
    """Check ``scaled_mm``'s arguments and return their plan.

    Raises :class:`GemmInputError` for malformed arguments (shapes, scale dtypes and shapes,
    recipe and swizzle lists) and :class:`GemmUnsupportedError` for pairs no route runs.
    """
    fmt_a, fmt_b = _check_mat(mat_a, "a"), _check_mat(mat_b, "b")
    if (fmt_a == "e2m1") != (fmt_b == "e2m1"):
        raise GemmUnsupportedError(
            f"mat_a.dtype={mat_a.dtype} with mat_b.dtype={mat_b.dtype}: no route multiplies "
            f"FP4 by FP8; quantize both operands to the same family"
        )
    if mat_a.shape[1] != mat_b.shape[0]:
        raise GemmInputError(
            f"mat_a.shape={tuple(mat_a.shape)} and mat_b.shape={tuple(mat_b.shape)}; expected "
            f"mat_a.shape[1] == mat_b.shape[0] (the contraction); transpose the operand whose "
            f"K is in the wrong place"
        )
    fp4 = fmt_a == "e2m1"
    m, n, k = mat_a.shape[0], mat_b.shape[1], mat_a.shape[1] * (2 if fp4 else 1)
    scales = {"a": _listed(scale_a), "b": _listed(scale_b)}
    recipes = {"a": _listed(recipe_a), "b": _listed(recipe_b)}
    swizzles = {"a": _listed(swizzle_a), "b": _listed(swizzle_b)}
    for side in "ab":
        bad = [r for r in recipes[side] if not isinstance(r, _S)]
        if bad or not recipes[side] or len(recipes[side]) != len(scales[side]):
            raise GemmInputError(
                f"scale_recipe_{side}={recipe_a if side == 'a' else recipe_b!r} for "
                f"{len(scales[side])} scale tensor(s); expected one "
                f"torch.nn.functional.ScalingType per scale tensor"
            )
        bad = [z for z in swizzles[side] if not isinstance(z, _Z)]
        if bad or len(swizzles[side]) not in (0, len(scales[side])):
            raise GemmInputError(
                f"swizzle_{side}={swizzle_a if side == 'a' else swizzle_b!r}; expected None or "
                f"one torch.nn.functional.SwizzleType per scale tensor"
            )
    ra, rb = tuple(recipes["a"]), tuple(recipes["b"])
    is_block = ra[0] in (_S.BlockWise1x16, _S.BlockWise1x32)
    for side in "ab":
        if not is_block and any(z != _Z.NO_SWIZZLE for z in swizzles[side]):
            raise GemmInputError(
                f"swizzle_{side}={swizzles[side]}; SWIZZLE_32_4_4 applies only to BlockWise1x16 "
                f"and BlockWise1x32 scales; pass None"
            )
    data = {"a": mat_a, "b": mat_b.t()}  # both [rows, K]: rows = M for a, N for b
    if fp4:
        data = {side: t.view(torch.uint8) for side, t in data.items()}
    rows, fmts = {"a": m, "b": n}, {"a": fmt_a, "b": fmt_b}
    one_each = len(ra) == len(rb) == 1
    if "fnuz" in fmt_a + fmt_b and not (one_each and ra == rb in _LIGHT):
        raise GemmUnsupportedError(
            f"mat_a.dtype={mat_a.dtype}, mat_b.dtype={mat_b.dtype} with scale_recipe_a="
            f"{ra[0].name}: the fnuz float8 types run TensorWise and RowWise only; use "
            f"float8_e4m3fn / float8_e5m2 for the block-wise recipes"
        )
    if not fp4 and one_each and ((ra[0], rb[0]) in _DEEPSEEK or ra == rb in _LIGHT):
        ops = {
            side: _float_side(side, data[side], fmts[side], k, rows[side], scales[side][0], rec)
            for side, rec in (("a", ra[0]), ("b", rb[0]))
        }
        name = {_S.TensorWise: "tensorwise", _S.RowWise: "rowwise"}.get(ra[0], "deepseek")
        return ScaledPlan(name, ops["a"], ops["b"], None, None)
    nvfp4 = ((_S.BlockWise1x16,), _NVFP4_2LVL)
    mx = ra == rb == (_S.BlockWise1x32,)
    if mx or (fp4 and ra in nvfp4 and rb in nvfp4):
        block, dtype = (32, torch.float8_e8m0fnu) if mx else (16, torch.float8_e4m3fn)
        sides: dict[str, tuple[ScaledOperand, Tensor]] = {}
        alpha: Tensor | None = None
        for side, rec in (("a", ra), ("b", rb)):
            z = swizzles[side][0] if swizzles[side] else _Z.NO_SWIZZLE
            given = (data[side], fmts[side], k, rows[side], scales[side][0], rec[0], z)
            sides[side] = _block_side(side, *given, block, dtype)
            if len(rec) == 2:
                what = "the NVFP4 tensor-wise level"
                g = _check_scale(scales[side][1], side, what, torch.float32, (), 1).reshape(())
                alpha = g if alpha is None else alpha * g
        (a_op, sa), (b_op, sb) = sides["a"], sides["b"]
        return ScaledPlan("mx" if mx else "nvfp4", a_op, b_op, alpha, (sa, sb))
    raise GemmUnsupportedError(
        f"scale_recipe_a={[r.name for r in ra]} with scale_recipe_b={[r.name for r in rb]} for "
        f"mat_a.dtype={mat_a.dtype}, mat_b.dtype={mat_b.dtype}: no route runs this pair. "
        f"Supported: TensorWise/TensorWise and RowWise/RowWise (FP8), BlockWise1x128 with "
        f"BlockWise128x128 or 1x128 (FP8), BlockWise1x32/BlockWise1x32 (FP8 or FP4), "
        f"BlockWise1x16 [+ TensorWise] on both sides (FP4)"
    )


def check_nan_scales(plan: ScaledPlan) -> None:
    """NaN scales raise (one host synchronisation for all of them)."""
    scales = [plan.a.scales, plan.b.scales, plan.alpha]
    present = [s for s in scales if s is not None and s.numel()]
    if not present or not bool(torch.stack([torch.isnan(s).any() for s in present]).any()):
        return
    for side, s in (("a", plan.a.scales), ("b", plan.b.scales), ("a/b", plan.alpha)):
        if s is not None and bool(torch.isnan(s).any()):
            where = tuple(int(i) for i in torch.nonzero(torch.isnan(s))[0])
            raise GemmInputError(
                f"scale_{side} holds NaN (first at index {where} of its [rows, groups] form); "
                f"expected finite scales; a NaN scale comes from NaN or inf in the tensor that "
                f"was quantized: clean that tensor and quantize again"
            )
