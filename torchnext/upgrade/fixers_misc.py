"""Fixers for the non-linalg 2.14 changes: profiler, distributed, nn, JIT, CUDA, amp.

Call-level rules only; rules that need statement or scope context (split_group None
checks, ``new_group`` signatures, version guards, attribute renames, statement
removal) live in the transformer, which has that context.
"""

from __future__ import annotations

import libcst as cst

from torchnext.upgrade._cst import (
    Unbindable,
    bind,
    bool_literal,
    drop_kwargs,
    find_kwarg,
    has_star_args,
    kwarg,
    set_kwarg,
    str_literal,
)
from torchnext.upgrade._site import Diagnosis, Site, call_rule, method_rule

__all__ = ["PROFILERS", "AUTOGRAD_PROFILERS", "JIT_DEPRECATED", "SIDE_EFFECT_FREE"]

AUTOGRAD_PROFILERS = ("torch.autograd.profiler.profile", "torch.autograd.profiler_util.profile")
PROFILERS = ("torch.profiler.profile", "torch.profiler.profiler.profile", *AUTOGRAD_PROFILERS)

SIDE_EFFECT_FREE = (cst.Name, cst.Attribute, cst.Integer, cst.Float, cst.SimpleString)


def _pure(node: cst.BaseExpression) -> bool:
    """Dropping this expression cannot drop a side effect (names, literals, attributes)."""
    if isinstance(node, cst.UnaryOperation):
        return _pure(node.expression)
    if isinstance(node, cst.List | cst.Tuple):
        return all(_pure(e.value) for e in node.elements)
    return isinstance(node, SIDE_EFFECT_FREE)


# ------------------------------------------------------------------ TNU003 profiler use_cuda


@call_rule("TNU003", *PROFILERS)
def profiler_use_cuda(site: Site) -> Diagnosis | None:
    arg = find_kwarg(site.call, "use_cuda")
    if arg is None:
        return None
    value = arg.value
    lit = bool_literal(value)
    if site.qname not in AUTOGRAD_PROFILERS:
        # 2.13's torch.profiler.profile only used use_cuda for a sanity check and passed the
        # caller's activities on unchanged, so dropping it keeps what is traced.
        return Diagnosis(
            "TNU003",
            fix=drop_kwargs(site.call, ["use_cuda"]),
            unsafe=not _pure(value),
            detail="pass activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA] to be explicit",
        )
    if lit is False:
        return Diagnosis("TNU003", fix=drop_kwargs(site.call, ["use_cuda"]))
    cuda = cst.SimpleString('"cuda"')
    if lit is True:
        device: cst.BaseExpression = cuda
    else:
        # 2.13: use_cuda=True overrode use_device; otherwise use_device stood.
        existing = find_kwarg(site.call, "use_device")
        fallback = existing.value if existing is not None else cst.Name("None")
        device = cst.IfExp(test=value, body=cuda, orelse=fallback)
    call = site.call
    if find_kwarg(call, "use_device") is not None:
        call = drop_kwargs(call, ["use_device"])
    args = [
        kwarg("use_device", device).with_changes(comma=a.comma)
        if a.keyword and a.keyword.value == "use_cuda"
        else a
        for a in call.args
    ]
    return Diagnosis("TNU003", fix=call.with_changes(args=args))


# ------------------------------------------------------------------ TNU102 with_modules


@call_rule("TNU102", *PROFILERS)
def profiler_with_modules(site: Site) -> Diagnosis | None:
    arg = find_kwarg(site.call, "with_modules")
    if arg is None:
        return None
    lit = bool_literal(arg.value)
    if lit is False:
        return Diagnosis("TNU102", fix=drop_kwargs(site.call, ["with_modules"]))
    if lit is True:
        stack = find_kwarg(site.call, "with_stack")
        call = drop_kwargs(site.call, ["with_modules"])
        if stack is None or bool_literal(stack.value) is False:
            call = set_kwarg(call, "with_stack", cst.Name("True"))
        return Diagnosis("TNU102", fix=call, unsafe=True, detail="with_stack records other data")
    return Diagnosis("TNU102", detail="non-literal value; use with_stack=True for eager modules")


# ------------------------------------------------------------------ TNU103 profiler metrics


@call_rule("TNU103", "torch.profiler._ExperimentalConfig", "torch._C._profiler._ExperimentalConfig")
def experimental_config(site: Site) -> Diagnosis | None:
    names = ["profiler_metrics", "profiler_measure_per_kernel"]
    found = [find_kwarg(site.call, n) for n in names]
    present = [a for a in found if a is not None]
    if not present:
        return None
    unsafe = not all(_pure(a.value) for a in present)
    return Diagnosis("TNU103", fix=drop_kwargs(site.call, names), unsafe=unsafe)


# ------------------------------------------------------------------ TNU006 acc_policy


@call_rule(
    "TNU006",
    "torch.nn.LinearCrossEntropyOptions",
    "torch.nn.modules.loss.LinearCrossEntropyOptions",
)
def acc_policy(site: Site) -> Diagnosis | None:
    arg = find_kwarg(site.call, "acc_policy")
    if arg is None or str_literal(arg.value) != "balanced":
        return None
    quote = arg.value.value[0] if isinstance(arg.value, cst.SimpleString) else '"'
    return Diagnosis(
        "TNU006", fix=set_kwarg(site.call, "acc_policy", cst.SimpleString(f"{quote}compact{quote}"))
    )


