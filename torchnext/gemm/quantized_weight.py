"""4-bit weight containers for weight-only GEMV: NVFP4, MXFP4 and group-wise int4.

When to use: quantize a linear layer's weight ``w_NK`` once, then call
:func:`torchnext.gemm.gemv.linear` with it on every decode step::

    w = NVFP4Weight.from_float(w_NK)    # or MXFP4Weight / Int4Weight, or .from_torchao(t)
    y = torchnext.gemm.gemv.linear(x, w, bias)

Every container holds ``W[n, k] = VALUES[code[n, k]] * scale[n, k // block] (+ zero[...])``:

============  ======================  =============================================  =========
container     VALUES[code]            scale (per ``block`` elements of a row)        block
============  ======================  =============================================  =========
NVFP4Weight   FP4 e2m1                ``float(e4m3) * per_tensor_scale`` (torchao)   16
MXFP4Weight   FP4 e2m1                ``2 ** (e8m0 - 127)`` (torchao's MXTensor)     32
Int4Weight    ``code - 8``            bf16/f16/f32 scale, plus a zero when           32..256
                                      asymmetric (torch's int4 CPU kernel's rule)
============  ======================  =============================================  =========

The FP4 quantizers are :mod:`torchnext.gemm.formats`' (bit for bit torchao 0.18's);
``NVFP4Weight.from_torchao`` / ``MXFP4Weight.from_torchao`` (or :func:`weight_from_torchao`)
take torchao's ``NVFP4Tensor`` / ``MXTensor`` (any scale swizzle).

The base class, :class:`QuantizedWeight`, and the storage layout are in
:mod:`torchnext.gemm.quantized_base` (re-exported here). Layout: on the CPU the codes and
scales are stored in the GEMV kernel's ``blocked8`` layout (see
:mod:`torchnext.gemm.gemv_cpu_source`; a permutation of the row-major form, rows padded to a
multiple of 8); on other devices row-major ``[N, K/2]`` like torchao's. ``codes_rows()`` and
``scales_rows()`` give the row-major form on any device.

What not to assume: these are not ``torch.Tensor`` subclasses (no autograd, no tracing by
``torch.compile``); :meth:`QuantizedWeight.dequantize` materialises the whole weight and is
for reference and tests only.

Shape legend: ``N`` rows (out features), ``K`` columns (in features), ``P = K/2`` packed
bytes, ``G = K/block`` scale groups, ``B = ceil(N/8)`` row blocks, ``Q = K/4`` code quads.
"""

from __future__ import annotations

from typing import Literal

import torch
from torch import Tensor

from torchnext.compat import gemm_internals
from torchnext.errors import GemmInputError, GemmUnsupportedError
from torchnext.gemm import formats
from torchnext.gemm.quantized_base import SCALE_KINDS, QuantizedWeight, check_weight

__all__ = [
    "SCALE_KINDS",
    "Int4Weight",
    "MXFP4Weight",
    "NVFP4Weight",
    "QuantizedWeight",
    "weight_from_torchao",
]

_INT4_GROUPS = (32, 64, 128, 256)
_INT4_SCALE_DTYPES = (torch.bfloat16, torch.float16, torch.float32)


