"""Low-precision element and scale formats: FP4 (e2m1), MX (e8m0 scales) and NVFP4, bit for bit
as torchao 0.18 makes them, plus the SWIZZLE_32_4_4 scale layout that cuBLAS and torch use.

When to use: to quantize a weight or an activation for :func:`torchnext.gemm.scaled_mm` or the
weight-only GEMV, to read torchao's ``NVFP4Tensor`` / ``MXTensor`` without importing torchao
(:func:`from_torchao`), or to turn a result back into one (:func:`to_torchao`).

Quantizers (each bit-identical to torchao's, tested against it):

- :func:`quantize_mx` is ``MXTensor.to_mx``: one e8m0 (power-of-two) scale per ``block_size``
  elements along the last dimension; elements float8_e4m3fn, float8_e5m2 or FP4 e2m1. The
  scale rule is torchao's ``ScaleCalculationMode`` (``"floor"``, its default, ``"ceil"``,
  ``"even"`` or ``"rceil"``, the cuBLAS rule).
- :func:`quantize_nvfp4` is ``NVFP4Tensor.to_nvfp4`` (torch ops path): FP4 e2m1 elements, one
  float8_e4m3fn scale per 16 elements, optionally under one float32 per-tensor scale.

What is torchao's and what is here: torchao's tensor classes are the interchange format
(read by attribute in :func:`from_torchao`, built by :func:`to_torchao`), and its training
recipes, ``quantize_`` configs and CUDA/Triton cast kernels are not rewritten. Its reference
quantizers (torch ops, a few dozen lines each) are re-derived here rather than called, even
when torchao is installed: a result must not change with an optional package, importing
torchao costs seconds and pulls in its kernels and DTensor, and its quantizers ``assert`` on
contiguity and dtype where these raise a :class:`GemmInputError`. The tests hold them to
torchao's output bit for bit, NaN and inf included.

The element codes (e2m1 encode/decode, FP4 packing, FP8 decoding) and :class:`ScaledOperand`
live in :mod:`torchnext.gemm.elements`; they are re-exported here.

FP4 packing (torchao's and torch's ``float4_e2m1fn_x2``): element ``2i`` is the LOW nibble of
byte ``i``, element ``2i+1`` the HIGH nibble.

What not to assume: quantization is along the last dimension only (quantize ``w_NK`` for a
weight used as ``x @ w.T``); the last dimension must divide by the block (torchao's rule).

Shape legend: ``X`` any leading dimensions, ``K`` the quantized (last) dimension, ``P = K/2``
packed FP4 bytes, ``G = K/block`` scale groups, ``R`` rows of a 2-D scale matrix.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from torchnext.errors import GemmInputError, GemmUnsupportedError
from torchnext.gemm.elements import (
    E2M1_VALUES,
    ScaledOperand,
    decode_e2m1,
    decode_packed_e2m1,
    encode_e2m1,
    pack_fp4,
    unpack_fp4,
)

__all__ = [
    "E2M1_VALUES",
    "MXParts",
    "NVFP4Parts",
    "ScaledOperand",
    "decode_e2m1",
    "decode_packed_e2m1",
    "dequantize_mx",
    "dequantize_nvfp4",
    "encode_e2m1",
    "from_torchao",
    "nvfp4_per_tensor_scale",
    "pack_fp4",
    "quantize_mx",
    "quantize_nvfp4",
    "swizzle_32_4_4",
    "to_torchao",
    "unpack_fp4",
    "unswizzle_32_4_4",
]


F4_MAX = 6.0
E4M3_MAX = 448.0
E4M3_TINY = 2.0**-6  # smallest normal float8_e4m3fn; torchao's floor for NVFP4 block scales
_HP_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
# Per element dtype: (largest power of two it holds, mantissa bits, largest value).
_MX_ELEMS = {
    torch.float8_e4m3fn: (8, 3, 448.0),
    torch.float8_e5m2: (15, 2, 57344.0),
    torch.float4_e2m1fn_x2: (2, 1, F4_MAX),
}
_MX_MODES = ("floor", "ceil", "even", "rceil")


@dataclass(frozen=True)
class NVFP4Parts:
    """An NVFP4 tensor: ``value = E2M1[code] * float(scales) * (per_tensor_scale or 1)``.

    ``qdata`` uint8 ``[X, K/2]`` (packed e2m1 codes), ``scales`` float8_e4m3fn ``[X, K/16]``
    (one per 16 consecutive elements), ``per_tensor_scale`` float32 scalar (or ``[E, 1, 1]``
    for a 3-D tensor of E experts, as torchao allows) or ``None``.
    """

    qdata: Tensor
    scales: Tensor
    per_tensor_scale: Tensor | None = None
    block_size: int = 16

    @property
    def shape(self) -> torch.Size:
        """The logical (unpacked) shape ``[X, K]``."""
        return torch.Size((*self.qdata.shape[:-1], 2 * self.qdata.shape[-1]))


@dataclass(frozen=True)
class MXParts:
    """An MX tensor: ``value = element * 2 ** (scale_bits - 127)`` per ``block_size`` block.

    ``qdata`` is float8 ``[X, K]`` or, for ``elem_dtype=torch.float4_e2m1fn_x2``, uint8
    ``[X, K/2]`` (packed e2m1 codes); ``scales`` float8_e8m0fnu ``[X, K/block_size]``.
    """

    qdata: Tensor
    scales: Tensor
    elem_dtype: torch.dtype
    block_size: int = 32

    @property
    def shape(self) -> torch.Size:
        """The logical (unpacked) shape ``[X, K]``."""
        k = self.qdata.shape[-1] * (2 if self.elem_dtype == torch.float4_e2m1fn_x2 else 1)
        return torch.Size((*self.qdata.shape[:-1], k))


# --------------------------------------------------------------------------- quantizers


def _check_hp(x: Tensor, block: int) -> None:
    if x.dtype not in _HP_DTYPES:
        raise GemmInputError(
            f"x.dtype={x.dtype}; expected one of {list(_HP_DTYPES)}; convert x with .float()"
        )
    if x.dim() < 1 or x.shape[-1] % block:
        raise GemmInputError(
            f"x.shape={tuple(x.shape)}; expected a last dimension divisible by the block size "
            f"{block} (torchao's rule); pad the last dimension with zeros to a multiple of {block}"
        )


def nvfp4_per_tensor_scale(amax: Tensor) -> Tensor:
    """torchao's per-tensor NVFP4 scale from an amax: ``amax.float() / (448 * 6)``."""
    return amax.to(torch.float32) / (E4M3_MAX * F4_MAX)


