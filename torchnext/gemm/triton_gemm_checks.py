"""The argument checks of the Triton GEMM template (:func:`torchnext.gemm.triton_gemm.triton_gemm`).

What it is: :func:`check_triton_gemm_args`, which refuses, with the fix in the message, every
call the template cannot run (operands that do not contract, dtypes other than
float16/bfloat16/float32, a device other than CUDA outside Triton's interpreter, a misshapen
bias or epilogue operand, more than :data:`MAX_STEPS` steps, inputs that require grad) and
returns the output dtype; and :func:`interpreting`, whether Triton's CPU interpreter is on.

When to use: ``triton_gemm`` calls it first; call it directly only to ask whether a call
would be accepted. Nothing here imports Triton, so bad input fails fast and in process.

What not to assume: it checks shapes, dtypes and devices, not values (NaN and inf pass
through the kernel as they would through torch).

Shape legend: M output rows, N output columns, K the contracted dimension; ``a_MK``,
``b_KN``, ``bias_N``; an epilogue operand is a row ``[N]``, a column ``[M, 1]`` or full
``[M, N]``.
"""

from __future__ import annotations

import os

import torch

from torchnext.errors import GemmInputError, GemmUnsupportedError
from torchnext.gemm.epilogue import Epilogue

__all__ = ["MAX_STEPS", "check_triton_gemm_args", "interpreting"]

MAX_STEPS = 4
"""Epilogue steps the template specialises on (2.14's NVGEMM captures at most 4 tensors)."""

_INPUT_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
_OUT_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


def interpreting() -> bool:
    """Whether Triton's CPU interpreter is on (``TRITON_INTERPRET=1``, read at each call)."""
    return os.environ.get("TRITON_INTERPRET", "") == "1"


def _describe(value: object) -> str:
    if isinstance(value, torch.Tensor):
        return f"a {value.dtype} tensor of shape {list(value.shape)} on {value.device}"
    return repr(value)


def check_triton_gemm_args(
    a_MK: torch.Tensor,
    b_KN: torch.Tensor,
    bias_N: torch.Tensor | None,
    epilogue: Epilogue,
    out_dtype: torch.dtype | None,
) -> torch.dtype:
    """The output dtype; GemmInputError / GemmUnsupportedError for what the kernel cannot run.

    Checks everything :func:`~torchnext.gemm.triton_gemm.triton_gemm` takes (shapes, dtypes,
    devices, the epilogue's steps and operands, autograd) without importing Triton.
    """
    for name, t in (("a_MK", a_MK), ("b_KN", b_KN)):
        if not isinstance(t, torch.Tensor) or t.dim() != 2:
            raise GemmInputError(
                f"triton_gemm({name}): got {_describe(t)}; expected a 2-D tensor "
                "(flatten leading dimensions first, or call torchnext.gemm.gemm)"
            )
    if a_MK.shape[1] != b_KN.shape[0]:
        raise GemmInputError(
            f"triton_gemm(a_MK, b_KN): inner dimensions differ: a_MK is {list(a_MK.shape)} "
            f"(K={a_MK.shape[1]}), b_KN is {list(b_KN.shape)} (K={b_KN.shape[0]}); expected "
            "[M, K] and [K, N] (for an nn.Linear weight [N, K] pass weight.t())"
        )
    if a_MK.dtype not in _INPUT_DTYPES or b_KN.dtype != a_MK.dtype:
        raise GemmUnsupportedError(
            f"triton_gemm(a_MK, b_KN): dtypes {a_MK.dtype} and {b_KN.dtype}; expected both "
            "float16, both bfloat16 or both float32. Use torchnext.gemm.gemm (ATen route) for "
            "float64 and torchnext.gemm.scaled_mm for float8/float4"
        )
    out_dtype = a_MK.dtype if out_dtype is None else out_dtype
    if out_dtype not in _OUT_DTYPES:
        raise GemmUnsupportedError(
            f"triton_gemm(out_dtype={out_dtype}): expected one of "
            f"{', '.join(str(d) for d in _OUT_DTYPES)}; cast the result yourself"
        )
    device = a_MK.device
    if b_KN.device != device:
        raise GemmInputError(
            f"triton_gemm(b_KN): on {b_KN.device}, a_MK on {device}; move both to one device"
        )
    if device.type != "cuda" and not (device.type == "cpu" and interpreting()):
        raise GemmUnsupportedError(
            f"triton_gemm(a_MK): on {device}; expected a CUDA tensor (CPU tensors run only "
            "under Triton's interpreter, TRITON_INTERPRET=1). Use torchnext.gemm.gemm, which "
            "picks a CPU route"
        )
    m, n = a_MK.shape[0], b_KN.shape[1]
    if bias_N is not None and (
        not isinstance(bias_N, torch.Tensor)
        or tuple(bias_N.shape) != (n,)
        or not bias_N.is_floating_point()
        or bias_N.device != device
    ):
        raise GemmInputError(
            f"triton_gemm(bias_N): got {_describe(bias_N)}; expected a floating tensor of "
            f"shape [{n}] on {device}"
        )
    if not isinstance(epilogue, Epilogue):
        raise GemmInputError(
            f"triton_gemm(epilogue): got {type(epilogue).__name__}; expected a "
            "torchnext.gemm.Epilogue, e.g. Epilogue(gelu(), add(residual_MN))"
        )
    if len(epilogue.steps) > MAX_STEPS:
        raise GemmUnsupportedError(
            f"triton_gemm(epilogue): {len(epilogue.steps)} steps {epilogue!r}; the template "
            f"takes at most {MAX_STEPS}. Apply the rest after the call, or use "
            "torchnext.gemm.gemm, whose other routes take any number"
        )
    for i, step in enumerate(epilogue.steps):
        step.kind(m, n)  # raises GemmInputError for a misshapen operand
        operand = step.operand
        if isinstance(operand, torch.Tensor) and (
            operand.device != device or operand.dtype not in _OUT_DTYPES
        ):
            raise GemmInputError(
                f"triton_gemm(epilogue.steps[{i}] {step.op}): operand is {_describe(operand)}; "
                f"expected a float16/bfloat16/float32/float64 tensor on {device}"
            )
    amax = epilogue.amax_into
    if amax is not None and amax.device != device:
        raise GemmInputError(
            f"triton_gemm(epilogue.amax_into): on {amax.device}; expected a float32 tensor "
            f"with one element on {device} (the kernel writes it with an atomic max)"
        )
    if torch.is_grad_enabled() and any(
        isinstance(x, torch.Tensor) and x.requires_grad
        for x in (a_MK, b_KN, bias_N, *epilogue.captured)
    ):
        raise GemmUnsupportedError(
            "triton_gemm: an input requires grad; the template has no backward. Call it "
            "under torch.no_grad(), or use torchnext.gemm.gemm, which records the eager chain"
        )
    return out_dtype
