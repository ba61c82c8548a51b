"""Grouped GEMM with torch 2.14's ``torch.nn.functional.grouped_mm`` semantics, on any device.

What it is: :func:`grouped_mm` multiplies many independent matrix pairs that share their
inner shapes but not their sizes along one jagged dimension, in one call. Mixture-of-experts
layers use it with their tokens sorted by expert (``offs`` marks where each expert's rows
end) and one 3-D weight holding every expert; the weight gradient of such a layer is the
2-D x 2-D form, with the groups along the contraction.

When to use it: wherever you would call 2.14's ``F.grouped_mm`` / 2.13's ``torch._grouped_mm``
or loop over experts with ``mm``, on the CPU, on sm90/sm100 GPUs (through torch's own
kernel) and on every other GPU (through one Triton kernel, :mod:`torchnext.gemm.triton_grouped`).
It is a registered op (``torchnext::grouped_mm``) with a backward, so it works under
autograd and inside ``torch.compile`` graphs. :func:`available_routes` lists what runs here.

CPU routes: 3-D x 3-D is one ``bmm``; every form with offsets takes the routes of
:mod:`torchnext.gemm.grouped_cpu`: small groups of a decode step (2-D x 3-D; float32 up to
64 rows with weights stored ``[K, N]``, float32 up to 32 and bfloat16 up to 8 with
``[G, N, K]`` weights passed transposed) on AVX-512 kernels where the CPU has the
instructions, the rest on torch's C++ loop where it takes the call (float32, no bias), else
balanced runs on worker threads (16-bit inputs widened to float32 on CPUs without bfloat16 instructions).
This module checks the arguments, registers the op and its backward, and picks the route.

What not to assume:

* torch leaves the rows (or columns) past ``offs[-1]`` uninitialised; here they are zero.
* torch does not check the offsets' values; here they are checked, which on a GPU costs one
  device-to-host copy of ``offs`` per call.
* torch accepts only inputs whose strides are multiples of 16 bytes; here any strides run.
* Extensions where torch 2.14.1 raises "not supported yet": ``bias`` (one row per group),
  ``out_dtype=torch.float32`` for 16-bit inputs (documented by 2.14, rejected by its code),
  and ``float64`` (for references and ``gradcheck``). Everything torch runs gives its values.
* Results match a float64 reference to float32-accumulation tolerance, not bit for bit:
  the CPU route may split a group between threads and computes 16-bit inputs in float32.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import cast

import torch
from torch import Tensor

from torchnext.compat import gemm_internals as _gi
from torchnext.errors import GemmInputError, GemmUnsupportedError
from torchnext.gemm import triton_grouped
from torchnext.gemm.grouped_cpu import (
    GroupedProblem,
    cpu_upcasts,
    grouped_mm_looped,
    small_group_kernel,
    threads_are_per_worker,
    zero_tail,
)

__all__ = ["grouped_mm", "available_routes", "GROUPED_DTYPES"]

# Shape legend: G groups (experts), M rows, K contraction, N columns. a_MK / a_GMK is mat_a,
# b_GKN / b_KN mat_b, out_MN / out_GMN the result, offs_G the groups' end offsets along the
# jagged dimension (M, N or K), bias_GN one bias row per group (bias_N for 3-D x 2-D).

GROUPED_DTYPES = (torch.float32, torch.bfloat16, torch.float16, torch.float64)
"""Operand dtypes :func:`grouped_mm` runs (torch 2.14.1 runs the first three)."""

_HALF = (torch.bfloat16, torch.float16)
_MODES = {(2, 3): "2d3d", (3, 3): "3d3d", (2, 2): "2d2d", (3, 2): "3d2d"}
_FORMS = {"2d3d": "2-D x 3-D", "3d3d": "3-D x 3-D", "2d2d": "2-D x 2-D", "3d2d": "3-D x 2-D"}


def grouped_mm(
    mat_a: Tensor,
    mat_b: Tensor,
    *,
    offs: Tensor | None = None,
    bias: Tensor | None = None,
    out_dtype: torch.dtype | None = None,
) -> Tensor:
    """Grouped matrix multiply; 2.14's ``F.grouped_mm``. Equivalent Python::

        ends = offs.tolist()          # int32, 1-D, non-decreasing, last <= the jagged size
        starts = [0] + ends[:-1]
        if mat_a.dim() == 2 and mat_b.dim() == 3:      # groups of rows: (M,K) x (G,K,N)
            out = zeros(M, N)                          # rows past ends[-1] stay zero
            for g, (s, e) in enumerate(zip(starts, ends)):
                out[s:e] = mat_a[s:e] @ mat_b[g] + bias[g]
        elif mat_a.dim() == 3 and mat_b.dim() == 3:    # batched: (G,M,K) x (G,K,N), no offs
            out = mat_a @ mat_b + bias[:, None, :]
        elif mat_a.dim() == 2 and mat_b.dim() == 2:    # groups along K: (M,K) x (K,N)
            out = stack([mat_a[:, s:e] @ mat_b[s:e] + bias[g] for g, (s, e) in ...])  # (G,M,N)
        else:                                          # groups of columns: (G,M,K) x (K,N)
            out = zeros(M, N)                          # columns past ends[-1] stay zero
            for g, (s, e) in enumerate(zip(starts, ends)):
                out[:, s:e] = mat_a[g] @ mat_b[:, s:e] + bias[s:e]
        return out.to(out_dtype or mat_a.dtype)        # accumulated in float32 (or float64)

    ``mat_a`` and ``mat_b`` have one dtype from :data:`GROUPED_DTYPES`; ``out_dtype`` is
    ``None``, that dtype, or ``torch.float32`` for 16-bit inputs. ``bias`` (an extension, see
    the module docstring) is ``(G, N)``, or ``(N,)`` for 3-D x 2-D, in the input or output
    dtype. Empty groups are allowed. The expert weights of an ``nn.Linear``-style ``(G, N, K)``
    tensor go in as ``w.transpose(-2, -1)`` (no copy is made).

    Raises:
        GemmInputError: malformed arguments (dimensions, contraction sizes, group counts,
            offsets not int32 / 1-D / non-decreasing / within the jagged size, mixed dtypes
            or devices, bias of the wrong shape); the message names argument and value.
        GemmUnsupportedError: a dtype or ``out_dtype`` no route runs.
    """
    inferred = _infer(mat_a, mat_b, offs, bias, out_dtype)
    operands = (mat_a, mat_b, offs, bias)
    if (
        torch.compiler.is_compiling()
        or mat_a.is_meta
        or any(t is not None and type(t) is not Tensor for t in operands)
        or (torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in operands))
    ):
        return _grouped_mm_op(mat_a, mat_b, offs, bias, out_dtype)
    # Plain eager tensors and nothing to differentiate: skip the op's dispatch (tens of
    # microseconds, as much as a small grouped GEMM takes).
    return _forward(mat_a, mat_b, offs, bias, inferred)


def available_routes(device: torch.device | str = "cpu") -> dict[str, bool]:
    """Which of :func:`grouped_mm`'s routes can run on ``device`` (for ``torchnext doctor``).

    ``torch-loop``: torch's own C++ loop (float32, no bias); ``cpu-avx512``: the AVX-512
    kernels for a decode step's small groups (:mod:`torchnext.gemm.grouped_avx512_source`);
    ``threads``: the split over worker threads (OpenMP builds); ``torch-kernel``: torch's grouped CUDA kernel (sm90 or
    sm100, bfloat16); ``triton``: the Triton kernel (CUDA with Triton installed); ``loop``:
    a Python loop of ``mm``, which always runs.
    """
    dev = torch.device(device)
    cuda = dev.type == "cuda" and torch.cuda.is_available()
    return {
        "torch-loop": dev.type == "cpu" and _gi.native_grouped_mm() is not None,
        "cpu-avx512": dev.type == "cpu" and small_group_kernel(),
        "threads": dev.type == "cpu" and threads_are_per_worker(),
        "torch-kernel": cuda and _gi.native_grouped_mm_is_kernel(dev, torch.bfloat16),
        "triton": cuda and triton_grouped.triton_available(),
        "loop": True,
    }


# --------------------------------------------------------------------------- checks


def _bad(arg: str, value: object, expected: str, fix: str) -> GemmInputError:
    return GemmInputError(f"grouped_mm: {arg} is {value}; expected {expected}. {fix}")


def _infer(
    a: Tensor, b: Tensor, offs: Tensor | None, bias: Tensor | None, out_dtype: torch.dtype | None
) -> tuple[str, tuple[int, ...], torch.dtype]:
    """Check everything but the offsets' values; return (mode, output shape, output dtype)."""
    for name, t in (("mat_a", a), ("mat_b", b)):
        if not isinstance(t, Tensor):
            raise _bad(f"type({name})", type(t).__name__, "a torch.Tensor", "Pass a tensor.")
        if t.dim() not in (2, 3):
            shown = f"{t.dim()} (shape {tuple(t.shape)})"
            raise _bad(f"{name}.dim()", shown, "2 or 3", "Pass (M, K) rows or a (G, ., .) batch.")
    if a.dtype not in GROUPED_DTYPES:
        raise GemmUnsupportedError(
            f"grouped_mm: mat_a.dtype is {a.dtype}; expected one of {list(GROUPED_DTYPES)}. "
            "Cast the operands with .to(torch.float32) (or bfloat16)."
        )
    if b.dtype != a.dtype:
        raise _bad("mat_b.dtype", b.dtype, f"mat_a.dtype = {a.dtype}", "Cast one operand.")
    if b.device != a.device:
        raise _bad("mat_b.device", b.device, f"mat_a.device = {a.device}", "Move one operand.")
    mode = _MODES[(a.dim(), b.dim())]
    if a.shape[-1] != b.shape[-2]:
        shown = f"{tuple(b.shape)} (contraction size {b.shape[-2]})"
        want = f"contraction size mat_a.shape[-1] = {a.shape[-1]} (mat_a {tuple(a.shape)})"
        fix = "(G, N, K) expert weights go in as w.transpose(-2, -1)."
        raise _bad("mat_b.shape", shown, want, fix)
    if mode == "3d3d":
        if offs is not None:
            shown = f"a tensor of shape {tuple(offs.shape)}"
            raise _bad("offs", shown, "None for 3-D x 3-D", "Drop offs.")
        if b.shape[0] != a.shape[0]:
            want = f"mat_a.shape[0] = {a.shape[0]} groups"
            raise _bad("mat_b.shape[0]", b.shape[0], want, "Pass equal batches.")
        groups = a.shape[0]
    else:
        groups = _check_offs_tensor(offs, a, mode, b)
    if mode == "2d2d":
        out_shape: tuple[int, ...] = (groups, a.shape[0], b.shape[1])
    elif mode == "3d3d":
        out_shape = (groups, a.shape[1], b.shape[2])
    else:  # rows of a 2-D mat_a, or of each 3-D mat_a entry, by columns of mat_b
        out_shape = (a.shape[-2], b.shape[-1])
    dtype = a.dtype if out_dtype is None else out_dtype
    if dtype != a.dtype and not (a.dtype in _HALF and dtype == torch.float32):
        allowed = f"None, {a.dtype} or torch.float32" if a.dtype in _HALF else f"None or {a.dtype}"
        raise GemmUnsupportedError(
            f"grouped_mm: out_dtype is {out_dtype} for {a.dtype} inputs; expected {allowed}. "
            "Cast the result instead."
        )
    if bias is not None:
        want_shape = (out_shape[-1],) if mode == "3d2d" else (groups, out_shape[-1])
        if not isinstance(bias, Tensor) or tuple(bias.shape) != want_shape:
            got = str(tuple(bias.shape)) if isinstance(bias, Tensor) else type(bias).__name__
            want = f"{want_shape}, {'(N,)' if mode == '3d2d' else '(G, N)'}"
            raise _bad("bias.shape", got, want, "Pass one bias row per group.")
        if bias.dtype not in (a.dtype, dtype) or bias.device != a.device:
            dtypes = f"{a.dtype}" if dtype == a.dtype else f"{a.dtype} or {dtype}"
            shown, want = f"{bias.dtype} on {bias.device}", f"{dtypes} on {a.device}"
            raise _bad("bias", shown, want, "Cast or move the bias.")
    return mode, out_shape, dtype


