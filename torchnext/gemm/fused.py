"""``gemm`` and ``linear``: one GEMM with its epilogue, on the fastest route this machine has.

Use :func:`gemm` where a model computes ``act(x @ w + bias) + residual``-shaped code and
you want it as one call: the autotuner (:mod:`torchnext.gemm.autotune`) picks among torch's
own GEMM with the steps in eager or in place, oneDNN post-ops, row blocks, Inductor and the
Triton template, once per problem class, and falls back to torch's own where nothing wins.
:func:`linear` is the same call shaped like ``F.linear`` (weight ``[N, K]``).

Semantics, as equivalent Python::

    def gemm(a, b, *, bias=None, epilogue=None, out_dtype=None):
        acc = a.float() @ b.float() + (bias.float() if bias is not None else 0)
        acc = epilogue.apply(acc) if epilogue is not None else acc   # amax before the cast
        return acc.to(out_dtype or a.dtype)

What not to assume: with autograd recording (an input requires grad and grad mode is on)
the call runs the eager chain, the only route with a backward; the fused routes are for
inference and for graphs whose intermediate results are not saved. Routes round
differently (see :mod:`torchnext.gemm.epilogue`). bfloat16/float16 operands with a float32 or
float64 ``out_dtype``, or with an ``amax_into``, are computed in float32 (torch's CPU GEMM
rounds its output to the operands' dtype): a float32 copy of the operands per call.

Shape legend: M output rows (all leading dimensions of ``a`` flattened), N columns, K the
contracted dimension.
"""

from __future__ import annotations

import math
import weakref

import torch

from torchnext.errors import GemmInputError, GemmUnsupportedError
from torchnext.gemm import gemv, prepared
from torchnext.gemm.autotune import choose, remembered
from torchnext.gemm.epilogue import Epilogue, Step
from torchnext.gemm.gemv import GEMV_MAX_ROWS
from torchnext.gemm.quantized_weight import QuantizedWeight
from torchnext.gemm.routes import Problem, route

__all__ = ["gemm", "linear"]

_FLOATS = (torch.float32, torch.bfloat16, torch.float16, torch.float64)
_HALF = (torch.bfloat16, torch.float16)
_EMPTY = Epilogue()
_PLAIN = (torch.Tensor, torch.nn.Parameter)  # types a prepared call may take


def _check(
    a: torch.Tensor, b: torch.Tensor, bias: torch.Tensor | None, out_dtype: torch.dtype | None
) -> None:
    if not isinstance(a, torch.Tensor) or not isinstance(b, torch.Tensor):
        raise GemmInputError(
            f"gemm(a, b): got a={type(a).__name__}, b={type(b).__name__}; expected tensors"
        )
    if a.dim() < 1 or b.dim() != 2:
        raise GemmInputError(
            f"gemm(a, b): a has shape {list(a.shape)}, b has shape {list(b.shape)}; expected "
            "a [..., K] and b [K, N] (for an F.linear weight [N, K] use linear(x, weight))"
        )
    if a.shape[-1] != b.shape[0]:
        raise GemmInputError(
            f"gemm(a, b): inner dimensions differ: a is {list(a.shape)} (K={a.shape[-1]}), b is "
            f"{list(b.shape)} (K={b.shape[0]}); expected a [..., K] and b [K, N]"
        )
    if a.dtype not in _FLOATS or b.dtype != a.dtype:
        raise GemmUnsupportedError(
            f"gemm(a, b): dtypes a={a.dtype}, b={b.dtype}; expected both the same floating "
            f"dtype ({', '.join(str(d) for d in _FLOATS)}): convert, e.g. "
            f"a.to({b.dtype if b.dtype in _FLOATS else torch.float32}). For float8/float4 "
            "operands use torchnext.gemm.scaled_mm"
        )
    both_cpu = a.is_cpu and b.is_cpu  # the common case, without building device objects
    if not both_cpu and a.device != b.device:
        raise GemmInputError(
            f"gemm(a, b): a is on {a.device}, b on {b.device}; move them to one device"
        )
    if bias is not None and (
        not isinstance(bias, torch.Tensor)
        or tuple(bias.shape) != (b.shape[1],)
        or (not bias.is_cpu if both_cpu else bias.device != a.device)
    ):
        raise GemmInputError(
            f"gemm(bias=...): got {_describe(bias)}; expected a tensor of shape [{b.shape[1]}] "
            f"on {a.device}"
        )
    _check_out_dtype(out_dtype)


