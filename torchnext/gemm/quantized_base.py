"""The base class of the 4-bit weight containers, and the CPU kernel's ``blocked8`` layout.

What it is: :class:`QuantizedWeight` holds a 4-bit weight ``[N, K]`` as packed codes plus
per-block scales (and zeros), stores them in the layout the device's kernel reads, and gives
the row-major views, ``to(device)``, ``nbytes`` and dequantization of any rows; each format
(:mod:`torchnext.gemm.quantized_weight`'s ``NVFP4Weight``, ``MXFP4Weight``, ``Int4Weight``)
adds only its quantizer and its decode of stored rows (``_dequantize``).

When to use: to add a 4-bit format (subclass it) or to type a parameter that takes any
container. To build a weight use a subclass's ``from_float``; the public names here are
re-exported by :mod:`torchnext.gemm.quantized_weight`.

Layout: on the CPU the codes and scales are stored ``blocked8`` (see
:mod:`torchnext.gemm.gemv_cpu_source`; a permutation of the row-major form, rows padded to a
multiple of 8); on other devices row-major ``[N, K/2]`` like torchao's.

What not to assume: the base class checks shapes and devices, not values (NaN scales are a
subclass's check); :meth:`QuantizedWeight.dequantize` materialises the whole weight and is
for reference and tests only.

Shape legend: ``N`` rows (out features), ``K`` columns (in features), ``P = K/2`` packed
bytes, ``G = K/block`` scale groups, ``B = ceil(N/8)`` row blocks, ``R`` rows of a slice,
``X`` the columns of a stored tensor, ``Y`` its columns per block of 8 rows.
"""

from __future__ import annotations

import abc
import functools
from typing import ClassVar, Literal

import torch
from torch import Tensor

from torchnext.errors import GemmInputError

__all__ = ["SCALE_KINDS", "QuantizedWeight", "check_weight"]

SCALE_KINDS: dict[object, int] = {
    "e4m3": 0,
    "e8m0": 1,
    torch.bfloat16: 2,
    torch.float16: 3,
    torch.float32: 4,
}
"""How the kernels read a scale: its encoding -> the code they take. An ``e4m3`` scale is read
as float16 bits, which is its value times ``2**-8`` (the weight's ``out_scale`` undoes it)."""


@functools.cache
def _bf16_bits(values: tuple[float, ...]) -> Tensor:
    # Cached: the kernels read it through a raw pointer, so it must outlive every call.
    return torch.tensor(values, dtype=torch.bfloat16).view(torch.int16)


