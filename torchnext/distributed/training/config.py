"""The training manager's configuration and what it reports: config, events, step results.

Use these with :class:`~torchnext.distributed.training.manager.Manager` (they are
re-exported there and from :mod:`torchnext.distributed`). What not to assume: events are
delivered inside the manager's calls on the training thread, except
``failure_detected``, which comes from the thread that noticed the failure; a slow
``on_event`` callback slows training.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

__all__ = ["ManagerConfig", "ManagerEvent", "StepResult"]


@dataclass(frozen=True, kw_only=True)
class ManagerConfig:
    """Bounds and knobs of a :class:`Manager`."""

    step_timeout: timedelta = timedelta(seconds=30)
    """Bound on a step's gradient all-reduce and commit vote (failures are detected
    much sooner, by the group's revoke; this only catches what nothing reports)."""
    recovery_timeout: timedelta = timedelta(seconds=30)
    """Bound on agreeing on a new membership after a failure."""
    heal_timeout: timedelta = timedelta(seconds=120)
    """Bound on one state transfer to a joiner (size it for your state and network)."""
    grow_timeout: timedelta = timedelta(seconds=30)
    """Bound on admitting pending joiners."""
    bucket_cap_bytes: int = 25 * 1024 * 1024
    """Gradient bucket size; smaller buckets start communicating earlier."""
    check_replicas: bool = False
    """In every step, before the commit vote, compare a CRC of each replicated entry
    (model, optimizer, sampler, registered state) across members (one pass over the
    state and one small collective); a difference raises
    :class:`~torchnext.errors.ReplicaDivergenceError` naming the entry, uncommitted."""
    commit_vote: str = "collective"
    """How members agree that a step counts. ``"collective"``: the step's last
    all-reduce (the loss's) is the vote: a member whose all-reduce completed knows every
    member finished the step and commits it, with no store round trip on the step's
    path; a failure inside that all-reduce can leave survivors one step apart, and the
    next membership agreement heals the ones behind from the ones ahead. ``"store"``:
    every member votes through the store and all adopt one outcome (a few store round
    trips a step; with a remote or replicated store, such as etcd, they show in the
    step time). ``check_replicas`` always votes through the store: its check runs after
    the all-reduce, and so do replica groups (HSDP), whose processes of one group must
    never be a step apart: a shard has no other source to heal from."""
    heal_host: str = ""
    """Interface the healing server binds; empty means the one that reaches the store."""
    max_recoveries: int = 1000
    """Give up (raise) after this many membership changes in one run."""
    publish_events: bool = True
    """Put failures, shrinks, grows, heals and recoveries into the job's store, where
    ``torchnext run`` prints them (a few small writes per membership change)."""

    def __post_init__(self) -> None:
        for name in ("step_timeout", "recovery_timeout", "heal_timeout", "grow_timeout"):
            value = getattr(self, name)
            if not isinstance(value, timedelta) or value.total_seconds() <= 0:
                raise ValueError(f"ManagerConfig.{name}={value!r} must be a positive timedelta.")
        if self.bucket_cap_bytes <= 0:
            raise ValueError(
                f"ManagerConfig.bucket_cap_bytes={self.bucket_cap_bytes} must be positive."
            )
        if self.commit_vote not in ("collective", "store"):
            raise ValueError(
                f"ManagerConfig.commit_vote={self.commit_vote!r}: give 'collective' (the "
                "default: no store round trip a step) or 'store'."
            )
        if self.max_recoveries < 1:
            raise ValueError(f"ManagerConfig.max_recoveries={self.max_recoveries} must be >= 1.")


@dataclass(frozen=True, kw_only=True)
class ManagerEvent:
    """Something the manager did or saw; handed to ``on_event``."""

    kind: str
    """``failure_detected``, ``step_aborted``, ``shrink``, ``grow``, ``healing`` (a
    joiner starts receiving), ``healed``, ``serving_heal`` / ``served_heal`` (a healer
    starts / finished sending), ``replica_mismatch``, ``finished``."""
    step: int
    epoch: int
    world_size: int
    member_id: str
    time: float
    """``time.time()`` when it happened (comparable across processes of one machine)."""
    detail: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, kw_only=True)
class StepResult:
    committed: bool
    step: int
    """Committed steps after this one (unchanged when not committed)."""
    loss: float
    """Global-batch loss of the step (the all-reduced scaled sum); NaN if unknown."""
    world_size: int
    reason: str = ""
    compute_s: float = 0.0
    """From the step's start (after recovery and healing) to ``finish_step``: forward and
    backward, with the gradient all-reduce that overlapped them."""
    allreduce_s: float = 0.0
    """Waiting for the rest of the gradient all-reduce and the loss (and the replica check)."""
    commit_s: float = 0.0
    """The commit vote and the optimizer step."""
    recovery_s: float = 0.0
    """Shrinking, growing and healing before this step's attempt started (0 when none)."""
