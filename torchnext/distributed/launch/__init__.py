"""Launching fault-tolerant jobs: the per-node agent and ``torchnext run``.

Use :class:`Agent` (or the ``torchnext run`` command, :mod:`.cli`) to start a node's
workers, replace the ones that die and evict the ones the group fenced out. The
worker side is :mod:`.worker_entry` (what the agent executes); the store keys both
sides read are in :mod:`.keys`; exit codes and their meaning in :mod:`.exits`; the
agent's configuration in :mod:`.config`; warm spares (``--spares``) in :mod:`.spares`.
The store: hosting, connecting and leaving it in :mod:`.store`, a ``TCPStore`` client
whose every call is bounded in :mod:`.bounded_store`, the agent's view of it through
outages in :mod:`.store_link`; evicted workers in :mod:`.evictions`; the checks between
the agents of one job (node ranks, job shape) in :mod:`.claims`.

What not to assume: names are loaded on first use; a worker process imports
:mod:`.keys`, :mod:`.exits`, :mod:`.store` and :mod:`.spares` (with what they import),
never the agent.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from torchnext._lazy import lazy_exports

if TYPE_CHECKING:
    from torchnext.distributed.launch.agent import Agent
    from torchnext.distributed.launch.config import AgentConfig, AgentEvent
    from torchnext.distributed.launch.exits import EXIT_EVICTED, WorkerExit
    from torchnext.distributed.launch.keys import EVICTED_KEY_PREFIX, FINISHED_KEY
    from torchnext.distributed.launch.spares import SparePool, is_spare
    from torchnext.distributed.launch.store import connect_store, host_store

__all__ = [
    "EVICTED_KEY_PREFIX",
    "EXIT_EVICTED",
    "FINISHED_KEY",
    "Agent",
    "AgentConfig",
    "AgentEvent",
    "SparePool",
    "WorkerExit",
    "connect_store",
    "host_store",
    "is_spare",
]

__getattr__, __dir__ = lazy_exports(
    __name__,
    {
        "Agent": "agent",
        "AgentConfig": "config",
        "AgentEvent": "config",
        "SparePool": "spares",
        "is_spare": "spares",
        "EXIT_EVICTED": "exits",
        "WorkerExit": "exits",
        "EVICTED_KEY_PREFIX": "keys",
        "FINISHED_KEY": "keys",
        "connect_store": "store",
        "host_store": "store",
    },
)
