"""How the training manager's members map onto replicas: the :class:`ReplicaLayout` seam.

Use it when extending :class:`~torchnext.distributed.training.manager.Manager` to a new
shape of replica. The manager runs the same step state machine (quorum, heal, compute,
commit) for every shape; the layout answers the shape's questions:

* which slice of the global batch a member trains on (:meth:`ReplicaLayout.data_position`),
* what sums the gradients over replicas (:meth:`ReplicaLayout.gradient_reducer`),
* whether the pending joiners may be admitted now (:meth:`ReplicaLayout.joiners_ready`),
* how members agree on the committed step and heal the ones behind
  (:meth:`ReplicaLayout.sync_and_heal`).

:class:`DDPLayout`, the default, is a member per replica (every process holds the whole
model); :class:`~torchnext.distributed.training.hsdp.HSDPLayout` is a replica group of
G processes sharding it. What not to assume: a layout holds per-run state (whether the
first sync happened, the current sub-groups); give each manager its own.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import timedelta
from typing import TYPE_CHECKING, Any, Protocol

import torch

from torchnext.distributed.training.bucketing import GradBucketer, Work
from torchnext.distributed.training.healing import describe_tensors
from torchnext.distributed.training.replica_check import check_same_entries
from torchnext.errors import CommError

if TYPE_CHECKING:
    from contextlib import AbstractContextManager

    from torchnext.distributed.group.fault_tolerant_group import FaultTolerantGroup
    from torchnext.distributed.training.config import ManagerConfig
    from torchnext.distributed.training.heal_exchange import HealExchange
    from torchnext.distributed.training.healing import TransferStats
    from torchnext.distributed.training.state import TrainingState

__all__ = ["DDPLayout", "GradientReducer", "ManagerView", "ReplicaLayout", "fetch_state"]


class ManagerView(Protocol):
    """What a layout uses of the training manager (the manager itself, in practice)."""

    group: FaultTolerantGroup
    model: torch.nn.Module
    config: ManagerConfig
    step: int
    steps_redone: int
    training_state: TrainingState
    heals: HealExchange
    heal_stats: list[TransferStats]

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...

    def emit_event(self, kind: str, **detail: Any) -> None: ...


class GradientReducer(Protocol):
    """Sums one step's gradients over the replicas (a :class:`GradBucketer` for DDP)."""

    enabled: bool

    def interruptible(self) -> AbstractContextManager[None]: ...

    def finish(self, timeout: timedelta) -> None: ...

    def abandon(self) -> None: ...

    def remove(self) -> None: ...


class ReplicaLayout(Protocol):
    """The replica shape's answers to the manager (see the module docstring)."""

    atomic_commit: bool
    """Whether every member must adopt one commit decision (a vote through the store):
    members one step apart cannot be healed in this shape."""

    def data_position(self, group: FaultTolerantGroup) -> tuple[int, int]:
        """``(rank, world)`` of this member's slice of each global batch."""
        ...

    def gradient_reducer(
        self,
        model: torch.nn.Module,
        all_reduce: Callable[[torch.Tensor], Work],
        *,
        bucket_cap_bytes: int,
        failed: Callable[[], bool],
    ) -> GradientReducer: ...

    def joiners_ready(self, group: FaultTolerantGroup, *, fresh: bool = True) -> bool:
        """Whether the pending joiners may be admitted at this step's end (``fresh``: read
        the registry now; else the monitor's view, at most a heartbeat old)."""
        ...

    def sync_and_heal(self, manager: ManagerView) -> None:
        """Agree on the committed step; members behind receive state (collective)."""
        ...


class DDPLayout:
    """Every member is a whole replica (the manager's default)."""

    atomic_commit = False  # a member left a step behind heals from one ahead

    def __init__(self) -> None:
        self.first_sync = True

    def data_position(self, group: FaultTolerantGroup) -> tuple[int, int]:
        return int(group.rank), int(group.size)

    def gradient_reducer(
        self,
        model: torch.nn.Module,
        all_reduce: Callable[[torch.Tensor], Work],
        *,
        bucket_cap_bytes: int,
        failed: Callable[[], bool],
    ) -> GradientReducer:
        return GradBucketer(
            list(model.parameters()),
            all_reduce,
            bucket_cap_bytes=bucket_cap_bytes,
            failed=failed,
            modules=model.modules(),
        )

    def joiners_ready(self, group: FaultTolerantGroup, *, fresh: bool = True) -> bool:
        return bool(group.pending_joiners(fresh=fresh))

    def sync_and_heal(self, manager: ManagerView) -> None:
        """Compare committed steps; members behind receive state from one that is not."""
        group, timeout = manager.group, manager.config.step_timeout
        size = int(group.size)
        mine = torch.tensor([manager.step, manager.training_state.spec_crc()], dtype=torch.int64)
        gathered = torch.zeros(2 * size, dtype=torch.int64)
        group.all_gather_into_tensor(gathered, mine, timeout=timeout)
        step_of = gathered[0::2].tolist()
        check_same_entries(
            group,
            manager.training_state,
            steps=step_of,
            crcs=gathered[1::2].tolist(),
            timeout=timeout,
        )
        best = max(step_of)
        if best < 0:
            raise CommError(
                f"{group.member_id}: no member of epoch {group.epoch} has committed state to "
                f"heal from (steps {step_of}); every original member is gone."
            )
        sources = [r for r, s in enumerate(step_of) if s == best]
        if best == 0 and (self.first_sync or any(s < 0 for s in step_of)):
            # Nothing trained yet: one broadcast of the first source's initial weights
            # makes every replica (joiners included) start identical, whatever its seed.
            for tensor in manager.model.state_dict().values():
                group.broadcast(tensor, src=sources[0], timeout=timeout)
            manager.step = 0
            self.first_sync = False
            return
        self.first_sync = False
        dests = [r for r, s in enumerate(step_of) if s != best]
        if not dests:
            return
        plan = {d: sources[i % len(sources)] for i, d in enumerate(dests)}
        members = tuple(group.members)
        rank = int(group.rank)
        if rank in sources:
            mine_dests = [members[d] for d, s in plan.items() if s == rank]
            if mine_dests:
                manager.heals.serve(
                    manager.state_dict(), mine_dests, manager.training_state.spec_problems
                )
            return
        fetch_state(manager, members[plan[rank]], describe_tensors(manager.model.state_dict()))


def fetch_state(
    manager: ManagerView,
    source_id: str,
    model_spec: list[tuple[str, str, tuple[int, ...]]],
    load: Callable[[Any], None] | None = None,
) -> None:
    """Receive ``source_id``'s state, load it (``load``, default the manager's) and report it."""
    t0 = time.monotonic()
    state, stats = manager.heals.fetch(
        source_id, model_spec=model_spec, entries=manager.training_state.spec()
    )
    (load or manager.load_state_dict)(state)
    manager.heal_stats.append(stats)
    manager.emit_event(
        "healed",
        source=source_id,
        bytes=stats.total_bytes,
        seconds=time.monotonic() - t0,
        mb_per_s=stats.mb_per_s,
    )
