"""Forward and backward of one member's share of a training step: micro-batches and losses.

Use it through :meth:`Manager.run_step
<torchnext.distributed.training.manager.Manager.run_step>`, which calls
:func:`forward_backward` once per attempt of a step. The share is cut into contiguous
micro-batches; each gets one closure call and one backward, the gradients accumulate in
``p.grad``, and only the last backward all-reduces (the others run under the manager's
``no_sync``). Each micro-batch's loss is weighted so that the all-reduced gradient is
the mean over the *global* batch, whatever the number of members and micro-batches:

* ``loss_reduction="sum"``: the closure returns the sum over its samples; weight
  ``1 / len(global batch)``;
* ``loss_reduction="mean"``: the closure returns their mean; weight
  ``len(micro-batch) / len(global batch)``. Empty micro-batches are skipped (a mean
  over nothing is NaN).

What not to assume: the closure must not call ``backward`` itself, and its loss must
be a 0-dim tensor; a member whose share is empty still runs one (zero) backward with
``"sum"`` and none with ``"mean"``; the bucketer then contributes zeros for it.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

import torch

from torchnext.distributed.training.loader import run_batch
from torchnext.distributed.training.sampler import split_range

__all__ = ["LOSS_REDUCTIONS", "check_step_args", "forward_backward", "compute"]

LOSS_REDUCTIONS = ("sum", "mean")


def check_step_args(micro_batches: object, loss_reduction: object) -> None:
    """Raise ``ValueError`` naming the argument when either is unusable."""
    if not isinstance(micro_batches, int) or isinstance(micro_batches, bool) or micro_batches < 1:
        raise ValueError(f"run_step: micro_batches={micro_batches!r} must be an int >= 1.")
    if loss_reduction not in LOSS_REDUCTIONS:
        raise ValueError(
            f"run_step: loss_reduction={loss_reduction!r}; give 'sum' (the closure returns "
            "the sum over its samples) or 'mean' (their mean)."
        )


def forward_backward(
    closure: Callable[[list[int]], torch.Tensor],
    indices: list[int],
    *,
    micro_batches: int,
    loss_reduction: str,
    loss_scale: float,
    no_sync: Callable[[], contextlib.AbstractContextManager[Any]],
) -> float:
    """Run the closure and backward over ``indices`` in micro-batches; return the weighted loss.

    ``loss_scale`` is ``1 / len(global batch)``; ``no_sync()`` suspends the gradient
    all-reduce for the backward passes it wraps.
    """
    bounds = [split_range(len(indices), i, micro_batches) for i in range(micro_batches)]
    pieces = [indices[a:b] for a, b in bounds if b > a]
    if not pieces and loss_reduction == "sum":
        pieces = [[]]  # a member without samples still runs its (zero) backward
    total = 0.0
    for i, piece in enumerate(pieces):
        loss = closure(piece)
        if not isinstance(loss, torch.Tensor) or loss.dim() != 0:
            shape = tuple(loss.shape) if isinstance(loss, torch.Tensor) else ""
            raise TypeError(
                f"run_step: the closure returned {type(loss).__name__}{shape}; return the "
                f"loss of the given samples as a 0-dim tensor ({loss_reduction} over them)."
            )
        weight = loss_scale * (len(piece) if loss_reduction == "mean" else 1)
        with no_sync() if i < len(pieces) - 1 else contextlib.nullcontext():
            (loss * weight).backward()
        total += float(loss.detach()) * weight
    return total


def compute(
    closure: Callable[[Any], torch.Tensor],
    indices: list[int],
    batch: Any | None,
    *,
    from_loader: bool,
    micro_batches: int,
    loss_reduction: str,
    loss_scale: float,
    no_sync: Callable[[], contextlib.AbstractContextManager[Any]],
) -> float:
    """One attempt's forward and backward: of the loader's ``batch`` (``from_loader``,
    :func:`~torchnext.distributed.training.loader.run_batch`) or of ``indices`` in
    micro-batches (:func:`forward_backward`); returns the weighted loss."""
    if from_loader:
        return run_batch(
            closure, batch, share=len(indices), loss_reduction=loss_reduction, loss_scale=loss_scale
        )
    return forward_backward(
        closure,
        indices,
        micro_batches=micro_batches,
        loss_reduction=loss_reduction,
        loss_scale=loss_scale,
        no_sync=no_sync,
    )
