"""Decode GEMV: ``F.linear``-shaped calls with few rows, on dense or 4-bit weights.

When to use: in place of ``F.linear(x, w, b)`` in a decoder's per-token step, where ``x`` is
``[B, 1, K]`` (or any ``[..., K]`` with at most :data:`GEMV_MAX_ROWS` rows), and above all
with a weight-only quantized weight (:mod:`torchnext.gemm.quantized_weight`): the weight is
read once in its packed form and decoded in registers, so a 4-bit weight moves an eighth of
float32's bytes and no full-precision copy of it exists at any time.

:func:`linear` picks one route per call (:func:`route` names it):

=====================  ==============  ===========================  =========================
weight                 device          rows <= GEMV_MAX_ROWS        more rows (GEMM)
=====================  ==============  ===========================  =========================
QuantizedWeight        CPU             ``cpu-q4-gemv``: fused       ``cpu-q4-chunked``: 256-
                                       dequant + reduction (C)      row chunks dequantized
                                                                    (C), then ``mm``
QuantizedWeight        CUDA + Triton   ``triton-q4-gemv``           ``torch-q4-chunked``
QuantizedWeight        other / traced  ``torch-q4-chunked``         ``torch-q4-chunked``
bfloat16 / float32     CPU with        ``cpu-dense512``: AVX-512    ``aten`` (``F.linear``)
(``AVX512_MIN_         AVX-512 (BF16   tiles (C), operands, bias
ELEMENTS`` and more)   for bfloat16)   and result in their dtype
float16, and bfloat16  CPU with AVX2   ``cpu-dense-gemv``: rows     ``aten``
without BF16                           upcast in registers (AVX2
(``DENSE_MIN_ELEMENTS``                C); 2 or more only where
and more)                              torch emulates the dtype
anything else          any             ``aten``                     ``aten``
=====================  ==============  ===========================  =========================

Accuracy: products and sums in float32 (as torch's CPU GEMM for these dtypes), output cast
to ``x.dtype``; within float32-accumulation tolerance of ``x.double() @ W.double().T``. The
AVX-512 bfloat16 tiles (``vdpbf16ps``) read subnormal bfloat16 values as zero.

First-call cost: the CPU kernels are C compiled once per machine (1-2 s, then cached on disk,
see :mod:`torchnext.gemm.gemv_cpu`); no ``torch.compile`` is involved, so no call recompiles
for a new shape. Without a C compiler the ``torch-q4-chunked`` route is used (correct, slower).
Under ``torch.compile`` tracing the traceable ``torch-q4-chunked`` / ``aten`` routes are used.

What not to assume: no autograd through a quantized weight (inference only); a torchao
``NVFP4Tensor`` / ``MXTensor`` weight is converted on every call (convert it once with
:func:`~torchnext.gemm.quantized_weight.weight_from_torchao`).

Shape legend: ``M`` rows of x (all leading dims), ``K`` in features, ``N`` out features,
``R`` rows of a dequantized chunk.
"""

from __future__ import annotations

import importlib.util

import torch
import torch.nn.functional as F
from torch import Tensor

from torchnext.compat.gemm_internals import onednn_has_bf16
from torchnext.errors import GemmInputError, GemmUnsupportedError
from torchnext.gemm import gemv_cpu
from torchnext.gemm.grouped_cpu import cpu_upcasts
from torchnext.gemm.quantized_weight import QuantizedWeight, weight_from_torchao

__all__ = [
    "CHUNK_BYTES",
    "AVX512_MIN_ELEMENTS",
    "DENSE_MIN_ELEMENTS",
    "GEMV_MAX_ROWS",
    "available_routes",
    "dense_or_none",
    "linear",
    "route",
]

GEMV_MAX_ROWS = 8
"""Calls with at most this many rows of ``x`` take a GEMV route."""

CHUNK_BYTES = 4 << 20
"""Largest dequantized float32 chunk of the weight on the GEMM routes; a chunk is also at most
the packed weight's size (but at least 64 rows), so the GEMM routes' extra memory stays under
twice the packed weight for weights of 500 rows and more."""

DENSE_MIN_ELEMENTS = 1 << 19
"""A bfloat16/float16 weight takes ``cpu-dense-gemv``'s AVX2 tiles from this size (half of it
when M > 1)."""

AVX512_MIN_ELEMENTS = {torch.bfloat16: (1 << 16, 1 << 16), torch.float32: (1 << 20, 1 << 18)}
"""Weight elements from which ``cpu-dense512``'s AVX-512 tiles run, per dtype, for one row of
``x`` and for more. Below them torch's call plus less Python was measured faster (float32 at
one row: torch's GEMV is quick while the weight sits in cache)."""

_ACT_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
_OUT_DTYPES = (torch.float32, torch.bfloat16, torch.float16, torch.float64)


