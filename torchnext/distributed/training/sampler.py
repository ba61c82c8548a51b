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

What not to assume: the per-member split is contiguous and may be uneven by one
sample (``global_batch_size`` need not divide by the world size); with
``drop_last=False`` the last step of an epoch is smaller. The sampler's whole state
is a few integers (:meth:`state_dict`), which a joining member receives while it heals.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

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


class ElasticSampler:
    """Per-step global batches of a seeded permutation, split over the current members."""

    def __init__(self, config: SamplerConfig) -> None:
        self.config = config
        self.epoch = 0
        self.cursor = 0
        """Samples of the current epoch already consumed by committed steps."""
        self._perm_epoch = -1
        self._perm: torch.Tensor = torch.empty(0, dtype=torch.int64)

    # ------------------------------------------------------------------ queries

    def _permutation(self) -> torch.Tensor:
        if self._perm_epoch != self.epoch:
            n = self.config.dataset_size
            if self.config.shuffle:
                gen = torch.Generator().manual_seed(self.config.seed + self.epoch)
                self._perm = torch.randperm(n, generator=gen)
            else:
                self._perm = torch.arange(n)
            self._perm_epoch = self.epoch
        return self._perm

    def steps_per_epoch(self) -> int:
        n, b = self.config.dataset_size, self.config.global_batch_size
        return n // b if self.config.drop_last else -(-n // b)

    def global_batch(self) -> list[int]:
        """Indices of the next step, over all members (what every member's share comes from)."""
        self._roll_epoch_if_done()
        stop = min(self.cursor + self.config.global_batch_size, self.config.dataset_size)
        return self._permutation()[self.cursor : stop].tolist()

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
        n, b = self.config.dataset_size, self.config.global_batch_size
        remaining = n - self.cursor
        if remaining <= 0 or (self.config.drop_last and remaining < b):
            self.epoch += 1
            self.cursor = 0

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
