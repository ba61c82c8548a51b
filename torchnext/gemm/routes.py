"""The candidate routes of :func:`torchnext.gemm.gemm`: each computes the same fused GEMM.

Use this module to see what the autotuner chooses between; call :func:`torchnext.gemm.gemm`
rather than a route. A route is a GEMM (how ``a @ b + bias`` is computed) paired with an
epilogue mode (how the steps after it run):

=================  ======================================================================
GEMM               ``aten``: torch's own kernel in the inputs' dtype (MKL/oneDNN, cuBLAS).
                   ``upcast``: bfloat16/float16 inputs computed in float32 and rounded
                   once at the end (CPUs without native bfloat16 arithmetic).
epilogue           ``eager``: the steps out of place, as user code writes them (the
                   reference, and what the benchmark calls "unfused").
                   ``inplace``: the steps in place on the GEMM's fresh output, no temporaries.
                   ``onednn``: the first activation (or a full-matrix add) as oneDNN's
                   post-op inside the GEMM kernel, the rest in place (CPU, float32; and
                   bfloat16 where the CPU has bfloat16 instructions).
                   ``blocked``: the GEMM in row blocks, each block's steps applied while it
                   is still in cache (large M).
                   ``inductor``: the whole call compiled by Inductor (one generated loop for
                   the steps).
                   ``triton``: the Triton template, steps in registers (CUDA).
=================  ======================================================================

What not to assume: a route's availability depends on the build (oneDNN, Inductor's C++
compiler, Triton, CUDA); :func:`available_routes` says which exist here and why not.

Shape legend: M output rows, N output columns, K contracted; ``a_MK``, ``b_KN``, ``out_MN``.
"""

from __future__ import annotations

import functools
import types
from collections.abc import Callable
from dataclasses import dataclass

import torch

from torchnext.compat.gemm_internals import (
    inductor_available,
    onednn_has_bf16,
    onednn_linear_pointwise,
    onednn_linear_pointwise_binary,
)
from torchnext.gemm.epilogue import Epilogue

__all__ = ["Problem", "Route", "ROUTES", "available_routes", "routes_for"]

# oneDNN's post-op names for the activations it fuses.
_ONEDNN_ATTR = {
    "relu": ("relu", "none"),
    "gelu": ("gelu", "none"),
    "gelu_tanh": ("gelu", "tanh"),
    "silu": ("swish", "none"),
    "tanh": ("tanh", "none"),
    "sigmoid": ("sigmoid", "none"),
}
# Row blocks of the ``blocked`` route hold about this many output bytes: small enough to
# stay in a core's L2 while the steps run, large enough to keep the GEMM efficient.
_BLOCK_BYTES = 1 << 20
_MIN_BLOCK_ROWS = 64


@dataclass(frozen=True, slots=True)
class Problem:
    """One validated call: 2-D operands, an epilogue (possibly empty), the output dtype."""

    a_MK: torch.Tensor
    b_KN: torch.Tensor
    bias_N: torch.Tensor | None
    epilogue: Epilogue
    out_dtype: torch.dtype

    @property
    def compute_dtype(self) -> torch.dtype:
        return self.a_MK.dtype


@dataclass(frozen=True, slots=True)
class Route:
    """A named way to compute a :class:`Problem`."""

    name: str
    run: Callable[[Problem], torch.Tensor]
    applies: Callable[[Problem], bool]


# --------------------------------------------------------------------------- GEMMs


def _aten_gemm(p: Problem, a_MK: torch.Tensor, b_KN: torch.Tensor) -> torch.Tensor:
    bias_N = p.bias_N
    if bias_N is None:
        return torch.mm(a_MK, b_KN)
    # .to() costs a microsecond even when it returns its input; this runs on every call.
    return torch.addmm(bias_N if bias_N.dtype == a_MK.dtype else bias_N.to(a_MK.dtype), a_MK, b_KN)


def _upcast(t: torch.Tensor) -> torch.Tensor:
    return t if t.dtype == torch.float32 else t.float()


