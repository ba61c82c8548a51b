"""The flat K-way switch operator that ``switch`` emits under ``torch.compile``.

``flat_switch(index, branches, operands)`` is one higher-order op holding all K branches,
so a compiled program dispatches with one host-side read of ``index`` whatever K is, and
every tracer (Dynamo, fake tensors, ``make_fx``, functionalization, autograd) traces each
branch once: tracing cost is linear in K. Its meaning, as Python::

    def flat_switch(index, branches, operands):
        i = min(max(int(index), 0), len(branches) - 1)   # int() truncates a float index
        return branches[i](*operands)

Branches take the flat operand tensors and return a tuple of tensors; every branch must
return the same number of tensors with the same dtypes (sizes may differ: the traced
output then gets unbacked sizes, as ``cond`` does). Branches must not mutate or return
their inputs.

Under ``vmap`` the op stays flat when the whole batch takes one branch (the branches are
vmapped), and runs every branch and keeps each example's pick when the index itself is
batched.

Use ``torchnext.control_flow.switch``, not this module: ``switch`` validates arguments,
boxes ``int``/``None`` outputs, and keeps a tree of ``torch.cond`` where a program must
stay in torch's own operator set (``torch.export``, whose programs must load again, and
``make_fx``). What not to assume: the op is registered under ``torch.ops.higher_order``
with torchnext's name, so passes written for torch 2.14's ``higher_order.switch`` do not
match it, and ``torch.export`` cannot serialise it.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch.fx.experimental.proxy_tensor import ProxyTorchDispatchMode, track_tensor_tree

from torchnext.compat.control_flow_internals import (
    VMAP,
    AutoDispatchBelowAutograd,
    DispatchKey,
    FakeTensorMode,
    HigherOrderOperator,
    add_batch_dim,
    check_alias_and_mutation,
    create_bw_fn,
    dispatch_exclude_set,
    dispatch_include_set,
    fill_none_with_masks,
    get_unwrapped,
    is_batchedtensor,
    materialize_as_graph,
    maybe_get_bdim,
    maybe_run_with_interpreter,
    merge_output,
    pytree,
    reenter_make_fx,
    save_values_for_backward,
    saved_values,
    unique_graph_id,
)
from torchnext.errors import ControlFlowError

__all__ = ["flat_switch", "pick"]

Branch = Callable[..., Any]


class _FlatSwitchOp(HigherOrderOperator):
    # cacheable: Inductor's FX graph cache may store graphs holding this op. Its key
    # covers the branch subgraphs (they are submodules of the graph), and a cache hit
    # replays generated code that never calls the op.
    def __init__(self) -> None:
        super().__init__("torchnext_switch", cacheable=True)

    def __call__(
        self, index: torch.Tensor | int | torch.SymInt, branches: Sequence[Branch], operands: Any
    ) -> Any:
        return super().__call__(index, tuple(branches), tuple(operands))


flat_switch = _FlatSwitchOp()


def pick(index: torch.Tensor | int, n_branches: int) -> int:
    """The branch ``index`` selects among ``n_branches``: truncated, then clamped."""
    value = index.item() if isinstance(index, torch.Tensor) else index
    return min(max(int(value), 0), n_branches - 1)


def _same_structure(outs: Sequence[Any], what: str) -> list[pytree.TreeSpec]:
    specs = [pytree.tree_flatten(out)[1] for out in outs]
    for i, spec in enumerate(specs):
        if spec != specs[0]:
            raise ControlFlowError(
                f"switch: branch{i} returns {spec}, but branch0 returns {specs[0]} ({what}); "
                "every branch must return the same structure."
            )
    return specs


@flat_switch.py_impl(DispatchKey.CompositeExplicitAutograd)
def _dense(
    index: torch.Tensor | int, branches: tuple[Branch, ...], operands: tuple[Any, ...]
) -> Any:
    return branches[pick(index, len(branches))](*operands)


def _fn_without_none(fn: Branch, masks: list[bool]) -> Branch:
    """``fn`` with its ``None`` outputs dropped; ``masks`` records which were tensors."""

    @functools.wraps(fn)
    def wrapped(*args: Any) -> tuple[Any, ...]:
        outs = fn(*args)
        masks[:] = [isinstance(out, torch.Tensor) for out in outs]
        return tuple(out for out in outs if isinstance(out, torch.Tensor))

    return wrapped


class _FlatSwitchAutograd(torch.autograd.Function):
    """Forward: the switch. Backward: a switch over each branch's backward graph."""

    @staticmethod
    def forward(  # type: ignore[override]
        ctx: Any, index: torch.Tensor | int, branches: tuple[Branch, ...], *operands: Any
    ) -> Any:
        ctx._index = index
        ctx._bw_fns = [create_bw_fn(branch, operands) for branch in branches]
        # The key sets in force now are the ones the backward graphs must be traced under.
        ctx._include = dispatch_include_set()
        ctx._exclude = dispatch_exclude_set()
        save_values_for_backward(ctx, operands)
        with AutoDispatchBelowAutograd():
            return flat_switch(index, branches, operands)

    @staticmethod
    def backward(ctx: Any, *grads: Any) -> Any:
        args = saved_values(ctx) + grads
        masks: list[bool] = []
        bw_graphs = [
            materialize_as_graph(
                _fn_without_none(bw_fn, masks),
                args,
                ctx._include,
                ctx._exclude,
                force_enable_grad=True,
            )
            for bw_fn in ctx._bw_fns
        ]
        # create_bw_fn returns a zero gradient, not None, for an operand a branch does not
        # use, so every branch has the same mask and the last one traced stands for all.
        in_grads = flat_switch(ctx._index, bw_graphs, args)
        return None, None, *fill_none_with_masks(in_grads, masks)


