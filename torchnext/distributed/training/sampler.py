"""Elastic data sampler: re-splits the rest of an epoch when the world size changes.

Use it with :class:`torchnext.distributed.manager.Manager` (or on its own) when the
number of data-parallel members can change in the middle of an epoch. The sampler
owns one *global* cursor per epoch: every training step draws the next
``global_batch_size`` indices of a seeded permutation and splits them over the
members that exist *at that step*. The cursor only advances when the step commits
(:meth:`ElasticSampler.commit`), so a step that is discarded after a failure is
redone, on the new membership, with exactly the same global batch. Consequences
(tested as properties): within an epoch no index is skipped and none is seen twice,
whatever the sequence of world sizes; and the gradient of a step, normalised by the
global batch size (see :meth:`ElasticSampler.loss_scale`), does not depend on how
many members shared it.

It is also a ``torch.utils.data.Sampler`` of index lists, for a ``DataLoader``'s
``batch_sampler`` (workers, prefetch and ``pin_memory`` included): iterating it yields
this member's share of every step from the committed position on, for the membership
it is bound to (:meth:`ElasticSampler.bind`), and records each yielded list's step in
:attr:`ElasticSampler.issued`. :meth:`Manager.run_step(..., batches=loader)
<torchnext.distributed.training.manager.Manager.run_step>` uses that record to take
the batch made for the step about to run, and starts the loader again from the
committed position when a membership change made the prefetched batches wrong, so
indices prefetched but never committed are issued again.

What not to assume: the per-member split is contiguous and may be uneven by one
sample (``global_batch_size`` need not divide by the world size); with
``drop_last=False`` the last step of an epoch is smaller. Iteration never ends (epochs
follow each other; ``len()`` is the steps of one epoch) and empty shares are not
yielded; keep one live iterator at a time. The sampler's whole state is a few integers
(:meth:`state_dict`), which a joining member receives while it heals.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass

import torch
from torch.utils.data import Sampler

__all__ = ["SamplerConfig", "ElasticSampler", "split_range"]


@dataclass(frozen=True, kw_only=True)
class SamplerConfig:
    """How an :class:`ElasticSampler` walks a dataset."""

    dataset_size: int
    """Number of samples in the dataset (indices ``0 .. dataset_size - 1``)."""
    global_batch_size: int
    """Samples per step, summed over all members, independent of the world size."""
    seed: int = 0
    """Seed of the per-epoch permutation (epoch ``e`` uses ``seed + e``)."""
    shuffle: bool = True
    """Permute the dataset each epoch; ``False`` walks it in order."""
    drop_last: bool = False
    """Drop the final step of an epoch when it would be smaller than a full batch."""

    def __post_init__(self) -> None:
        if self.dataset_size <= 0:
            raise ValueError(
                f"SamplerConfig.dataset_size={self.dataset_size} must be positive; "
                "pass len(dataset)."
            )
        if self.global_batch_size <= 0:
            raise ValueError(
                f"SamplerConfig.global_batch_size={self.global_batch_size} must be positive."
            )
        if self.drop_last and self.global_batch_size > self.dataset_size:
            raise ValueError(
                f"SamplerConfig.global_batch_size={self.global_batch_size} exceeds "
                f"dataset_size={self.dataset_size} with drop_last=True: no step would run; "
                "lower the batch size or set drop_last=False."
            )


def split_range(n: int, rank: int, world_size: int) -> tuple[int, int]:
    """``[start, stop)`` of member ``rank``'s share of ``n`` items split over ``world_size``.

    The first ``n % world_size`` members get one item more; shares are contiguous and
    together cover ``range(n)`` exactly once.
    """
    if world_size <= 0:
        raise ValueError(f"split_range: world_size={world_size} must be positive.")
    if not 0 <= rank < world_size:
        raise ValueError(f"split_range: rank={rank} is outside [0, {world_size}).")
    base, extra = divmod(n, world_size)
    start = rank * base + min(rank, extra)
    return start, start + base + (1 if rank < extra else 0)


Position = tuple[int, int, int, int]
"""``(epoch, cursor, rank, world_size)``: which step's share an index list is."""