def _finish(p: Problem, acc_MN: torch.Tensor) -> torch.Tensor:
    """Amax (before the cast), then the output cast."""
    if p.epilogue.amax_into is not None:
        p.epilogue.amax_into.copy_(acc_MN.abs().amax().float())
    return acc_MN if acc_MN.dtype == p.out_dtype else acc_MN.to(p.out_dtype)


# --------------------------------------------------------------------------- epilogue modes


def _eager(p: Problem, upcast: bool) -> torch.Tensor:
    a_MK, b_KN = (_upcast(p.a_MK), _upcast(p.b_KN)) if upcast else (p.a_MK, p.b_KN)
    out_MN = _aten_gemm(p, a_MK, b_KN)
    for step in p.epilogue.steps:
        out_MN = step.apply(out_MN)
    return _finish(p, out_MN)


def _inplace(p: Problem, upcast: bool) -> torch.Tensor:
    a_MK, b_KN = (_upcast(p.a_MK), _upcast(p.b_KN)) if upcast else (p.a_MK, p.b_KN)
    out_MN = _aten_gemm(p, a_MK, b_KN)
    p.epilogue.apply_(out_MN)
    return _finish(p, out_MN)


def _onednn_applies(p: Problem) -> bool:
    if p.a_MK.device.type != "cpu" or onednn_linear_pointwise() is None:
        return False
    steps = p.epilogue.steps
    if not steps:
        return False
    first = steps[0]
    if first.op in _ONEDNN_ATTR:
        return True
    return first.op == "add" and first.kind(p.a_MK.shape[0], p.b_KN.shape[1]) == "full"


def _onednn(p: Problem, upcast: bool) -> torch.Tensor:
    a_MK, b_KN = (_upcast(p.a_MK), _upcast(p.b_KN)) if upcast else (p.a_MK, p.b_KN)
    w_NK = b_KN.t()
    # oneDNN reads the bias as contiguous whatever its strides (a strided view read wrong
    # values, an expanded one read past its buffer): one contiguous copy where needed.
    bias_N = None if p.bias_N is None else p.bias_N.to(a_MK.dtype).contiguous()
    first, rest = p.epilogue.steps[0], p.epilogue.steps[1:]
    if first.op in _ONEDNN_ATTR:
        attr, algorithm = _ONEDNN_ATTR[first.op]
        op = onednn_linear_pointwise()
        if op is None:  # applies() checked; the build cannot lose it in between
            raise RuntimeError("oneDNN linear-pointwise disappeared")
        out_MN = op(a_MK, w_NK, bias_N, attr, [], algorithm)
    else:
        binary = onednn_linear_pointwise_binary()
        if binary is None:
            raise RuntimeError("oneDNN linear-pointwise (binary) is missing")
        other = first.operand
        if not isinstance(other, torch.Tensor):
            raise RuntimeError("a full add without a tensor operand")
        out_MN = binary(a_MK, other.to(a_MK.dtype).contiguous(), w_NK, bias_N, "add")
    for step in rest:
        step.apply_(out_MN)
    return _finish(p, out_MN)


def _blocked_applies(p: Problem) -> bool:
    return p.a_MK.shape[0] >= 4 * _MIN_BLOCK_ROWS and bool(p.epilogue.steps)