class NVFP4Weight(QuantizedWeight):
    """NVFP4: e2m1 codes, an e4m3 scale per 16 elements, an optional float32 global scale."""

    fmt = "nvfp4"
    VALUES = formats.E2M1_VALUES
    __slots__ = ("_pts",)

    def __init__(self, parts: formats.NVFP4Parts) -> None:
        pts = parts.per_tensor_scale
        if parts.qdata.dim() != 2 or (pts is not None and pts.numel() != 1):
            raise GemmInputError(
                f"parts.qdata.shape={tuple(parts.qdata.shape)} with per_tensor_scale of "
                f"{None if pts is None else pts.numel()} elements; expected a 2-D weight and "
                f"one scalar per-tensor scale"
            )
        if parts.scales.dtype != torch.float8_e4m3fn or parts.block_size != 16:
            raise GemmInputError(
                f"parts.scales.dtype={parts.scales.dtype}, block_size={parts.block_size}; "
                f"expected torch.float8_e4m3fn scales per 16 elements (NVFP4)"
            )
        nan = (parts.scales.view(torch.uint8) & 0x7F) == 0x7F
        if bool(nan.any()) or (pts is not None and bool(torch.isnan(pts).any())):
            raise GemmInputError(
                "NVFP4 scales hold NaN (e4m3 0x7F/0xFF) or per_tensor_scale is NaN; expected "
                "finite scales; re-quantize from a finite weight"
            )
        self._pts = None if pts is None else pts.reshape(()).to(torch.float32)
        super().__init__(parts.qdata.view(torch.uint8), parts.scales, None, 16)

    @classmethod
    def from_float(
        cls, w_NK: Tensor, *, per_tensor_scale: Tensor | Literal["amax"] | None = "amax"
    ) -> NVFP4Weight:
        """Quantize ``w_NK`` as torchao's ``NVFP4Tensor.to_nvfp4`` (K % 16 == 0).

        ``per_tensor_scale="amax"`` (default) uses torchao's weight rule,
        ``amax(|w|) / (448 * 6)``; ``None`` uses none; a float32 scalar tensor is used as is.
        """
        check_weight(w_NK)
        if isinstance(per_tensor_scale, str):
            per_tensor_scale = formats.nvfp4_per_tensor_scale(w_NK.abs().amax())
        return cls(formats.quantize_nvfp4(w_NK, per_tensor_scale=per_tensor_scale))

    @classmethod
    def from_torchao(cls, t: Tensor) -> NVFP4Weight:
        """torchao's 2-D ``NVFP4Tensor`` (any scale swizzle) as an ``NVFP4Weight``."""
        parts = formats.from_torchao(t)
        if not isinstance(parts, formats.NVFP4Parts):
            raise GemmInputError(f"t is torchao's {type(t).__name__}; expected an NVFP4Tensor")
        return cls(parts)

    @property
    def per_tensor_scale(self) -> Tensor | None:
        return self._pts

    @property
    def scale_kind(self) -> int:
        return SCALE_KINDS["e4m3"]

    @property
    def out_scale(self) -> float:
        # The kernels read e4m3 as float16 bits, which is the value times 2**-8.
        return 256.0 * (1.0 if self._pts is None else float(self._pts))

    def parts(self) -> formats.NVFP4Parts:
        """The row-major :class:`~torchnext.gemm.formats.NVFP4Parts`."""
        return formats.NVFP4Parts(self.codes_rows(), self.scales_rows(), self._pts)

    def _dequantize(self, codes_RP: Tensor, scales_RG: Tensor, zeros_RG: Tensor | None) -> Tensor:
        part = formats.NVFP4Parts(codes_RP, scales_RG, self._pts)
        return formats.dequantize_nvfp4(part, torch.float32)

    def _extra_slots(self) -> tuple[str, ...]:
        return ("_pts",)


