"""Which worker slots of an agent form which replica group (``torchnext run --group-size G``).

Use :class:`ReplicaSlots` from the :class:`~torchnext.distributed.launch.agent.Agent`:
slots ``k*G .. k*G+G-1`` of an agent are replica group ``k`` of its node, named
``n{node}g{k}`` and, after its r-th restart, ``n{node}g{k}.r{r}``. Every process of a
group gets the group's name (``TORCHNEXT_REPLICA_ID``), its shard index
(``TORCHNEXT_SHARD_INDEX``) and the group size (``TORCHNEXT_GROUP_SIZE``); the
training side builds the group's shard process group from them
(:class:`~torchnext.distributed.training.replica_groups.ReplicaGroup`).

A group lives and dies whole: when one of its processes exits, the agent kills the
others at once (:func:`stop_siblings`, they are its children) and restarts the group,
all its processes as joiners under a new name. What not to assume: a group never spans
agents (``nproc`` is a multiple of ``G``), and its processes are started together but
may reach the job's store seconds apart; they meet there before building their group.
"""

from __future__ import annotations

import signal
import subprocess
from collections.abc import MutableMapping

from torchnext._env import TORCHNEXT_GROUP_SIZE, TORCHNEXT_REPLICA_ID, TORCHNEXT_SHARD_INDEX
from torchnext.distributed.launch.process import WorkerProcess, signal_process
from torchnext.errors import ReplicaLayoutError

__all__ = ["ReplicaSlots", "check_group_size", "stop_siblings"]


def check_group_size(group_size: int, world_size: int, *, what: str = "--group-size") -> None:
    """Raise :class:`ReplicaLayoutError` unless ``world_size`` splits into groups of ``group_size``."""
    if not isinstance(group_size, int) or group_size < 1:
        raise ReplicaLayoutError(
            f"{what}={group_size!r}: a replica group needs at least 1 process; give 1 for "
            "DDP-style replicas or a divisor of the world size (e.g. 2) for HSDP."
        )
    if world_size % group_size:
        raise ReplicaLayoutError(
            f"{what}={group_size} does not divide the world size {world_size} (--nproc): "
            f"replica groups must all have {group_size} processes; use --nproc "
            f"{max(group_size, world_size - world_size % group_size)} or a group size that "
            f"divides {world_size}."
        )


class ReplicaSlots:
    """The replica groups of one agent's slots and their current names."""

    def __init__(self, *, group_size: int, node_rank: int, nproc: int) -> None:
        check_group_size(group_size, nproc)
        self.group_size = group_size
        self.node_rank = node_rank
        self.restarts: dict[int, int] = {}
        """Replica index -> how many times it was restarted."""

    def replica_of(self, slot: int) -> int:
        return slot // self.group_size

    def name(self, slot: int) -> str:
        """The current name of ``slot``'s replica group."""
        k = self.replica_of(slot)
        r = self.restarts.get(k, 0)
        return f"n{self.node_rank}g{k}" + (f".r{r}" if r else "")

    def slots(self, slot: int) -> list[int]:
        """Every slot of ``slot``'s replica group, in shard order."""
        first = self.replica_of(slot) * self.group_size
        return list(range(first, first + self.group_size))

    def restart(self, slot: int) -> str:
        """Give ``slot``'s replica group its next name (the restarted group's)."""
        k = self.replica_of(slot)
        self.restarts[k] = self.restarts.get(k, 0) + 1
        return self.name(slot)

    def env(self, slot: int) -> dict[str, str]:
        """The variables that tell a process of ``slot`` its group and shard."""
        return {
            TORCHNEXT_GROUP_SIZE.name: str(self.group_size),
            TORCHNEXT_REPLICA_ID.name: self.name(slot),
            TORCHNEXT_SHARD_INDEX.name: str(slot % self.group_size),
        }


def stop_siblings(
    workers: MutableMapping[int, WorkerProcess], slots: list[int], dead: WorkerProcess
) -> list[tuple[WorkerProcess, int]]:
    """SIGKILL the live processes of ``dead``'s group (``slots``), wait, forget them.

    Returns ``(worker, exit code)`` for each one removed from ``workers``.
    """
    gone = []
    for slot in slots:
        worker = workers.get(slot)
        if worker is None or worker is dead:
            continue
        signal_process(worker.proc, signal.SIGCONT)  # a stopped process dies on SIGKILL too
        signal_process(worker.proc, signal.SIGKILL)
        try:
            code = worker.proc.wait(5)
        except subprocess.TimeoutExpired:
            continue  # left in place: the agent's poll loop reaps it later
        del workers[slot]
        gone.append((worker, int(code)))
    return gone