def _blocked(p: Problem, upcast: bool) -> torch.Tensor:
    a_MK, b_KN = (_upcast(p.a_MK), _upcast(p.b_KN)) if upcast else (p.a_MK, p.b_KN)
    m, n = a_MK.shape[0], b_KN.shape[1]
    out_MN = torch.empty((m, n), dtype=a_MK.dtype, device=a_MK.device)
    rows = max(_MIN_BLOCK_ROWS, _BLOCK_BYTES // max(1, n * out_MN.element_size()))
    bias_N = None if p.bias_N is None else p.bias_N.to(a_MK.dtype)
    for start in range(0, m, rows):
        block = slice(start, min(m, start + rows))
        out_RN = out_MN[block]
        if bias_N is None:
            torch.mm(a_MK[block], b_KN, out=out_RN)
        else:
            torch.addmm(bias_N, a_MK[block], b_KN, out=out_RN)
        p.epilogue.apply_(out_RN, block)
    return _finish(p, out_MN)


# One compiled function per epilogue structure (ops, scalar values, bias, dtypes); the
# tensors are its arguments, so Inductor sees plain tensors and marks every size dynamic.
_Structure = tuple[tuple[str, float | None], ...]


@functools.cache
def _compiled(
    structure: _Structure,
    has_bias: bool,
    upcast: bool,
    out_dtype: torch.dtype,
    layout: tuple[object, ...],
) -> Callable[..., torch.Tensor]:
    """``layout``: what else makes Dynamo recompile (dtypes, operand kinds, unit strides); one
    compiled function per layout keeps each far below the recompile limit, past which a
    ``fullgraph=True`` function raises instead of recompiling."""
    from torchnext.gemm.epilogue import ACTIVATIONS

    def fused(
        a_MK: torch.Tensor, b_KN: torch.Tensor, bias_N: torch.Tensor | None, *operands: torch.Tensor
    ) -> torch.Tensor:
        if upcast:
            a_MK, b_KN = a_MK.float(), b_KN.float()
        acc_MN = a_MK @ b_KN
        if has_bias and bias_N is not None:
            acc_MN = acc_MN + bias_N.to(acc_MN.dtype)
        tensors = iter(operands)
        for op, value in structure:
            if op in ACTIVATIONS:
                acc_MN = ACTIVATIONS[op](acc_MN)
            else:
                other = value if value is not None else next(tensors)
                acc_MN = acc_MN + other if op == "add" else acc_MN * other
        return acc_MN.to(out_dtype)

    # Dynamo keeps its compiled entries on the code object, and every structure's closure
    # shares one; a code object of its own per structure keeps each under the recompile
    # limit instead of all of them competing for its eight entries.
    own_code = fused.__code__.replace(co_name=f"fused_gemm_{len(_compiled_names)}")
    _compiled_names.append(own_code.co_name)
    unique = types.FunctionType(
        own_code, fused.__globals__, own_code.co_name, fused.__defaults__, fused.__closure__
    )
    return torch.compile(unique, dynamic=True, fullgraph=True)


_compiled_names: list[str] = []


def _inductor(p: Problem, upcast: bool) -> torch.Tensor:
    structure = tuple(
        (s.op, None if isinstance(s.operand, torch.Tensor) or s.operand is None else s.operand)
        for s in p.epilogue.steps
    )
    operands = [s.operand for s in p.epilogue.steps if isinstance(s.operand, torch.Tensor)]
    m, n = p.a_MK.shape[0], p.b_KN.shape[1]
    layout = (
        p.a_MK.dtype,
        p.epilogue.signature(m, n),
        tuple(t.stride(-1) == 1 for t in (p.a_MK, p.b_KN, *operands)),
        tuple(t.stride(0) == 1 for t in (p.a_MK, p.b_KN)),
        None if p.bias_N is None else (p.bias_N.dtype, p.bias_N.stride(0)),
    )
    fn = _compiled(structure, p.bias_N is not None, upcast, p.out_dtype, layout)
    return fn(p.a_MK, p.b_KN, p.bias_N, *operands)


def _triton(p: Problem) -> torch.Tensor:
    from torchnext.gemm.triton_gemm import triton_gemm

    return triton_gemm(p.a_MK, p.b_KN, p.bias_N, p.epilogue, p.out_dtype)


# --------------------------------------------------------------------------- the table


def _onednn_native(p: Problem) -> bool:
    if p.compute_dtype == torch.float32:
        return True
    return p.compute_dtype == torch.bfloat16 and _onednn_bf16()


@functools.cache
def _onednn_bf16() -> bool:
    return onednn_has_bf16()


def _half(p: Problem) -> bool:
    return p.compute_dtype in (torch.bfloat16, torch.float16)


def _on_cpu(p: Problem) -> bool:
    return p.a_MK.device.type == "cpu"


def _always(p: Problem) -> bool:
    return True


def _has_steps(p: Problem) -> bool:
    return bool(p.epilogue.steps)


def _inductor_applies(p: Problem) -> bool:
    # Compiling costs seconds; only worth it where a call is large enough to amortise the
    # compiled wrapper's overhead, and never for the amax (Inductor's reduction would
    # change the rounding of the output it reads from).
    return _inductor_works() and p.a_MK.shape[0] >= 64 and p.epilogue.amax_into is None


@functools.cache
def _inductor_works() -> bool:
    return inductor_available()


def _triton_applies(p: Problem) -> bool:
    if p.a_MK.device.type != "cuda" or p.compute_dtype == torch.float64:
        return False
    from torchnext.gemm.triton_gemm import MAX_STEPS, triton_available

    return len(p.epilogue.steps) <= MAX_STEPS and triton_available()


ROUTES: tuple[Route, ...] = (
    Route("aten+eager", lambda p: _eager(p, False), _always),
    Route("aten+inplace", lambda p: _inplace(p, False), _has_steps),
    Route(
        "aten+onednn",
        lambda p: _onednn(p, False),
        # oneDNN's bfloat16 inner product needs native bfloat16 instructions (AVX-512 BF16,
        # AMX); "upcast+onednn" covers half inputs everywhere.
        lambda p: _onednn_native(p) and _onednn_applies(p),
    ),
    Route("aten+blocked", lambda p: _blocked(p, False), _blocked_applies),
    Route("aten+inductor", lambda p: _inductor(p, False), _inductor_applies),
    Route("upcast+eager", lambda p: _eager(p, True), lambda p: _half(p) and _on_cpu(p)),
    Route(
        "upcast+inplace",
        lambda p: _inplace(p, True),
        lambda p: _half(p) and _on_cpu(p) and _has_steps(p),
    ),
    Route(
        "upcast+onednn",
        lambda p: _onednn(p, True),
        lambda p: _half(p) and _onednn_applies(p),
    ),
    Route(
        "upcast+blocked",
        lambda p: _blocked(p, True),
        lambda p: _half(p) and _on_cpu(p) and _blocked_applies(p),
    ),
    Route("triton", _triton, _triton_applies),
)
_BY_NAME = {r.name: r for r in ROUTES}


def route(name: str) -> Route:
    """The route called ``name`` (KeyError names the known ones)."""
    try:
        return _BY_NAME[name]
    except KeyError:
        raise KeyError(f"no GEMM route {name!r}; known: {', '.join(_BY_NAME)}") from None


def routes_for(p: Problem) -> list[Route]:
    """The routes that can run ``p`` here, ``aten+eager`` (the reference) first."""
    return [r for r in ROUTES if r.applies(p)]


def available_routes(device: str = "cpu") -> dict[str, str]:
    """Route family -> "available" or why not, for ``torchnext doctor``."""
    report: dict[str, str] = {"aten": "available (torch's own GEMM)"}
    if device == "cpu":
        report["upcast"] = "available (bfloat16/float16 computed in float32)"
        report["onednn"] = (
            "available (oneDNN linear + post-op)"
            if onednn_linear_pointwise() is not None
            else "missing: this torch build has no oneDNN (mkldnn) linear-pointwise op"
        )
        report["blocked"] = "available (row blocks, steps while in cache)"
    report["inductor"] = (
        "available (torch.compile of the fused call)"
        if _inductor_works()
        else "missing: torch._inductor does not import here"
    )
    if device == "cuda":
        from torchnext.gemm.triton_gemm import triton_available

        report["triton"] = (
            "available" if triton_available() else "missing: pip install 'torchnext[gpu]'"
        )
    else:
        report["triton"] = "GPU only (tested on the CPU in Triton's interpreter)"
    return report
