"""Replica groups (HSDP): a replica is G processes that shard one copy of the model.

Use :class:`ReplicaGroup` in a script started by ``torchnext run --nproc N
--group-size G``: it builds this process's shard group (an ordinary gloo group of its
replica's G processes, bounded by twice the heartbeat timeout) and the 1-D
``DeviceMesh`` on it that FSDP2's ``fully_shard`` takes; then hand it to the training
manager (``Manager.from_env(..., replica=group)``), which keeps the replicas in step
(:mod:`.hsdp`). The layout of the job (which member is which replica's which shard,
and so which slice of the global batch it trains on) is computed here by pure
functions from what every member reports at a sync::

    replicas = {}                                   # replica id -> {shard: member}
    for member in group.members:                    # in rank order
        replicas.setdefault(replica_of[member], {})[shard_of[member]] = member
    complete = [r for r in replicas.values() if sorted(r) == list(range(G))]
    # replica order: the order of the replicas' first members in the group
    data_rank = replica_order * G + shard           # of R * G data-parallel positions

What not to assume: a shard group cannot shrink. A replica that loses a process is
dropped whole (the launcher kills its other processes and restarts the replica), and a
member of an incomplete replica leaves the job (:class:`~torchnext.errors.ReplicaIncompleteError`).
"""

from __future__ import annotations

import time
import zlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from torchnext.distributed.launch.replica_slots import check_group_size
from torchnext.errors import CommTimeoutError, ReplicaLayoutError

__all__ = [
    "ReplicaGroup",
    "ReplicaGroupConfig",
    "ReplicaPlan",
    "ReplicaSlot",
    "check_group_size",
    "plan_replicas",
    "replica_tag",
]

_READY_KEY = "torchnext/replica"


@dataclass(frozen=True, kw_only=True, slots=True)
class ReplicaGroupConfig:
    """This process's place in a job of replica groups (what ``torchnext run`` tells it)."""

    group_size: int
    """Processes per replica group (G); the model is sharded G ways inside a group."""
    replica_id: str
    """This incarnation of the replica (``n0g1``; a restarted one is ``n0g1.r2``)."""
    shard: int
    """This process's shard index in its group, ``0 .. group_size - 1``."""
    timeout: timedelta
    """Bound on every collective of the shard group (at most twice the heartbeat timeout:
    a group that lost a process must fail fast, not wait out gloo's 30 minutes)."""
    ready_timeout: timedelta = timedelta(seconds=120)
    """How long the processes of a (re)started group wait for each other to start."""

    def __post_init__(self) -> None:
        check_group_size(self.group_size, self.group_size, what="ReplicaGroupConfig.group_size")
        if not 0 <= self.shard < self.group_size:
            raise ReplicaLayoutError(
                f"ReplicaGroupConfig.shard={self.shard} is outside 0..{self.group_size - 1}; "
                "give this process's index inside its replica group."
            )
        if not self.replica_id:
            raise ReplicaLayoutError(
                "ReplicaGroupConfig.replica_id='' : give the replica's name (shared by its "
                "processes, new for every restart), e.g. 'n0g1'."
            )
        for name in ("timeout", "ready_timeout"):
            value = getattr(self, name)
            if not isinstance(value, timedelta) or value <= timedelta(0):
                raise ValueError(
                    f"ReplicaGroupConfig.{name}={value!r}: pass a positive datetime.timedelta."
                )


def replica_tag(replica_id: str) -> int:
    """A replica id as a number (what members all-gather to tell replicas apart)."""
    return zlib.crc32(replica_id.encode())


@dataclass(frozen=True, slots=True)
class ReplicaSlot:
    """What one member reported at a sync: its replica (as :func:`replica_tag`), shard, G."""

    replica: int
    shard: int
    group_size: int


@dataclass(frozen=True, slots=True)
class ReplicaPlan:
    """The replica layout of one membership (see the module docstring)."""

    group_size: int
    replicas: tuple[tuple[str, ...], ...]
    """Complete replicas in replica order; each lists its members by shard index."""
    incomplete: tuple[str, ...]
    """Members of replicas that miss a shard (they must leave)."""

    @property
    def members(self) -> tuple[str, ...]:
        """Members of complete replicas, replica after replica."""
        return tuple(m for r in self.replicas for m in r)

    def replica_order(self, member: str) -> int:
        for i, replica in enumerate(self.replicas):
            if member in replica:
                return i
        raise ReplicaLayoutError(f"{member} is in no complete replica of {list(self.replicas)}")

    def data_position(self, member: str) -> tuple[int, int]:
        """``(data rank, data world)``: this member's slice of every global batch."""
        g = self.group_size
        order = self.replica_order(member)
        return order * g + self.replicas[order].index(member), len(self.replicas) * g

    def shard_peers(self, shard: int) -> tuple[str, ...]:
        """The members holding shard ``shard``, one per replica, in replica order."""
        return tuple(r[shard] for r in self.replicas)

    def heal_sources(self, steps: Mapping[str, int]) -> dict[str, str]:
        """``{behind: source}``: each member behind the newest step heals from a member
        of the same shard index that has it (sources taken in turn)."""
        best = max(steps[m] for m in self.members)
        plan: dict[str, str] = {}
        for shard in range(self.group_size):
            peers = self.shard_peers(shard)
            sources = [m for m in peers if steps[m] == best]
            if not sources:
                raise ReplicaLayoutError(f"no member with shard {shard} has step {best}")
            behind = [m for m in peers if steps[m] != best]
            for i, member in enumerate(behind):
                plan[member] = sources[i % len(sources)]
        return plan


