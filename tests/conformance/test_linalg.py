"""torchnext.linalg on torch 2.13 against torch 2.14.1's native polar and matrix_sqrth.

The inputs are made here (2.14) and shipped to the 2.13 program as JSON, so both sides
see bit-identical matrices. Agreement is required within the issue's accuracy gates
(the factors are unique for full-rank / positive-definite input, so they are compared
directly), and the 2.14 error contracts are compared message for message.
"""

from __future__ import annotations

import json
import textwrap
from collections.abc import Callable
from typing import Any

import pytest
import torch

GATE = 10.0  # in n*eps


def _neps(x: torch.Tensor, n: int, dtype: torch.dtype) -> float:
    real = torch.empty(0, dtype=dtype).real.dtype
    return float(x.max()) / (n * torch.finfo(real).eps)


def _encode(t: torch.Tensor) -> Any:
    if t.is_complex():
        return {"re": t.real.tolist(), "im": t.imag.tolist(), "dtype": str(t.dtype)}
    return {"re": t.tolist(), "dtype": str(t.dtype)}


def _decode(obj: Any) -> torch.Tensor:
    dtype = getattr(torch, obj["dtype"].split(".")[-1])
    real = torch.tensor(obj["re"], dtype=torch.float64)
    if "im" in obj:
        return torch.complex(real, torch.tensor(obj["im"], dtype=torch.float64)).to(dtype)
    return real.to(dtype)


# Both programs open alike: the cases from the payload, and a decoder for them.
_PREAMBLE = """
import json, torch
import torchnext.linalg as tl
from torchnext.linalg import compat214
cases = json.loads({payload!r})
def dec(o):
    dt = getattr(torch, o["dtype"].split(".")[-1])
    r = torch.tensor(o["re"], dtype=torch.float64)
    return (torch.complex(r, torch.tensor(o["im"], dtype=torch.float64)) if "im" in o else r).to(dt)
"""

_PROGRAM = (
    _PREAMBLE
    + """def enc(t):
    return {{"re": t.real.tolist(), "im": t.imag.tolist(), "dtype": str(t.dtype)}} if t.is_complex() else {{"re": t.tolist(), "dtype": str(t.dtype)}}
out = []
for case in cases:
    A = dec(case["A"])
    if case["op"] == "polar":
        U, H = compat214.polar(A)
        out.append([enc(U), enc(H)])
    else:
        out.append([enc(compat214.matrix_sqrth(A))])
print(json.dumps(out))
"""
)


def _cases() -> list[dict[str, Any]]:
    gen = torch.Generator().manual_seed(0)
    cases = []
    for dtype in (torch.float32, torch.float64, torch.complex64, torch.complex128):
        for shape in ((6, 5, 5), (4, 7, 3), (3, 1, 1), (2, 3, 4, 4)):
            A = torch.randn(*shape, dtype=dtype, generator=gen)
            cases.append({"op": "polar", "A": _encode(A)})
        X = torch.randn(5, 6, 6, dtype=dtype, generator=gen)
        spd = X @ X.mH / 6 + torch.eye(6, dtype=dtype)
        spd = spd + 100 * torch.ones_like(spd).triu(1)  # upper triangle must be ignored
        cases.append({"op": "sqrth", "A": _encode(spd)})
    return cases


def test_polar_and_sqrth_agree_with_native(run_on_torch213: Callable[[str], Any]) -> None:
    cases = _cases()
    theirs = run_on_torch213(_PROGRAM.format(payload=json.dumps(cases)))
    assert len(theirs) == len(cases)
    for case, got in zip(cases, theirs, strict=True):
        A = _decode(case["A"])
        dtype = A.dtype
        wide = torch.complex128 if dtype.is_complex else torch.float64
        if case["op"] == "polar":
            U, H = (_decode(g) for g in got)
            U_ref, H_ref = torch.linalg.polar(A)
            assert U.shape == U_ref.shape and H.shape == H_ref.shape and U.dtype == dtype
            n = A.shape[-1]
            Ud, Ad = U.to(wide), A.to(wide)
            orth = torch.linalg.matrix_norm(Ud.mH @ Ud - torch.eye(n, dtype=wide))
            rec = torch.linalg.matrix_norm(Ud @ H.to(wide) - Ad) / torch.linalg.matrix_norm(Ad)
            assert _neps(orth, n, dtype) <= GATE and _neps(rec, n, dtype) <= GATE
            diff_u = torch.linalg.matrix_norm(Ud - U_ref.to(wide)) / n**0.5
            diff_h = torch.linalg.matrix_norm(
                H.to(wide) - H_ref.to(wide)
            ) / torch.linalg.matrix_norm(H_ref.to(wide))
            # Equal factors: both are within the gates of the unique exact answer.
            cond = torch.linalg.cond(A.to(wide)).real.clamp_max(1e6)
            assert bool((diff_u <= 2 * GATE * n * torch.finfo(U_ref.real.dtype).eps * cond).all())
            assert _neps(diff_h, n, dtype) <= 2 * GATE
        else:
            (X,) = (_decode(g) for g in got)
            X_ref = torch.linalg.matrix_sqrth(A)
            n = A.shape[-1]
            herm = A.tril() + A.tril(-1).mH
            rec = torch.linalg.matrix_norm(
                (X @ X).to(wide) - herm.to(wide)
            ) / torch.linalg.matrix_norm(herm.to(wide))
            assert _neps(rec, n, dtype) <= GATE
            diff = torch.linalg.matrix_norm((X - X_ref).to(wide)) / torch.linalg.matrix_norm(
                X_ref.to(wide)
            )
            assert _neps(diff, n, dtype) <= 2 * GATE


