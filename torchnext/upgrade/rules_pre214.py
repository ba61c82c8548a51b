"""The upgrade rules for linalg and amp APIs deprecated or removed before torch 2.14 (TNU2xx).

Code written for an old torch meets these on the way to 2.14. Read them through
:data:`torchnext.upgrade.rules.RULES`; the fixers are in
:mod:`torchnext.upgrade.fixers_linalg` and :mod:`torchnext.upgrade.fixers_misc`.
What not to assume: "before 2.14" means the old name may already be gone on 2.13 too.
"""

from __future__ import annotations

from torchnext.upgrade.rule_model import FixClass, Rule

__all__ = ["EARLIER_LINALG_AMP"]

EARLIER_LINALG_AMP: tuple[Rule, ...] = (
    Rule(
        code="TNU201",
        name="symeig-removed",
        message="`torch.symeig` was removed; use `torch.linalg.eigh` / `eigvalsh`",
        fix=FixClass.SAFE,
        what="Finds `torch.symeig(A, eigenvectors, upper)` and the method form.",
        why="It raises RuntimeError on every torch since 1.13.",
        before="w, V = torch.symeig(A, eigenvectors=True)",
        after='w, V = torch.linalg.eigh(A, UPLO="U")',
        fix_safety=(
            'Safe with a literal `eigenvectors`: True gives `linalg.eigh(A, UPLO="U")` (symeig '
            "read the upper triangle by default), `[0]`/`.eigenvalues` with False gives "
            "`linalg.eigvalsh`. A non-literal `eigenvectors` is reported."
        ),
    ),
    Rule(
        code="TNU202",
        name="eig-removed",
        message="`torch.eig` was removed; use `torch.linalg.eig` (complex results)",
        fix=FixClass.REPORT_ONLY,
        what="Finds `torch.eig(...)` and the method form.",
        why="It raises RuntimeError; `linalg.eig` returns complex tensors, not the old (n, 2) layout.",
        before="e, v = torch.eig(A, eigenvectors=True)",
        after="L, V = torch.linalg.eig(A)  # complex; downstream indexing changes",
        fix_safety="Report-only: the result layout differs, so the code that reads it must change.",
    ),
    Rule(
        code="TNU203",
        name="lstsq-removed",
        message="`torch.lstsq(B, A)` was removed; use `torch.linalg.lstsq(A, B).solution`",
        fix=FixClass.REPORT_ONLY,
        what="Finds `torch.lstsq(...)` and the method form.",
        why="It raises RuntimeError; the new function swaps the arguments and returns other shapes.",
        before="X = torch.lstsq(B, A)[0][: A.shape[1]]",
        after="X = torch.linalg.lstsq(A, B).solution",
        fix_safety="Report-only: the old solution was padded to max(m, n) rows, so slices must change.",
    ),
    Rule(
        code="TNU204",
        name="solve-removed",
        message="`torch.solve(B, A)` was removed; use `torch.linalg.solve(A, B)`",
        fix=FixClass.SAFE,
        what="Finds `torch.solve(B, A)` and the method form.",
        why="It raises RuntimeError.",
        before="X = torch.solve(B, A)[0]",
        after="X = torch.linalg.solve(A, B)",
        fix_safety=(
            "Safe when the result is indexed with `[0]` or `.solution` (the arguments are "
            "swapped). A use of the whole (solution, LU) tuple is reported."
        ),
    ),
    Rule(
        code="TNU205",
        name="matrix-rank-removed",
        message="`torch.matrix_rank` was removed; use `torch.linalg.matrix_rank`",
        fix=FixClass.SAFE,
        what="Finds `torch.matrix_rank(A, tol, symmetric)`.",
        why="It raises RuntimeError.",
        before="r = torch.matrix_rank(A, tol=1e-6, symmetric=True)",
        after="r = torch.linalg.matrix_rank(A, atol=1e-6, hermitian=True)",
        fix_safety="Safe: `tol` is an absolute threshold (`atol`), `symmetric` is `hermitian`.",
    ),
    Rule(
        code="TNU206",
        name="lu-deprecated",
        message="`torch.lu` is deprecated; use `torch.linalg.lu_factor` (`_ex` with infos)",
        fix=FixClass.SAFE,
        what="Finds `torch.lu(A, pivot, get_infos)` and the method form.",
        why="Deprecated since 1.13, due for removal.",
        before="LU, piv, info = torch.lu(A, get_infos=True)",
        after="LU, piv, info = torch.linalg.lu_factor_ex(A)",
        fix_safety="Safe with a literal `get_infos`; otherwise reported.",
    ),
    Rule(
        code="TNU207",
        name="lu-solve-deprecated",
        message="`torch.lu_solve(b, LU, piv)` is deprecated; use `torch.linalg.lu_solve(LU, piv, b)`",
        fix=FixClass.SAFE,
        what="Finds `torch.lu_solve(b, LU_data, LU_pivots)` and the method form.",
        why="Deprecated since 1.13, due for removal.",
        before="x = torch.lu_solve(b, LU, piv)",
        after="x = torch.linalg.lu_solve(LU, piv, b)",
        fix_safety="Safe: the arguments are reordered; `*args` calls are reported.",
    ),
    Rule(
        code="TNU208",
        name="triangular-solve-deprecated",
        message="`torch.triangular_solve(b, A)` is deprecated; use `torch.linalg.solve_triangular(A, b, upper=)`",
        fix=FixClass.SAFE,
        what="Finds `torch.triangular_solve(b, A, upper, transpose, unitriangular)` and the method form.",
        why="Deprecated since 1.11, due for removal.",
        before="x = torch.triangular_solve(b, A, upper=False)[0]",
        after="x = torch.linalg.solve_triangular(A, b, upper=False)",
        fix_safety=(
            "Safe when the result is indexed with `[0]` or `.solution`: the arguments are "
            "swapped, `upper` (default True) is passed explicitly, `transpose=True` becomes "
            "`A.mT` with `upper` negated. Tuple uses are reported."
        ),
    ),
    Rule(
        code="TNU209",
        name="norm-deprecated",
        message="`torch.norm` is deprecated; use `torch.linalg.vector_norm` / `matrix_norm`",
        fix=FixClass.SAFE,
        what="Finds `torch.norm(x, p, dim, keepdim, dtype)`.",
        why="Its meaning depends on `p` and `dim`; `torch.linalg` states it explicitly.",
        before="n = torch.norm(x, p=2, dim=1)",
        after="n = torch.linalg.vector_norm(x, ord=2, dim=1)",
        fix_safety=(
            "Safe for a numeric or absent `p` (vector norm over `dim`, or all elements) and for "
            '`p="fro"`; `p="nuc"` becomes `matrix_norm`. A non-literal `p` is reported.'
        ),
    ),
    Rule(
        code="TNU210",
        name="range-deprecated",
        message="`torch.range` is deprecated; use `torch.arange` (end-exclusive)",
        fix=FixClass.SAFE,
        what="Finds `torch.range(start, end, step)`.",
        why="It includes `end` and always returns the default float dtype, unlike Python's range.",
        before="t = torch.range(0, 4)",
        after="t = torch.arange(0, 5, dtype=torch.get_default_dtype())",
        fix_safety=(
            "Safe for integer literals (the end is computed; the float dtype is kept explicitly). "
            "Other arguments are reported, since `end + step` may round differently."
        ),
    ),
    Rule(
        code="TNU211",
        name="ger-deprecated",
        message="`torch.ger` is deprecated; use `torch.outer`",
        fix=FixClass.SAFE,
        what="Finds `torch.ger(a, b)` and `a.ger(b)`.",
        why="A pure rename.",
        before="M = torch.ger(a, b)",
        after="M = torch.outer(a, b)",
        fix_safety="Safe (method form: only on a provable tensor, else not reported).",
    ),
    Rule(
        code="TNU212",
        name="svd-deprecated",
        message="`torch.svd` is deprecated; use `torch.linalg.svd` (returns Vh, not V)",
        fix=FixClass.SAFE,
        what="Finds `torch.svd(A, some, compute_uv)` and the method form.",
        why="Deprecated; `linalg.svd` returns the conjugate transpose of the old V.",
        before="U, S, V = torch.svd(A)\nsigma = torch.svd(B)[1]",
        after=(
            "U, S, V = torch.linalg.svd(A, full_matrices=False)\nV = V.mH\n"
            "sigma = torch.linalg.svdvals(B)"
        ),
        fix_safety=(
            "Safe for `[1]`/`.S` (`linalg.svdvals`) and for an unpacking `U, S, V = ...` alone "
            "on its line (`full_matrices=not some`, then `V = V.mH`). `compute_uv=`, `out=` and "
            "other uses of the tuple are reported: the third result changes from V to Vh."
        ),
    ),
    Rule(
        code="TNU213",
        name="chain-matmul-deprecated",
        message="`torch.chain_matmul` is deprecated; use `torch.linalg.multi_dot`",
        fix=FixClass.SAFE,
        what="Finds `torch.chain_matmul(*matrices)`.",
        why="Deprecated since 1.9.",
        before="P = torch.chain_matmul(a, b, c)",
        after="P = torch.linalg.multi_dot([a, b, c])",
        fix_safety="Safe with two or more positional matrices; `multi_dot` rejects one, so a single or starred argument is reported.",
    ),
    Rule(
        code="TNU214",
        name="pinverse-legacy",
        message="`torch.pinverse` is legacy; use `torch.linalg.pinv`",
        fix=FixClass.SAFE,
        what="Finds `torch.pinverse(A, rcond)` and the method form.",
        why="`linalg.pinv` is the maintained API; its default tolerance differs.",
        before="P = torch.pinverse(A)",
        after="P = torch.linalg.pinv(A, rtol=1e-15)",
        fix_safety="Safe: the old default `rcond=1e-15` is passed as `rtol` so results match.",
    ),
    Rule(
        code="TNU215",
        name="amp-autocast-device-specific",
        message="`torch.cuda.amp.autocast` / `torch.cpu.amp.autocast` are deprecated; use `torch.amp.autocast(device)`",
        fix=FixClass.SAFE,
        what="Finds the device-specific autocast classes (call, decorator and `with` forms).",
        why="Deprecated with a FutureWarning.",
        before="with torch.cuda.amp.autocast(True, torch.bfloat16): ...",
        after='with torch.amp.autocast("cuda", enabled=True, dtype=torch.bfloat16): ...',
        fix_safety="Safe: positional arguments become keywords (the parameter order differs).",
    ),
)
"""Earlier linalg / amp: deprecated or removed before 2.14."""