def plan_replicas(members: Sequence[str], slots: Mapping[str, ReplicaSlot]) -> ReplicaPlan:
    """Group ``members`` (rank order) into replicas; raise if the group sizes differ."""
    sizes = {slots[m].group_size for m in members}
    if len(sizes) != 1:
        by_size = {s: [m for m in members if slots[m].group_size == s] for s in sorted(sizes)}
        raise ReplicaLayoutError(
            f"replica groups of different sizes: {by_size} (group size -> members); start "
            "every process of the job with the same --group-size (TORCHNEXT_GROUP_SIZE)."
        )
    g = sizes.pop()
    grouped: dict[int, dict[int, str]] = {}
    extra: list[str] = []
    for m in members:
        slot = slots[m]
        shards = grouped.setdefault(slot.replica, {})
        if slot.shard in shards or not 0 <= slot.shard < g:
            extra.append(m)  # a second claim on a shard: never part of a complete replica
        else:
            shards[slot.shard] = m
    replicas, incomplete = [], list(extra)
    for shards in grouped.values():
        if sorted(shards) == list(range(g)):
            replicas.append(tuple(shards[i] for i in range(g)))
        else:
            incomplete.extend(shards.values())
    return ReplicaPlan(group_size=g, replicas=tuple(replicas), incomplete=tuple(incomplete))


class ReplicaGroup:
    """This process's shard group: the gloo group and 1-D mesh of its replica's processes.

    Build it with :meth:`from_env` (under ``torchnext run --group-size G``) or from a
    :class:`ReplicaGroupConfig` and the job's store, before the model: shard the model
    over :attr:`mesh` with ``fully_shard``, make the optimizer, then create the manager.
    """

    def __init__(self, store: Any, config: ReplicaGroupConfig) -> None:
        from torchnext.compat.fsdp_internals import mesh_on_group, replica_process_group

        self.store = store
        self.config = config
        prefix = f"{_READY_KEY}/{config.replica_id}"
        self._await_siblings(prefix)
        self.process_group = replica_process_group(
            store,
            prefix=f"{prefix}/pg/",
            rank=config.shard,
            size=config.group_size,
            timeout=config.timeout,
            name=f"torchnext_replica_{config.replica_id}",
        )
        self.mesh = mesh_on_group(self.process_group, rank=config.shard, size=config.group_size)
        """The 1-D ``DeviceMesh`` to pass to ``fully_shard(module, mesh=...)``."""

    @property
    def shard(self) -> int:
        return self.config.shard

    @property
    def group_size(self) -> int:
        return self.config.group_size

    @property
    def slot(self) -> ReplicaSlot:
        return ReplicaSlot(replica_tag(self.config.replica_id), self.shard, self.group_size)

    def _await_siblings(self, prefix: str) -> None:
        # The processes of a restarted group start seconds apart on a loaded host; gloo's
        # rendezvous is bounded by the (short) shard-group timeout, so meet here first.
        self.store.set(f"{prefix}/ready/{self.config.shard}", "1")
        keys = [f"{prefix}/ready/{i}" for i in range(self.config.group_size)]
        deadline = time.monotonic() + self.config.ready_timeout.total_seconds()
        while not self.store.check(keys):
            if time.monotonic() > deadline:
                raise CommTimeoutError(
                    f"replica group {self.config.replica_id}: its {self.config.group_size} "
                    f"processes did not all start within {self.config.ready_timeout}"
                )
            time.sleep(0.01)

    @staticmethod
    def requested() -> bool:
        """Whether this process was started as part of a replica group of more than one
        process (``torchnext run --group-size G``, G > 1): a script that runs either way
        shards its model only then."""
        from torchnext._env import TORCHNEXT_GROUP_SIZE

        return TORCHNEXT_GROUP_SIZE.get() > 1

    @classmethod
    def from_env(cls, *, ready_timeout: timedelta = timedelta(seconds=120)) -> ReplicaGroup:
        """The group ``torchnext run --group-size G`` described in the environment."""
        from torchnext._env import (
            TORCHNEXT_GROUP_SIZE,
            TORCHNEXT_HEARTBEAT_TIMEOUT,
            TORCHNEXT_MEMBER_ID,
            TORCHNEXT_REPLICA_ID,
            TORCHNEXT_SHARD_INDEX,
            TORCHNEXT_STORE_ADDR,
            TORCHNEXT_WORLD_SIZE,
        )
        from torchnext.distributed.launch.store import connect_store

        group_size = TORCHNEXT_GROUP_SIZE.get()
        check_group_size(group_size, TORCHNEXT_WORLD_SIZE.get() or group_size)
        config = ReplicaGroupConfig(
            group_size=group_size,
            # Without --group-size every process is a group of one, named after itself.
            replica_id=TORCHNEXT_REPLICA_ID.get() or TORCHNEXT_MEMBER_ID.get() or "g0",
            shard=TORCHNEXT_SHARD_INDEX.get(),
            timeout=2 * TORCHNEXT_HEARTBEAT_TIMEOUT.get(),
            ready_timeout=ready_timeout,
        )
        store = connect_store(TORCHNEXT_STORE_ADDR.get(), timedelta(seconds=30))
        return cls(store, config)
