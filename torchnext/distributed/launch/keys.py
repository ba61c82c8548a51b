"""The store keys that the launcher's agents and the workers' training loop share.

Use these names wherever a key crosses the agent/worker boundary: the agent
(:mod:`~torchnext.distributed.launch.agent`) and the manager
(:mod:`~torchnext.distributed.training.manager`) both import them from here, so
neither imports the other. Each constant is a key or a key prefix in the job's
``torch.distributed.Store``; a prefix takes the suffix its docstring names.

What not to assume: the keys are part of the job's wire format between processes of the
same torchnext version. Changing one breaks a job whose agents and workers run
different versions; keep them stable.
"""

from __future__ import annotations

__all__ = [
    "AGENT_ALIVE_KEY_PREFIX",
    "AGENT_CLAIM_KEY_PREFIX",
    "AGENT_DETACHED_KEY_PREFIX",
    "EVENT_COUNT_KEY",
    "EVENT_KEY_PREFIX",
    "EVICTED_KEY_PREFIX",
    "FINISHED_KEY",
    "JOB_SHAPE_KEY",
    "SPARE_KEY_PREFIX",
]

EVICTED_KEY_PREFIX = "torchnext/agent/evicted/"
"""Prefix the survivors set for a member they evicted (suffix: its member id); the
agent that runs that member kills it."""

FINISHED_KEY = "torchnext/job/finished"
"""Set once training finished; late joiners exit instead of waiting."""

AGENT_ALIVE_KEY_PREFIX = "torchnext/agent/alive/"
"""Prefix of each non-hosting agent's liveness counter (suffix: its node rank)."""

AGENT_CLAIM_KEY_PREFIX = "torchnext/agent/claim/"
"""Prefix of the claim an agent makes on its node rank when it starts (suffix: the node
rank; value: JSON naming its host and pid): two agents with one rank are refused."""

JOB_SHAPE_KEY = "torchnext/agent/shape"
"""The job's shape (JSON: nodes, workers per node, world size) as the first agent set it;
every later agent must run the same."""

AGENT_DETACHED_KEY_PREFIX = "torchnext/agent/detached/"
"""Prefix an agent sets when it is done with the store (suffix: its node rank)."""

EVENT_COUNT_KEY = "torchnext/events/count"
"""Counter of the training events the workers published (``store.add`` returns the index)."""

EVENT_KEY_PREFIX = "torchnext/events/"
"""Prefix of one published training event, JSON (suffix: its index, from 1)."""

SPARE_KEY_PREFIX = "torchnext/spares/"
"""Prefix of a warm spare's keys (suffix: its name, e.g. ``n0s0``, then ``/assign``: the
member id the agent gives it, empty to send it away; ``/ready``: set by the spare once
it waits; ``/beat``: the agent's liveness counter for it). See
:mod:`~torchnext.distributed.launch.spares`."""
