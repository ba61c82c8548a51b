"""Multi-way ``switch``: run ``branches[index](*operands)``, capturable by every tracer.

Use it where torch 2.14 code calls ``torch._higher_order_ops.switch``: the call has
2.14's contract (out-of-range indices clamp into ``[0, K-1]``; Python-int indices
specialise under tracing with the same ``UserWarning``; the same error types for bad
branches), and it works on any torch that has ``torch.cond``.

How, by context:

* Under ``torch.compile`` (Dynamo, not export) and in eager mode, with three or more
  branches: one flat ``torchnext_switch`` node holding every branch as a subgraph
  (``torchnext.control_flow._flat_switch``). Dynamo, AOT autograd and Inductor trace
  each branch once, so compile time is linear in K, and Inductor dispatches with one
  host-side read of the index and an ``if``/``elif`` chain, so compiled dispatch does
  not grow with K. Autograd through the taken branch works (the backward is a flat
  switch over the branches' backward graphs).
* With two branches, under ``torch.export``, ``make_fx`` and eager ``vmap``: a balanced
  binary tree of ``torch.cond`` on ``index < mid``. Comparisons against integer
  midpoints clamp implicitly (a negative index walks left to branch 0, a too-large one
  right to branch K-1) and truncate float indices as 2.14 does. ``torch.export`` keeps
  every branch and, unlike 2.14's native HOP, the exported program saves and loads with
  ``torch.export.save``/``load`` (``cond`` serialises); ``vmap`` uses ``cond``'s
  batching rule. (Under ``torch.compile``, ``vmap`` goes through the flat op's own rule.)

What not to assume: the compiled graph holds a ``torchnext_switch`` node, not 2.14's
``higher_order.switch``, so passes that pattern-match the native HOP will not see one.
The flat node hooks into Dynamo's and Inductor's internals; on a torch where those are
missing, or with ``TORCHNEXT_SWITCH_FLAT=0``, compile uses the ``cond`` tree (dispatch
O(log K), compile time about K log K), and Inductor's C++ wrapper cannot compile the flat
node (set the variable to 0 there). In eager mode a tensor index is traced once per
distinct set of branch functions (as 2.14 does), so build branches once, not per call.
"""

from __future__ import annotations

import functools
import warnings
from collections.abc import Callable, Sequence
from typing import Any

import torch

from torchnext._env import TORCHNEXT_SWITCH_FLAT
from torchnext.compat import control_flow_internals as internals
from torchnext.compat.control_flow_internals import pytree
from torchnext.control_flow._typed_errors import retyped
from torchnext.errors import ControlFlowError

__all__ = ["switch"]

try:
    # Dynamo shows a SymInt to isinstance as an int; this tells them apart (Dynamo
    # constant-folds it while tracing).
    from torch.fx.experimental.symbolic_shapes import has_static_value as _has_static_value
except ImportError:  # older torch, where Dynamo specialises such an index anyway

    def _has_static_value(a: Any) -> bool:  # type: ignore[misc]
        return not isinstance(a, torch.SymInt)


_DYNAMO_INDEX_WARNING = (
    "Index is a Python constant. When used with torch.switch, it specializes on one of the "
    "branches. If you want torch.switch to preserve the branches, please make the index a "
    "tensor or SymInt."
)
_EXPORT_INDEX_WARNING = (
    "Index is a Python constant. When used with torch.switch, it specializes on one of the "
    "branches. If you want torch.switch to preserve the branches, please make the index an "
    "int tensor or a SymInt."
)


_INT_BOX = "__torchnext_switch_int__"
_NONE_BOX = "__torchnext_switch_none__"


def _is_box(node: object) -> bool:
    return isinstance(node, dict) and len(node) == 1 and (_INT_BOX in node or _NONE_BOX in node)


def _box(out: Any, box_ints: bool) -> Any:
    # cond accepts neither None outputs nor (once nested) the unbacked SymInt an inner
    # cond makes of differing ints; carry both through the tree as tiny tensors.
    def box(v: Any) -> Any:
        if v is None:
            return {_NONE_BOX: torch.zeros((), dtype=torch.bool)}
        if box_ints and isinstance(v, int) and not isinstance(v, bool):
            return {_INT_BOX: torch.tensor(v, dtype=torch.int64)}
        return v

    return pytree.tree_map(box, out, is_leaf=lambda v: v is None)


def _unbox(out: Any) -> Any:
    def unbox(node: Any) -> Any:
        if not _is_box(node):
            return node
        if _NONE_BOX in node:
            return None
        value = node[_INT_BOX]
        return value.item() if torch.compiler.is_compiling() else int(value)

    return pytree.tree_map(unbox, out, is_leaf=_is_box)


def _call_branch(
    *flat: Any, branch: Callable[..., Any], spec: pytree.TreeSpec, box_ints: bool
) -> Any:
    return _box(branch(*pytree.tree_unflatten(list(flat), spec)), box_ints)