@flat_switch.py_autograd_impl
def _autograd(
    index: torch.Tensor | int, branches: tuple[Branch, ...], operands: tuple[Any, ...]
) -> Any:
    return _FlatSwitchAutograd.apply(index, branches, *operands)


@flat_switch.py_impl(ProxyTorchDispatchMode)
def _trace(
    mode: ProxyTorchDispatchMode,
    index: torch.Tensor | int,
    branches: tuple[Branch, ...],
    operands: tuple[Any, ...],
) -> Any:
    graphs = [reenter_make_fx(branch)(*operands) for branch in branches]
    outs = [next(n for n in g.graph.nodes if n.op == "output").args for g in graphs]
    _same_structure(outs, "traced outputs")
    uid, _ = unique_graph_id(mode, prefix="switch_branch0")
    tracer: Any = mode.tracer
    for i, graph in enumerate(graphs):
        tracer.root.register_module(f"switch_branch{i}_{uid}", graph)
    args = (index, tuple(graphs), operands)
    proxy_args = pytree.tree_map(tracer.unwrap_proxy, args)
    out_proxy = tracer.create_proxy("call_function", flat_switch, proxy_args, {})
    out = flat_switch(index, tuple(graphs), operands)
    return track_tensor_tree(out, out_proxy, constant=None, tracer=tracer)


@flat_switch.py_impl(FakeTensorMode)
def _fake(
    mode: FakeTensorMode,
    index: torch.Tensor | int,
    branches: tuple[Branch, ...],
    operands: tuple[Any, ...],
) -> Any:
    import contextlib

    # The branch graphs are reused as traced, so their unbacked symbols are not new ones.
    fresh = mode.shape_env.ignore_fresh_unbacked_symbols() if mode.shape_env else None
    with mode, fresh or contextlib.nullcontext():
        flat_outs, specs = zip(*(pytree.tree_flatten(b(*operands)) for b in branches), strict=True)
    _same_structure(
        [pytree.tree_unflatten(list(o), s) for o, s in zip(flat_outs, specs, strict=True)],
        "outputs",
    )
    merged = []
    for leaves in zip(*flat_outs, strict=True):
        if not all(isinstance(leaf, torch.Tensor) for leaf in leaves):
            raise ControlFlowError(
                f"switch: branch outputs must be tensors here, got {[type(x).__name__ for x in leaves]}."
            )
        merged.append(_merge_leaves(leaves, mode))
    return pytree.tree_unflatten(merged, specs[0])


