"""Input validation shared by every ``torchnext.linalg`` function.

Use these before doing any work: they raise the typed, argument-naming errors the
public functions promise (shape, dtype, finiteness), with the index of the offending
matrix in the flattened batch, the way ``torch.linalg``'s ``_ex`` variants report
``info``. Messages of the checks that mirror a torch 2.14 contract (``polar``,
``matrix_sqrth``) use the exact 2.14 wording, since callers may match on it.

Do not assume the finiteness check is free: it reads the whole input once (one fused
reduction and one host sync). Functions that document NaN propagation skip it.

Shape legend: ``B`` flattened batch, ``M`` rows, ``N`` columns.
"""

from __future__ import annotations

import torch

from torchnext.compat.linalg_internals import functorch_transforms_active
from torchnext.errors import LinAlgInputError, NotPositiveDefiniteError

__all__ = [
    "check_matrix",
    "check_square",
    "check_finite",
    "check_dtype",
    "first_bad_index",
    "raise_not_pd",
]

_LOW_PRECISION = (torch.float16, torch.bfloat16)
_SUPPORTED = (torch.float32, torch.float64, torch.complex64, torch.complex128)


def _dtype_name(dtype: torch.dtype) -> str:
    # torch prints ``Long``/``Half`` in its linalg messages; mirror that spelling.
    names = {
        torch.int64: "Long",
        torch.int32: "Int",
        torch.int16: "Short",
        torch.int8: "Char",
        torch.uint8: "Byte",
        torch.bool: "Bool",
        torch.float16: "Half",
        torch.bfloat16: "BFloat16",
        torch.float32: "Float",
        torch.float64: "Double",
        torch.complex64: "ComplexFloat",
        torch.complex128: "ComplexDouble",
    }
    return names.get(dtype, str(dtype))


def check_matrix(fn: str, A: torch.Tensor, *, arg: str = "A") -> None:
    """``RuntimeError`` (torch's wording) unless ``A`` is a tensor with >= 2 dims."""
    if not isinstance(A, torch.Tensor):
        raise TypeError(f"{fn}: argument '{arg}' must be a Tensor, not {type(A).__name__}")
    if A.dim() < 2:
        raise RuntimeError(f"{fn}: The input tensor {arg} must have at least 2 dimensions.")


def check_square(fn: str, A: torch.Tensor, *, arg: str = "A") -> None:
    """``RuntimeError`` (torch's wording) unless ``A`` is a batch of square matrices."""
    check_matrix(fn, A, arg=arg)
    m, n = A.shape[-2], A.shape[-1]
    if m != n:
        raise RuntimeError(
            f"{fn}: {arg} must be batches of square matrices, but they are {m} by {n} matrices"
        )


def check_dtype(fn: str, A: torch.Tensor, *, arg: str = "A", allow_low: bool = False) -> None:
    """``RuntimeError`` for integer and (unless ``allow_low``) half/bfloat16 inputs."""
    dtype = A.dtype
    if not (dtype.is_floating_point or dtype.is_complex):
        raise RuntimeError(
            f"{fn}: Expected a floating point or complex tensor as input. Got {_dtype_name(dtype)}"
        )
    if dtype in _LOW_PRECISION and not allow_low:
        raise RuntimeError(f"{fn}: Low precision dtypes not supported. Got {_dtype_name(dtype)}")
    if dtype not in _SUPPORTED and dtype not in _LOW_PRECISION:
        raise RuntimeError(f"{fn}: unsupported dtype {dtype} for argument '{arg}'")


def first_bad_index(bad_B: torch.Tensor) -> int:
    """Index of the first ``True`` of a flat boolean tensor, or -1 (one host sync)."""
    if bad_B.numel() == 0:
        return -1
    idx = int(torch.argmax(bad_B.to(torch.uint8)).item())
    return idx if bool(bad_B[idx].item()) else -1


def check_finite(fn: str, A: torch.Tensor, *, arg: str = "A") -> None:
    """:class:`LinAlgInputError` naming the first batch index holding NaN or inf."""
    if A.numel() == 0 or torch.compiler.is_compiling():
        return
    if functorch_transforms_active():
        return  # data-dependent checks cannot run under vmap/grad transforms
    a_BMN = A.reshape(-1, A.shape[-2], A.shape[-1])
    # One fused reduction: sum is non-finite iff some entry is NaN/inf (or it overflows,
    # which the second, exact test below rules out before we report).
    if bool(torch.isfinite(a_BMN.sum()).item()):
        return
    bad_B = ~torch.isfinite(a_BMN).flatten(1).all(dim=1)
    idx = first_bad_index(bad_B)
    if idx < 0:
        return
    raise LinAlgInputError(
        f"{fn}: argument '{arg}' contains NaN or inf entries in the matrix at batch index "
        f"{idx} (of {a_BMN.shape[0]} in the flattened batch {tuple(A.shape[:-2])}); "
        "remove or replace the non-finite values first.",
        batch_index=idx,
    )


def raise_not_pd(fn: str, info_B: torch.Tensor, *, arg: str = "A") -> None:
    """Raise :class:`NotPositiveDefiniteError` if any ``info`` entry is non-zero."""
    flat = info_B.reshape(-1)
    idx = first_bad_index(flat != 0)
    if idx < 0:
        return
    order = int(flat[idx].item())
    raise NotPositiveDefiniteError(
        f"{fn}: argument '{arg}' is not positive definite: the matrix at batch index {idx} "
        f"(flattened batch of {flat.numel()}) failed at leading minor of order {order}. "
        "Pass a Hermitian positive-definite matrix, or regularise it (A + eps*I).",
        batch_index=idx,
    )
