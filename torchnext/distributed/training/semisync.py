"""Semi-synchronous fault-tolerant training: DiLoCo and LocalSGD on the training manager.

Use it when the network, not compute, limits data-parallel training: each member takes
``sync_every`` (H) optimizer steps on its own data without communicating, then the
members average what they learned once. LocalSGD averages the parameters; DiLoCo
(Douillard et al., 2023) treats the averaged change of the parameters as a gradient
(the *pseudo-gradient*) for an outer optimizer, Nesterov SGD, which keeps momentum
across rounds. LocalSGD is DiLoCo with outer SGD at learning rate 1 and no momentum,
and that is how it is built here (:meth:`SyncConfig.local_sgd`).

One round, as equivalent Python (``global_p`` are the parameters all members agreed on
at the last sync; the outer optimizer holds them)::

    idx = manager.start_step()               # shrink, grow, heal: at round boundaries
    for piece in split(idx, H):              # this member's share of the round, in order
        inner_opt.zero_grad()
        closure(piece).backward()            # the mean loss of the piece; no all-reduce
        inner_opt.step()
    pseudo_grad = global_p - p               # what this member learned this round
    p.grad = all_reduce_sum(pseudo_grad) / world_size      # the only communication
    outer_opt.step()                         # on global_p, once every member voted
    p.copy_(global_p)                        # every replica starts the next round equal

A failure during a round (or its sync) drops only the dead member's contribution: the
survivors keep what they learned, shrink, and redo the sync among themselves; the dead
member's share of the round is not trained again. A replacement joins at the next round
boundary and heals the model, the outer optimizer (with its momentum), its healer's
inner optimizer, the sampler, the RNG and every registered entry.

What not to assume: the sampler's ``global_batch_size`` is a whole round's samples
(H inner steps of all members); each member's share is cut into H contiguous pieces,
so give at least H samples per member. Replicas differ inside a round by design, so
``ManagerConfig.check_replicas`` is refused; after every committed round they are
bit-identical (``manager.checksum()``). Streaming DiLoCo (a fragment of the model per
sync) is not provided.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch

from torchnext.distributed.group.fault_tolerant_group import FaultTolerantGroup
from torchnext.distributed.training.config import ManagerConfig, ManagerEvent, StepResult
from torchnext.distributed.training.manager import Manager
from torchnext.distributed.training.sampler import ElasticSampler, split_range
from torchnext.distributed.training.state import Stateful

__all__ = ["SyncConfig", "DiLoCo"]


@dataclass(frozen=True, kw_only=True, slots=True)
class SyncConfig:
    """How often members synchronise and what the outer step does."""

    sync_every: int = 50
    """H: inner optimizer steps between two synchronisations (>= 1)."""
    outer_lr: float = 0.7
    """Learning rate of the outer SGD on the averaged pseudo-gradient (> 0)."""
    outer_momentum: float = 0.9
    """Momentum of the outer SGD, kept across rounds (0 <= momentum < 1)."""
    nesterov: bool = True
    """Nesterov momentum for the outer SGD (needs outer_momentum > 0)."""

    @classmethod
    def local_sgd(cls, *, sync_every: int = 50) -> SyncConfig:
        """LocalSGD: the parameters are averaged every ``sync_every`` steps."""
        return cls(sync_every=sync_every, outer_lr=1.0, outer_momentum=0.0, nesterov=False)

    def __post_init__(self) -> None:
        if not isinstance(self.sync_every, int) or isinstance(self.sync_every, bool):
            raise TypeError(f"SyncConfig(sync_every={self.sync_every!r}): give an int >= 1.")
        if self.sync_every < 1:
            raise ValueError(
                f"SyncConfig(sync_every={self.sync_every}): give the number of inner steps "
                "between syncs, >= 1 (1 syncs after every step)."
            )
        if not self.outer_lr > 0:
            raise ValueError(
                f"SyncConfig(outer_lr={self.outer_lr}): the outer learning rate must be > 0 "
                "(DiLoCo uses 0.7; LocalSGD is 1.0)."
            )
        if not 0 <= self.outer_momentum < 1:
            raise ValueError(
                f"SyncConfig(outer_momentum={self.outer_momentum}): give a value in [0, 1) "
                "(DiLoCo uses 0.9; LocalSGD 0)."
            )
        if self.nesterov and self.outer_momentum == 0:
            raise ValueError(
                "SyncConfig(nesterov=True, outer_momentum=0): Nesterov needs momentum; "
                "give outer_momentum > 0 or nesterov=False."
            )


class DiLoCo:
    """Runs DiLoCo (or LocalSGD) rounds on one member (see the module docstring).

    ``model`` and ``inner_optimizer`` are the member's own; ``sampler`` hands out each
    round's samples. ``group`` is the fault-tolerant group (default: the one ``torchnext
    run`` describes in the environment, created or joined); ``joining`` says ``group``
    was joined as a replacement. ``state`` registers more entries, as for
    :class:`Manager`.
    """

    def __init__(
        self,
        model: torch.nn.Module,
        inner_optimizer: torch.optim.Optimizer,
        sampler: ElasticSampler,
        *,
        config: SyncConfig | None = None,
        group: FaultTolerantGroup | None = None,
        joining: bool = False,
        manager_config: ManagerConfig | None = None,
        state: Mapping[str, Stateful] | None = None,
        on_event: Callable[[ManagerEvent], None] | None = None,
        join_timeout: timedelta = timedelta(seconds=120),
    ) -> None:
        self.config = config or SyncConfig()
        if not isinstance(self.config, SyncConfig):
            raise TypeError(f"DiLoCo(config={config!r}): give a SyncConfig.")
        if not isinstance(inner_optimizer, torch.optim.Optimizer):
            raise TypeError(
                f"DiLoCo(inner_optimizer={type(inner_optimizer).__name__}): give the "
                "torch.optim.Optimizer each member steps locally (AdamW in the paper)."
            )
        if manager_config is not None and manager_config.check_replicas:
            raise ValueError(
                "DiLoCo(manager_config=ManagerConfig(check_replicas=True)): replicas differ "
                "inside a round by design; leave check_replicas off (manager.checksum() "
                "compares them after a committed round)."
            )
        self.model = model
        self.params = [p for p in model.parameters() if p.requires_grad]
        self.global_params = [p.detach().clone() for p in self.params]
        """The parameters the members agreed on at the last sync (the outer optimizer's)."""
        self.outer_optimizer = torch.optim.SGD(
            self.global_params,
            lr=self.config.outer_lr,
            momentum=self.config.outer_momentum,
            nesterov=self.config.nesterov,
        )
        self.inner_optimizer = inner_optimizer
        self.sync_s = 0.0
        """Seconds the last committed round spent in its sync (all-reduce, vote, outer step)."""
        manager_kwargs: dict[str, Any] = {
            "config": manager_config,
            "on_event": on_event,
            "state": state,
            "optimizer_step": self._outer_step,
        }
        if group is None:
            self.manager = Manager.from_env(
                model, self.outer_optimizer, sampler, join_timeout=join_timeout, **manager_kwargs
            )
        else:
            self.manager = Manager(
                group, model, self.outer_optimizer, sampler, joining=joining, **manager_kwargs
            )
        # Per member; a replacement takes its healer's, as a fresh worker would need some.
        self.manager.register("inner_optimizer", inner_optimizer, replicated=False)

    @property
    def rounds(self) -> int:
        """Committed rounds (the manager's step count)."""
        return self.manager.step

    def run_round(self, closure: Callable[[list[int]], torch.Tensor]) -> StepResult:
        """Run one round to commit: H inner steps, then the sync (see the module docstring).

        ``closure(indices)`` returns the *mean* loss of the given samples (never called
        with none). After a failure the sync is redone among the survivors, without
        running the inner steps again.
        """
        manager = self.manager
        indices = manager.start_step()
        with torch.no_grad():
            for g, p in zip(self.global_params, self.params, strict=True):
                g.copy_(p)  # equal on survivors; a healed replacement takes them from here
        loss = self._inner_steps(closure, indices)
        while True:
            self._set_pseudo_gradient(manager.world_size)
            result = manager.finish_step(loss / manager.world_size)
            if result.committed:
                self.sync_s = result.allreduce_s + result.commit_s
                return result
            # A member died in this round: keep what this member learned, agree on the
            # survivors and redo only the sync among them.
            manager.start_step()

    def finish(self) -> None:
        """Mark the job finished; see :meth:`Manager.finish`."""
        self.manager.finish()

    # ------------------------------------------------------------------ the round

    def _inner_steps(
        self, closure: Callable[[list[int]], torch.Tensor], indices: list[int]
    ) -> float:
        steps = self.config.sync_every
        bounds = [split_range(len(indices), i, steps) for i in range(steps)]
        pieces = [indices[a:b] for a, b in bounds if b > a]
        if len(pieces) < steps:
            raise ValueError(
                f"DiLoCo: member {self.manager.rank} of {self.manager.world_size} got "
                f"{len(indices)} samples for a round of sync_every={steps} inner steps; give "
                "the sampler a global_batch_size of at least sync_every samples per member "
                "(the round's samples: inner steps x samples per step)."
            )
        total = 0.0
        for piece in pieces:
            self.inner_optimizer.zero_grad(set_to_none=True)
            loss = closure(piece)
            if not isinstance(loss, torch.Tensor) or loss.dim() != 0:
                shape = tuple(loss.shape) if isinstance(loss, torch.Tensor) else ""
                raise TypeError(
                    f"DiLoCo.run_round: the closure returned {type(loss).__name__}{shape}; "
                    "return the mean loss of the given samples as a 0-dim tensor."
                )
            with self.manager.no_sync():
                loss.backward()
            self.inner_optimizer.step()
            total += float(loss.detach())
        self.inner_optimizer.zero_grad(set_to_none=True)
        return total / len(pieces)

    def _set_pseudo_gradient(self, world_size: int) -> None:
        with torch.no_grad():
            for g, p in zip(self.global_params, self.params, strict=True):
                p.grad = (g - p) / world_size  # summed over members: the mean pseudo-gradient

    def _outer_step(self) -> None:
        with torch.no_grad():
            for g, p in zip(self.global_params, self.params, strict=True):
                g.grad = p.grad
        self.outer_optimizer.step()
        with torch.no_grad():
            for g, p in zip(self.global_params, self.params, strict=True):
                p.copy_(g)
                p.grad = None
                g.grad = None
