"""The upgrade rules, as data: code, message, fix class and the docs of each rule.

Use this table to list, select or document rules; the code that finds and rewrites
sites lives in ``torchnext.upgrade.fixers_*`` and is keyed by the same codes.

Code policy (like TorchFix's):

* ``TNU0xx``: APIs removed or changed in torch 2.14; old code fails or changes numbers.
* ``TNU1xx``: APIs deprecated in torch 2.14; old code still runs but warns.
* ``TNU2xx``: linalg and amp APIs deprecated or removed before 2.14.
* ``TNU3xx``: upgrade hygiene (version-guarded legacy branches).
* ``TNU4xx``: noisy rules, off unless selected.
* ``TNU9xx``: the tool itself (unparsable file, a rule that failed on one site).

Fix classes follow ruff: a *safe* fix keeps the program's meaning, an *unsafe* fix
probably does but cannot be proved (applied only with ``--unsafe-fixes``), and
*report-only* rules never rewrite. A rule's class is its best case: a safe rule may
still offer an unsafe fix, or none, at a site where the proof fails.

This module imports nothing outside the standard library.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

__all__ = ["FixClass", "Rule", "RULES", "RULES_BY_CODE", "DISABLED_BY_DEFAULT"]


class FixClass(str, enum.Enum):
    """How far a rule can rewrite code (its best case)."""

    SAFE = "safe"
    UNSAFE = "unsafe"
    REPORT_ONLY = "report-only"


@dataclass(frozen=True, kw_only=True)
class Rule:
    """One rule and its documentation page."""

    code: str
    """``TNU`` plus three digits; unique."""
    name: str
    """kebab-case name, stable across releases."""
    message: str
    """One line shown with every finding."""
    fix: FixClass
    """Best-case fix class."""
    what: str
    """What it does."""
    why: str
    """Why the old code is a problem on 2.14."""
    before: str
    """Example of code the rule flags."""
    after: str
    """The same example after the fix (or the manual fix for report-only rules)."""
    fix_safety: str
    """When the fix is safe, when unsafe, when none is offered."""
    references: tuple[str, ...] = ()
    """Upstream pull requests (``#186817``) the rule is about."""

    def __post_init__(self) -> None:
        if not (len(self.code) == 6 and self.code.startswith("TNU") and self.code[3:].isdigit()):
            raise ValueError(f"Rule.code={self.code!r}: expected 'TNU' plus three digits")
        for field_name in ("name", "message", "what", "why", "before", "after", "fix_safety"):
            if not getattr(self, field_name).strip():
                raise ValueError(f"Rule {self.code}: field {field_name!r} is empty; document it")


def _r(**kwargs: object) -> Rule:
    return Rule(**kwargs)  # type: ignore[arg-type]


RULES: tuple[Rule, ...] = (
    # ------------------------------------------------------------------ removed in 2.14
    _r(
        code="TNU001",
        name="cholesky-removed",
        message="`torch.cholesky` / `Tensor.cholesky` are removed in torch 2.14; use `torch.linalg.cholesky`",
        fix=FixClass.SAFE,
        what="Finds `torch.cholesky(A, upper)` and `A.cholesky(upper)`, under any alias or from-import.",
        why="torch 2.14 removed both; every call raises RuntimeError.",
        before="U = torch.cholesky(A, upper=flag, out=U_buf)",
        after="U = torch.linalg.cholesky(A, upper=flag, out=U_buf)",
        fix_safety=(
            "Safe: `upper` (literal or not) maps to `torch.linalg.cholesky`'s keyword-only `upper`, "
            "`input=` becomes the positional matrix, `out=` is kept. The method form is matched only "
            "on a receiver provably a tensor (torch call, `Tensor`-annotated name, tensor method "
            "result); `self` or unknown receivers are left alone. `*args`/`**kwargs`: report only."
        ),
        references=("#186817",),
    ),
    _r(
        code="TNU002",
        name="qr-removed",
        message="`torch.qr` / `Tensor.qr` are removed in torch 2.14; use `torch.linalg.qr` with `mode=`",
        fix=FixClass.SAFE,
        what="Finds `torch.qr(A, some)` and `A.qr(some)`, under any alias or from-import.",
        why="torch 2.14 removed both; every call raises RuntimeError.",
        before="Q, R = torch.qr(A, some=reduced)",
        after='Q, R = torch.linalg.qr(A, mode="reduced" if reduced else "complete")',
        fix_safety=(
            'Safe: `some=True`/absent is `mode="reduced"` (the default), `some=False` is '
            '`mode="complete"`, a non-literal `some` becomes a conditional expression with the same '
            "meaning; `out=` is kept. Method form: only on a provable tensor, else not reported."
        ),
        references=("#186815",),
    ),
    _r(
        code="TNU003",
        name="profiler-use-cuda-removed",
        message="profiler `use_cuda=` is removed in torch 2.14 (TypeError)",
        fix=FixClass.SAFE,
        what=(
            "Finds `use_cuda=` passed to `torch.autograd.profiler.profile` or "
            "`torch.profiler.profile` (aliases resolved), and reads of `.use_cuda` on a "
            "profiler object; user functions with a `use_cuda` parameter are never matched."
        ),
        why="torch 2.14 removed the keyword; passing it raises TypeError.",
        before="with torch.autograd.profiler.profile(use_cuda=on_gpu) as prof: ...",
        after='with torch.autograd.profiler.profile(use_device="cuda" if on_gpu else None) as prof: ...',
        fix_safety=(
            'Safe. Autograd profiler: `True` becomes `use_device="cuda"` (2.13 let it override '
            "`use_device`), `False` is dropped, an expression becomes a conditional. "
            "`torch.profiler.profile`: the keyword is dropped, because 2.13 computed the activity "
            "set from it only for a check and passed the caller's `activities` on unchanged; pass "
            "`activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]` yourself to be explicit. "
            "A value with possible side effects (a call) makes the drop unsafe."
        ),
        references=("#192543",),
    ),
    _r(
        code="TNU004",
        name="split-group-none-check",
        message=(
            "`split_group()` / `new_group(use_local_synchronization=True)` return "
            "`GroupMember.NON_GROUP_MEMBER`, not None, on non-member ranks in torch 2.14"
        ),
        fix=FixClass.UNSAFE,
        what=(
            "Finds `g is None`, `g is not None`, `g == None` and `not g` where `g` was assigned "
            "from `dist.split_group(...)` or `dist.new_group(..., use_local_synchronization=True)`."
        ),
        why="The None check is never true on 2.14, so non-member ranks go on to use the sentinel.",
        before="g = dist.split_group(split_ranks=[[0, 1], [2, 3]])\nif g is None:\n    return",
        after=(
            "g = dist.split_group(split_ranks=[[0, 1], [2, 3]])\n"
            "if g is None or g == dist.GroupMember.NON_GROUP_MEMBER:\n    return"
        ),
        fix_safety=(
            "Unsafe: the rewrite tests both None and the sentinel, which keeps 2.13 working, but "
            "the assignment-to-use link is a same-scope name match, not a proof."
        ),
        references=("#190725",),
    ),
    _r(
        code="TNU005",
        name="process-group-new-group-backend",
        message="a ProcessGroup subclass's `new_group()` must accept `backend=` in torch 2.14",
        fix=FixClass.SAFE,
        what=(
            "Finds `def new_group(...)` methods without a `backend` parameter or `**kwargs` in "
            "classes deriving from `ProcessGroup` (any alias)."
        ),
        why="`dist.new_group` now forwards `backend=` to the default group's `new_group`; TypeError.",
        before="def new_group(self, ranks, *, timeout=None, pg_options=None): ...",
        after="def new_group(self, ranks, *, timeout=None, backend=None, pg_options=None): ...",
        fix_safety="Safe: adds a keyword-only `backend=None` parameter, which no caller can hit by position.",
        references=("#188489",),
    ),
    _r(
        code="TNU006",
        name="linear-cross-entropy-balanced",
        message='`LinearCrossEntropyOptions(acc_policy="balanced")` raises ValueError in torch 2.14; use "compact"',
        fix=FixClass.SAFE,
        what='Finds the literal `acc_policy="balanced"` on `torch.nn.LinearCrossEntropyOptions`.',
        why='"balanced" was removed; "compact" gives the same accumulation precision with less memory.',
        before='opts = torch.nn.LinearCrossEntropyOptions(acc_policy="balanced")',
        after='opts = torch.nn.LinearCrossEntropyOptions(acc_policy="compact")',
        fix_safety="Safe for the literal. A non-literal policy is not flagged.",
        references=("#188283",),
    ),
    _r(
        code="TNU007",
        name="tvm-relay-removed",
        message="the tvm backend's relay path is removed in torch 2.14 (relax only)",
        fix=FixClass.REPORT_ONLY,
        what=(
            'Finds `torch.compile(..., backend="tvm", options={...})` with relay-only keys '
            "(`scheduler`, `trials`, `opt_level`) and imports of `tvm_meta_schedule` / "
            "`tvm_auto_scheduler`."
        ),
        why="Those options are ignored or rejected, and the entry points no longer exist.",
        before='torch.compile(m, backend="tvm", options={"scheduler": "meta_schedule", "trials": 2000})',
        after='torch.compile(m, backend="tvm", options={"pipeline": tvm.relax.get_pipeline(...)})',
        fix_safety="Report-only: the relax pipeline has to be chosen by a person.",
        references=("#190766", "#189639"),
    ),
    _r(
        code="TNU008",
        name="symm-mem-pool-late-segments",
        message=(
            "`register_mem_pool(..., symm=True)` no longer upgrades segments allocated later in "
            "torch 2.14"
        ),
        fix=FixClass.REPORT_ONLY,
        what="Finds `.register_mem_pool(..., symm=True)` calls.",
        why=(
            "Segments allocated after registration stay ordinary NCCL buffers; re-register the "
            "pool collectively after it grows if symmetric-window algorithms are needed."
        ),
        before="backend.register_mem_pool(pool, symm=True)",
        after="backend.deregister_mem_pool(pool)\nbackend.register_mem_pool(pool, symm=True)",
        fix_safety="Report-only: where the pool grows is a runtime property.",
        references=("#192112",),
    ),
    _r(
        code="TNU009",
        name="except-typeerror-swallows-214-error",
        message="this `except` would swallow the TypeError torch 2.14 raises in its `try` body",
        fix=FixClass.REPORT_ONLY,
        what=(
            "Finds `try` blocks whose body makes a call that raises TypeError on 2.14 "
            "(profiler `use_cuda=`) and whose handler catches TypeError, Exception or everything."
        ),
        why="The fallback branch then runs silently on every 2.14 start.",
        before="try:\n    p = profile(use_cuda=True)\nexcept TypeError:\n    p = profile()",
        after='p = profile(use_device="cuda")',
        fix_safety="Report-only: which branch to keep is a decision about supported torch versions.",
        references=("#192543",),
    ),
    # ------------------------------------------------------------------ deprecated in 2.14
    _r(
        code="TNU101",
        name="torchscript-deprecated",
        message="TorchScript APIs emit a FutureWarning in torch 2.14; move to `torch.compile` / `torch.export`",
        fix=FixClass.REPORT_ONLY,
        what=(
            "Finds calls of `torch.jit.script`, `script_method`, `trace`, `trace_method`, `save`, "
            "`load`, `fork`, `wait`, `freeze`, `optimize_for_inference`, `set_fusion_strategy` "
            "and `interface` (decorators included). `torch.jit.is_scripting`, `ignore`, `unused` "
            "and `export` are not flagged."
        ),
        why="Every call now prints a FutureWarning; TorchScript is on its way out.",
        before='scripted = torch.jit.script(model)\ntorch.jit.save(scripted, "m.pt")',
        after='ep = torch.export.export(model, example_inputs)\ntorch.export.save(ep, "m.pt2")',
        fix_safety="Report-only: export needs example inputs and a new artifact format.",
        references=("#189914",),
    ),
    _r(
        code="TNU102",
        name="profiler-with-modules-deprecated",
        message="profiler `with_modules=` is deprecated in torch 2.14; use `with_stack=True`",
        fix=FixClass.SAFE,
        what="Finds `with_modules=` on `torch.profiler.profile` and `torch.autograd.profiler.profile`.",
        why="It only worked for TorchScript models and now warns.",
        before="torch.profiler.profile(with_modules=True)",
        after="torch.profiler.profile(with_stack=True)",
        fix_safety=(
            "`with_modules=False` is dropped (safe). `True` becomes `with_stack=True` (unsafe: "
            "it records different data). Other values are reported."
        ),
        references=("#192808",),
    ),
    _r(
        code="TNU103",
        name="profiler-metrics-ignored",
        message=(
            "`_ExperimentalConfig(profiler_metrics=, profiler_measure_per_kernel=)` are ignored "
            "in torch 2.14"
        ),
        fix=FixClass.SAFE,
        what="Finds the two keywords on `torch.profiler._ExperimentalConfig`.",
        why="CUPTI range profiling is gone; the values are ignored with a FutureWarning.",
        before='torch.profiler._ExperimentalConfig(profiler_metrics=["sm__cycles_elapsed.avg"])',
        after="torch.profiler._ExperimentalConfig()",
        fix_safety="Safe: the keywords are dropped (2.14 ignores them); unsafe if a value is a call.",
        references=("#187204",),
    ),
    _r(
        code="TNU104",
        name="checkpoint-saved-tensors-hooks-default",
        message=(
            "selective checkpointing will honor `saved_tensors_hooks` by default; pass "
            "`respect_saved_tensors_hooks=` explicitly"
        ),
        fix=FixClass.UNSAFE,
        what=(
            "Finds `torch.utils.checkpoint.checkpoint(..., context_fn=...)` without "
            "`respect_saved_tensors_hooks=`."
        ),
        why="The default will change; today it warns when hooks are active.",
        before="checkpoint(fn, x, use_reentrant=False, context_fn=sac_ctx)",
        after="checkpoint(fn, x, use_reentrant=False, context_fn=sac_ctx, respect_saved_tensors_hooks=False)",
        fix_safety=(
            "Unsafe: `False` keeps today's behavior, but the keyword does not exist before 2.14, "
            "so the fixed file no longer runs on 2.13."
        ),
        references=("#190581",),
    ),
    _r(
        code="TNU105",
        name="compile-on-one-rank-moved",
        message="`torch.distributed.config.compile_on_one_rank` moved to `torch.compiler.config`",
        fix=FixClass.SAFE,
        what="Finds `torch.distributed.config.compile_on_one_rank` (aliases resolved).",
        why="The old spelling is a forwarding alias that now emits a FutureWarning.",
        before="torch.distributed.config.compile_on_one_rank = True",
        after="torch.compiler.config.compile_on_one_rank = True",
        fix_safety=(
            "Safe when written through `torch`: the rename, plus `import torch.compiler.config` "
            "when the file imported `torch.distributed.config`. From-imports are reported."
        ),
        references=("#187869",),
    ),
    _r(
        code="TNU106",
        name="set-pg-timeout-public",
        message="`_set_pg_timeout` is deprecated; use `torch.distributed.set_timeout`",
        fix=FixClass.SAFE,
        what="Finds `torch.distributed.distributed_c10d._set_pg_timeout(...)`.",
        why="The private alias now warns; 2.14 made the API public with the same signature.",
        before="c10d._set_pg_timeout(timedelta(seconds=60), group)",
        after="torch.distributed.set_timeout(timedelta(seconds=60), group)",
        fix_safety="Safe: same parameters `(timeout, group=None)`.",
        references=("#187387",),
    ),
    _r(
        code="TNU107",
        name="cuda-graph-register-generator-state",
        message="`CUDAGraph.register_generator_state()` is a deprecated no-op in torch 2.14",
        fix=FixClass.UNSAFE,
        what="Finds `<graph>.register_generator_state(...)` calls.",
        why="Graphs register generator state lazily now; the call only warns.",
        before="graph.register_generator_state(state)",
        after="(the statement is removed)",
        fix_safety=(
            "Unsafe: the statement is deleted when it is a bare expression statement, but the "
            "receiver is not proved to be a CUDAGraph."
        ),
        references=("#176753",),
    ),
    _r(
        code="TNU108",
        name="green-context-set-pop-deprecated",
        message="`GreenContext.set_context()/pop_context()` are deprecated; use `torch.cuda.stream(ctx.Stream())`",
        fix=FixClass.REPORT_ONLY,
        what="Finds `.set_context()` / `.pop_context()` calls in files that use green contexts.",
        why="Both now emit a FutureWarning.",
        before="ctx.set_context()\ntry:\n    out = model(x)\nfinally:\n    ctx.pop_context()",
        after="with torch.cuda.stream(ctx.Stream()):\n    out = model(x)",
        fix_safety="Report-only: the try/finally has to become a `with` block by hand.",
        references=("#188419",),
    ),
    _r(
        code="TNU109",
        name="faithful-generator-behavior-noop",
        message="`torch._dynamo.config.enable_faithful_generator_behavior` is a deprecated no-op in torch 2.14",
        fix=FixClass.REPORT_ONLY,
        what="Finds reads, writes and `config.patch(enable_faithful_generator_behavior=...)` uses.",
        why="Setting it changes nothing; generators are always traced lazily.",
        before="torch._dynamo.config.enable_faithful_generator_behavior = False",
        after="(remove the setting)",
        fix_safety="Report-only: code that relied on eager exhaustion needs a look.",
        references=("#189894",),
    ),
    # ------------------------------------------------------------------ earlier linalg / amp
    _r(
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
    _r(
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
    _r(
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
    _r(
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
    _r(
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
    _r(
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
    _r(
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
    _r(
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
    _r(
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
    _r(
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
    _r(
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
    _r(
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
    _r(
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
    _r(
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
    _r(
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
    # ------------------------------------------------------------------ hygiene
    _r(
        code="TNU301",
        name="version-guarded-legacy-branch",
        message="version-guarded branch uses APIs changed for torch 2.14; review it, it is not rewritten",
        fix=FixClass.REPORT_ONLY,
        what=(
            "Finds `if` tests on `torch.__version__`, version constants or `hasattr(torch, ...)`, "
            "and `try/except (TypeError, AttributeError, ImportError)` fallbacks, that contain "
            "findings of other rules. Those findings are reported without a fix."
        ),
        why="Rewriting one branch makes both identical; the guard itself is what should go.",
        before="if TORCH_GE_1_9:\n    Q, R = torch.linalg.qr(A)\nelse:\n    Q, R = torch.qr(A)",
        after="Q, R = torch.linalg.qr(A)",
        fix_safety="Report-only: deleting a branch is a support-policy decision.",
    ),
    # ------------------------------------------------------------------ noisy
    _r(
        code="TNU401",
        name="clamp-boundary-gradient",
        message="clamp/clamp_min/clamp_max/fmin/fmax gradients at the bounds change in torch 2.14",
        fix=FixClass.REPORT_ONLY,
        what=(
            "Finds `clamp`, `clamp_min`, `clamp_max`, `fmin`, `fmax` calls (function and method "
            "forms). Off by default: almost every model calls clamp."
        ),
        why=(
            "At x == bound the input gradient is now 0 for scalar bounds and split 0.5/0.5 with "
            "tensor bounds (2.13: all to the input)."
        ),
        before="y = torch.clamp_min(x, 0.0)",
        after="y = torch.where(x >= 0.0, x, torch.zeros_like(x))  # only if you need the 2.13 gradient",
        fix_safety="Report-only: most code does not depend on the subgradient at a tie.",
        references=("#191142",),
    ),
    # ------------------------------------------------------------------ tool
    _r(
        code="TNU901",
        name="syntax-error",
        message="file could not be parsed; it was not checked",
        fix=FixClass.REPORT_ONLY,
        what="Reports a file (or notebook cell) that is not valid Python.",
        why="Nothing in it can be checked or fixed.",
        before="def f(:",
        after="(fix the syntax)",
        fix_safety="Report-only.",
    ),
    _r(
        code="TNU902",
        name="rule-error",
        message="a rule failed on this site; the rest of the file was processed",
        fix=FixClass.REPORT_ONLY,
        what="Reports a site where a rule raised, with the error text.",
        why="The site was left unchanged and needs a look; please report it as a bug.",
        before="(any)",
        after="(unchanged)",
        fix_safety="Report-only.",
    ),
)

RULES_BY_CODE: dict[str, Rule] = {r.code: r for r in RULES}
if len(RULES_BY_CODE) != len(RULES):  # pragma: no cover - guarded by a test too
    raise RuntimeError("torchnext.upgrade.rules: duplicate rule codes")

DISABLED_BY_DEFAULT: tuple[str, ...] = ("TNU4",)
"""Code prefixes off unless selected explicitly (by code, prefix or ``ALL``)."""