def _check_offs_tensor(offs: Tensor | None, a: Tensor, mode: str, b: Tensor) -> int:
    """Check offs as a tensor (not its values); return the number of groups."""
    if offs is None:
        want = f"an int32 tensor of group ends for {_FORMS[mode]} operands"
        raise _bad("offs", None, want, "Pass torch.cumsum(group_sizes, 0).to(torch.int32).")
    if not isinstance(offs, Tensor):
        want = "an int32 tensor of group ends"
        fix = "Pass torch.tensor(ends, dtype=torch.int32)."
        raise _bad("type(offs)", type(offs).__name__, want, fix)
    if offs.dtype != torch.int32:
        raise _bad("offs.dtype", offs.dtype, "torch.int32", "Convert with offs.to(torch.int32).")
    if offs.dim() != 1:
        shown = f"{offs.dim()} (shape {tuple(offs.shape)})"
        raise _bad("offs.dim()", shown, "1", "Pass one end offset per group.")
    if offs.device != a.device:
        raise _bad("offs.device", offs.device, f"mat_a.device = {a.device}", "Move offs.")
    n = offs.shape[0]
    if mode == "2d3d" and n != b.shape[0]:
        want = f"mat_b.shape[0] = {b.shape[0]} groups"
        raise _bad("offs.shape[0]", n, want, "Pass one offset per expert weight.")
    if mode == "3d2d" and n != a.shape[0]:
        want = f"mat_a.shape[0] = {a.shape[0]} groups"
        raise _bad("offs.shape[0]", n, want, "Pass one offset per entry of mat_a.")
    return n


