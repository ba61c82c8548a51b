"""The fault-tolerant process group: epochs, membership, heartbeats and the ops on them.

Use :class:`FaultTolerantGroup` (``from torchnext.distributed import
FaultTolerantGroup`` is the same class) for collectives and point-to-point ops that
survive a member dying or hanging; :func:`as_process_group` gives a
``torch.distributed.ProcessGroup`` view of it for ``dist.*(group=...)`` and DDP.

The modules, from the bottom up: :mod:`.config` (timeouts), :mod:`.membership` (what
an agreement decided, the store keys), :mod:`.hooks` (observers of every op),
:mod:`.epoch` (one epoch's native group and its revocation), :mod:`.heartbeat`,
:mod:`.fencing` (eviction and a lost store, the ends no retry undoes),
:mod:`.work` (async handles), :mod:`.wire` (bytes each op puts on the wire),
:mod:`.backend` (builds an epoch's native group),
:mod:`.collectives` and :mod:`.p2p` (the ops), :mod:`.fault_tolerant_group` (the
group) and :mod:`.interop` (the c10d view).

What not to assume: names are loaded on first use, so importing this package loads
nothing until a name is read.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from torchnext._lazy import lazy_exports

if TYPE_CHECKING:
    from torchnext.distributed.group.collectives import P2POp
    from torchnext.distributed.group.config import GroupConfig
    from torchnext.distributed.group.fault_tolerant_group import (
        FaultTolerantGroup,
        connect_store,
        live_groups,
    )
    from torchnext.distributed.group.interop import FaultTolerantProcessGroup, as_process_group
    from torchnext.distributed.group.membership import Membership
    from torchnext.distributed.group.work import Work

__all__ = [
    "FaultTolerantGroup",
    "FaultTolerantProcessGroup",
    "GroupConfig",
    "Membership",
    "P2POp",
    "Work",
    "as_process_group",
    "connect_store",
    "live_groups",
]

__getattr__, __dir__ = lazy_exports(
    __name__,
    {
        "FaultTolerantGroup": "fault_tolerant_group",
        "connect_store": "fault_tolerant_group",
        "live_groups": "fault_tolerant_group",
        "FaultTolerantProcessGroup": "interop",
        "as_process_group": "interop",
        "GroupConfig": "config",
        "Membership": "membership",
        "P2POp": "collectives",
        "Work": "work",
    },
)