def _subtree(
    index: Any, lo: int, hi: int, branches: tuple[Callable[..., Any], ...], *flat: Any
) -> Any:
    """Branches ``lo..hi-1`` as nested conds; ``index`` is compared, never clamped."""
    if hi - lo == 1:
        return branches[lo](*flat)
    mid = (lo + hi) // 2
    # partial objects, not fresh closures: Dynamo guards on the wrapped function, so the
    # eager path's compile cache is reused across calls with the same branches.
    return torch.cond(
        index < mid,
        functools.partial(_subtree, index, lo, mid, branches),
        functools.partial(_subtree, index, mid, hi, branches),
        tuple(flat),
    )


def _run_tree(index: Any, branches: tuple[Callable[..., Any], ...], flat: list[Any]) -> Any:
    return _subtree(index, 0, len(branches), branches, *flat)


def _validate(index: object, branches: object, leaves: list[Any]) -> None:
    if not isinstance(index, (int, torch.SymInt, torch.Tensor)):
        raise ControlFlowError(
            f"Expected index to be int or single-element tensor, but got {index}. "
            "Pass switch(index=...) as an int, a SymInt or a one-element tensor."
        )
    if isinstance(index, torch.Tensor) and index.numel() != 1:
        raise ControlFlowError(
            f"Expected index to be int or single-element tensor, but got {index}. "
            f"switch(index=...) has {index.numel()} elements; pass one element."
        )
    if not isinstance(branches, (tuple, list)) or len(branches) == 0:
        raise ControlFlowError(
            "Expected branches to be a non-empty tuple or list of callables. "
            f"switch(branches=...) got {branches!r}."
        )
    for i, branch in enumerate(branches):
        if not callable(branch):
            raise ControlFlowError(
                f"Expected all branches to be callable. branch{i} is not callable "
                f"(it is {type(branch).__name__}: {branch!r})."
            )
    for leaf in leaves:
        if not isinstance(leaf, torch.Tensor):
            raise ControlFlowError(
                f"All operand leaves must be a Tensor but got {leaf}. "
                "switch(operands=...) takes a pytree of tensors; close over other values "
                "in the branch functions instead."
            )


def _describe_outputs(branch: Callable[..., Any], leaves: list[torch.Tensor]) -> str | None:
    """Run ``branch`` on fake copies; return a description, or the problem it has."""
    with internals.FakeTensorMode(allow_non_fake_inputs=True) as mode:
        fakes = [mode.from_tensor(t) for t in leaves]
        out = branch(*fakes)
    out_leaves, spec = pytree.tree_flatten(out)
    parts = [str(spec)]
    for j, leaf in enumerate(out_leaves):
        if isinstance(leaf, torch.Tensor):
            if any(leaf is f for f in fakes):
                return f"!output {j} returns an operand unchanged (aliasing); return a .clone()"
            parts.append(f"{leaf.dtype}/{leaf.dim()}d")
        elif leaf is None or (isinstance(leaf, int) and not isinstance(leaf, bool)):
            parts.append("int" if leaf is not None else "None")
        else:
            return (
                f"!output {j} is a {type(leaf).__name__}; branch outputs must be tensors, "
                "ints or None"
            )
    return " ".join(parts)


def _diagnose(
    exc: BaseException, wrapped: tuple[Callable[..., Any], ...], leaves: list[torch.Tensor]
) -> BaseException | None:
    """A message naming the offending branch, when fake-running the branches finds one."""
    try:
        described = [_describe_outputs(b, leaves) for b in wrapped]
    except Exception:  # noqa: BLE001 - diagnosis is best effort; the original error stands
        return None
    problem = None
    for i, desc in enumerate(described):
        if desc is not None and desc.startswith("!"):
            problem = f"branch{i}: {desc[1:]}"
            break
        if desc != described[0]:
            problem = (
                f"branch{i} returns {desc}, but branch0 returns {described[0]} "
                "(tree structure, then dtype/ndim per output); every branch must return "
                "the same structure, dtypes and ranks"
            )
            break
    if problem is None:
        return None
    return retyped(exc, f"switch: {problem}.")


# Set by comptime hooks while Dynamo traces, read by the traced code right after:
# the flat op once this torch is known to run it (None: keep the cond tree), and
# whether Inductor can lower it too (eager calls need Dynamo only).
_flat_op: Any = None
_flat_ready = False


def _load_flat(*, inductor: bool) -> Any:
    if not TORCHNEXT_SWITCH_FLAT.get():
        return None
    try:
        from torchnext.control_flow import _flat_switch_compile
    except ImportError:  # a torch without the internals the flat op is built on
        return None
    if not _flat_switch_compile.supported():
        return None
    if inductor:
        _flat_switch_compile.register()
    else:
        _flat_switch_compile.register_dynamo()
    return _flat_switch_compile.flat_switch