def _ends(offs: Tensor, limit: int, dim: str) -> list[int]:
    """The offsets as Python ints, checked: non-negative, non-decreasing, last <= limit."""
    ends: list[int] = offs.tolist()
    prev = 0
    for i, e in enumerate(ends):
        if e < prev:
            want = f">= {f'offs[{i - 1}] = {prev}' if i else '0'} (group ends never decrease)"
            raise _bad(f"offs[{i}]", e, want, "Pass torch.cumsum(group_sizes, 0).to(torch.int32).")
        prev = e
    if ends and ends[-1] > limit:
        fix = (
            f"The groups cover more than the {limit} entries along {dim}: pass the ends of "
            f"the groups in this operand, torch.cumsum(group_sizes, 0) with sum <= {limit}."
        )
        raise _bad(f"offs[-1] (offs[{len(ends) - 1}])", ends[-1], f"<= {dim} = {limit}", fix)
    return ends


# --------------------------------------------------------------------------- the op


@torch.library.custom_op("torchnext::grouped_mm", mutates_args=())
def _grouped_mm_op(
    mat_a: Tensor,
    mat_b: Tensor,
    offs: Tensor | None,
    bias: Tensor | None,
    out_dtype: torch.dtype | None,
) -> Tensor:
    return _forward(mat_a, mat_b, offs, bias, _infer(mat_a, mat_b, offs, bias, out_dtype))