def _check_out_dtype(out_dtype: torch.dtype | None) -> None:
    if out_dtype is not None and out_dtype not in _FLOATS:
        raise GemmUnsupportedError(
            f"gemm(out_dtype={out_dtype}): expected one of "
            f"{', '.join(str(d) for d in _FLOATS)}; cast the result yourself for other dtypes"
        )


def _sums_in_float32(dtype: torch.dtype, out_dtype: torch.dtype | None, epilogue: Epilogue) -> bool:
    """bfloat16/float16 operands whose float32 sums must survive: a float32/float64 result, or
    an amax taken before the cast. torch's CPU GEMM rounds its output to the operands' dtype
    (it has no float32 output for them), so these calls compute in float32."""
    if dtype not in _HALF:
        return False
    return out_dtype in (torch.float32, torch.float64) or epilogue.amax_into is not None


def _flat_epilogue(epilogue: Epilogue, out_shape: tuple[int, ...], m: int, n: int) -> Epilogue:
    """Operands shaped like the (N-D) output become ``[M, N]`` views; the rest stay."""
    if not epilogue.has_nd_operand:
        return epilogue
    steps = []
    for step in epilogue.steps:
        t = step.operand
        if isinstance(t, torch.Tensor) and t.dim() > 2:
            if tuple(t.shape) == out_shape:
                t = t.reshape(m, n)
            elif tuple(t.shape) == out_shape[:-1] + (1,):
                t = t.reshape(m, 1)
            else:
                raise GemmInputError(
                    f"epilogue {step.op}(operand): shape {list(t.shape)}; expected the output's "
                    f"shape {list(out_shape)}, {list(out_shape[:-1]) + [1]} (a column) or [{n}] "
                    "(a row)"
                )
        steps.append(Step(step.op, t))
    return Epilogue(*steps, amax_into=epilogue.amax_into)


def gemm(
    a: torch.Tensor,
    b: torch.Tensor,
    *,
    bias: torch.Tensor | None = None,
    epilogue: Epilogue | None = None,
    out_dtype: torch.dtype | None = None,
) -> torch.Tensor:
    """``epilogue(a @ b + bias)`` cast to ``out_dtype``, fused on the tuned route.

    Args:
        a: ``[..., K]``; the leading dimensions are rows of the product.
        b: ``[K, N]``, the same dtype and device as ``a``.
        bias: ``[N]`` or None.
        epilogue: an :class:`~torchnext.gemm.Epilogue`; its operands are rows ``[N]``,
            columns (``[..., 1]``) or full (``[..., N]``, the output's shape).
        out_dtype: the result's dtype (default ``a.dtype``).

    Returns:
        ``[..., N]`` in ``out_dtype``.

    Raises:
        GemmInputError: shapes that do not contract, a misshapen bias or operand.
        GemmUnsupportedError: a dtype no route runs (float8/float4 go to ``scaled_mm``).
    """
    return _gemm(a, b, bias, epilogue, out_dtype)[0]


