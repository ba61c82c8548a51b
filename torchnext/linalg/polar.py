"""``polar``: right and left polar decomposition of any shape, QDWH / Newton-Schulz / SVD.

When to use: ``torchnext.linalg.polar(A)`` is torch 2.14's ``torch.linalg.polar(A)``
(right polar ``A = U H`` for m >= n, same outputs, ``out=``, errors) on any torch,
plus ``side="left"`` (``A = H U``), wide matrices, a choice of ``method`` and
``return_info``. ``method``:

* ``"svd"``: 2.14's algorithm (``U = W Vh``, ``H = V diag(S) V^H``), through the
  batch-aware SVD of :mod:`torchnext.linalg.spectral`;
* ``"qdwh"``: batched QDWH with a per-matrix convergence test (orthogonality ~0.3
  n*eps), SVD for any matrix that does not converge (rank-deficient input);
* ``"newton_schulz"``: matmul-only scaled Newton-Schulz, SVD for the matrices it
  does not converge on (ill-conditioned ones);
* ``"auto"``: Newton-Schulz with SVD fallback, except on the CPU for tiny real
  matrices (n <= 6, where the unrolled-Jacobi SVD is cheaper) and for float64
  n >= 32 (slow float64 matmuls), which take the SVD; every auto route ends with a
  Newton-Schulz refinement so that ``||U^H U - I||_F <= 2 n eps``.

What not to assume: for rank-deficient ``A`` the factor ``U`` is not unique (any
route returns *a* valid one) and gradients are undefined, as in torch 2.14.

Shape legend: ``B`` flattened batch, ``M`` rows, ``N`` columns.
"""

from __future__ import annotations

from typing import Literal, NamedTuple

import torch

from torchnext.compat.linalg_internals import traced
from torchnext.linalg._checks import check_finite, check_matrix
from torchnext.linalg._info import IterInfo
from torchnext.linalg._out import write_out
from torchnext.linalg.autograd import PolarFunction
from torchnext.linalg.dispatch import run_matmul_split

__all__ = ["polar", "PolarResult", "PolarInfoResult"]

Side = Literal["right", "left"]
Method = Literal["auto", "qdwh", "newton_schulz", "svd"]
_METHODS = ("auto", "qdwh", "newton_schulz", "svd")


class PolarResult(NamedTuple):
    """``(U, H)``; torch 2.14 returns ``torch.return_types.linalg_polar`` (same fields)."""

    U: torch.Tensor
    H: torch.Tensor


class PolarInfoResult(NamedTuple):
    """``(U, H, info)`` returned when ``return_info=True``."""

    U: torch.Tensor
    H: torch.Tensor
    info: IterInfo


def _dtype_check(A: torch.Tensor) -> None:
    dt = A.dtype
    if not (dt.is_floating_point or dt.is_complex):
        names = {torch.int64: "Long", torch.int32: "Int", torch.bool: "Bool"}
        raise RuntimeError(
            "linalg.polar: Expected a floating point or complex tensor as input. "
            f"Got {names.get(dt, str(dt))}"
        )
    if dt in (torch.float16, torch.bfloat16):
        # torch 2.14 fails in its SVD kernel with exactly this error type and text.
        name = "Half" if dt == torch.float16 else "BFloat16"
        raise NotImplementedError(f"\"linalg_svd_cpu\" not implemented for '{name}'")


def _herm(x: torch.Tensor) -> torch.Tensor:
    return 0.5 * (x + x.mH)


def _svd_polar(a_BMN: torch.Tensor, refine: bool) -> tuple[torch.Tensor, torch.Tensor]:
    from torchnext.linalg.spectral import svd

    W, S, Vh = svd(a_BMN, full_matrices=False)
    U = W @ Vh
    H = (Vh.mH * S[..., None, :].to(Vh.dtype)) @ Vh
    if refine:
        U = _refine(U)
    return U, H


def _refine(U: torch.Tensor) -> torch.Tensor:
    eye = torch.eye(U.shape[-1], dtype=U.dtype, device=U.device)
    return U @ (1.5 * eye - 0.5 * (U.mH @ U))


