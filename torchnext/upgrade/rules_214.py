"""The upgrade rules for what torch 2.14 itself changed: removed (TNU0xx), deprecated (TNU1xx).

Read these through :data:`torchnext.upgrade.rules.RULES`, which also holds the older and
the tool's rules; the code that finds and rewrites the sites is in
``torchnext.upgrade.fixers_*``, keyed by the same codes. What not to assume: the order
here is the order of the docs and of ``--list``; codes never move between modules.
"""

from __future__ import annotations

from torchnext.upgrade.rule_model import FixClass, Rule

__all__ = ["REMOVED_214", "DEPRECATED_214"]

REMOVED_214: tuple[Rule, ...] = (
    Rule(
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
    Rule(
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
    Rule(
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
    Rule(
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
    Rule(
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
    Rule(
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
    Rule(
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
    Rule(
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
    Rule(
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
)
"""Removed in 2.14: old code fails or changes numbers."""

DEPRECATED_214: tuple[Rule, ...] = (
    Rule(
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
    Rule(
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
    Rule(
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
    Rule(
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
    Rule(
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
    Rule(
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
    Rule(
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
    Rule(
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
    Rule(
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
)
"""Deprecated in 2.14: old code still runs but warns."""