def _forward(
    mat_a: Tensor,
    mat_b: Tensor,
    offs: Tensor | None,
    bias: Tensor | None,
    inferred: tuple[str, tuple[int, ...], torch.dtype],
) -> Tensor:
    mode, shape, dtype = inferred
    a, b = mat_a.detach(), mat_b.detach()
    x = None if bias is None else bias.detach()
    if mode == "3d3d":
        return _batched(a, b, x, dtype)
    offs = cast(Tensor, offs)  # _infer raised unless offs is a tensor here
    jagged = {"2d3d": ("M", a.shape[0]), "3d2d": ("N", b.shape[1]), "2d2d": ("K", a.shape[1])}
    problem = GroupedProblem(mode, shape, dtype, _ends(offs, jagged[mode][1], jagged[mode][0]))
    if a.device.type == "cuda":
        routed = _cuda_route(a, b, offs, x, problem)
        if routed is not None:
            return routed
    return grouped_mm_looped(a, b, offs, x, problem)


@_grouped_mm_op.register_fake
def _grouped_mm_fake(
    mat_a: Tensor,
    mat_b: Tensor,
    offs: Tensor | None,
    bias: Tensor | None,
    out_dtype: torch.dtype | None,
) -> Tensor:
    _, shape, dtype = _infer(mat_a, mat_b, offs, bias, out_dtype)
    return mat_a.new_empty(shape, dtype=dtype)