def _gemm(
    a: torch.Tensor,
    b: torch.Tensor,
    bias: torch.Tensor | None,
    epilogue: Epilogue | None,
    out_dtype: torch.dtype | None,
) -> tuple[torch.Tensor, prepared.Prepared | None]:
    """:func:`gemm`, and what a later identical call can skip to (None where it cannot)."""
    _check(a, b, bias, out_dtype)
    given = epilogue
    epilogue = _EMPTY if epilogue is None else epilogue
    if not isinstance(epilogue, Epilogue):
        raise GemmInputError(
            f"gemm(epilogue=...): got {type(epilogue).__name__}; expected a "
            "torchnext.gemm.Epilogue, e.g. Epilogue(gelu(), add(residual))"
        )
    flat = a.dim() == 2
    out_shape = (*a.shape[:-1], b.shape[1])
    m, k, n = math.prod(a.shape[:-1]), b.shape[0], b.shape[1]
    a_MK = a if flat else a.reshape(m, k)
    epilogue = _flat_epilogue(epilogue, out_shape, m, n)
    dtype = out_dtype or a.dtype
    wide = _sums_in_float32(a.dtype, out_dtype, epilogue)
    if wide:
        a_MK, b = a_MK.float(), b.float()
        bias = None if bias is None else bias.float()
    problem = Problem(a_MK, b, bias, epilogue, dtype)
    recording = _records(a, b, bias, epilogue.captured)
    # Nothing to tune: torch's answer (bias, or empty); meta tensors have no values to time.
    empty = m == 0 or k == 0 or n == 0 or a.is_meta
    chosen = route("aten+eager") if recording or empty else choose(problem)
    out = chosen.run(problem)
    ready = None
    # Only where the call's own epilogue object runs as it is (no N-D operand to reshape per
    # call): the table then holds nothing but a weak reference to it.
    reshaped = given is not None and epilogue is not given
    if not (recording or empty or wide or reshaped) and remembered(problem):
        ready = prepared.Prepared(chosen, None if given is None else weakref.ref(given), dtype)
    return (out if flat else out.reshape(out_shape)), ready


def _records(
    a: torch.Tensor,
    b: torch.Tensor,
    bias: torch.Tensor | None,
    captured: tuple[torch.Tensor, ...],
) -> bool:
    """Whether autograd records this call (then only the eager chain has a backward)."""
    return torch.is_grad_enabled() and (
        a.requires_grad
        or b.requires_grad
        or (bias is not None and bias.requires_grad)
        or (bool(captured) and any(t.requires_grad for t in captured))
    )


def linear(
    x: torch.Tensor,
    weight: torch.Tensor | QuantizedWeight,
    bias: torch.Tensor | None = None,
    *,
    epilogue: Epilogue | None = None,
    out_dtype: torch.dtype | None = None,
) -> torch.Tensor:
    """``F.linear`` with an epilogue: ``gemm(x, weight.T, bias=bias, epilogue=...)``.

    ``weight`` is ``[N, K]`` as in ``nn.Linear``, or a quantized weight
    (:class:`~torchnext.gemm.NVFP4Weight`, ``MXFP4Weight``, ``Int4Weight``, torchao's
    ``NVFP4Tensor``/``MXTensor``). Decode calls (at most :data:`GEMV_MAX_ROWS` rows, e.g.
    ``[B, 1, K]``) and quantized weights take :func:`torchnext.gemm.gemv.linear`'s GEMV
    path, with the epilogue applied in place on its fresh output.
    """
    if (
        isinstance(weight, torch.Tensor)
        and type(x) in _PLAIN
        and type(weight) in _PLAIN
        and (bias is None or type(bias) in _PLAIN)
        and not torch.compiler.is_compiling()
    ):
        # A call this process has made before: skip to its route (see torchnext.gemm.prepared).
        key = prepared.signature(x, weight, bias, epilogue, out_dtype)
        hit = prepared.get(key, epilogue)
        steps = _EMPTY if epilogue is None else epilogue
        if hit is not None and not _records(x, weight, bias, steps.captured):
            k, n = weight.shape[1], weight.shape[0]
            a_MK = x if x.dim() == 2 else x.reshape(-1, k)
            out = hit.route.run(Problem(a_MK, weight.t(), bias, steps, hit.out_dtype))
            return out if x.dim() == 2 else out.reshape(*x.shape[:-1], n)
        _check_out_dtype(out_dtype)
        return _dense_linear(x, weight, bias, epilogue, out_dtype, key)
    _check_out_dtype(out_dtype)
    if isinstance(weight, torch.Tensor) and not _is_torchao(weight):
        return _dense_linear(x, weight, bias, epilogue, out_dtype, None)
    # The quantized routes sum in float32: keep that where the result or an amax needs it.
    wide = isinstance(x, torch.Tensor) and _sums_in_float32(x.dtype, out_dtype, epilogue or _EMPTY)
    out = gemv.linear(x, weight, bias, out_dtype=torch.float32 if wide else None)
    return _epilogue_after(out, epilogue, out_dtype or x.dtype)


