"""FP4 (e2m1) and FP8 element codes, and :class:`ScaledOperand`, a GEMM operand in kernel form.

The element level under :mod:`torchnext.gemm.formats`: packing two e2m1 codes per byte,
encoding float32 to e2m1 codes bit for bit as torchao, decoding codes and packed bytes and FP8
bytes to float32 through small lookup tables, and decoding a ``[R, K]`` operand's rows with
its block scales applied (:meth:`ScaledOperand.dequantize_rows`, what the CPU emulation of
:func:`torchnext.gemm.scaled_mm` and the Triton kernels read).

When to use: to handle FP4/FP8 elements without quantizing a tensor. To quantize or
dequantize whole NVFP4/MX tensors use :mod:`torchnext.gemm.formats`, which re-exports every
public name here (import them from either module).

FP4 packing (torchao's and torch's ``float4_e2m1fn_x2``): element ``2i`` is the LOW nibble of
byte ``i``, element ``2i+1`` the HIGH nibble.

What not to assume: codes are uint8 values 0..15 (bit 3 the sign), never ``float4`` tensors;
the lookup tables are built per device on first use and kept (256 entries each); decoding is
exact, but a scaled value may leave float32's range.

Shape legend: ``X`` any leading dimensions, ``K`` the last (contraction) dimension, ``P = K/2``
packed FP4 bytes, ``R`` rows of an operand, ``G`` scale groups along K, ``B`` elements of a
block (``K = G * B``), ``B2`` the two floats of a byte's pair.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from torchnext.errors import GemmInputError

__all__ = [
    "E2M1_VALUES",
    "ScaledOperand",
    "decode_e2m1",
    "decode_fp8",
    "decode_packed_e2m1",
    "encode_e2m1",
    "pack_fp4",
    "unpack_fp4",
]

E2M1_VALUES: tuple[float, ...] = (
    *(0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0),
    *(-0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0),
)
"""The 16 FP4 e2m1 code points, code -> value (bit 3 is the sign; code 8 is -0.0)."""


# --------------------------------------------------------------------------- FP4 codes

# A byte's two decoded floats (low nibble first) stored as one int64, so decoding packed data
# is one gather of 8-byte words: measured about 3x faster on the CPU than decoding each nibble
# through a 16-entry table. Copying int64 words moves the float bits unchanged.
_PAIR_TABLES: dict[torch.device, Tensor] = {}


def _pair_table(device: torch.device) -> Tensor:
    table = _PAIR_TABLES.get(device)
    if table is None:
        values = torch.tensor(E2M1_VALUES, dtype=torch.float32)
        pairs_B2 = torch.stack([values.repeat(16), values.repeat_interleave(16)], dim=-1)
        table = pairs_B2.contiguous().view(torch.int64).reshape(256).to(device)
        _PAIR_TABLES[device] = table
    return table


def _check_codes(name: str, t: Tensor, *, even_last: bool) -> None:
    if t.dtype != torch.uint8:
        raise GemmInputError(
            f"{name}.dtype={t.dtype}; expected torch.uint8 (FP4 codes or packed bytes); "
            f"pass the tensor viewed as uint8 (.view(torch.uint8))"
        )
    if t.dim() < 1 or (even_last and t.shape[-1] % 2):
        raise GemmInputError(
            f"{name}.shape={tuple(t.shape)}; expected an even last dimension (two FP4 codes "
            f"per byte); pad the last dimension to an even size"
        )


def pack_fp4(codes_XK: Tensor) -> Tensor:
    """Pack e2m1 codes (uint8 0..15) two per byte along the last dimension.

    Equivalent to ``codes_XK[..., 0::2] | (codes_XK[..., 1::2] << 4)``: element ``2i`` in the
    low nibble of byte ``i`` (torchao's and ``torch.float4_e2m1fn_x2``'s order).
    """
    _check_codes("codes_XK", codes_XK, even_last=True)
    return codes_XK[..., 0::2] | (codes_XK[..., 1::2] << 4)


def unpack_fp4(packed_XP: Tensor) -> Tensor:
    """Inverse of :func:`pack_fp4`: uint8 ``[X, P]`` -> codes uint8 ``[X, 2P]``."""
    _check_codes("packed_XP", packed_XP, even_last=False)
    both_XP2 = torch.stack([packed_XP & 0x0F, packed_XP >> 4], dim=-1)
    return both_XP2.reshape(*packed_XP.shape[:-1], 2 * packed_XP.shape[-1])


def encode_e2m1(x: Tensor) -> Tensor:
    """float32 -> e2m1 codes (uint8 0..15), torchao's ``f32_to_f4_unpacked`` bit for bit.

    Round to nearest, ties to the even code; magnitudes at or above 6 (inf included) saturate
    to code 7; the sign bit is kept (``-0.0`` and negative values that round to zero give
    code 8). A NaN gets the code torchao's bit arithmetic gives it (2, 3 or 4 plus sign,
    depending on its payload), so quantized NaN data compares equal to torchao's.
    """
    if x.dtype != torch.float32:
        raise GemmInputError(f"x.dtype={x.dtype}; expected torch.float32; pass x.float()")
    bits = x.view(torch.int32)
    mag_bits = bits & 0x7FFFFFFF
    a = mag_bits.view(torch.float32)
    # Each threshold is a midpoint between neighbouring magnitudes; ">" sends the tie down,
    # ">=" sends it up, whichever neighbour has the even code.
    code = (a > 0.25).to(torch.uint8)
    for threshold, tie_up in ((0.75, True), (1.25, False), (1.75, True), (2.5, False)):
        code += (a >= threshold) if tie_up else (a > threshold)
    code += a >= 3.5
    code += a > 5.0
    # NaN: torchao's normal-range rounding applied to the NaN's bits, low byte kept.
    odd = (mag_bits >> 22) & 1
    nan_code = ((mag_bits + ((1 - 127) << 23) + 0x1FFFFF + odd) >> 22) & 0xFF
    code = torch.where(torch.isnan(a), nan_code.to(torch.uint8), code)
    return code | ((bits < 0).to(torch.uint8) << 3)


def decode_e2m1(codes: Tensor, dtype: torch.dtype = torch.float32) -> Tensor:
    """e2m1 codes (uint8 0..15) -> values: ``E2M1_VALUES[code]``, exact in any float dtype."""
    table = torch.tensor(E2M1_VALUES, dtype=dtype, device=codes.device)
    return table[codes.long()]


def decode_packed_e2m1(packed_XP: Tensor) -> Tensor:
    """Packed FP4 bytes uint8 ``[X, P]`` -> float32 ``[X, 2P]`` (one gather per byte)."""
    flat = packed_XP.reshape(-1).to(torch.int32)
    words = _pair_table(packed_XP.device).index_select(0, flat)
    return words.view(torch.float32).reshape(*packed_XP.shape[:-1], 2 * packed_XP.shape[-1])


_FP8_FORMATS = {
    "e4m3": torch.float8_e4m3fn,
    "e5m2": torch.float8_e5m2,
    "e4m3fnuz": torch.float8_e4m3fnuz,
    "e5m2fnuz": torch.float8_e5m2fnuz,
}
_FP8_TABLES: dict[tuple[str, torch.device], Tensor] = {}


def decode_fp8(data_RK: Tensor, fmt: str) -> Tensor:
    """FP8 bytes (any float8 dtype, ``fmt`` one of ``"e4m3"``, ``"e5m2"``, ``"e4m3fnuz"``,
    ``"e5m2fnuz"``) -> float32 of the same shape, the bits of ``.float()``."""
    # A 256-entry table of float32 bits: one gather, measured 1.5x faster than .float() on
    # the CPU, and the same bits (NaN included) because the table is built with .float().
    table = _FP8_TABLES.get((fmt, data_RK.device))
    if table is None:
        codes = torch.arange(256, dtype=torch.uint8).view(_FP8_FORMATS[fmt])
        table = codes.float().view(torch.int32).to(data_RK.device)
        _FP8_TABLES[(fmt, data_RK.device)] = table
    flat = data_RK.view(torch.uint8).reshape(-1).to(torch.int32)
    return table.index_select(0, flat).view(torch.float32).reshape(data_RK.shape)


@dataclass(frozen=True)
class ScaledOperand:
    """One GEMM operand as ``[R, K]`` (K, the contraction, last), the form the kernels take.

    ``value[r, k] = element(data[r, k]) * scales[r // row_block, k // k_block]``, where
    ``data`` is float8 ``[R, K]`` (``fmt`` ``"e4m3"``, ``"e5m2"``, or their ``"...fnuz"``) or
    uint8 ``[R, K/2]`` packed e2m1 (``fmt="e2m1"``), with any strides; ``scales`` is float32
    ``[ceil(R/row_block), ceil(K/k_block)]`` or ``None`` (all ones). ``raw_scales`` keeps an
    MX operand's e8m0 scales ``[R, K/32]`` for kernels that take them as they are.
    """

    data: Tensor
    fmt: str
    k: int
    scales: Tensor | None = None
    row_block: int = 1
    k_block: int = 1
    raw_scales: Tensor | None = None

    @property
    def rows(self) -> int:
        return int(self.data.shape[0])

    def dequantize_rows(self, start: int, stop: int) -> Tensor:
        """float32 ``[stop - start, K]``: rows ``start:stop`` with their scales applied.

        Exact: every element times its scale is a float32 number here (FP4 x e4m3 has 6
        significant bits, FP8 x a power of two 4), except where a product leaves float32's
        range, and float32 scales (RowWise, 1x128) where one rounding per element is the rule.
        """
        part = self.data[start:stop]
        vals_RK = (
            decode_packed_e2m1(part.view(torch.uint8))
            if self.fmt == "e2m1"
            else decode_fp8(part, self.fmt)
        )
        if self.scales is None or vals_RK.numel() == 0:
            return vals_RK
        rows = torch.arange(start, stop, device=self.scales.device) // self.row_block
        scale_RG = self.scales.index_select(0, rows)
        groups, kb = scale_RG.shape[1], self.k_block
        if groups * kb != self.k:  # a last, partial block: widen, scale, cut back
            vals_RK = torch.nn.functional.pad(vals_RK, (0, groups * kb - self.k))
        vals_RGB = vals_RK.view(stop - start, groups, kb)
        vals_RGB.mul_(scale_RG.unsqueeze(-1))
        return vals_RGB.view(stop - start, groups * kb)[:, : self.k]