_ERRORS = {
    "polar_1d": "torch.linalg.polar(torch.randn(3))",
    "polar_wide": "torch.linalg.polar(torch.randn(3, 5))",
    "polar_long": "torch.linalg.polar(torch.ones(3, 3, dtype=torch.long))",
    "polar_half": "torch.linalg.polar(torch.eye(3, dtype=torch.half))",
    "polar_out_dtype": "torch.linalg.polar(torch.randn(3, 3), out=(torch.empty(3, 3, dtype=torch.float64), torch.empty(0)))",
    "sqrth_1d": "torch.linalg.matrix_sqrth(torch.randn(3))",
    "sqrth_nonsquare": "torch.linalg.matrix_sqrth(torch.randn(3, 4))",
    "sqrth_long": "torch.linalg.matrix_sqrth(torch.ones(3, 3, dtype=torch.long))",
    "sqrth_half": "torch.linalg.matrix_sqrth(torch.eye(3, dtype=torch.half))",
}


def _outcome(expr: str, ns: dict[str, Any]) -> list[str]:
    try:
        eval(expr, ns)  # noqa: S307 - fixed expressions defined in this file
    except Exception as exc:  # noqa: BLE001 - we record whatever torch raises
        return [type(exc).__name__, str(exc)]
    return ["ok", ""]


@pytest.mark.parametrize("key", sorted(_ERRORS))
def test_error_contracts_match_native(key: str, run_on_torch213: Callable[[str], Any]) -> None:
    expr = _ERRORS[key]
    native = _outcome(expr, {"torch": torch})
    program = f"""
import json, torch
from torchnext.linalg import compat214
torch.linalg.polar = compat214.polar
torch.linalg.matrix_sqrth = compat214.matrix_sqrth
try:
    {expr}
    print(json.dumps(["ok", ""]))
except Exception as exc:
    print(json.dumps([type(exc).__name__, str(exc)]))
"""
    theirs = run_on_torch213(program)
    assert theirs == native


def test_semantics_lower_triangle_clamp_and_nan(run_on_torch213: Callable[[str], Any]) -> None:
    exprs = [
        "torch.tensor([[4., 100.], [0., -1.]])",
        "torch.tensor([[1., 2.], [2., 1.]])",
        "torch.full((2, 2), float('nan'))",
    ]
    native = [torch.linalg.matrix_sqrth(eval(e)).tolist() for e in exprs]  # noqa: S307
    theirs = run_on_torch213(
        "import json, math, torch\nfrom torchnext.linalg import compat214\n"
        f"print(json.dumps([[[None if math.isnan(v) else v for v in row] for row in compat214.matrix_sqrth(eval(e)).tolist()] for e in {exprs!r}]))"
    )
    for n_res, t_res in zip(native, theirs, strict=True):
        for n_row, t_row in zip(n_res, t_res, strict=True):
            for n_v, t_v in zip(n_row, t_row, strict=True):
                if t_v is None:
                    assert n_v != n_v  # NaN on both sides
                else:
                    assert abs(n_v - t_v) <= 1e-6


