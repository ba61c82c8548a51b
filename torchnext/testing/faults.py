"""Fault declarations for the multi-process harness: who fails, where, and how.

A :class:`Fault` names a rank, a *point* and a kind. Points are plain strings that a
worker passes through, either explicitly (``ctx.checkpoint("step:5")``) or implicitly
when an op of a torchnext group runs: the harness registers an op observer in every
worker, so ``"allreduce:3:before"``, ``"allreduce:3:during"`` and
``"allreduce:3:after"`` are points too (``3`` counts that op's calls in the worker,
from 0, across groups and epochs). Op names are the flight-recorder vocabulary used
by :mod:`torchnext.distributed.group.hooks` (``allreduce``, ``broadcast``, ``allgather``,
``barrier``, ``send``...).

Kinds:

* ``"kill"``: SIGKILL to the worker's whole process group (the worker and anything it
  started), like a machine that vanishes.
* ``"stop"``: SIGSTOP to the same process group, like a hung machine: sockets stay
  open, nothing answers. ``resume_after`` sends SIGCONT later (from the harness), which
  lets a test check that a process waking up in an old epoch is fenced.

Timing: a fault fires synchronously at the point (the worker signals itself, so the
point is exact), except for ``:during`` points and faults with a ``delay``, which fire
from a timer thread so the worker is inside the op when the signal lands. "During"
therefore means "``delay`` after the op was issued" (10 ms by default): make peers
arrive late, or use large tensors, if a test needs the op to be still running then.

Do not assume a fault fires: if the worker never reaches the point (it failed
earlier, or the point name is misspelt), the fault is reported in
``HarnessResult.unfired_faults``; assert on it.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from typing import Literal

__all__ = ["Fault", "FaultKind", "DURING_DEFAULT_DELAY"]

FaultKind = Literal["kill", "stop"]

DURING_DEFAULT_DELAY = timedelta(milliseconds=10)
"""Delay used for ``...:during`` points when the fault gives none."""


@dataclass(frozen=True, kw_only=True)
class Fault:
    """SIGKILL or SIGSTOP worker ``rank`` when it reaches point ``at``."""

    rank: int
    """Harness rank of the victim (initial workers are 0..N-1; spawned ones follow)."""
    at: str
    """Point name, e.g. ``"step:5"`` or ``"allreduce:3:during"``."""
    kind: FaultKind = "kill"
    """``"kill"`` (SIGKILL) or ``"stop"`` (SIGSTOP)."""
    delay: timedelta | None = None
    """Wait this long after reaching the point before signalling (from a thread).
    ``None``: 0 for most points, ``DURING_DEFAULT_DELAY`` for ``:during`` points."""
    resume_after: timedelta | None = None
    """For ``"stop"`` only: the harness sends SIGCONT this long after the stop."""

    def __post_init__(self) -> None:
        if self.rank < 0:
            raise ValueError(f"Fault.rank={self.rank} is negative; pass a harness rank >= 0")
        if not self.at or not isinstance(self.at, str):
            raise ValueError(f"Fault.at={self.at!r} must be a non-empty point name like 'step:5'")
        if self.kind not in ("kill", "stop"):
            raise ValueError(f"Fault.kind={self.kind!r}; use 'kill' (SIGKILL) or 'stop' (SIGSTOP)")
        if self.delay is not None and self.delay < timedelta(0):
            raise ValueError(f"Fault.delay={self.delay} is negative; pass a delay >= 0")
        if self.resume_after is not None:
            if self.kind != "stop":
                raise ValueError(
                    f"Fault.resume_after={self.resume_after} only applies to kind='stop'; "
                    f"this fault is kind={self.kind!r}"
                )
            if self.resume_after <= timedelta(0):
                raise ValueError(f"Fault.resume_after={self.resume_after} must be positive")

    def effective_delay(self) -> timedelta:
        """The delay actually applied (see :attr:`delay`)."""
        if self.delay is not None:
            return self.delay
        return DURING_DEFAULT_DELAY if self.at.endswith(":during") else timedelta(0)
