"""Feed a training step from a ``DataLoader`` whose ``batch_sampler`` is the ElasticSampler.

Use it through :meth:`Manager.run_step(closure, batches=loader)
<torchnext.distributed.training.manager.Manager.run_step>`: the closure then gets the
collated batch of this member's share instead of its indices, loaded by the
``DataLoader``'s workers ahead of time (``num_workers``, ``prefetch_factor``,
``pin_memory`` as usual)::

    loader = DataLoader(dataset, batch_sampler=sampler, num_workers=2, pin_memory=True)
    while manager.step < steps:
        manager.run_step(lambda batch: loss_fn(model(batch["x"]), batch["y"]), batches=loader)

How it stays exact: the sampler records the step position of every index list the
loader pulled (:attr:`ElasticSampler.issued`, in order, as the loader returns them).
Before a step, :class:`LoaderFeed` compares the oldest recorded position with the
step's: equal, it takes the next batch; the step being redone after an abort, it
gives the batch it gave before; anything else (the membership changed, so the
prefetched shares are split for the old one) it drops the loader's iterator and starts
a new one from the committed position, split for the new membership. Indices
prefetched but never committed are thus issued again, and none is skipped.

What not to assume: restarting the iterator restarts the loader's workers (use
``persistent_workers=False``, the default, or accept the restart cost of a persistent
pool); a member whose share of a step is empty gets no batch and contributes a zero
gradient; micro-batching (``micro_batches``) needs index mode, since a collated batch
cannot be split generally.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch.utils.data import DataLoader

from torchnext.distributed.training.sampler import ElasticSampler, Position

__all__ = ["LoaderFeed", "run_batch"]


class LoaderFeed:
    """The batch a loader made for the step about to run (see the module docstring)."""

    def __init__(self, loader: DataLoader[Any], sampler: ElasticSampler) -> None:
        if not isinstance(loader, DataLoader):
            raise TypeError(
                f"run_step(batches={type(loader).__name__}): give a torch.utils.data.DataLoader "
                "built with batch_sampler=<the manager's ElasticSampler>."
            )
        if loader.batch_sampler is not sampler:
            raise ValueError(
                "run_step(batches=loader): the loader's batch_sampler is "
                f"{type(loader.batch_sampler).__name__}, not the manager's ElasticSampler; "
                "build it as DataLoader(dataset, batch_sampler=sampler, ...) with the sampler "
                "given to the Manager."
            )
        self.loader = loader
        self.sampler = sampler
        self.restarts = 0
        """Times the loader's iterator was started again (the first start included)."""
        self._it: Iterator[Any] | None = None
        self._last: tuple[Position, Any] | None = None

    def batch(self, rank: int, world_size: int, *, empty: bool) -> Any | None:
        """This member's batch for the next step; None when its share is ``empty``."""
        self.sampler.bind(rank, world_size)
        wanted = self.sampler.position()
        if self._last is not None and self._last[0] == wanted:
            return self._last[1]  # the step is being redone: the same batch again
        if empty:
            return None
        issued = self.sampler.issued
        # A loader without workers pulls its index lists only when asked (nothing is in
        # ``issued`` yet), so a membership change is caught by the last batch's position
        # too: its share was cut for another (rank, world size).
        moved = self._last is not None and self._last[0][2:] != wanted[2:]
        if self._it is None or moved or (issued and issued[0] != wanted):
            self._it = self._restart()
        batch = next(self._it)
        got = issued.popleft() if issued else None
        if got != wanted:
            raise RuntimeError(
                f"LoaderFeed: the loader returned the batch of position {got}, but the step "
                f"is at {wanted}; another iterator over the same sampler is running. Keep one "
                "live iterator over the loader the manager feeds from."
            )
        self._last = (wanted, batch)
        return batch

    def _restart(self) -> Iterator[Any]:
        self._it = None  # shuts the old iterator's workers down before the new ones start
        self.sampler.issued.clear()
        self.restarts += 1
        return iter(self.loader)

    def close(self) -> None:
        """Stop the loader's iterator (its workers exit)."""
        self._it = None
        self._last = None


def run_batch(
    closure: Callable[[Any], Any],
    batch: Any | None,
    *,
    share: int,
    loss_reduction: str,
    loss_scale: float,
) -> float:
    """Forward and backward of one step's batch; return the weighted loss (0 without a batch)."""
    if batch is None:
        return 0.0  # no share this step: the bucketer contributes zeros
    loss = closure(batch)
    if not isinstance(loss, torch.Tensor) or loss.dim() != 0:
        shape = tuple(loss.shape) if isinstance(loss, torch.Tensor) else ""
        raise TypeError(
            f"run_step: the closure returned {type(loss).__name__}{shape}; return the loss "
            f"of the batch as a 0-dim tensor ({loss_reduction} over its samples)."
        )
    weight = loss_scale * (share if loss_reduction == "mean" else 1)
    (loss * weight).backward()
    return float(loss.detach()) * weight