# Jacobians on general (non-Hermitian, non-symmetric) inputs. For the factors fixed
# only up to sign or phase, gauge-invariant functions are compared: values,
# U diag(S) Vh, projectors U U^H, Q R. Complex inputs are seen as pairs of reals.
_JACOBIAN_PROGRAM = (
    _PREAMBLE
    + """{functions}
def jac(fn, A):
    if A.is_complex():
        g = lambda x: torch.view_as_real(fn(torch.view_as_complex(x)))
        return torch.autograd.functional.jacobian(g, torch.view_as_real(A))
    return torch.autograd.functional.jacobian(fn, A)
out = []
for case in cases:
    fn = FUNCTIONS[case["fn"]](tl, compat214)
    out.append(jac(fn, dec(case["A"])).flatten().tolist())
print(json.dumps(out))
"""
)

# One source for both sides: `lib` is torchnext.linalg (2.13) or torch.linalg (2.14.1),
# `top` is compat214 (2.13) or torch.linalg (2.14.1).
_FUNCTIONS = """
def _eigh(lib, uplo):
    return lambda a: torch.cat([lib.eigh(a, UPLO=uplo)[0].to(a.dtype).flatten(),
                                (lambda V: V[..., :2] @ V[..., :2].mH)(lib.eigh(a, UPLO=uplo)[1]).flatten()])
def _svd(lib):
    def f(a):
        U, S, Vh = lib.svd(a, full_matrices=False)
        return torch.cat([S.to(a.dtype).flatten(), ((U * S[..., None, :].to(U.dtype)) @ Vh).flatten(),
                          (U[..., :2] @ U[..., :2].mH).flatten()])
    return f
def _qr(lib):
    return lambda a: torch.cat([(lambda q, r: torch.cat([(q @ r).flatten(), r.flatten()]))(*lib.qr(a))])
FUNCTIONS = {{
    "polar": lambda lib, top: (lambda a: torch.cat([t.flatten() for t in top.polar(a)])),
    "matrix_sqrth": lambda lib, top: top.matrix_sqrth,
    "eigh_L": lambda lib, top: _eigh(lib, "L"),
    "eigh_U": lambda lib, top: _eigh(lib, "U"),
    "svd": lambda lib, top: _svd(lib),
    "qr": lambda lib, top: _qr(lib),
    "cholesky": lambda lib, top: lib.cholesky,
    "cholesky_upper": lambda lib, top: (lambda a: lib.cholesky(a, upper=True)),
}}
"""


def _jacobian_cases() -> list[dict[str, Any]]:
    gen = torch.Generator().manual_seed(5)
    cases = []
    for dtype in (torch.float64, torch.complex128):
        X = torch.randn(2, 4, 4, dtype=dtype, generator=gen)
        # distinct eigenvalues, positive definite, then a non-Hermitian perturbation
        spd = X @ X.mH / 4 + torch.diag(torch.arange(1.0, 5.0, dtype=torch.float64)).to(dtype)
        general = spd + 0.1 * torch.randn(2, 4, 4, dtype=dtype, generator=gen)
        tall = torch.randn(2, 5, 3, dtype=dtype, generator=gen)
        for fn in ("matrix_sqrth", "eigh_L", "eigh_U", "cholesky", "cholesky_upper"):
            cases.append({"fn": fn, "A": _encode(general)})
        for fn in ("polar", "svd", "qr"):
            cases.append({"fn": fn, "A": _encode(tall)})
            cases.append({"fn": fn, "A": _encode(general)})
    return cases


def test_jacobians_match_native_on_general_inputs(run_on_torch213: Callable[[str], Any]) -> None:
    cases = _jacobian_cases()
    program = _JACOBIAN_PROGRAM.format(
        payload=json.dumps(cases), functions=textwrap.dedent(_FUNCTIONS).format()
    )
    theirs = run_on_torch213(program)
    namespace: dict[str, Any] = {"torch": torch}
    exec(textwrap.dedent(_FUNCTIONS).format(), namespace)  # noqa: S102 - the same source as the 2.13 side
    assert len(theirs) == len(cases)
    for case, got in zip(cases, theirs, strict=True):
        A = _decode(case["A"])
        fn = namespace["FUNCTIONS"][case["fn"]](torch.linalg, torch.linalg)
        if A.is_complex():

            def real_fn(x: torch.Tensor, fn: Any = fn) -> torch.Tensor:
                return torch.view_as_real(fn(torch.view_as_complex(x)))

            ref = torch.autograd.functional.jacobian(real_fn, torch.view_as_real(A))
        else:
            ref = torch.autograd.functional.jacobian(fn, A)
        ours = torch.tensor(got, dtype=torch.float64)
        torch.testing.assert_close(
            ours,
            ref.flatten(),  # type: ignore[union-attr]
            rtol=1e-7,
            atol=1e-12,
            msg=lambda m, where=f"{case['fn']} on {tuple(A.shape)} {A.dtype}": f"{where}: {m}",
        )
