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

The package's names are loaded on first use: ``from torchnext.distributed import
FaultTolerantGroup`` loads the group's modules only, no trainer, launcher, recorder or
analyzer. Its products live in subpackages: :mod:`.group`, :mod:`.training`
(:class:`Manager`), :mod:`.launch` (:class:`Agent`, ``torchnext run``),
:mod:`.flight_recorder` and :mod:`.rma` (:class:`Window`). With
``TORCHNEXT_FR_ENABLE=1`` importing this package switches the flight recorder on.

What not to assume: the store must live outside the workers (a launcher, agent or
test process), or losing the process that hosts it loses the job; outputs of a failed
op are undefined; a process left out of an epoch cannot come back (it gets
:class:`~torchnext.errors.StaleEpochError`) and should exit and be replaced.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from torchnext import _env
from torchnext._lazy import lazy_exports

if TYPE_CHECKING:
    from torchnext.distributed import flight_recorder
    from torchnext.distributed.flight_recorder.recorder import (
        FlightRecorder,
        FlightRecorderConfig,
    )
    from torchnext.distributed.group.collectives import P2POp
    from torchnext.distributed.group.config import GroupConfig
    from torchnext.distributed.group.fault_tolerant_group import FaultTolerantGroup, connect_store
    from torchnext.distributed.group.interop import FaultTolerantProcessGroup, as_process_group
    from torchnext.distributed.group.membership import Membership
    from torchnext.distributed.group.work import Work
    from torchnext.distributed.launch.agent import Agent, AgentConfig
    from torchnext.distributed.launch.spares import is_spare
    from torchnext.distributed.rma import RmaWork, StoreGroup, Window, WindowConfig
    from torchnext.distributed.training.checkpoint import (
        export_checkpoint,
        latest_checkpoint,
        load_checkpoint,
        read_checkpoint,
        save_checkpoint,
    )
    from torchnext.distributed.training.config import ManagerConfig, ManagerEvent, StepResult
    from torchnext.distributed.training.ddp import FaultTolerantDDP
    from torchnext.distributed.training.manager import Manager
    from torchnext.distributed.training.sampler import ElasticSampler, SamplerConfig
    from torchnext.distributed.training.semisync import DiLoCo, SyncConfig
    from torchnext.distributed.training.state import Stateful

_EXPORTS = {
    # the group
    "FaultTolerantGroup": "group.fault_tolerant_group",
    "connect_store": "group.fault_tolerant_group",
    "FaultTolerantProcessGroup": "group.interop",
    "as_process_group": "group.interop",
    "GroupConfig": "group.config",
    "Membership": "group.membership",
    "P2POp": "group.collectives",
    "Work": "group.work",
    # flight recorder
    "flight_recorder": "flight_recorder:",
    "FlightRecorder": "flight_recorder.recorder",
    "FlightRecorderConfig": "flight_recorder.recorder",
    # RMA windows
    "RmaWork": "rma",
    "StoreGroup": "rma",
    "Window": "rma",
    "WindowConfig": "rma",
    # training and launching
    "Agent": "launch.agent",
    "AgentConfig": "launch.agent",
    "is_spare": "launch.spares",
    "ElasticSampler": "training.sampler",
    "FaultTolerantDDP": "training.ddp",
    "Manager": "training.manager",
    "ManagerConfig": "training.config",
    "ManagerEvent": "training.config",
    "SamplerConfig": "training.sampler",
    "DiLoCo": "training.semisync",
    "SyncConfig": "training.semisync",
    "Stateful": "training.state",
    "StepResult": "training.config",
    "export_checkpoint": "training.checkpoint",
    "latest_checkpoint": "training.checkpoint",
    "load_checkpoint": "training.checkpoint",
    "read_checkpoint": "training.checkpoint",
    "save_checkpoint": "training.checkpoint",
}

__all__ = [
    "Agent",
    "AgentConfig",
    "DiLoCo",
    "ElasticSampler",
    "FaultTolerantDDP",
    "FaultTolerantGroup",
    "FaultTolerantProcessGroup",
    "FlightRecorder",
    "FlightRecorderConfig",
    "GroupConfig",
    "Manager",
    "ManagerConfig",
    "ManagerEvent",
    "Membership",
    "P2POp",
    "RmaWork",
    "SamplerConfig",
    "Stateful",
    "StepResult",
    "StoreGroup",
    "SyncConfig",
    "Window",
    "WindowConfig",
    "Work",
    "as_process_group",
    "connect_store",
    "export_checkpoint",
    "flight_recorder",
    "is_spare",
    "latest_checkpoint",
    "load_checkpoint",
    "read_checkpoint",
    "save_checkpoint",
]

__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)

if _env.TORCHNEXT_FR_ENABLE.get():
    # The one eager import, and only when asked for: a job switched on from its
    # environment records from its first op.
    from torchnext.distributed.flight_recorder import recorder as _recorder

    _recorder.enable_from_env()