def quantize_nvfp4(x: Tensor, *, per_tensor_scale: Tensor | None = None) -> NVFP4Parts:
    """Quantize ``x [X, K]`` (float32/bfloat16/float16, K % 16 == 0) to NVFP4, as torchao.

    Equivalent to (per 16-element block ``b`` of ``x.float()``; ``pts = per_tensor_scale``)::

        s = clamp(amax(|b|) / 6 / (pts or 1), 2**-6, 448).to(float8_e4m3fn)
        r = 1 / s.float()  if pts is None else  (1 / pts) / s.float()
        codes = encode_e2m1(clamp(b * r, -6, 6))
    """
    _check_hp(x, 16)
    if per_tensor_scale is not None:
        if per_tensor_scale.dtype != torch.float32 or not (
            per_tensor_scale.numel() == 1
            or (x.dim() == 3 and per_tensor_scale.shape == (x.shape[0], 1, 1))
        ):
            raise GemmInputError(
                f"per_tensor_scale has dtype {per_tensor_scale.dtype} and shape "
                f"{tuple(per_tensor_scale.shape)}; expected a float32 scalar (or [E, 1, 1] "
                f"for a 3-D x); build it with nvfp4_per_tensor_scale(x.abs().amax())"
            )
        if torch.isnan(per_tensor_scale).any():
            raise GemmInputError(
                "per_tensor_scale holds NaN; expected a finite float32 scale; compute it from "
                "a finite amax"
            )
    x_XGB = x.float().reshape(*x.shape[:-1], x.shape[-1] // 16, 16)
    block_scale_XG = torch.amax(x_XGB.abs(), dim=-1) / F4_MAX
    if per_tensor_scale is None:
        scales_XG = torch.clamp(block_scale_XG, min=E4M3_TINY, max=E4M3_MAX)
        scales_XG = scales_XG.to(torch.float8_e4m3fn)
        recip_XG = 1.0 / scales_XG.to(torch.float32)
    else:
        pts = per_tensor_scale.reshape(()) if per_tensor_scale.numel() == 1 else per_tensor_scale
        scales_XG = torch.clamp(block_scale_XG / pts, min=E4M3_TINY, max=E4M3_MAX)
        scales_XG = scales_XG.to(torch.float8_e4m3fn)
        recip_XG = (1.0 / pts) / scales_XG.to(torch.float32)
    y_XGB = torch.clamp(x_XGB * recip_XG.unsqueeze(-1), -F4_MAX, F4_MAX)
    codes_XK = encode_e2m1(y_XGB.reshape(x.shape))
    return NVFP4Parts(pack_fp4(codes_XK), scales_XG, per_tensor_scale)


def dequantize_nvfp4(parts: NVFP4Parts, dtype: torch.dtype = torch.float32) -> Tensor:
    """``E2M1[code] * (per_tensor_scale * float(scale))`` in float32, then cast to ``dtype``."""
    vals_XK = decode_packed_e2m1(parts.qdata)
    scale_XG = parts.scales.to(torch.float32)
    if parts.per_tensor_scale is not None:
        pts = parts.per_tensor_scale
        scale_XG = (pts.reshape(()) if pts.numel() == 1 else pts) * scale_XG
    vals_XGB = vals_XK.reshape(*scale_XG.shape, parts.block_size)
    return (vals_XGB * scale_XG.unsqueeze(-1)).reshape(vals_XK.shape).to(dtype)


def _mx_scale_bits(amax: Tensor, max_pow2: int, mbits: int, mode: str) -> Tensor:
    """Biased e8m0 exponents (int32) of the floor/ceil/even rules, from the block amax."""
    bits = amax.view(torch.int32)
    if mode == "even":
        # Round the amax to the element's mantissa width first (NaN stays NaN below).
        bits = (bits + (1 << (23 - mbits - 1))) & (0x1FF << 23)
    pow2 = ((bits >> 23) & 0xFF) - 127
    if mode == "ceil":
        pow2 = pow2 + ((bits & 0x7FFFFF) > 0).to(torch.int32)
    biased = torch.clamp(pow2 - max_pow2, min=-127, max=128) + 127
    return torch.where(torch.isnan(amax), 255, biased)


def quantize_mx(
    x: Tensor, elem_dtype: torch.dtype, *, block_size: int = 32, scaling_mode: str = "floor"
) -> MXParts:
    """Quantize ``x [X, K]`` to MX, as torchao's ``MXTensor.to_mx`` (``K % block_size == 0``).

    Equivalent, for the default ``"floor"`` rule, per block ``b`` of ``x.float()`` (``emax``
    the largest power of two of ``elem_dtype``: 8, 15, 2; ``vmax`` its largest value)::

        e = clamp(floor(log2(amax(|b|))) - emax, -127, 128) + 127      # 255 if amax is NaN
        y = b / max(2.0 ** (e - 127), 2.0 ** -126)   # float bits e << 23 (inf for e = 255)
        elements = clamp(y, -vmax, vmax).to(elem_dtype)    # FP4: encode_e2m1(y), packed

    ``"rceil"`` is cuBLAS's rule: ``e = ceil(log2(amax / vmax)) + 127`` (254 for inf, 255 for
    NaN), ``y = clamp(b * 2.0 ** (127 - e), -vmax, vmax)`` with torchao's special cases.
    """
    if elem_dtype not in _MX_ELEMS:
        raise GemmInputError(
            f"elem_dtype={elem_dtype}; expected one of {list(_MX_ELEMS)}; FP6 MX is not "
            f"implemented here, use torchao for it"
        )
    if scaling_mode not in _MX_MODES:
        raise GemmInputError(
            f"scaling_mode={scaling_mode!r}; expected one of {_MX_MODES} (torchao's "
            f"ScaleCalculationMode names, lower case)"
        )
    if block_size < 2 or block_size % 2:
        raise GemmInputError(f"block_size={block_size}; expected an even size such as 32")
    _check_hp(x, block_size)
    max_pow2, mbits, max_pos = _MX_ELEMS[elem_dtype]
    x_XGB = x.float().reshape(*x.shape[:-1], x.shape[-1] // block_size, block_size)
    amax_XG1 = torch.amax(x_XGB.abs(), dim=-1, keepdim=True)
    if scaling_mode == "rceil":
        descale = amax_XG1 / max_pos
        exact = torch.clamp(torch.ceil(torch.log2(descale)), min=-127, max=127) + 127
        e_XG1 = torch.where(torch.isinf(descale), 254, exact.to(torch.uint8))
        e_XG1 = torch.where(torch.isnan(descale), 255, e_XG1).to(torch.uint8)
        e_f = e_XG1.to(torch.float32)
        recip = torch.where(e_XG1 == 0, 1.0, torch.exp2(127 - e_f))
        recip = torch.where(e_XG1 == 254, 2.0**-127, recip)
        recip = torch.where(e_XG1 == 255, descale, recip)
        y_XGB = torch.clamp(x_XGB * recip, min=-max_pos, max=max_pos)
    else:
        e_XG1 = _mx_scale_bits(amax_XG1, max_pow2, mbits, scaling_mode).to(torch.uint8)
        scale_XG1 = (e_XG1.to(torch.int32) << 23).view(torch.float32)
        y_XGB = x_XGB / torch.clamp(scale_XG1, min=2.0**-126)
        if elem_dtype != torch.float4_e2m1fn_x2:
            y_XGB = torch.clamp(y_XGB, min=-max_pos, max=max_pos)
    y_XK = y_XGB.reshape(x.shape)
    if elem_dtype == torch.float4_e2m1fn_x2:
        qdata = pack_fp4(encode_e2m1(y_XK))
    else:
        qdata = y_XK.to(elem_dtype)
    scales_XG = e_XG1.squeeze(-1).view(torch.float8_e8m0fnu)
    return MXParts(qdata, scales_XG, elem_dtype, block_size)


def dequantize_mx(parts: MXParts, dtype: torch.dtype = torch.float32) -> Tensor:
    """``element * 2 ** (e - 127)`` (NaN where ``e == 255``), computed in ``dtype`` as torchao."""
    if parts.elem_dtype == torch.float4_e2m1fn_x2:
        vals_XK = decode_packed_e2m1(parts.qdata).to(dtype)
    else:
        vals_XK = parts.qdata.to(dtype)
    # e8m0 255 is NaN; torchao writes the canonical NaN, which .float() of e8m0 does not.
    nan_XG = parts.scales.view(torch.uint8) == 255
    scale_XG = torch.where(nan_XG, float("nan"), parts.scales.to(torch.float32)).to(dtype)
    vals_XGB = vals_XK.reshape(*scale_XG.shape, parts.block_size)
    return (vals_XGB * scale_XG.unsqueeze(-1)).reshape(vals_XK.shape)


# --------------------------------------------------------------------------- scale layout


def _blocked_dims(rows: int, groups: int) -> tuple[int, int]:
    return -(-rows // 128), -(-groups // 4)


def swizzle_32_4_4(scales_RG: Tensor) -> Tensor:
    """Lay ``[R, G]`` block scales out in cuBLAS's SWIZZLE_32_4_4 order (torchao's ``to_blocked``).

    The matrix is zero-padded to ``[128 * ceil(R/128), 4 * ceil(G/4)]`` and cut into 128x4
    tiles, row-tiles outer; each tile is stored as 32x16, where tile row ``r`` of 128 holds
    rows ``r, r+32, r+64, r+96``. Returns the flat (1-D) result, as torchao does::

        out.view(RT, GT, 32, 16)[i, j, r % 32, 4 * (r // 32) + g] == padded[128 i + r, 4 j + g]
    """
    if scales_RG.dim() != 2:
        raise GemmInputError(
            f"scales_RG.shape={tuple(scales_RG.shape)}; expected a 2-D [rows, groups] matrix; "
            f"reshape leading dimensions into the rows first"
        )
    rows, groups = scales_RG.shape
    rt, gt = _blocked_dims(rows, groups)
    padded = scales_RG
    if (rows, groups) != (128 * rt, 4 * gt):
        padded = scales_RG.new_zeros((128 * rt, 4 * gt))
        padded[:rows, :groups] = scales_RG
    tiles = padded.view(rt, 128, gt, 4).permute(0, 2, 1, 3)
    return tiles.reshape(-1, 4, 32, 4).transpose(1, 2).reshape(-1)


def unswizzle_32_4_4(blocked: Tensor, rows: int, groups: int) -> Tensor:
    """Inverse of :func:`swizzle_32_4_4`: the ``[rows, groups]`` scales (torchao's ``from_blocked``)."""
    rt, gt = _blocked_dims(rows, groups)
    if blocked.numel() != rt * gt * 512:
        raise GemmInputError(
            f"blocked has {blocked.numel()} elements; expected {rt * gt * 512} for [{rows}, "
            f"{groups}] scales in SWIZZLE_32_4_4 layout (128 x 4 tiles of 512); swizzle the "
            f"scales with swizzle_32_4_4"
        )
    tiles = blocked.reshape(rt * gt, 32, 4, 4).transpose(1, 2)
    padded = tiles.reshape(rt, gt, 128, 4).permute(0, 2, 1, 3).reshape(128 * rt, 4 * gt)
    return padded[:rows, :groups]


# --------------------------------------------------------------------------- torchao interop


def _torchao_kind(t: object) -> str | None:
    """``"nvfp4"``/``"mx"`` for torchao's tensor classes, found without importing torchao."""
    cls = type(t)
    if not cls.__module__.startswith("torchao."):
        return None
    return {"NVFP4Tensor": "nvfp4", "MXTensor": "mx"}.get(cls.__name__)


def from_torchao(t: Tensor) -> NVFP4Parts | MXParts:
    """The parts of a torchao ``NVFP4Tensor`` / ``MXTensor`` laid out ``[X, K]`` (K last).

    Swizzled scales are unswizzled. A transposed tensor (torchao's ``w.t()``) is returned in
    its untransposed ``[N, K]`` form; :func:`torchnext.gemm.mm_quantized` handles that.
    """
    kind = _torchao_kind(t)
    if kind is None:
        raise GemmInputError(
            f"t is a {type(t).__name__}; expected torchao's NVFP4Tensor or MXTensor"
        )
    obj: Any = t
    qdata, scale = obj.qdata, obj.scale
    if qdata.dim() >= 2 and qdata.stride(-2) < qdata.stride(-1):  # torchao's transposed view
        qdata, scale = qdata.transpose(-2, -1), scale.transpose(-2, -1)
    k_packed = qdata.shape[-1]
    fp4 = kind == "nvfp4" or obj.elem_dtype == torch.float4_e2m1fn_x2
    groups = (2 * k_packed if fp4 else k_packed) // obj.block_size
    if obj.is_swizzled_scales:
        rows = qdata.numel() // max(k_packed, 1)
        scale = unswizzle_32_4_4(scale.contiguous(), rows, groups)
    scale = scale.reshape(*qdata.shape[:-1], groups)
    qdata = qdata.view(torch.uint8) if fp4 else qdata
    if kind == "nvfp4":
        return NVFP4Parts(qdata, scale, obj.per_tensor_scale, obj.block_size)
    return MXParts(qdata, scale, obj.elem_dtype, obj.block_size)


def to_torchao(parts: NVFP4Parts | MXParts, orig_dtype: torch.dtype = torch.bfloat16) -> Tensor:
    """The torchao tensor holding ``parts`` (unswizzled scales); needs torchao installed."""
    try:
        from torchao.prototype.mx_formats.mx_tensor import MXTensor
        from torchao.prototype.mx_formats.nvfp4_tensor import NVFP4Tensor
    except ImportError as exc:
        raise GemmUnsupportedError(
            "to_torchao needs torchao; install it with pip install 'torchnext[gemm]'"
        ) from exc
    if isinstance(parts, NVFP4Parts):
        return NVFP4Tensor(
            parts.qdata, parts.scales, parts.block_size, orig_dtype, parts.per_tensor_scale
        )
    return MXTensor(
        parts.qdata, parts.scales, parts.elem_dtype, parts.block_size, orig_dtype, None, None, False
    )
