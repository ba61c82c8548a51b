"""One-sided communication (RMA) windows on CPU; see :mod:`torchnext.distributed.rma.window`.

``Window.create(group, tensor)`` / ``Window.allocate(group, shape, dtype)`` build a
window collectively over a :class:`~torchnext.distributed.FaultTolerantGroup` or a
:class:`StoreGroup` (plain ``torch.distributed`` jobs); then ``put``, ``get``,
``accumulate``, ``signal``/``wait_signal``, ``fence`` and ``lock``/``unlock`` work on any
member's window without the target's participation.
"""

from __future__ import annotations

from torchnext.distributed.rma._group import StoreGroup, WindowGroup
from torchnext.distributed.rma.window import AccumulateOp, RmaWork, Window, WindowConfig

__all__ = ["Window", "WindowConfig", "RmaWork", "AccumulateOp", "StoreGroup", "WindowGroup"]
