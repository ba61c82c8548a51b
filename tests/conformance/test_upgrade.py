"""Executable equivalence of the numeric upgrade rules.

Each snippet uses an API that 2.14 removed or deprecated. The original program runs on
torch 2.13 (through ``run_on_torch213``); the program after ``torchnext upgrade --fix``
runs on native torch 2.14.1; both print their numbers, which must agree. The removed
APIs are also run unfixed on 2.14.1 to show the fix was needed.

``symeig``, ``solve``, ``matrix_rank``, ``lstsq`` and ``eig`` already raise on 2.13, so
their old programs cannot run on either side; their rewrites are pinned by fixtures.
"""

from __future__ import annotations

import json
import subprocess
import textwrap
from collections.abc import Callable
from typing import Any

import pytest

pytest.importorskip("libcst")

from torchnext.upgrade.engine import EngineOptions, process_source  # noqa: E402
from torchnext.upgrade.registry import resolve_selection  # noqa: E402

PREAMBLE = """
import json
import warnings

import torch

warnings.simplefilter("ignore")
A = torch.tensor([[4.0, 1.0, 0.5], [1.0, 3.0, 0.2], [0.5, 0.2, 2.0]], dtype=torch.float64)
W = torch.tensor([[2.0, -1.0, 0.5, 1.0], [0.3, 1.5, -0.7, 2.0], [1.0, 0.2, 3.0, -1.0]], dtype=torch.float64)
b = torch.tensor([[1.0, 2.0], [0.5, -1.0], [3.0, 0.25]], dtype=torch.float64)
upper_flag = bool(len("x"))
some_flag = not upper_flag
buf = torch.empty(3, 3, dtype=torch.float64)
LU, piv = torch.linalg.lu_factor(A)
"""

# name -> expression whose value is a tensor or a tuple of tensors.
SNIPPETS: dict[str, str] = {
    "cholesky": "torch.cholesky(A)",
    "cholesky_upper": "torch.cholesky(A, upper=True)",
    "cholesky_flag_out": "torch.cholesky(A, upper=upper_flag, out=buf)",
    "cholesky_method": "A.cholesky(True)",
    "qr": "torch.qr(W)",
    "qr_complete": "torch.qr(W.mT, some=False)",
    "qr_flag": "torch.qr(input=W.mT, some=some_flag)",
    "qr_method": "W.mT.qr()",
    "lu": "torch.lu(A)",
    "lu_infos": "torch.lu(A, get_infos=True)",
    "lu_solve": "torch.lu_solve(b, LU, piv)",
    "lu_solve_kw": "torch.lu_solve(b, LU_data=torch.linalg.lu_factor(A)[0], LU_pivots=torch.linalg.lu_factor(A)[1])",
    "triangular_solve": "torch.triangular_solve(b, torch.triu(A))[0]",
    "triangular_solve_lower_t": "torch.triangular_solve(b, torch.tril(A), upper=False, transpose=True)[0]",
    "triangular_solve_unit": "torch.triangular_solve(b, torch.triu(A), True, False, True).solution",
    "norm": "torch.norm(W)",
    "norm_p_dim": "torch.norm(W, p=1, dim=1, keepdim=True)",
    "norm_fro_dims": "torch.norm(W, p='fro', dim=(0, 1))",
    "norm_inf": "torch.norm(W, p=3, dim=0)",
    "norm_nuc": "torch.norm(W, p='nuc', dim=(0, 1))",
    "range": "torch.range(0, 5)",
    "range_step": "torch.range(0, 9, 4)",
    "range_down": "torch.range(5, -3, -3, dtype=torch.float64)",
    "ger": "torch.ger(W[0], W[1])",
    "svdvals": "torch.svd(W)[1]",
    "svd_S": "torch.svd(W, some=False).S",
    "chain_matmul": "torch.chain_matmul(A, W, W.mT)",
    "pinverse": "torch.pinverse(W)",
    "pinverse_rcond": "torch.pinverse(W, rcond=0.3)",
    "autocast_cpu": (
        "(lambda ctx: (ctx.__enter__(), W.float() @ W.float().mT, ctx.__exit__(None, None, None))[1])"
        "(torch.cpu.amp.autocast(dtype=torch.bfloat16))"
    ),
}


# name -> (statement, expression read after it): rewrites that span a statement.
STATEMENTS: dict[str, tuple[str, str]] = {
    "svd_unpack": ("U, S, V = torch.svd(W)", "(U, S, V)"),
    "svd_unpack_full": ("U2, S2, V2 = torch.svd(W.mT, some=some_flag)", "(U2, S2, V2)"),
    "svd_method": ("U3, S3, V3 = A.svd()", "(U3, S3, V3)"),
}


def _program(snippets: dict[str, str]) -> str:
    body = "\n".join(f"results[{name!r}] = {expr}" for name, expr in snippets.items())
    for name, (statement, read) in STATEMENTS.items():
        body += f"\n{statement}\nresults[{name!r}] = {read}"
    return (
        PREAMBLE
        + "\nresults = {}\n"
        + body
        + "\n\n"
        + "def _j(v):\n"
        + "    if isinstance(v, torch.Tensor):\n"
        + "        return v.detach().double().tolist()\n"
        + "    return [_j(x) for x in v]\n\n\n"
        + "print(json.dumps({k: _j(v) for k, v in results.items()}))\n"
    )


def _fixed(program: str) -> str:
    options = EngineOptions(active=resolve_selection(), fix_level="safe")
    findings, new = process_source(program, options)
    assert new is not None, "the upgrade tool fixed nothing"
    unfixed = [f for f in findings if not f.fixed]
    assert not unfixed, f"sites left unfixed: {[(f.line, f.code, f.message) for f in unfixed]}"
    return new


def _close(a: Any, b: Any, path: str) -> None:
    if isinstance(a, list):
        assert isinstance(b, list) and len(a) == len(b), f"{path}: shapes differ"
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            _close(x, y, f"{path}[{i}]")
    else:
        assert abs(a - b) <= 1e-9 * max(1.0, abs(a)), f"{path}: {a} (2.13) != {b} (2.14.1)"


def test_fixed_programs_give_213_numbers_on_2141(
    run_on_torch213: Callable[[str], Any], this_python: str
) -> None:
    program = _program(SNIPPETS)
    before = run_on_torch213(program)
    fixed = _fixed(program)
    for old in (
        "torch.cholesky(",
        "torch.qr(",
        ".qr()",
        "torch.range(",
        "torch.ger(",
        "torch.svd(",
    ):
        assert old not in fixed
    proc = subprocess.run(
        [this_python, "-c", fixed], capture_output=True, text=True, timeout=120, check=False
    )
    assert proc.returncode == 0, f"fixed program failed on 2.14.1:\n{fixed}\n{proc.stderr[-3000:]}"
    after = json.loads(proc.stdout.strip().splitlines()[-1])
    assert set(before) == set(after) == set(SNIPPETS) | set(STATEMENTS)
    for name in before:
        _close(before[name], after[name], name)


@pytest.mark.parametrize("expr", ["torch.cholesky(A)", "A.qr()", "torch.qr(A, some=False)"])
def test_removed_apis_really_fail_on_2141(this_python: str, expr: str) -> None:
    code = textwrap.dedent(PREAMBLE) + f"\n{expr}\n"
    proc = subprocess.run(
        [this_python, "-c", code], capture_output=True, text=True, timeout=120, check=False
    )
    assert proc.returncode != 0 and "RuntimeError" in proc.stderr