class MXFP4Weight(QuantizedWeight):
    """MXFP4: e2m1 codes and an e8m0 (power of two) scale per 32 elements."""

    fmt = "mxfp4"
    VALUES = formats.E2M1_VALUES
    __slots__ = ()

    def __init__(self, parts: formats.MXParts) -> None:
        if parts.elem_dtype != torch.float4_e2m1fn_x2 or parts.qdata.dim() != 2:
            raise GemmInputError(
                f"parts.elem_dtype={parts.elem_dtype}, qdata.shape={tuple(parts.qdata.shape)}; "
                f"expected a 2-D MX weight with torch.float4_e2m1fn_x2 elements (MXFP4)"
            )
        if bool((parts.scales.view(torch.uint8) == 255).any()):
            raise GemmInputError(
                "MX scales hold NaN (e8m0 0xFF); expected finite scales; re-quantize from a "
                "finite weight"
            )
        super().__init__(parts.qdata.view(torch.uint8), parts.scales, None, parts.block_size)

    @classmethod
    def from_float(cls, w_NK: Tensor, *, scaling_mode: str = "floor") -> MXFP4Weight:
        """Quantize ``w_NK`` as torchao's ``MXTensor.to_mx(w, float4_e2m1fn_x2, 32)``."""
        check_weight(w_NK)
        parts = formats.quantize_mx(
            w_NK, torch.float4_e2m1fn_x2, block_size=32, scaling_mode=scaling_mode
        )
        return cls(parts)

    @classmethod
    def from_torchao(cls, t: Tensor) -> MXFP4Weight:
        """torchao's 2-D FP4 ``MXTensor`` (any scale swizzle) as an ``MXFP4Weight``."""
        parts = formats.from_torchao(t)
        if not isinstance(parts, formats.MXParts):
            raise GemmInputError(f"t is torchao's {type(t).__name__}; expected an MXTensor")
        return cls(parts)

    @property
    def scale_kind(self) -> int:
        return SCALE_KINDS["e8m0"]

    def parts(self) -> formats.MXParts:
        """The row-major :class:`~torchnext.gemm.formats.MXParts`."""
        return formats.MXParts(
            self.codes_rows(), self.scales_rows(), torch.float4_e2m1fn_x2, self.block_size
        )

    def _dequantize(self, codes_RP: Tensor, scales_RG: Tensor, zeros_RG: Tensor | None) -> Tensor:
        part = formats.MXParts(codes_RP, scales_RG, torch.float4_e2m1fn_x2, self.block_size)
        return formats.dequantize_mx(part, torch.float32)