def _to_blocked(t_NX: Tensor, per_row: int) -> Tensor:
    """Row-major ``[N, X]`` -> ``[B, X/per_row, 8 * per_row]`` with rows padded to 8B."""
    n, x = t_NX.shape
    b = -(-n // 8)
    padded = t_NX.new_zeros((8 * b, x))
    padded[:n] = t_NX
    blocked = padded.view(b, 8, x // per_row, per_row).permute(0, 2, 3, 1)
    return blocked.reshape(b, x // per_row, 8 * per_row).contiguous()


def _from_blocked(t_BY: Tensor, per_row: int, n: int) -> Tensor:
    """Inverse of :func:`_to_blocked`: the first ``n`` rows, row-major."""
    b, y, _ = t_BY.shape
    return t_BY.view(b, y, per_row, 8).permute(0, 3, 1, 2).reshape(8 * b, y * per_row)[:n]


class QuantizedWeight(abc.ABC):
    """A 4-bit weight ``[N, K]``: codes two per byte plus per-block scales (and zeros).

    Build one with a subclass's ``from_float``; ``nbytes`` is the packed size, the only memory
    the GEMV needs besides a few rows of scratch.
    """

    fmt: ClassVar[str] = ""
    VALUES: ClassVar[tuple[float, ...]] = ()
    __slots__ = ("block_size", "codes", "in_features", "out_features", "scales", "zeros")

    def __init__(
        self, codes_NP: Tensor, scales_NG: Tensor, zeros_NG: Tensor | None, block_size: int
    ) -> None:
        n, p = codes_NP.shape
        k = 2 * p
        if block_size % 16 or k % block_size:
            raise GemmInputError(
                f"in_features={k} with block_size={block_size}; expected a block size that is a "
                f"multiple of 16 and divides in_features; pad the weight's columns with zeros"
            )
        for name, t in (("scales", scales_NG), ("zeros", zeros_NG)):
            if t is not None and tuple(t.shape) != (n, k // block_size):
                raise GemmInputError(
                    f"{name}.shape={tuple(t.shape)}; expected {(n, k // block_size)} (one per "
                    f"{block_size} elements of each of the {n} rows)"
                )
            if t is not None and t.device != codes_NP.device:
                raise GemmInputError(
                    f"{name}.device={t.device}; expected the codes' device {codes_NP.device}"
                )
        self.out_features, self.in_features, self.block_size = n, k, block_size
        blocked = codes_NP.device.type == "cpu"
        self.codes = _to_blocked(codes_NP, 2) if blocked else codes_NP.contiguous()
        self.scales = self._store(scales_NG, blocked)
        self.zeros = None if zeros_NG is None else self._store(zeros_NG, blocked)

    @staticmethod
    def _store(t_NG: Tensor, blocked: bool) -> Tensor:
        if not blocked:
            return t_NG.contiguous()
        raw = t_NG.view(torch.uint8) if t_NG.element_size() == 1 else t_NG
        return _to_blocked(raw, 1).view(t_NG.dtype)

    # ------------------------------------------------------------------ properties

    @property
    def layout(self) -> Literal["blocked8", "rows"]:
        """``"blocked8"`` (the CPU kernel's) or ``"rows"`` (row-major, other devices)."""
        return "blocked8" if self.codes.dim() == 3 else "rows"

    @property
    def shape(self) -> torch.Size:
        return torch.Size((self.out_features, self.in_features))

    @property
    def device(self) -> torch.device:
        return self.codes.device

    @property
    def nbytes(self) -> int:
        """Bytes of the packed form: codes, scales, zeros (and a per-tensor scale)."""
        parts = [self.codes, self.scales, self.zeros, self.per_tensor_scale]
        return sum(t.numel() * t.element_size() for t in parts if t is not None)

    @property
    def per_tensor_scale(self) -> Tensor | None:
        return None

    @property
    def scale_kind(self) -> int:
        """How the kernels read a scale (:data:`SCALE_KINDS`)."""
        return SCALE_KINDS[self.scales.dtype]

    @property
    def out_scale(self) -> float:
        """The factor the kernels apply to each output (a per-tensor scale, an encoding's)."""
        return 1.0

    def value_bits(self) -> Tensor:
        """``VALUES`` as 16 bfloat16 bit patterns (every value is exact in bfloat16)."""
        return _bf16_bits(self.VALUES)

    # ------------------------------------------------------------------ row-major views

    def codes_rows(self) -> Tensor:
        """Packed codes, row-major uint8 ``[N, K/2]`` (low nibble first, torchao's order)."""
        return self._slice(self.codes, 2, 0, self.out_features)

    def scales_rows(self) -> Tensor:
        """Scales, row-major ``[N, K/block]``."""
        return self._rows(self.scales)

    def zeros_rows(self) -> Tensor | None:
        """Zero points, row-major ``[N, K/block]``, or ``None``."""
        return None if self.zeros is None else self._rows(self.zeros)

    def _rows(self, t: Tensor) -> Tensor:
        return self._slice(t, 1, 0, self.out_features)

    # ------------------------------------------------------------------ dequantization

    def dequantize(self, dtype: torch.dtype = torch.float32) -> Tensor:
        """The full-precision weight ``[N, K]`` (reference only: it materialises the weight)."""
        return self.dequantize_rows(0, self.out_features).to(dtype)

    def dequantize_rows(self, start: int, stop: int) -> Tensor:
        """Rows ``start:stop`` of the weight in float32 (only those rows are unpacked)."""
        codes = self._slice(self.codes, 2, start, stop)
        scales = self._slice(self.scales, 1, start, stop)
        zeros = None if self.zeros is None else self._slice(self.zeros, 1, start, stop)
        return self._dequantize(codes, scales, zeros)

    def _slice(self, t: Tensor, per_row: int, start: int, stop: int) -> Tensor:
        """Rows ``start:stop`` of a stored tensor, row-major."""
        if self.layout == "rows":
            return t[start:stop]
        b0, b1 = start // 8, -(-stop // 8)
        raw = t.view(torch.uint8) if t.element_size() == 1 else t
        rows = _from_blocked(raw[b0:b1], per_row, 8 * (b1 - b0)).view(t.dtype)
        return rows[start - 8 * b0 : stop - 8 * b0]

    @abc.abstractmethod
    def _dequantize(self, codes_RP: Tensor, scales_RG: Tensor, zeros_RG: Tensor | None) -> Tensor:
        """Each format's decode of stored rows to float32 (NVFP4, MXFP4 and int4 differ)."""

    def to(self, device: torch.device | str) -> QuantizedWeight:
        """The same weight on ``device`` (re-laid out for that device's kernel)."""
        device = torch.device(device)
        if device == self.device:
            return self
        zeros = self.zeros_rows()
        new = object.__new__(type(self))
        for slot in self._extra_slots():
            value = getattr(self, slot)
            setattr(new, slot, value.to(device) if isinstance(value, Tensor) else value)
        QuantizedWeight.__init__(
            new,
            self.codes_rows().to(device),
            self.scales_rows().to(device),
            None if zeros is None else zeros.to(device),
            self.block_size,
        )
        return new

    def _extra_slots(self) -> tuple[str, ...]:
        return ()

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(out_features={self.out_features}, in_features="
            f"{self.in_features}, block_size={self.block_size}, layout={self.layout!r}, "
            f"device={self.device}, nbytes={self.nbytes})"
        )


def check_weight(w_NK: Tensor) -> None:
    """Raise :class:`GemmInputError` unless ``w_NK`` is a 2-D floating-point tensor."""
    if not isinstance(w_NK, Tensor) or w_NK.dim() != 2 or not w_NK.is_floating_point():
        raise GemmInputError(
            f"w_NK is {type(w_NK).__name__} of shape {tuple(getattr(w_NK, 'shape', ()))}; "
            f"expected a 2-D floating-point [out_features, in_features] tensor (a linear "
            f"layer's .weight)"
        )
