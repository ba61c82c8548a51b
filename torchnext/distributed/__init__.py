"""Fault-tolerant distributed communication for torch.distributed (gloo first, NCCL where present)."""

from __future__ import annotations

from torchnext.distributed.collectives import P2POp
from torchnext.distributed.group import FaultTolerantGroup, connect_store
from torchnext.distributed.group_config import GroupConfig
from torchnext.distributed.membership import Membership
from torchnext.distributed.work import Work

__all__ = [
    "FaultTolerantGroup",
    "GroupConfig",
    "Membership",
    "P2POp",
    "Work",
    "connect_store",
]

# ---------------------------------------------------------------------------
# Other areas (flight recorder, RMA windows, training manager): add imports below
# and extend __all__ here.
# ---------------------------------------------------------------------------
from torchnext.distributed import flight_recorder  # noqa: E402 - enables TORCHNEXT_FR_ENABLE
from torchnext.distributed.flight_recorder import (  # noqa: E402
    FlightRecorder,
    FlightRecorderConfig,
)
from torchnext.distributed.rma import RmaWork, StoreGroup, Window, WindowConfig  # noqa: E402

__all__ += [
    "FlightRecorder",
    "FlightRecorderConfig",
    "RmaWork",
    "StoreGroup",
    "Window",
    "WindowConfig",
    "flight_recorder",
]