def _prepare_flat(ctx: object) -> None:
    """Register the flat switch with Dynamo and Inductor if this torch allows it."""
    global _flat_op, _flat_ready
    _flat_op = _load_flat(inductor=True)
    _flat_ready = _flat_op is not None


def _prepare_flat_eager(ctx: object) -> None:
    """Register the flat switch with Dynamo only: eager calls never reach Inductor."""
    global _flat_op
    _flat_op = _load_flat(inductor=False)


def _run_eager(index: Any, branches: tuple[Callable[..., Any], ...], flat: list[Any]) -> Any:
    """What an eager call compiles (backend "eager"): the flat op where it can be had."""
    if torch.compiler.is_dynamo_compiling():
        internals.comptime()(_prepare_flat_eager)
        if _flat_op is not None:
            return _flat_op(index, branches, tuple(flat))
    return _run_tree(index, branches, flat)


def _functorch_active() -> bool:
    return internals.functorch_level_active()


def _warn_dynamo_index(ctx: object) -> None:
    warnings.warn(_DYNAMO_INDEX_WARNING, UserWarning, stacklevel=2)


def _in_plain_eager() -> bool:
    return not torch.compiler.is_compiling() and internals.current_dispatch_mode() is None


def switch(
    index: int | torch.SymInt | torch.Tensor,
    branches: Sequence[Callable[..., Any]],
    operands: Any = (),
) -> Any:
    """Run ``branches[clamp(index, 0, K-1)](*operands)``; capturable by compile/export/make_fx.

    Args:
        index: an ``int``, a ``SymInt`` or a one-element tensor (any dtype; float values
            truncate, as in 2.14). Out-of-range values clamp; there is no negative
            indexing. A Python ``int`` selects the branch at trace time (other branches
            are not traced), with 2.14's ``UserWarning`` under compile/export.
        branches: non-empty list/tuple of callables taking ``*operands``. Every branch
            must return the same pytree structure and the same dtype and rank per tensor
            leaf (sizes may differ); ``int``/``None`` leaves are allowed (with three
            or more branches under ``torch.compile``, int leaves come back through
            ``.item()``, which needs ``torch._dynamo.config.capture_scalar_outputs``).
        operands: a tuple (or pytree) of tensors passed to the chosen branch.

    Raises:
        ControlFlowError: (a ``RuntimeError``) bad index, empty or non-callable branches,
            non-tensor operand leaves, before anything runs.
        torch._dynamo.exc.TorchRuntimeError / UncapturedHigherOrderOpError: branches
            whose outputs disagree (the types 2.14 raises), naming the branch in eager mode.
    """
    leaves, spec = pytree.tree_flatten(operands)
    _validate(index, branches, leaves)
    n = len(branches)
    box = n > 2  # nesting only starts at three branches
    wrapped = tuple(
        functools.partial(_call_branch, branch=b, spec=spec, box_ints=box) for b in branches
    )
    if n == 1:
        return branches[0](*pytree.tree_unflatten(leaves, spec))
    if isinstance(index, bool):
        index = int(index)
    # Dynamo shows a SymInt as an int to isinstance; has_static_value tells them apart
    # (it is constant-folded while Dynamo traces), so a shape-derived index keeps every
    # branch instead of specialising.
    if isinstance(index, int) and _has_static_value(index):
        chosen = max(0, min(index, n - 1))
        if torch.compiler.is_dynamo_compiling():
            # Dynamo cannot trace warnings.warn; comptime runs it once, at trace time,
            # which is when 2.14's native switch warns too.
            internals.comptime()(_warn_dynamo_index)
        elif torch.compiler.is_compiling():
            warnings.warn(_EXPORT_INDEX_WARNING, UserWarning, stacklevel=2)
        return branches[chosen](*pytree.tree_unflatten(leaves, spec))
    if torch.compiler.is_dynamo_compiling():
        # Decided at trace time (comptime runs while Dynamo traces, before the global
        # read below), so merely importing torchnext never imports Inductor.
        internals.comptime()(_prepare_flat)
        # Two branches are one cond either way, and cond carries int outputs natively.
        if box and _flat_ready and not torch.compiler.is_exporting():
            return _unbox(_flat_op(index, wrapped, tuple(leaves)))
        return _unbox(_run_tree(index, wrapped, leaves))
    compile_and_run = internals.maybe_compile_and_run  # None: cond compiles the tree itself
    plain_eager = _in_plain_eager()
    # vmap and the other functorch transforms run the captured graph on wrapped tensors;
    # cond has rules for them, so they keep the tree.
    run = _run_eager if box and plain_eager and not _functorch_active() else _run_tree
    try:
        if compile_and_run is None:
            return _unbox(_run_tree(index, wrapped, leaves))
        return _unbox(compile_and_run(run, index, wrapped, leaves))
    except internals.dynamo_exception() as exc:
        better = _diagnose(exc, wrapped, leaves) if plain_eager else None
        if better is None:
            raise
        raise better from exc
