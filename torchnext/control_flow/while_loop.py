"""``while_loop`` with torch 2.14's contract and errors that name the bad carry.

Use it where you would call ``torch.while_loop(cond_fn, body_fn, carried_inputs)``:
``val = carried_inputs; while cond_fn(*val): val = body_fn(*val)``, capturable by
``torch.compile``/``torch.export``. It is ``torch.while_loop`` (present and identical
in 2.13 and 2.14) plus checks made before anything runs (callables, the carry
container) and, in eager mode, a diagnosis that turns torch's generic "same metadata"
error into one naming the carry, its path, and the old and new shape/dtype, keeping the
type torch raised. For capture in a CUDA graph see :mod:`.cuda_graph_loop`.

What not to assume: the loop body must not mutate or return its inputs unchanged
(clone first), and every carry must keep its shape and dtype across iterations.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from torchnext.compat import control_flow_internals as internals
from torchnext.compat.control_flow_internals import pytree
from torchnext.control_flow._typed_errors import retyped
from torchnext.errors import ControlFlowError

__all__ = ["while_loop"]


def _meta(leaf: object) -> str:
    if isinstance(leaf, torch.Tensor):
        return f"Tensor(shape={tuple(leaf.shape)}, dtype={leaf.dtype})"
    return type(leaf).__name__


def _diagnose(
    exc: BaseException,
    cond_fn: Callable[..., Any],
    body_fn: Callable[..., Any],
    carried: tuple[Any, ...],
) -> BaseException | None:
    try:
        with internals.FakeTensorMode(allow_non_fake_inputs=True) as mode:
            fake = pytree.tree_map_only(torch.Tensor, mode.from_tensor, carried)
            pred = cond_fn(*fake)
            out = body_fn(*fake)
    except Exception:  # noqa: BLE001 - best effort; the original error stands
        return None
    if not (
        isinstance(pred, bool)
        or (isinstance(pred, torch.Tensor) and pred.dtype == torch.bool and pred.numel() == 1)
    ):
        return retyped(
            exc,
            f"while_loop: cond_fn must return a bool or a one-element bool tensor, got "
            f"{_meta(pred)}; compare instead (e.g. `x.sum() > 0`).",
        )
    out_t = out if isinstance(out, tuple) else (out,)
    in_paths = pytree.tree_flatten_with_path(carried)[0]
    out_paths, out_spec = pytree.tree_flatten_with_path(out_t)
    if out_spec != pytree.tree_structure(carried):
        return retyped(
            exc,
            f"while_loop: body_fn returns {len(out_paths)} leaves structured as "
            f"{out_spec}, but carried_inputs is {pytree.tree_structure(carried)}; return "
            "one value per carry, in the same structure.",
        )
    for (path, before), (_, after) in zip(in_paths, out_paths, strict=True):
        name = f"carried_inputs{pytree.keystr(path)}"
        if isinstance(before, torch.Tensor) and isinstance(after, torch.Tensor):
            if before.shape != after.shape or before.dtype != after.dtype:
                return retyped(
                    exc,
                    f"while_loop: body_fn changes {name} from {_meta(before)} to "
                    f"{_meta(after)}; a carry must keep its shape and dtype across "
                    "iterations (pad to a fixed size, or carry the length separately).",
                )
            if any(after is f for f in pytree.tree_leaves(fake)):
                return retyped(
                    exc,
                    f"while_loop: body_fn returns {name} unchanged (aliasing its input); "
                    "return a .clone() of it.",
                )
        elif type(before) is not type(after) and not (
            isinstance(before, int) and isinstance(after, (int, torch.SymInt))
        ):
            return retyped(
                exc, f"while_loop: body_fn turns {name} from {_meta(before)} into {_meta(after)}."
            )
    return None


def while_loop(
    cond_fn: Callable[..., Any],
    body_fn: Callable[..., Any],
    carried_inputs: tuple[Any, ...] | list[Any],
) -> Any:
    """``torch.while_loop(cond_fn, body_fn, carried_inputs)`` with early, named errors.

    Args:
        cond_fn: ``cond_fn(*carries) -> bool`` or a one-element bool tensor.
        body_fn: ``body_fn(*carries) -> carries`` with the same structure, shapes and
            dtypes as ``carried_inputs``; it must not mutate or alias its inputs.
        carried_inputs: a tuple (or list) of tensors/ints, possibly nested pytrees.

    Returns:
        The final carries, with the structure of ``carried_inputs``.

    Raises:
        ControlFlowError: (a ``RuntimeError``) non-callable functions or a carry that is
            not a tuple/list, before anything runs.
        torch._dynamo.exc.UncapturedHigherOrderOpError: a body changing a carry's shape,
            dtype or structure (the type torch raises), naming the carry in eager mode.
    """
    for name, fn in (("cond_fn", cond_fn), ("body_fn", body_fn)):
        if not callable(fn):
            raise ControlFlowError(
                f"Expect cond_fn and body_fn to be callable. while_loop({name}=...) got "
                f"{type(fn).__name__}: {fn!r}."
            )
    if not isinstance(carried_inputs, (tuple, list)):
        raise ControlFlowError(
            "while_loop(carried_inputs=...) must be a tuple of tensors/ints (possibly "
            f"nested), got {type(carried_inputs).__name__}; wrap a single carry as (x,)."
        )
    carried = tuple(carried_inputs)
    for path, leaf in pytree.tree_flatten_with_path(carried)[0]:
        if not isinstance(leaf, (torch.Tensor, int, torch.SymInt)):
            raise ControlFlowError(
                f"while_loop: carried_inputs{pytree.keystr(path)} is a "
                f"{type(leaf).__name__}; carries must be tensors or ints."
            )
    if torch.compiler.is_compiling():
        return torch.while_loop(cond_fn, body_fn, carried)
    try:
        return torch.while_loop(cond_fn, body_fn, carried)
    except internals.dynamo_exception() as exc:
        better = _diagnose(exc, cond_fn, body_fn, carried)
        if better is None:
            raise
        raise better from exc