class Int4Weight(QuantizedWeight):
    """Group-wise int4: ``W = (code - 8) * scale + zero`` per ``group_size`` elements of a row.

    The rule and the ``[K/group, N, 2]`` scale-and-zero table of torch's
    ``_weight_int4pack_mm_for_cpu`` (see :meth:`to_int4pack`); symmetric weights have no zero.
    """

    fmt = "int4"
    VALUES = tuple(float(c - 8) for c in range(16))
    __slots__ = ()

    @classmethod
    def from_float(
        cls,
        w_NK: Tensor,
        *,
        group_size: int = 128,
        symmetric: bool = False,
        scale_dtype: torch.dtype = torch.bfloat16,
    ) -> Int4Weight:
        """Quantize ``w_NK`` group-wise to int4 (round to nearest, ties to even).

        Equivalent, per group ``g`` of a row (``lo, hi`` its min and max, scales and zeros
        rounded to ``scale_dtype`` before the codes are chosen)::

            asymmetric: s = max(hi - lo, 1e-6) / 15; z = lo + 8 * s
            symmetric:  s = max(|g|.max(), 1e-6) / 7 (codes 1..15); z = 0
            code = clamp(round((g - z) / s) + 8, 0, 15)
        """
        check_weight(w_NK)
        if group_size not in _INT4_GROUPS or w_NK.shape[1] % group_size:
            raise GemmInputError(
                f"group_size={group_size} for in_features={w_NK.shape[1]}; expected one of "
                f"{_INT4_GROUPS} that divides in_features"
            )
        if scale_dtype not in _INT4_SCALE_DTYPES:
            raise GemmInputError(
                f"scale_dtype={scale_dtype}; expected one of {list(_INT4_SCALE_DTYPES)}"
            )
        n, k = w_NK.shape
        w_NGB = w_NK.float().reshape(n, k // group_size, group_size)
        if symmetric:
            s_NG = w_NGB.abs().amax(-1).clamp_min(1e-6) / 7
            z_NG = None
        else:
            lo_NG, hi_NG = w_NGB.amin(-1), w_NGB.amax(-1)
            s_NG = (hi_NG - lo_NG).clamp_min(1e-6) / 15
            z_NG = (lo_NG + 8 * s_NG).to(scale_dtype)
        s_NG = s_NG.to(scale_dtype)
        shifted = w_NGB if z_NG is None else w_NGB - z_NG.float().unsqueeze(-1)
        q_NGB = torch.round(shifted / s_NG.float().unsqueeze(-1)) + 8
        codes_NK = q_NGB.clamp(0, 15).to(torch.uint8).reshape(n, k)
        return cls(formats.pack_fp4(codes_NK), s_NG, z_NG, group_size)

    def __init__(
        self, codes_NP: Tensor, scales_NG: Tensor, zeros_NG: Tensor | None, group_size: int
    ) -> None:
        if codes_NP.dtype != torch.uint8 or codes_NP.dim() != 2:
            raise GemmInputError(
                f"codes_NP is {codes_NP.dtype} of shape {tuple(codes_NP.shape)}; expected uint8 "
                f"[N, K/2] (two codes per byte, low nibble first)"
            )
        if group_size not in _INT4_GROUPS:
            raise GemmInputError(f"group_size={group_size}; expected one of {_INT4_GROUPS}")
        if scales_NG.dtype not in _INT4_SCALE_DTYPES or (
            zeros_NG is not None and zeros_NG.dtype != scales_NG.dtype
        ):
            raise GemmInputError(
                f"scales dtype {scales_NG.dtype}, zeros dtype "
                f"{None if zeros_NG is None else zeros_NG.dtype}; expected one of "
                f"{list(_INT4_SCALE_DTYPES)}, the same for both"
            )
        bad = torch.isnan(scales_NG).any() | (
            torch.isnan(zeros_NG).any() if zeros_NG is not None else False
        )
        if bool(bad):
            raise GemmInputError("int4 scales or zeros hold NaN; expected finite values")
        super().__init__(codes_NP, scales_NG, zeros_NG, group_size)

    @property
    def symmetric(self) -> bool:
        return self.zeros is None

    def _dequantize(self, codes_RP: Tensor, scales_RG: Tensor, zeros_RG: Tensor | None) -> Tensor:
        rows, g = scales_RG.shape
        q_RGB = formats.unpack_fp4(codes_RP).float().reshape(rows, g, self.block_size) - 8
        w_RGB = q_RGB * scales_RG.float().unsqueeze(-1)
        if zeros_RG is not None:
            w_RGB = w_RGB + zeros_RG.float().unsqueeze(-1)
        return w_RGB.reshape(rows, g * self.block_size)

    def to_int4pack(self, dtype: torch.dtype = torch.bfloat16) -> tuple[Tensor, Tensor]:
        """``(packed, scales_and_zeros)`` for torch's int4 CPU kernel (``x`` of ``dtype``).

        ``torch.ops.aten._weight_int4pack_mm_for_cpu(x, packed, group_size, scales_and_zeros)``
        then equals ``x @ self.dequantize(dtype).T`` (the benchmark's native baseline).
        """
        convert = gemm_internals.int4pack_convert_for_cpu()
        if convert is None or self.device.type != "cpu":
            raise GemmUnsupportedError(
                f"to_int4pack needs torch's int4 CPU packing op and a CPU weight; this torch "
                f"{torch.__version__} lacks it or the weight is on {self.device}"
            )
        codes_NK = formats.unpack_fp4(self.codes_rows()).to(torch.int32)
        packed = convert(codes_NK.contiguous(), 1)
        s_NG = self.scales_rows().to(dtype)
        zeros = self.zeros_rows()
        z_NG = torch.zeros_like(s_NG) if zeros is None else zeros.to(dtype)
        return packed, torch.stack([s_NG, z_NG], dim=-1).transpose(0, 1).contiguous()


def weight_from_torchao(t: Tensor) -> NVFP4Weight | MXFP4Weight:
    """A container for torchao's 2-D ``NVFP4Tensor`` or FP4 ``MXTensor`` (its data, re-laid out).

    Scales swizzled for cuBLAS are unswizzled, a transposed weight is read as ``[N, K]`` (see
    :func:`torchnext.gemm.formats.from_torchao`); torchao itself is not imported.
    """
    parts = formats.from_torchao(t)
    if isinstance(parts, formats.NVFP4Parts):
        return NVFP4Weight(parts)
    return MXFP4Weight(parts)
