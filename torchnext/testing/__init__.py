"""Test fault-tolerant distributed code with real processes and real failures.

:class:`MultiProcessHarness` starts N worker processes on loopback around a TCPStore
hosted by the test process, runs ``fn(ctx)`` in each, injects SIGKILL/SIGSTOP faults at
named points (:class:`Fault`), and reports how every worker ended (:class:`RankResult`),
with every wait bounded and no process left behind. :func:`run_workers` is the one-shot
form. See :mod:`torchnext.testing.harness` and :mod:`torchnext.testing.faults`.

:class:`TestHosts` makes several *machines* on one Linux box (network namespaces on a
bridge, root only) and fails them whole: ``power_off``, ``freeze``, ``partition``,
``kill_agent``. See :mod:`torchnext.testing.hosts`.
"""

from __future__ import annotations

from torchnext.testing._worker import WorkerContext
from torchnext.testing.faults import Fault, FaultKind
from torchnext.testing.harness import (
    HarnessResult,
    MultiProcessHarness,
    Outcome,
    RankResult,
    run_workers,
)
from torchnext.testing.hosts import (
    HostFault,
    TestHost,
    TestHosts,
    hosts_unavailable_reason,
    requires_test_hosts,
)

__all__ = [
    "Fault",
    "FaultKind",
    "HarnessResult",
    "HostFault",
    "MultiProcessHarness",
    "Outcome",
    "RankResult",
    "TestHost",
    "TestHosts",
    "WorkerContext",
    "hosts_unavailable_reason",
    "requires_test_hosts",
    "run_workers",
]
