"""Test fault-tolerant distributed code with real processes and real failures.

:class:`MultiProcessHarness` starts N worker processes on loopback around a TCPStore
hosted by the test process, runs ``fn(ctx)`` in each, injects SIGKILL/SIGSTOP faults at
named points (:class:`Fault`), and reports how every worker ended (:class:`RankResult`),
with every wait bounded and no process left behind. :func:`run_workers` is the one-shot
form. See :mod:`torchnext.testing.harness` and :mod:`torchnext.testing.faults`.
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

__all__ = [
    "Fault",
    "FaultKind",
    "HarnessResult",
    "MultiProcessHarness",
    "Outcome",
    "RankResult",
    "WorkerContext",
    "run_workers",
]