def _merge_leaves(leaves: Sequence[torch.Tensor], mode: FakeTensorMode) -> torch.Tensor:
    """One fake output that every branch's output fits: ``cond``'s merge, folded over K.

    Where sizes differ the merge makes an unbacked size per fold; only the last fold's
    symbol reaches the output (its range covers every branch), so the earlier ones are
    made as ignored, or tracing would report them as unbound.
    """
    import contextlib

    shape_env = mode.shape_env
    merged = leaves[0]
    for i, leaf in enumerate(leaves[1:], start=2):
        interim = shape_env is not None and i < len(leaves)
        scope = shape_env.ignore_fresh_unbacked_symbols() if interim else contextlib.nullcontext()  # type: ignore[union-attr]
        with scope:
            merged = merge_output(merged, leaf, mode)
    return merged  # type: ignore[return-value]


@flat_switch.py_impl(VMAP)
def _vmap(
    interpreter: Any, index: Any, branches: tuple[Branch, ...], operands: tuple[Any, ...]
) -> Any:
    def unwrap(t: Any) -> tuple[Any, int | None]:
        if isinstance(t, torch.Tensor) and is_batchedtensor(t):
            return get_unwrapped(t), maybe_get_bdim(t)
        return t, None

    inner, in_dims = zip(*(unwrap(t) for t in operands), strict=True) if operands else ((), ())
    inner_index, index_dim = unwrap(index)
    level = interpreter.level()
    if index_dim is None:
        # One branch for the whole batch: still a flat switch, over vmapped branches.
        if all(d is None for d in in_dims):
            with interpreter.lower():
                return flat_switch(inner_index, branches, inner)
        batched = tuple(torch.vmap(b, in_dims=tuple(in_dims)) for b in branches)
        with interpreter.lower():
            outs = flat_switch(inner_index, batched, inner)
        return tuple(add_batch_dim(o, 0, level) for o in outs)

    # Each example picks its own branch: run every branch, keep each example's pick.
    def per_example(i: torch.Tensor, *args: Any) -> tuple[torch.Tensor, ...]:
        chosen = i.to(torch.int64).clamp(0, len(branches) - 1)
        results = [b(*args) for b in branches]
        picked = list(results[-1])
        for k in range(len(branches) - 2, -1, -1):
            picked = [
                torch.where(chosen == k, r, p) for r, p in zip(results[k], picked, strict=True)
            ]
        return tuple(picked)

    with interpreter.lower():
        outs = torch.vmap(per_example, in_dims=(index_dim, *in_dims))(inner_index, *inner)
    return tuple(add_batch_dim(o, 0, level) for o in outs)


@flat_switch.py_functionalize_impl
def _functionalize(
    ctx: Any, index: Any, branches: tuple[Branch, ...], operands: tuple[Any, ...]
) -> Any:
    inner_operands = ctx.unwrap_tensors(operands)
    inner_index = ctx.unwrap_tensors(index)
    with ctx.redispatch_to_next():
        functional = tuple(ctx.functionalize(maybe_run_with_interpreter(b)) for b in branches)
        pre_dispatch = hasattr(ctx, "mode") and ctx.mode.pre_dispatch
        for i, branch in enumerate(branches):
            # Raises on a branch that mutates or returns (a view of) an input.
            check_alias_and_mutation(branch, inner_operands, f"switch_branch{i}", pre_dispatch)
        return ctx.wrap_tensors(flat_switch(inner_index, functional, inner_operands))
