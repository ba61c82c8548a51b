"""Semi-synchronous fault-tolerant training: DiLoCo, streaming DiLoCo and LocalSGD.

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

Streaming DiLoCo (Douillard et al., 2025), ``SyncConfig(fragments=F)``: the trainable
parameters are cut into F contiguous fragments of about equal size
(:mod:`.semisync_fragments`); a round is H / F inner steps and syncs one fragment,
round-robin, so each fragment still syncs every H inner steps, at offsets spread over
H, and each sync moves 1/F of the model. Round ``r``, as equivalent Python::

    idx = manager.start_step()
    f = r % F                                # committed rounds before this one
    for piece in split(idx, H // F): ...     # inner steps as above
    pseudo_grad = global_p[f] - p[f]         # this fragment only
    p[f].grad = all_reduce_sum(pseudo_grad) / world_size
    outer_opt.step()                         # steps global_p[f] and its momentum only
    p[f].copy_(global_p[f])                  # the other fragments go on locally

A failure during a round (or its sync) drops only the dead member's contribution: the
survivors keep what they learned, shrink, and redo the sync among themselves; the dead
member's share of the round is not trained again. A replacement joins at the next round
boundary and heals the model, the outer optimizer (with its momentum), its healer's
inner optimizer, the sampler, the RNG and every registered entry; with fragments also
the global copies and its healer's local parameters.

With replica groups (``DiLoCo(..., replica=ReplicaGroup.from_env())``, the model sharded
by ``fully_shard``) a member is one process of a group: the inner steps run FSDP2 inside
the group, and the pseudo-gradient (a local shard) is summed with the same shard index
of every other group; ``world_size`` counts processes, so the sum comes out as the mean
over groups (:mod:`.shard_reduce`).

What not to assume: the sampler's ``global_batch_size`` is a whole round's samples
(H inner steps of all members; H / F with fragments); each member's share is cut into
that many contiguous pieces, so give at least one sample per piece. Replicas differ
inside a round by design, so ``ManagerConfig.check_replicas`` is refused; after every
committed round the agreed state is bit-identical (``manager.checksum()``: with
fragments, the global copies and the outer momentum; the members' local copies of the
fragments not just synced differ by design). :meth:`DiLoCo.wire_bytes` counts what
this member sent, heal traffic included.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch

from torchnext.distributed.group.fault_tolerant_group import FaultTolerantGroup
from torchnext.distributed.group.wire import with_heal
from torchnext.distributed.training.config import ManagerConfig, ManagerEvent, StepResult
from torchnext.distributed.training.hsdp import HSDPLayout
from torchnext.distributed.training.manager import Manager
from torchnext.distributed.training.replica_groups import ReplicaGroup
from torchnext.distributed.training.sampler import ElasticSampler, split_range
from torchnext.distributed.training.semisync_fragments import FragmentedOuter
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
    fragments: int = 1
    """F: streaming DiLoCo syncs one of F fragments per round of H / F inner steps
    (1: the whole model every H steps). F must divide ``sync_every``."""

    @classmethod
    def local_sgd(cls, *, sync_every: int = 50, fragments: int = 1) -> SyncConfig:
        """LocalSGD: the parameters are averaged every ``sync_every`` steps."""
        return cls(
            sync_every=sync_every,
            outer_lr=1.0,
            outer_momentum=0.0,
            nesterov=False,
            fragments=fragments,
        )

    @property
    def steps_per_round(self) -> int:
        """Inner steps between two syncs: H, or H / F with fragments."""
        return self.sync_every // self.fragments

    def __post_init__(self) -> None:
        if not isinstance(self.sync_every, int) or isinstance(self.sync_every, bool):
            raise TypeError(f"SyncConfig(sync_every={self.sync_every!r}): give an int >= 1.")
        if self.sync_every < 1:
            raise ValueError(
                f"SyncConfig(sync_every={self.sync_every}): give the number of inner steps "
                "between syncs, >= 1 (1 syncs after every step)."
            )
        if not isinstance(self.fragments, int) or isinstance(self.fragments, bool):
            raise TypeError(f"SyncConfig(fragments={self.fragments!r}): give an int >= 1.")
        if self.fragments < 1:
            raise ValueError(
                f"SyncConfig(fragments={self.fragments}): give the number of fragments, >= 1 "
                "(1 syncs the whole model each round; streaming DiLoCo uses 2 to 8 or so)."
            )
        if self.sync_every % self.fragments != 0:
            raise ValueError(
                f"SyncConfig(sync_every={self.sync_every}, fragments={self.fragments}): a round "
                "is sync_every / fragments inner steps, so fragments must divide sync_every; "
                f"give e.g. fragments={_largest_divisor(self.sync_every, self.fragments)}."
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


def _largest_divisor(n: int, at_most: int) -> int:
    return max(d for d in range(1, min(n, at_most) + 1) if n % d == 0)


class DiLoCo:
    """Runs DiLoCo (or LocalSGD) rounds on one member (see the module docstring).

    ``model`` and ``inner_optimizer`` are the member's own; ``sampler`` hands out each
    round's samples. ``group`` is the fault-tolerant group (default: the one ``torchnext
    run`` describes in the environment, created or joined); ``joining`` says ``group``
    was joined as a replacement. ``state`` registers more entries, as for
    :class:`Manager`. ``replica`` (a :class:`~.replica_groups.ReplicaGroup`, ``model``
    sharded with ``fully_shard`` over ``replica.mesh``) makes each replica a group of
    processes (:mod:`.hsdp`): inner steps run FSDP2 inside the group, and a sync sums the
    pseudo-gradient shard i with shard i of the other groups.
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
        replica: ReplicaGroup | None = None,
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
        self.sharded = replica is not None
        """Whether each replica is a group of processes sharding the model (``replica=``)."""
        self.params = [p for p in model.parameters() if p.requires_grad]
        cfg = self.config
        self.fragmented: FragmentedOuter | None = None
        """Streaming DiLoCo's fragments and global copies (``fragments > 1``), else None."""
        managed: torch.nn.Module = model
        if cfg.fragments > 1:
            self.fragmented = FragmentedOuter(
                self.params,
                fragments=cfg.fragments,
                outer_lr=cfg.outer_lr,
                outer_momentum=cfg.outer_momentum,
                nesterov=cfg.nesterov,
            )
            self.global_params = self.fragmented.global_params
            self.outer_optimizer = self.fragmented.outer_optimizer
            # The manager heals and fingerprints the global copies; the pseudo-gradient
            # of one fragment goes through its gradient all-reduce.
            managed = self.fragmented.holder
        else:
            self.global_params = [p.detach().clone() for p in self.params]
            self.outer_optimizer = torch.optim.SGD(
                self.global_params,
                lr=cfg.outer_lr,
                momentum=cfg.outer_momentum,
                nesterov=cfg.nesterov,
            )
        self.inner_optimizer = inner_optimizer
        self.sync_s = 0.0
        """Seconds the last committed round spent in its sync (all-reduce, vote, outer step)."""
        self._local_started = False
        manager_kwargs: dict[str, Any] = {
            "config": manager_config,
            "on_event": on_event,
            "state": state,
            "optimizer_step": self._outer_step,
        }
        if group is None:
            self.manager = Manager.from_env(
                managed,
                self.outer_optimizer,
                sampler,
                join_timeout=join_timeout,
                replica=replica,
                **manager_kwargs,
            )
        else:
            if replica is not None:
                # Published after the join: the members admit a joining group once
                # every one of its processes has said which group it belongs to.
                layout = HSDPLayout(replica, member_id=str(group.member_id))
                manager_kwargs["layout"] = layout
            self.manager = Manager(
                group, managed, self.outer_optimizer, sampler, joining=joining, **manager_kwargs
            )
        # Per member; a replacement takes its healer's, as a fresh worker would need some.
        self.manager.register("inner_optimizer", inner_optimizer, replicated=False)
        if self.fragmented is not None:
            # With fragments the members' parameters differ between syncs: a replacement
            # takes its healer's, like the inner optimizer.
            self.manager.register("local_model", model, replicated=False)

    @property
    def rounds(self) -> int:
        """Committed rounds (the manager's step count)."""
        return self.manager.step

    def run_round(self, closure: Callable[[list[int]], torch.Tensor]) -> StepResult:
        """Run one round to commit: the inner steps, then the sync (module docstring).

        ``closure(indices)`` returns the *mean* loss of the given samples (never called
        with none). After a failure the sync is redone among the survivors, without
        running the inner steps again.
        """
        manager = self.manager
        indices = manager.start_step()
        fragmented = self.fragmented
        fragment = 0
        if fragmented is None:
            with torch.no_grad():
                for g, p in zip(self.global_params, self.params, strict=True):
                    g.copy_(p)  # equal on survivors; a healed replacement takes them from here
        else:
            if not self._local_started and manager.step == 0:
                fragmented.start_local()  # the global copies were just made equal
            self._local_started = True
            fragment = fragmented.fragment_of(manager.step)
        loss = self._inner_steps(closure, indices)
        while True:
            if fragmented is None:
                self._set_pseudo_gradient(manager.world_size)
                result = manager.finish_step(loss / manager.world_size)
            else:
                fragmented.set_pseudo_gradient(fragment, manager.world_size)
                result = manager.finish_step(
                    loss / manager.world_size,
                    optimizer_step=lambda: fragmented.outer_step(fragment),
                )
            if result.committed:
                self.sync_s = result.allreduce_s + result.commit_s
                return result
            # A member died in this round: keep what this member learned, agree on the
            # survivors and redo only the sync among them.
            manager.start_step()

    def wire_bytes(self) -> dict[str, int]:
        """Bytes this member put on the wire so far, per op kind, plus ``"heal"``: the
        state it received as a replacement (see :mod:`torchnext.distributed.group.wire`)."""
        return with_heal(self.manager.group.wire_bytes(), self.manager.heal_stats)

    def finish(self) -> None:
        """Mark the job finished; see :meth:`Manager.finish`."""
        self.manager.finish()

    # ------------------------------------------------------------------ the round

    def _inner_steps(
        self, closure: Callable[[list[int]], torch.Tensor], indices: list[int]
    ) -> float:
        steps = self.config.steps_per_round
        bounds = [split_range(len(indices), i, steps) for i in range(steps)]
        pieces = [indices[a:b] for a, b in bounds if b > a]
        if len(pieces) < steps:
            raise ValueError(
                f"DiLoCo: member {self.manager.rank} of {self.manager.world_size} got "
                f"{len(indices)} samples for a round of {steps} inner steps (sync_every="
                f"{self.config.sync_every}, fragments={self.config.fragments}); give the sampler "
                "a global_batch_size of at least that many samples per member (the round's "
                "samples: inner steps x samples per step)."
            )
        # In a replica group an inner step runs FSDP's collectives inside the group: one
        # that fails means a group-mate died, and the group is dropped (the layout's guard
        # says so with ReplicaIncompleteError). Full replicas never communicate here.
        guard = self.manager.interruptible() if self.sharded else contextlib.nullcontext()
        with guard:
            total = self._run_pieces(closure, pieces)
        self.inner_optimizer.zero_grad(set_to_none=True)
        return total / len(pieces)

    def _run_pieces(
        self, closure: Callable[[list[int]], torch.Tensor], pieces: list[list[int]]
    ) -> float:
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
        return total

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