def _tall_polar(
    a_BMN: torch.Tensor, method: str, want_info: bool
) -> tuple[torch.Tensor, torch.Tensor, IterInfo | None]:
    """Right polar of a tall batch, routed; unconverged matrices fall back to SVD."""
    B, m, n = a_BMN.shape
    if n == 1 and method != "svd":
        # A single column: U = a / ||a||, H = ||a|| (closed form, exact to rounding).
        norm = torch.linalg.vector_norm(a_BMN, dim=-2, keepdim=True)
        e1 = torch.zeros_like(a_BMN)
        e1[:, 0] = 1
        U = torch.where(norm > 0, a_BMN / torch.where(norm > 0, norm, 1).to(a_BMN.dtype), e1)
        info = _direct_info(U, B) if want_info else None
        return U, norm.to(a_BMN.dtype), info
    if method == "auto":
        cpu = a_BMN.device.type == "cpu"
        tiny_real = not a_BMN.is_complex() and n <= 6
        # float64 batched matmul on the CPU runs at 1/2-1/4 of float32's rate, which
        # makes ~10 NS iterations cost more than LAPACK's SVD from n ~ 32 up.
        wide_f64 = a_BMN.dtype in (torch.float64, torch.complex128) and n >= 32
        method = "svd_refined" if cpu and (tiny_real or wide_f64) else "newton_schulz"
    if method in ("svd", "svd_refined"):
        U, H = _svd_polar(a_BMN, refine=method == "svd_refined")
        info = _direct_info(U, B) if want_info else None
        return U, H, info
    if method == "qdwh":
        from torchnext.linalg.qdwh import qdwh_polar

        def flat_qdwh(x: torch.Tensor) -> tuple[torch.Tensor, ...]:
            u, inf = qdwh_polar(x)
            return (u, *inf)

        # QDWH's QR/Cholesky are LAPACK batch loops, its GEMMs small: split the batch.
        U, iters, conv, resid = run_matmul_split(flat_qdwh, [a_BMN])
    else:
        from torchnext.linalg.newton_schulz import polar_newton_schulz

        def flat_ns(x: torch.Tensor) -> tuple[torch.Tensor, ...]:
            u, inf = polar_newton_schulz(x)
            return (u, *inf)

        U, iters, conv, resid = run_matmul_split(flat_ns, [a_BMN])
    info = IterInfo(iters=iters, converged=conv, residual=resid)
    H = _herm(U.mH @ a_BMN)
    bad = (~conv).nonzero().flatten()
    if bad.numel() > 0:
        U_bad, H_bad = _svd_polar(a_BMN[bad], refine=True)
        U, H = U.clone(), H.clone()
        U[bad], H[bad] = U_bad, H_bad
    return U, H, info


def _direct_info(U: torch.Tensor, B: int) -> IterInfo:
    eye = torch.eye(U.shape[-1], dtype=U.dtype, device=U.device)
    return IterInfo(
        iters=torch.zeros(B, dtype=torch.int32, device=U.device),
        converged=torch.ones(B, dtype=torch.bool, device=U.device),
        residual=torch.linalg.matrix_norm(U.mH @ U - eye),
    )


def _plain_tall(a: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    # Traceable composition for torch.compile / functorch: 2.14's own algorithm.
    W, S, Vh = torch.linalg.svd(a, full_matrices=False)
    return W @ Vh, (Vh.mH * S[..., None, :].to(Vh.dtype)) @ Vh


def polar(
    A: torch.Tensor,
    *,
    side: Side = "right",
    method: Method = "auto",
    return_info: bool = False,
    out: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> PolarResult | PolarInfoResult:
    """Polar decomposition: ``A = U H`` (``side="right"``) or ``A = H U`` (``"left"``).

    ``A`` has shape ``(*, m, n)``. Right: ``U`` is ``(*, m, n)``, ``H = (A^H A)^{1/2}``
    is ``(*, n, n)``; left: ``H = (A A^H)^{1/2}`` is ``(*, m, m)``. ``U`` has
    orthonormal columns (m >= n) or rows (m < n) and is the closest such matrix to A.
    NaN/inf input raises :class:`~torchnext.errors.LinAlgInputError` with the batch
    index (torch 2.14 raises its ``LinAlgError`` from the SVD). With
    ``return_info=True`` the result gains ``info`` (:class:`IterInfo`, per matrix:
    iterations, convergence of the iterative route before any SVD fallback, and
    its residual).
    """
    fn_name = "linalg.polar"
    check_matrix(fn_name, A)
    _dtype_check(A)
    if side not in ("right", "left"):
        raise ValueError(f"linalg.polar: side={side!r} must be 'right' or 'left'")
    if method not in _METHODS:
        raise ValueError(f"linalg.polar: method={method!r} must be one of {_METHODS}")
    m, n = A.shape[-2], A.shape[-1]
    # Reduce every case to the right polar of a tall matrix T = U_t H_t.
    transpose = (side == "right" and m < n) or (side == "left" and m <= n)
    T = A.mH if transpose else A
    info: IterInfo | None = None
    if A.numel() == 0 or traced():  # only traceable ops may run
        U_t, H_t = _plain_tall(T)
    else:
        check_finite(fn_name, A)
        batch = T.shape[:-2]
        t_BMN = T.reshape(-1, T.shape[-2], T.shape[-1])
        holder: list[IterInfo | None] = [None]

        def impl(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            u, h, inf = _tall_polar(x, method, return_info)
            holder[0] = inf
            return u, h

        if torch.is_grad_enabled() and A.requires_grad:
            U_f, H_f = PolarFunction.apply(t_BMN, impl)
        else:
            U_f, H_f = impl(t_BMN)
        U_t = U_f.reshape(*batch, *U_f.shape[-2:])
        H_t = H_f.reshape(*batch, *H_f.shape[-2:])
        if holder[0] is not None:
            info = holder[0].reshape(tuple(batch))
    if side == "right":
        U, H = (U_t.mH, _herm(U_t @ H_t @ U_t.mH)) if transpose else (U_t, H_t)
    else:
        U, H = (U_t.mH, H_t) if transpose else (U_t, _herm(U_t @ H_t @ U_t.mH))
    if out is not None:
        write_out(fn_name, out, (U, H))
        U, H = out
    if return_info:
        if info is None:
            B = 1
            for s in A.shape[:-2]:
                B *= s
            info = _direct_info(U_t.reshape(-1, *U_t.shape[-2:]), B).reshape(tuple(A.shape[:-2]))
        return PolarInfoResult(U, H, info)
    native = getattr(torch.return_types, "linalg_polar", None)
    if native is not None:
        result: PolarResult = native((U, H))
        return result
    return PolarResult(U, H)
