"""``eigh`` and ``svd`` with torch.linalg's signatures, routed per problem.

When to use: anywhere you would call ``torch.linalg.eigh`` / ``torch.linalg.svd``
on batches of small matrices; the outputs follow torch's conventions (ascending
eigenvalues, descending singular values, ``Vh`` not ``V``, named-tuple results,
``out=``). The extra keyword ``method`` forces a route (``"jacobi"``, ``"lapack"``).

What not to assume: eigenvector and singular-vector signs (phases) may differ from
torch's, as they may between torch versions and devices. When autograd must record
the call, under ``torch.compile`` or functorch transforms, and for empty inputs the
call goes straight to ``torch.linalg``, whose backward formulas and meta kernels are
the reference; the fast routes are inference routes.

Shape legend: ``B`` flattened batch, ``M`` rows, ``N`` columns / order.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from torchnext.compat.linalg_internals import functorch_transforms_active
from torchnext.linalg._checks import check_dtype, check_finite, check_matrix, check_square
from torchnext.linalg._out import EighResult, SVDResult, torch_result, write_out
from torchnext.linalg.dispatch import (
    LapackPlan,
    Problem,
    Route,
    choose,
    intra_op_threads,
    lapack_plan,
    run_batch_split,
)

__all__ = ["eigh", "svd", "plain_torch_needed"]

Fn = Callable[..., Sequence[torch.Tensor]]


def plain_torch_needed(A: torch.Tensor) -> bool:
    """True where only ``torch.linalg`` may run: autograd, compile, vmap, empty input."""
    if A.numel() == 0:
        return True
    if torch.is_grad_enabled() and A.requires_grad:
        return True
    if torch.compiler.is_compiling():
        return True
    return functorch_transforms_active()


_DIRECT = LapackPlan(chunks=1, intra_op_threads=None)
"""A plain ``torch.linalg`` call as the caller set it up (autograd, compile, vmap)."""


def _run(route: Route, plan: LapackPlan, fn: Fn, a_BXY: torch.Tensor) -> list[torch.Tensor]:
    # Only LAPACK batches are split over threads: a LAPACK call releases the GIL for the
    # whole chunk, while the unrolled route is thousands of small torch ops whose Python
    # dispatch holds it, so two threads only contend (measured 1.4-1.7x slower).
    chunks = plan.chunks if route == "lapack" else 1
    return run_batch_split(fn, [a_BXY], chunks=chunks)


def eigh(
    A: torch.Tensor,
    UPLO: str = "L",
    *,
    method: str = "auto",
    out: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> EighResult:
    """Eigen-decomposition of Hermitian ``A``; see ``torch.linalg.eigh``.

    Returns ``(eigenvalues, eigenvectors)``, eigenvalues ascending and real. Reads only
    the ``UPLO`` triangle. NaN entries propagate to NaN outputs, as in torch.
    ``method``: ``"auto"`` (default), ``"jacobi"`` or ``"lapack"``.
    """
    fn_name = "linalg.eigh"
    check_square(fn_name, A)
    check_dtype(fn_name, A)
    if UPLO not in ("L", "U"):
        raise RuntimeError(f"Expected UPLO argument to be 'L' or 'U', but got {UPLO}")
    _check_method(fn_name, method)
    plan = _DIRECT
    if plain_torch_needed(A):
        route: Route = "lapack"
    else:
        problem = Problem(op="eigh", device=A.device, dtype=A.dtype, n=A.shape[-1], batch=_batch(A))
        route = choose(problem, method)
        plan = lapack_plan(problem)
    if route == "lapack" and plan.chunks == 1:
        with intra_op_threads(plan.intra_op_threads):
            res = torch.linalg.eigh(A, UPLO=UPLO)
        L, V = res.eigenvalues, res.eigenvectors
    else:
        n = A.shape[-1]
        lower = UPLO == "L"
        fn = _eigh_fn(route, lower)
        L_BN, V_BNN = _run(route, plan, fn, A.reshape(-1, n, n))
        L, V = L_BN.reshape(*A.shape[:-1]), V_BNN.reshape(A.shape)
    if out is not None:
        write_out(fn_name, out, (L, V))
        L, V = out
    return torch_result("linalg_eigh", EighResult, (L, V))


def _eigh_fn(route: Route, lower: bool) -> Fn:
    if route == "unrolled":
        from torchnext.linalg.unrolled import eigh_unrolled

        return lambda x: eigh_unrolled(x, lower=lower)[:2]
    if route == "triton":
        from torchnext.linalg._triton_jacobi import eigh_triton

        return lambda x: eigh_triton(x, lower=lower)[:2]
    if route == "jacobi":
        from torchnext.linalg.jacobi import eigh_jacobi

        return lambda x: eigh_jacobi(x, lower=lower)[:2]
    uplo = "L" if lower else "U"
    return lambda x: tuple(torch.linalg.eigh(x, UPLO=uplo))


def svd(
    A: torch.Tensor,
    full_matrices: bool = True,
    *,
    driver: str | None = None,
    method: str = "auto",
    out: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None,
) -> SVDResult:
    """Singular value decomposition ``A = U diag(S) Vh``; see ``torch.linalg.svd``.

    ``S`` is descending. NaN/inf input raises :class:`~torchnext.errors.LinAlgInputError`
    naming the batch index (torch raises its ``LinAlgError`` there). ``driver`` is passed
    to torch on the LAPACK/cuSOLVER route. ``method``: ``"auto"``, ``"jacobi"``, ``"lapack"``.
    """
    fn_name = "linalg.svd"
    check_matrix(fn_name, A)
    check_dtype(fn_name, A)
    _check_method(fn_name, method)
    m, n = A.shape[-2], A.shape[-1]
    k = min(m, n)
    plan = _DIRECT
    if plain_torch_needed(A):
        route: Route = "lapack"
    else:
        problem = Problem(op="svd", device=A.device, dtype=A.dtype, n=k, batch=_batch(A))
        route = choose(problem, method)
        plan = lapack_plan(problem)
    if route == "triton" and max(m, n) > 32:
        route = "jacobi" if method == "jacobi" else "lapack"  # the kernel holds <= 32 rows
    if full_matrices and m != n and route != "lapack":
        route = "lapack"  # Jacobi yields the reduced factors; completing them costs a QR anyway
    check_finite(fn_name, A)
    if route == "lapack" and plan.chunks == 1:
        with intra_op_threads(plan.intra_op_threads):
            res = torch.linalg.svd(A, full_matrices=full_matrices, driver=driver)
        U, S, Vh = res.U, res.S, res.Vh
    else:
        wide = m < n
        a_BMN = (A.mH if wide else A).reshape(-1, max(m, n), k)
        fn = _svd_fn(route, full_matrices, driver)
        U_, S_, Vh_ = _run(route, plan, fn, a_BMN)
        if wide:
            U_, Vh_ = Vh_.mH, U_.mH
        batch = A.shape[:-2]
        U = U_.reshape(*batch, *U_.shape[-2:])
        S = S_.reshape(*batch, k)
        Vh = Vh_.reshape(*batch, *Vh_.shape[-2:])
    if out is not None:
        write_out(fn_name, out, (U, S, Vh))
        U, S, Vh = out
    return torch_result("linalg_svd", SVDResult, (U, S, Vh))


def _svd_fn(route: Route, full_matrices: bool, driver: str | None) -> Fn:
    if route == "unrolled":
        from torchnext.linalg.unrolled import svd_unrolled

        return lambda x: svd_unrolled(x)[:3]
    if route == "triton":
        from torchnext.linalg._triton_jacobi import svd_triton

        return lambda x: svd_triton(x)[:3]
    if route == "jacobi":
        from torchnext.linalg.jacobi import svd_jacobi

        return lambda x: svd_jacobi(x)[:3]
    return lambda x: tuple(torch.linalg.svd(x, full_matrices=full_matrices, driver=driver))


def _check_method(fn_name: str, method: str) -> None:
    if method not in ("auto", "jacobi", "lapack"):
        raise ValueError(
            f"{fn_name}: method={method!r} is not one of 'auto', 'jacobi', 'lapack'; "
            "pass 'auto' to let the dispatcher pick"
        )


def _batch(A: torch.Tensor) -> int:
    b = 1
    for s in A.shape[:-2]:
        b *= s
    return b
