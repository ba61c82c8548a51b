"""The private parts of ``torch.distributed`` that torchnext's distributed layer uses.

Every access to a c10d internal from :mod:`torchnext.distributed` goes through this
module, so a torch release that moves one breaks one place, and the table below says
what was checked. Use these names instead of reaching into ``torch._C`` or
``torch.distributed.distributed_c10d`` directly.

========================================  ==========================================  ==============
access                                    what for                                    tested on
========================================  ==========================================  ==============
``distributed_c10d._world``               register a group view's ranks and name      2.13.0, 2.14.1
``distributed_c10d._get_default_group``   the world group behind ``group=None``       2.13.0, 2.14.1
``distributed_c10d._get_process_group_name``  a group's registered name               2.13.0, 2.14.1
``torch._C._distributed_c10d.Work``       base class of a Python c10d work handle     2.13.0, 2.14.1
``torch._C._distributed_c10d.AllgatherOptions``  options of all-gather calls          2.13.0, 2.14.1
``ProcessGroup._allgather_base``          all-gather into one flat tensor             2.13.0, 2.14.1
``ProcessGroup._reduce_scatter_base``     reduce-scatter from one flat tensor         2.13.0, 2.14.1
``ProcessGroupNCCL.Options._timeout``     an NCCL group's collective timeout          2.14.1 (CUDA)
``torch._C._distributed_c10d.ReconfigureOptions``  gloo's in-place reconfigure        2.14.1 only
========================================  ==========================================  ==============

The conformance suite runs the distributed tests on 2.14.1 and the unit suite on
2.13.0. What not to assume: these are not torch's public API; torch may change any of
them in a release without notice, which is why they sit here.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import torch.distributed as dist
import torch.distributed.distributed_c10d as c10d
from torch._C import _distributed_c10d as _c10d

__all__ = [
    "AllgatherOptions",
    "C10dWork",
    "allgather_base",
    "c10d_world",
    "default_group",
    "has_native_reconfigure",
    "process_group_name",
    "reconfigure_options",
    "reduce_scatter_base",
    "set_nccl_timeout",
]

C10dWork: Any = _c10d.Work
"""The c10d ``Work`` class a Python work handle subclasses to be accepted by DDP."""

AllgatherOptions: Any = _c10d.AllgatherOptions
"""Options of ``ProcessGroup.allgather`` and ``_allgather_base``."""


def c10d_world() -> Any:
    """torch.distributed's registry of groups (ranks and names of every group)."""
    return c10d._world


def default_group() -> Any:
    """The default (world) process group; raises if none was initialised."""
    return c10d._get_default_group()


def process_group_name(pg: Any) -> str:
    """The name torch.distributed registered ``pg`` under."""
    return str(c10d._get_process_group_name(pg))


def allgather_base(pg: Any, output: Any, input: Any, opts: Any) -> Any:
    """``pg``'s all-gather of ``input`` into the flat ``output`` (returns the work)."""
    return pg._allgather_base(output, input, opts)


def reduce_scatter_base(pg: Any, output: Any, input: Any, opts: Any) -> Any:
    """``pg``'s reduce-scatter of the flat ``input`` into ``output`` (returns the work)."""
    return pg._reduce_scatter_base(output, input, opts)


def set_nccl_timeout(opts: Any, timeout: timedelta) -> None:
    """Set the collective timeout of a ``ProcessGroupNCCL.Options``."""
    opts._timeout = timeout


def has_native_reconfigure() -> bool:
    """Whether this torch's gloo groups can be reconfigured in place (torch >= 2.14)."""
    return hasattr(dist.ProcessGroupGloo, "reconfigure") and hasattr(_c10d, "ReconfigureOptions")


def reconfigure_options() -> Any:
    """A new ``ReconfigureOptions`` (torch >= 2.14; check :func:`has_native_reconfigure`)."""
    cls = getattr(_c10d, "ReconfigureOptions", None)
    if cls is None:
        raise RuntimeError(
            "reconfigure_options: this torch has no native gloo reconfigure (it came in "
            "torch 2.14); leave GroupConfig.native_reconfigure False"
        )
    return cls()
