"""How an :class:`~torchnext.distributed.launch.agent.Agent` is configured, and what it reports.

Use :class:`AgentConfig` to say how many workers (and warm spares) an agent keeps, how
it reaches the job's store and how long it waits; each :class:`AgentEvent` is one line
of ``torchnext run``'s output (a start, an exit, a replacement, a training event).

What not to assume: the config is checked when it is made (a ``ValueError`` naming the
field and the fix), not against the machine: a port in use or an unreachable store is
found when the agent starts.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Literal

from torchnext.distributed.launch.etcd_client import is_etcd_url, parse_etcd_url
from torchnext.distributed.launch.exits import WorkerExit
from torchnext.distributed.launch.replica_slots import check_group_size

__all__ = ["AgentConfig", "AgentEvent", "EventKind", "print_event"]


EventKind = Literal[
    "store",
    "started",
    "exited",
    "replacing",
    "gave_up",
    "evicting",
    "stopping",
    "detach",
    "job",
    "spare",
]
"""``job``: a training event a worker published (fault, shrink, grow, heal, recovery);
``spare``: a warm spare started, became ready, or exited without being used."""


@dataclass(frozen=True, kw_only=True)
class AgentConfig:
    """How an :class:`Agent` starts and supervises workers."""

    nproc: int
    """Workers this agent starts (and keeps alive)."""
    max_restarts: int = 3
    """Replacements this agent may start in all, over the whole run (a restarted replica
    group counts once)."""
    group_size: int = 1
    """Processes per replica group (``--group-size``, HSDP): slots ``k*G .. k*G+G-1``
    form group ``k``, which is stopped and restarted whole when one of them exits
    (:mod:`~torchnext.distributed.launch.replica_slots`). 1: every process is a replica."""
    spares: int = 0
    """Warm spares to keep started (script run up to ``Manager.from_env``); a dead worker
    is replaced by one of them, within a second, instead of a cold process. 0: none.
    See :mod:`~torchnext.distributed.launch.spares`."""
    store_host: str = "127.0.0.1"
    """Interface the hosted store binds to; loopback by default (use ``0.0.0.0`` multi-node)."""
    store_port: int = 0
    """Port of the hosted store; 0 picks a free one."""
    store_addr: str = ""
    """``host:port`` every node's workers use to reach the store (multi-node). The agent
    with ``node_rank == 0`` hosts it on that port, bound to ``store_host``; the others
    connect to it. Empty: host one here on ``store_host:store_port`` (single node).
    ``etcd://h1:2379,h2:2379,h3:2379/namespace``: the store is that etcd cluster (see
    :mod:`~torchnext.distributed.launch.etcd_store`); no agent hosts one, so
    ``store_hosted_elsewhere`` is then always True."""
    store_hosted_elsewhere: bool = False
    """The store at ``store_addr`` is hosted by someone else (torchrun's agent, when
    torchrun started this one, or an etcd cluster): every agent connects, none hosts or
    waits for goodbyes."""
    node_rank: int = 0
    """This agent's index among the agents of a job (member ids are ``n{node}w{i}``)."""
    world_size: int = 0
    """Members of the whole job; 0 means ``nproc`` (a single-node job)."""
    nnodes: int = 0
    """Agents of the job; 0 means ``world_size / nproc`` (rounded up) with ``store_addr``,
    else 1. The hosting agent waits for the other ones to leave before closing the store."""
    log_dir: str = ""
    """Folder for per-worker stdout/stderr logs; empty means workers inherit ours."""
    store_timeout: timedelta = timedelta(seconds=30)
    """Bound on connecting to the store; a store silent for longer is reported as lost."""
    store_call_timeout: timedelta = timedelta(seconds=2)
    """Bound on each of the agent's own store calls (eviction and finish checks, its
    liveness counter): one past it pauses those checks until the store answers again,
    never the agent's supervision of its workers."""
    evict_grace: timedelta = timedelta(seconds=10)
    """How long a worker the group evicted may take to exit by itself (it learns of its
    eviction from its group) before the agent kills it; a stopped one is killed at once."""
    term_grace: timedelta = timedelta(seconds=5)
    """Between SIGTERM and SIGKILL when stopping workers."""
    finish_grace: timedelta = timedelta(seconds=10)
    """After the first worker finishes, how long others may take before being stopped."""
    detach_timeout: timedelta = timedelta(seconds=30)
    """Multi-node: how long the hosting agent, when it closes, keeps the store for another
    agent that has neither said goodbye nor shown a sign of life (see the module docstring)."""
    extra_env: Mapping[str, str] = field(default_factory=dict)
    """Added to every worker's environment."""
    events_file: str = ""
    """Append every agent and training event to this file as a JSON line (empty: none)."""

    def __post_init__(self) -> None:
        if self.nproc <= 0:
            raise ValueError(f"AgentConfig.nproc={self.nproc} must be positive (workers to start).")
        check_group_size(self.group_size, self.nproc)
        if self.group_size > 1 and self.spares:
            raise ValueError(
                f"AgentConfig.spares={self.spares} with group_size={self.group_size}: warm "
                "spares replace single processes, not replica groups; give --spares 0."
            )
        if self.max_restarts < 0:
            raise ValueError(f"AgentConfig.max_restarts={self.max_restarts} must be >= 0.")
        if self.spares < 0:
            raise ValueError(
                f"AgentConfig.spares={self.spares} (--spares) must be >= 0: the number of "
                "warm spare processes to keep started; give 0 for none, or 1 or 2."
            )
        if self.world_size and self.world_size < self.nproc:
            raise ValueError(
                f"AgentConfig.world_size={self.world_size} is smaller than nproc={self.nproc}; "
                "world_size counts the workers of all agents."
            )
        if self.store_hosted_elsewhere and not self.store_addr:
            raise ValueError(
                "AgentConfig.store_hosted_elsewhere=True needs store_addr, the host:port "
                "of that store."
            )
        if is_etcd_url(self.store_addr):
            try:
                parse_etcd_url(self.store_addr)
            except ValueError as exc:
                raise ValueError(f"AgentConfig.store_addr: {exc}") from None
            # An etcd cluster is nobody's to host: every agent connects to it.
            object.__setattr__(self, "store_hosted_elsewhere", True)
        elif self.store_addr and ":" not in self.store_addr:
            raise ValueError(f"AgentConfig.store_addr={self.store_addr!r} must be host:port.")
        if self.node_rank < 0:
            raise ValueError(f"AgentConfig.node_rank={self.node_rank} must be >= 0.")
        if self.nnodes < 0:
            raise ValueError(f"AgentConfig.nnodes={self.nnodes} must be >= 0 (0: derived).")
        if self.node_rank >= self.node_count:
            raise ValueError(
                f"AgentConfig.node_rank={self.node_rank} must be below the job's "
                f"{self.node_count} agent(s); pass nnodes (and store_addr) for a multi-node job."
            )
        for name in ("store_timeout", "store_call_timeout", "evict_grace"):
            value = getattr(self, name)
            if not isinstance(value, timedelta) or value <= timedelta(0):
                raise ValueError(
                    f"AgentConfig.{name}={value!r}: pass a positive datetime.timedelta."
                )
        if self.detach_timeout < timedelta(0):
            raise ValueError(f"AgentConfig.detach_timeout={self.detach_timeout} must be >= 0.")

    @property
    def node_count(self) -> int:
        """Agents of the job (``nnodes``, or what ``world_size`` and ``nproc`` imply)."""
        if self.nnodes:
            return self.nnodes
        if self.store_addr and self.world_size:
            return -(-self.world_size // self.nproc)
        return 1


@dataclass(frozen=True, kw_only=True)
class AgentEvent:
    """One thing the agent reports (printed as one line by ``torchnext run``)."""

    kind: EventKind
    message: str
    time_s: float
    """Seconds since the agent started."""
    member_id: str = ""
    exit: WorkerExit | None = None


def print_event(event: AgentEvent) -> None:
    """``torchnext run``'s line for ``event`` (the agent's default ``on_event``)."""
    print(f"torchnext run [{event.time_s:7.2f}s] {event.message}", file=sys.stderr, flush=True)