def _is_torchao(weight: object) -> bool:
    cls = type(weight)
    return cls.__module__.startswith("torchao.") and cls.__name__ in ("NVFP4Tensor", "MXTensor")


def _tracing() -> bool:
    return bool(torch.compiler.is_compiling())


def _recording(x: Tensor, weight: object, bias: Tensor | None = None) -> bool:
    """Autograd records this call: only the torch routes have a backward."""
    if not torch.is_grad_enabled():
        return False
    return (
        x.requires_grad
        or (isinstance(weight, Tensor) and weight.requires_grad)
        or (isinstance(bias, Tensor) and bias.requires_grad)
    )


def _triton_available() -> bool:
    # Only looked up: importing Triton costs seconds, and only its route needs it.
    return importlib.util.find_spec("triton") is not None


def _cpu() -> gemv_cpu.CpuKernels:
    cpu = gemv_cpu.kernels()
    if cpu is None:
        raise GemmUnsupportedError(
            "the CPU GEMV kernels could not be built (no working C compiler); install one "
            "(cc, gcc or clang, or set CC), or call with a weight route() sends elsewhere"
        )
    return cpu


_DENSE = (torch.bfloat16, torch.float16, torch.float32)


def route(x: Tensor, weight: Tensor | QuantizedWeight, bias: Tensor | None = None) -> str:
    """The route :func:`linear` takes for these operands (see the module's table)."""
    k = x.shape[-1] if x.dim() else 0
    rows = x.numel() // max(k, 1)
    gemv = rows <= GEMV_MAX_ROWS
    if isinstance(weight, QuantizedWeight) or _is_torchao(weight):
        # The C and Triton kernels have no backward: under autograd the torch routes run.
        plain = not (_tracing() or _recording(x, weight, bias))
        device = weight.device
        if device.type == "cpu" and plain and gemv_cpu.kernels() is not None:
            return "cpu-q4-gemv" if gemv else "cpu-q4-chunked"
        if device.type == "cuda" and gemv and plain and _triton_available():
            return "triton-q4-gemv"
        return "torch-q4-chunked"
    # A dense weight: the cheap tests first, since most calls end in "aten" and every call
    # of F.linear's size pays for them; tracing before the kernel lookup, which Dynamo
    # cannot trace (it reads the disk on first use).
    if not isinstance(weight, Tensor) or not gemv or weight.dtype not in _DENSE:
        return "aten"
    if not (weight.is_cpu and x.is_cpu) or weight.dim() != 2 or x.dtype != weight.dtype:
        return "aten"  # the dense C kernels are CPU code, for one dtype
    if weight.stride(-1) != 1 or _tracing() or _recording(x, weight, bias):
        return "aten"
    cpu = gemv_cpu.kernels()
    if cpu is None:
        return "aten"
    if weight.dtype in cpu.avx512_dtypes:
        # AVX-512 tiles (bfloat16 dot products, float32 FMA): 1.2 to 4x torch's GEMM at 1 to 8
        # rows from this size on (measured); below it torch's call plus less Python wins.
        one_row, more_rows = AVX512_MIN_ELEMENTS[weight.dtype]
        big = weight.numel() >= (one_row if rows == 1 else more_rows)
        return "cpu-dense512" if big else "aten"
    if weight.dtype == torch.float32:
        return "aten"
    # From two rows on, a CPU with instructions for the dtype runs torch's GEMM, which
    # converts the weight once for all rows, at 0.8 to 1.4 times the AVX2 tiles; where torch
    # emulates the dtype the tiles win 2x and more.
    if rows > 1 and not cpu_upcasts(weight.dtype):
        return "aten"
    # Below this many weight elements torch's own call is faster than ours plus its ~50 us of
    # Python (measured: 512 x 512 at M = 1 lost 0.9x; at M = 2, and 1024 x 512, won 1.2x).
    big = weight.numel() >= (DENSE_MIN_ELEMENTS if rows == 1 else DENSE_MIN_ELEMENTS // 2)
    return "cpu-dense-gemv" if big else "aten"


def available_routes(device: str = "cpu") -> dict[str, str]:
    """GEMV route -> ``"available"`` or why not, for ``torchnext doctor`` (builds nothing)."""
    if device == "cpu":
        cc = gemv_cpu.compiler()
        status = f"available (C kernels, built once with {cc})" if cc else "missing: no C compiler"
        return {
            "cpu-q4-gemv": status,
            "cpu-q4-chunked": status,
            "cpu-dense512": _avx512_status(cc),
            "cpu-dense-gemv": status,
            "torch-q4-chunked": "available (pure torch, any device)",
        }
    triton = "available" if _triton_available() else "missing: pip install 'torchnext[gpu]'"
    return {"triton-q4-gemv": triton, "torch-q4-chunked": "available (pure torch, any device)"}


def _avx512_status(cc: str | None) -> str:
    # Without building: torch's own probes of the CPU (the kernel checks again at run time).
    if cc is None:
        return "missing: no C compiler"
    if torch.backends.cpu.get_cpu_capability() != "AVX512":
        return "missing: this CPU has no AVX-512 (the AVX2 tiles serve bfloat16/float16)"
    dtypes = "bfloat16 and float32" if onednn_has_bf16() else "float32 (no AVX-512 BF16)"
    return f"available for {dtypes} (C kernels, built once with {cc})"


def _check(x: Tensor, n: int, k: int, device: torch.device, bias: Tensor | None) -> None:
    if not isinstance(x, Tensor) or x.dim() < 1 or x.shape[-1] != k:
        raise GemmInputError(
            f"x.shape={tuple(getattr(x, 'shape', ()))}; expected [..., {k}] (the last dimension "
            f"must equal the weight's in_features={k})"
        )
    if x.device != device:
        raise GemmInputError(
            f"x.device={x.device}, weight.device={device}; expected both on one device; move x "
            f"with x.to({str(device)!r})"
        )
    if bias is not None and (
        not isinstance(bias, Tensor) or tuple(bias.shape) != (n,) or bias.dtype != x.dtype
    ):
        raise GemmInputError(
            f"bias is {getattr(bias, 'dtype', type(bias).__name__)} of shape "
            f"{tuple(getattr(bias, 'shape', ()))}; expected {x.dtype} of shape ({n},) (one per "
            f"output feature, in x's dtype)"
        )
    if bias is not None and bias.device != device:
        raise GemmInputError(f"bias.device={bias.device}; expected {device} (the weight's)")


def linear(
    x: Tensor,
    weight: Tensor | QuantizedWeight,
    bias: Tensor | None = None,
    *,
    out_dtype: torch.dtype | None = None,
) -> Tensor:
    """``F.linear(x, W, bias)`` for a dense ``W`` or a 4-bit :class:`QuantizedWeight`.

    Equivalent to (up to float32 rounding, the order of the sums differing)::

        W = weight.dequantize(torch.float64) if quantized else weight.double()
        y = x.double() @ W.T + (0 if bias is None else bias.double())
        return y.to(out_dtype or x.dtype)       # [..., N]

    ``x`` is ``[..., K]`` in float32, bfloat16 or float16 (a dense weight's dtype for a dense
    weight, as ``F.linear``); ``bias`` ``[N]`` in ``x.dtype``. ``out_dtype`` (float32,
    bfloat16, float16 or float64) keeps the float32 sums for bfloat16/float16 operands
    (``torch.float32``); on the ``aten`` route that upcasts the operands for the call. Raises
    :class:`GemmInputError` when the shapes do not contract, the devices differ, or a dtype
    is not one of these.
    """
    if out_dtype is not None and out_dtype not in _OUT_DTYPES:
        raise GemmInputError(
            f"linear(out_dtype={out_dtype}): expected one of {list(_OUT_DTYPES)} or None (x's "
            "dtype); cast the result yourself for other dtypes"
        )
    if _is_torchao(weight):
        weight = weight_from_torchao(weight)  # type: ignore[arg-type]
    if isinstance(weight, QuantizedWeight):
        return _quantized(x, weight, bias, out_dtype or x.dtype)
    if not isinstance(weight, Tensor) or weight.dim() != 2:
        raise GemmInputError(
            f"weight is {type(weight).__name__} of shape {tuple(getattr(weight, 'shape', ()))}; "
            f"expected a 2-D [N, K] tensor, a QuantizedWeight, or torchao's NVFP4Tensor/MXTensor"
        )
    if isinstance(x, Tensor) and x.dtype != weight.dtype:  # before the bias, which follows x
        raise GemmInputError(
            f"x.dtype={x.dtype}, weight.dtype={weight.dtype}; expected the same dtype (as "
            f"F.linear); convert x with x.to({weight.dtype})"
        )
    n, k = weight.shape
    _check(x, n, k, weight.device, bias)
    out = dense_or_none(x, weight, bias, out_dtype=out_dtype)
    if out is not None:
        return out
    dtype = out_dtype or x.dtype
    if dtype.itemsize > x.dtype.itemsize:  # torch's GEMM rounds to x's dtype: sum wider
        wide = torch.float32 if dtype != torch.float64 else dtype
        b = None if bias is None else bias.to(wide)
        return F.linear(x.to(wide), weight.to(wide), b).to(dtype)
    return F.linear(x, weight, bias).to(dtype)


def dense_or_none(
    x: Tensor,
    weight: Tensor,
    bias: Tensor | None = None,
    *,
    out_dtype: torch.dtype | None = None,
) -> Tensor | None:
    """``F.linear(x, weight, bias)`` in ``out_dtype`` (default ``x.dtype``) on a dense C route
    where :func:`route` names one and the operands fit it exactly, else ``None``: it checks
    nothing else and raises nothing, for callers (:func:`linear`, ``torchnext.gemm.linear``)
    that validate and run their own GEMM otherwise."""
    name = route(x, weight, bias)
    if name not in ("cpu-dense512", "cpu-dense-gemv") or x.numel() == 0:
        return None
    n, k = weight.shape
    if x.shape[-1] != k or (
        bias is not None and (tuple(bias.shape) != (n,) or bias.dtype != x.dtype or not bias.is_cpu)
    ):
        return None
    dtype = out_dtype or x.dtype
    cpu = _cpu()
    x_MK = x.reshape(-1, k)
    if name == "cpu-dense512":
        # x, bias and the result as they are: one C call, no casts on the step's path.
        direct = dtype in (torch.bfloat16, torch.float32)
        out_MN = torch.empty(x_MK.shape[0], n, dtype=dtype if direct else torch.float32)
        bias_N = None if bias is None else bias.contiguous()
        cpu.dense512(weight, x_MK.contiguous(), bias_N, out_MN)
        out_MN = out_MN if direct else out_MN.to(dtype)
        return out_MN.reshape(*x.shape[:-1], n)
    out_MN = torch.empty(x_MK.shape[0], n)
    cpu.dense_gemv(weight, x_MK.float().contiguous(), out_MN)
    return _finish(out_MN, x, bias, dtype)


def _finish(out_MN: Tensor, x: Tensor, bias: Tensor | None, dtype: torch.dtype) -> Tensor:
    """Bias (in float32), the cast to ``dtype``, and x's leading dimensions."""
    if bias is not None:
        out_MN += bias.float()
    # Contiguous, as F.linear's result (the GEMV's output has rows padded to a multiple of 8).
    return out_MN.to(dtype).contiguous().reshape(*x.shape[:-1], out_MN.shape[-1])


def _quantized(x: Tensor, w: QuantizedWeight, bias: Tensor | None, dtype: torch.dtype) -> Tensor:
    n, k = w.shape
    _check(x, n, k, w.device, bias)
    if x.dtype not in _ACT_DTYPES:
        raise GemmInputError(
            f"x.dtype={x.dtype}; expected one of {list(_ACT_DTYPES)} with a quantized weight; "
            f"convert x with x.float()"
        )
    name = route(x, w, bias)
    if name == "cpu-q4-gemv" and x.numel():
        # The kernel reads x in its own dtype: no conversion on the decode step's path.
        out_MN = torch.empty(x.numel() // k, n)
        _cpu().q4_gemv(w, x.reshape(-1, k).contiguous(), out_MN)
        return _finish(out_MN, x, bias, dtype)
    x_MK = x.reshape(-1, k).float().contiguous()
    if x_MK.shape[0] == 0:
        out_MN = x_MK.new_empty((0, n))
    elif name == "cpu-q4-chunked":
        out_MN = _cpu_chunked(x_MK, w)
    elif name == "triton-q4-gemv":
        from torchnext.gemm import triton_gemv

        out_MN = triton_gemv.q4_gemv(x_MK, w)
    else:
        out_MN = _torch_chunked(x_MK, w)
    return _finish(out_MN, x, bias, dtype)


def _chunk_rows(w: QuantizedWeight) -> int:
    return max(64, min(CHUNK_BYTES, w.nbytes) // (4 * w.in_features)) // 8 * 8


def _cpu_chunked(x_MK: Tensor, w: QuantizedWeight) -> Tensor:
    cpu = _cpu()
    n, k = w.shape
    rows = _chunk_rows(w)
    buf = torch.empty(k * rows)
    out_MN = torch.empty(x_MK.shape[0], n)
    blocks = w.codes.shape[0]
    for b0 in range(0, blocks, rows // 8):
        b1 = min(blocks, b0 + rows // 8)
        w_KR = buf[: k * 8 * (b1 - b0)].view(k, 8 * (b1 - b0))
        cpu.q4_dequant(w, b0, b1, w_KR)
        n0, n1 = 8 * b0, min(n, 8 * b1)
        out_MN[:, n0:n1] = x_MK @ w_KR[:, : n1 - n0]
    return out_MN


def _torch_chunked(x_MK: Tensor, w: QuantizedWeight) -> Tensor:
    n, k = w.shape
    rows = _chunk_rows(w)
    chunks = [F.linear(x_MK, w.dequantize_rows(n0, min(n, n0 + rows))) for n0 in range(0, n, rows)]
    return torch.cat(chunks, dim=-1)