def _setup_context(
    ctx: torch.autograd.function.FunctionCtx, inputs: Sequence[object], output: Tensor
) -> None:
    a, b, offs, bias, _ = inputs
    ctx.save_for_backward(cast(Tensor, a), cast(Tensor, b), cast(Tensor, offs))  # offs may be None
    ctx.bias_dtype = bias.dtype if isinstance(bias, Tensor) else None  # type: ignore[attr-defined]


def _backward(ctx: torch.autograd.function.FunctionCtx, grad: Tensor) -> tuple[Tensor | None, ...]:
    # In every form dA = grouped_mm(dOut, B^T) and dB = grouped_mm(A^T, dOut) with the same
    # offs (each a grouped GEMM of another form), so the backward runs on the same routes and
    # is itself differentiable.
    a, b, offs = ctx.saved_tensors  # type: ignore[attr-defined]
    need_a, need_b, _, need_bias, _ = ctx.needs_input_grad  # type: ignore[attr-defined]
    g = grad.to(a.dtype)
    da = grouped_mm(g, b.transpose(-2, -1), offs=offs) if need_a else None
    db = grouped_mm(a.transpose(-2, -1), g, offs=offs) if need_b else None
    dbias = None
    if need_bias:
        mode = _MODES[(a.dim(), b.dim())]
        if mode == "2d3d":  # per-group row sums: a 2-D x 2-D grouped GEMM with a ones row
            ones = grad.new_ones(1, grad.shape[0])
            dbias = grouped_mm(ones, grad, offs=offs).squeeze(1)
        elif mode == "3d2d":  # columns past offs[-1] got no bias
            last = offs[-1:] if offs.numel() else offs.new_zeros(1)
            used = torch.arange(grad.shape[1], device=grad.device) < last
            dbias = grad.sum(0) * used
        else:
            dbias = grad.sum(1)
        dbias = dbias.to(ctx.bias_dtype)  # type: ignore[attr-defined]
    return da, db, None, dbias, None


_grouped_mm_op.register_autograd(_backward, setup_context=_setup_context)


# --------------------------------------------------------------------------- routes


def _batched(a: Tensor, b: Tensor, bias: Tensor | None, dtype: torch.dtype) -> Tensor:
    """3-D x 3-D: one ``bmm`` (MKL splits the batch over threads on the CPU)."""
    wide = a.device.type == "cpu" and a.dtype in _HALF and cpu_upcasts(a.dtype)
    if wide or dtype != a.dtype:
        a, b = a.float(), b.float()
    out = torch.bmm(a, b) if bias is None else torch.baddbmm(bias.to(a.dtype)[:, None, :], a, b)
    return out.to(dtype)


def _cuda_route(
    a: Tensor, b: Tensor, offs: Tensor, bias: Tensor | None, p: GroupedProblem
) -> Tensor | None:
    """torch's kernel where it has one (sm90/sm100 bf16), else Triton; None: loop instead."""
    mode, _, dtype, ends = p
    native = _gi.native_grouped_mm()
    if (
        native is not None
        and bias is None
        and dtype == a.dtype
        and ends
        and _gi.native_grouped_mm_is_kernel(a.device, a.dtype)
        and _gi.native_grouped_mm_accepts_layout(a)
        and _gi.native_grouped_mm_accepts_layout(b)
    ):
        return zero_tail(native(a, b, offs=offs.contiguous()), mode, ends)
    if triton_grouped.triton_available() and a.dtype != torch.float64 and ends:
        return triton_grouped.grouped_mm_triton(a, b, offs, bias=bias, out_dtype=dtype)
    return None
