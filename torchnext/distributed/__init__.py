"""Fault-tolerant distributed communication on top of torch.distributed.

A job built on :class:`FaultTolerantGroup` keeps running when one of its processes
dies or hangs: the survivors are told at once (the epoch is *revoked*, every pending
op fails with :class:`~torchnext.errors.CommRevokedError` within tens of
milliseconds, whatever the collective timeout), *agree* on who is gone, and *shrink*
to a new epoch in place; replacements :meth:`~FaultTolerantGroup.join` and are
admitted with :meth:`~FaultTolerantGroup.grow`. Works on gloo (CPU) on torch 2.13 and
2.14, and on NCCL where CUDA is present.

    store = connect_store("10.0.0.1:29500", timedelta(seconds=30))  # hosted by a launcher
    group = FaultTolerantGroup(store, member_id="w3", world_size=8)  # or .from_env()
    try:
        group.all_reduce(grads)
    except CommRevokedError:
        group.agree()
        group.shrink()          # rank/size/members/epoch change in place

Pieces: :class:`GroupConfig` (timeouts, heartbeats), :class:`Membership` (what an
agreement decided), :class:`Work` (``async_op=True`` handles with ``wait(timeout)``),
:func:`as_process_group` (a ``torch.distributed.ProcessGroup`` view for
``dist.*(group=...)`` and DDP), :mod:`torchnext.testing` (kill and stop real worker
processes in tests).

What not to assume: the store must live outside the workers (a launcher, agent or
test process), or losing the process that hosts it loses the job; outputs of a failed
op are undefined; a process left out of an epoch cannot come back (it gets
:class:`~torchnext.errors.StaleEpochError`) and should exit and be replaced.
"""

from __future__ import annotations

from torchnext.distributed.collectives import P2POp
from torchnext.distributed.group import FaultTolerantGroup, connect_store
from torchnext.distributed.group_config import GroupConfig
from torchnext.distributed.interop import FaultTolerantProcessGroup, as_process_group
from torchnext.distributed.membership import Membership
from torchnext.distributed.work import Work

__all__ = [
    "FaultTolerantGroup",
    "FaultTolerantProcessGroup",
    "GroupConfig",
    "Membership",
    "P2POp",
    "Work",
    "as_process_group",
    "connect_store",
]

# ---------------------------------------------------------------------------
# Other areas (flight recorder, RMA windows, training manager): add imports below
# and extend __all__ here.
# ---------------------------------------------------------------------------
from torchnext.distributed import flight_recorder  # noqa: E402 - honours TORCHNEXT_FR_ENABLE
from torchnext.distributed.flight_recorder import (  # noqa: E402
    FlightRecorder,
    FlightRecorderConfig,
)
from torchnext.distributed.launcher import Agent, AgentConfig  # noqa: E402
from torchnext.distributed.manager import Manager, ManagerConfig, StepResult  # noqa: E402
from torchnext.distributed.rma import RmaWork, StoreGroup, Window, WindowConfig  # noqa: E402
from torchnext.distributed.sampler import ElasticSampler, SamplerConfig  # noqa: E402

__all__ += [
    # flight recorder
    "FlightRecorder",
    "FlightRecorderConfig",
    "flight_recorder",
    # RMA windows
    "RmaWork",
    "StoreGroup",
    "Window",
    "WindowConfig",
    # training
    "Agent",
    "AgentConfig",
    "ElasticSampler",
    "Manager",
    "ManagerConfig",
    "SamplerConfig",
    "StepResult",
]