# ------------------------------------------------------------------ TNU007 tvm


@call_rule("TNU007", "torch.compile")
def tvm_options(site: Site) -> Diagnosis | None:
    backend = find_kwarg(site.call, "backend")
    options = find_kwarg(site.call, "options")
    if backend is None or str_literal(backend.value) != "tvm" or options is None:
        return None
    if not isinstance(options.value, cst.Dict):
        return None
    keys = {str_literal(e.key) for e in options.value.elements if isinstance(e, cst.DictElement)}
    relay = sorted(k for k in keys if k in ("scheduler", "trials", "opt_level"))
    if not relay:
        return None
    return Diagnosis(
        "TNU007", detail=f"relay-only options {relay}; pass options={{'pipeline': ...}}"
    )


# ------------------------------------------------------------------ TNU008 symm mem pool


@method_rule("TNU008", "register_mem_pool", needs_tensor=False)
def register_mem_pool(site: Site) -> Diagnosis | None:
    arg = find_kwarg(site.call, "symm")
    if arg is None or bool_literal(arg.value) is False:
        return None
    return Diagnosis(
        "TNU008", detail="re-register after the pool grows if late segments need symmetric windows"
    )


# ------------------------------------------------------------------ TNU101 TorchScript

JIT_DEPRECATED = tuple(
    f"torch.jit.{n}"
    for n in (
        "script",
        "script_method",
        "trace",
        "trace_method",
        "trace_module",
        "save",
        "load",
        "fork",
        "wait",
        "freeze",
        "optimize_for_inference",
        "set_fusion_strategy",
        "interface",
    )
)


@call_rule("TNU101", *JIT_DEPRECATED)
def torchscript(site: Site) -> Diagnosis | None:
    return Diagnosis("TNU101", detail=f"`{site.qname}`")


# ------------------------------------------------------------------ TNU104 SAC hooks


@call_rule("TNU104", "torch.utils.checkpoint.checkpoint")
def checkpoint_hooks(site: Site) -> Diagnosis | None:
    if find_kwarg(site.call, "context_fn") is None:
        return None
    if find_kwarg(site.call, "respect_saved_tensors_hooks") is not None or has_star_args(site.call):
        return None
    fix = set_kwarg(site.call, "respect_saved_tensors_hooks", cst.Name("False"))
    return Diagnosis(
        "TNU104", fix=fix, unsafe=True, detail="False keeps today's behavior (2.14+ only)"
    )


# ------------------------------------------------------------------ TNU106 _set_pg_timeout


@call_rule(
    "TNU106",
    "torch.distributed.distributed_c10d._set_pg_timeout",
    "torch.distributed._set_pg_timeout",
)
def set_pg_timeout(site: Site) -> Diagnosis | None:
    try:
        bind(site.call, ["timeout", "group"])
    except Unbindable:
        return Diagnosis("TNU106", detail="arguments could not be matched statically")
    return Diagnosis(
        "TNU106",
        fix=site.call.with_changes(func=site.torch("distributed.set_timeout")),
        imports=("torch.distributed",),
    )


# ------------------------------------------------------------------ TNU108 green context


@method_rule("TNU108", "set_context", "pop_context", needs_tensor=False)
def green_context(site: Site) -> Diagnosis | None:
    if site.call.args:
        return None
    return Diagnosis("TNU108")


# ------------------------------------------------------------------ TNU109 faithful generators


@call_rule("TNU109", "torch._dynamo.config.patch")
def dynamo_patch(site: Site) -> Diagnosis | None:
    if find_kwarg(site.call, "enable_faithful_generator_behavior") is None:
        first = site.call.args[0].value if site.call.args else None
        if str_literal(first) != "enable_faithful_generator_behavior":
            return None
    return Diagnosis("TNU109", detail="the setting is ignored")


# ------------------------------------------------------------------ TNU215 amp autocast

_AUTOCAST = {
    "torch.cuda.amp.autocast": "cuda",
    "torch.cpu.amp.autocast": "cpu",
    "torch.cuda.amp.autocast_mode.autocast": "cuda",
    "torch.cpu.amp.autocast_mode.autocast": "cpu",
}


@call_rule("TNU215", *_AUTOCAST)
def amp_autocast(site: Site) -> Diagnosis | None:
    try:
        a = bind(site.call, ["enabled", "dtype", "cache_enabled"])
    except Unbindable:
        return Diagnosis("TNU215", detail="arguments could not be matched statically")
    device = cst.SimpleString(f'"{_AUTOCAST[site.qname]}"')
    args = [cst.Arg(device)] + [
        kwarg(k, a[k]) for k in ("enabled", "dtype", "cache_enabled") if k in a
    ]
    return Diagnosis("TNU215", fix=cst.Call(func=site.torch("amp.autocast"), args=args))


# ------------------------------------------------------------------ TNU401 clamp gradients

_CLAMPS = ("clamp", "clamp_min", "clamp_max", "clip", "fmin", "fmax")


@call_rule("TNU401", *(f"torch.{n}" for n in _CLAMPS))
@method_rule("TNU401", *_CLAMPS, *(f"{n}_" for n in _CLAMPS[:4]), needs_tensor=False)
def clamp_gradient(site: Site) -> Diagnosis | None:
    return Diagnosis(
        "TNU401", detail="only matters if this runs under autograd and inputs hit a bound"
    )