class ElasticSampler(Sampler[list[int]]):
    """Per-step global batches of a seeded permutation, split over the current members."""

    def __init__(self, config: SamplerConfig) -> None:
        super().__init__()
        self.config = config
        self.epoch = 0
        self.cursor = 0
        """Samples of the current epoch already consumed by committed steps."""
        self.rank = 0
        self.world_size = 1
        """The membership iteration splits for (see :meth:`bind`)."""
        self.issued: deque[Position] = deque()
        """Positions of the index lists iteration yielded and nobody consumed yet, oldest first."""
        self._perms: dict[int, torch.Tensor] = {}

    # ------------------------------------------------------------------ queries

    def _permutation(self, epoch: int | None = None) -> torch.Tensor:
        epoch = self.epoch if epoch is None else epoch
        if epoch not in self._perms:
            n = self.config.dataset_size
            if self.config.shuffle:
                gen = torch.Generator().manual_seed(self.config.seed + epoch)
                perm = torch.randperm(n, generator=gen)
            else:
                perm = torch.arange(n)
            if len(self._perms) >= 2:  # iteration looks at most one epoch ahead
                self._perms.pop(min(self._perms))
            self._perms[epoch] = perm
        return self._perms[epoch]

    def _rolled(self, epoch: int, cursor: int) -> tuple[int, int]:
        n, b = self.config.dataset_size, self.config.global_batch_size
        remaining = n - cursor
        if remaining <= 0 or (self.config.drop_last and remaining < b):
            return epoch + 1, 0
        return epoch, cursor

    def _batch_at(self, epoch: int, cursor: int) -> list[int]:
        stop = min(cursor + self.config.global_batch_size, self.config.dataset_size)
        return self._permutation(epoch)[cursor:stop].tolist()

    def steps_per_epoch(self) -> int:
        n, b = self.config.dataset_size, self.config.global_batch_size
        return n // b if self.config.drop_last else -(-n // b)

    def global_batch(self) -> list[int]:
        """Indices of the next step, over all members (what every member's share comes from)."""
        self._roll_epoch_if_done()
        return self._batch_at(self.epoch, self.cursor)

    def indices(self, rank: int, world_size: int) -> list[int]:
        """Member ``rank``'s share of the next step's global batch for ``world_size`` members.

        May be empty when the batch has fewer samples than members; the member still
        takes part in the step's collectives (with zero gradient contribution).
        """
        batch = self.global_batch()
        start, stop = split_range(len(batch), rank, world_size)
        return batch[start:stop]

    def loss_scale(self) -> float:
        """Multiply a member's *summed* loss by this so all-reduce-SUM gives the batch mean."""
        return 1.0 / max(1, len(self.global_batch()))

    # ------------------------------------------------------------------ progress

    def commit(self) -> None:
        """The step that used :meth:`global_batch` committed: advance past it."""
        self.cursor += len(self.global_batch())
        self._roll_epoch_if_done()

    def _roll_epoch_if_done(self) -> None:
        self.epoch, self.cursor = self._rolled(self.epoch, self.cursor)

    # ------------------------------------------------------------------ as a torch Sampler

    def bind(self, rank: int, world_size: int) -> None:
        """Split later iterations for member ``rank`` of ``world_size`` (the manager calls it)."""
        split_range(0, rank, world_size)  # validates both
        self.rank, self.world_size = rank, world_size

    def position(self) -> Position:
        """The position of the next step's share for the bound membership."""
        self._roll_epoch_if_done()
        return (self.epoch, self.cursor, self.rank, self.world_size)

    def __iter__(self) -> Iterator[list[int]]:
        """This member's non-empty shares of every step from the committed position on."""
        self.issued.clear()
        epoch, cursor = self._rolled(self.epoch, self.cursor)
        rank, world = self.rank, self.world_size
        empty_run = 0
        while True:
            batch = self._batch_at(epoch, cursor)
            start, stop = split_range(len(batch), rank, world)
            if stop > start:
                empty_run = 0
                self.issued.append((epoch, cursor, rank, world))
                yield batch[start:stop]
            else:
                empty_run += 1
                if empty_run > self.steps_per_epoch():
                    raise ValueError(
                        f"ElasticSampler: member {rank} of {world} gets no sample in any step "
                        f"(global_batch_size={self.config.global_batch_size}); iterating would "
                        "never yield. Use fewer members or a larger global batch."
                    )
            epoch, cursor = self._rolled(epoch, cursor + len(batch))

    def __len__(self) -> int:
        """Steps of one epoch (iteration itself goes on through the following epochs)."""
        return self.steps_per_epoch()

    def set_epoch(self, epoch: int) -> None:
        """Start ``epoch`` from its beginning (for loops that count epochs themselves)."""
        if epoch < 0:
            raise ValueError(f"ElasticSampler.set_epoch: epoch={epoch} must be >= 0.")
        self.epoch = epoch
        self.cursor = 0

    # ------------------------------------------------------------------ state

    def state_dict(self) -> dict[str, int]:
        return {"epoch": self.epoch, "cursor": self.cursor, "seed": self.config.seed}

    def load_state_dict(self, state: dict[str, int]) -> None:
        if int(state["seed"]) != self.config.seed:
            raise ValueError(
                f"ElasticSampler.load_state_dict: state seed={state['seed']} differs from "
                f"this sampler's seed={self.config.seed}; every member must use the same "
                "SamplerConfig."
            )
        self.epoch = int(state["epoch"])
        self.cursor = int(state["cursor"])