def _is_torchao(weight: torch.Tensor) -> bool:
    # torchao's NVFP4Tensor/MXTensor subclass Tensor; they are quantized weights here.
    return type(weight).__module__.startswith("torchao.")


def _dense_linear(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    epilogue: Epilogue | None,
    out_dtype: torch.dtype | None,
    key: tuple[object, ...] | None,
) -> torch.Tensor:
    """``key``: the call's :func:`torchnext.gemm.prepared.signature`, where it has one."""
    if weight.dim() != 2:
        raise GemmInputError(
            f"linear(weight): got {_describe(weight)}; expected a 2-D [N, K] tensor as in "
            "nn.Linear, or a quantized weight (NVFP4Weight, MXFP4Weight, Int4Weight)"
        )
    if isinstance(x, torch.Tensor) and x.dim() >= 1 and x.shape[-1] != weight.shape[1]:
        raise GemmInputError(
            f"linear(x, weight): x is {list(x.shape)} (K={x.shape[-1]}), weight is "
            f"{list(weight.shape)} (K={weight.shape[1]}); expected x [..., K] and weight [N, K] "
            "as in nn.Linear"
        )
    decode = (
        isinstance(x, torch.Tensor)
        and x.dim() >= 1
        and x.shape[-1] > 0
        and x.numel() // x.shape[-1] <= GEMV_MAX_ROWS
    )
    out = None
    if decode:
        wide = _sums_in_float32(x.dtype, out_dtype, epilogue or _EMPTY)
        out = gemv.dense_or_none(x, weight, bias, out_dtype=torch.float32 if wide else None)
    if out is None:
        out, ready = _gemm(x, weight.t(), bias, epilogue, out_dtype)
        if ready is not None and key is not None:
            prepared.put(key, ready)
        return out
    return _epilogue_after(out, epilogue, out_dtype or x.dtype)


def _epilogue_after(
    out: torch.Tensor, epilogue: Epilogue | None, dtype: torch.dtype
) -> torch.Tensor:
    """The epilogue on a GEMV's fresh output (in place unless autograd records it), its amax,
    then the cast to ``dtype``."""
    if epilogue is None:
        return out if out.dtype == dtype else out.to(dtype)
    rows = out.numel() // max(out.shape[-1], 1)
    out_MN = out.reshape(rows, out.shape[-1])
    flat = _flat_epilogue(epilogue, tuple(out.shape), rows, out.shape[-1])
    flat.signature(rows, out.shape[-1])  # validates every operand's shape
    if torch.is_grad_enabled() and (
        out.requires_grad or any(t.requires_grad for t in flat.captured)
    ):
        out_MN = flat.apply(out_MN)
    else:
        flat.apply_(out_MN)
        if flat.amax_into is not None:
            flat.amax_into.copy_(out_MN.abs().amax().float())
    result = out_MN.reshape(out.shape)
    return result if result.dtype == dtype else result.to(dtype)


def _describe(value: object) -> str:
    if isinstance(value, torch.Tensor):
        return f"a {value.dtype} tensor of shape {list(value.shape)} on {value.device}"
    return repr(value)
