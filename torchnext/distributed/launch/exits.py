"""How the agent classifies and reports the exit of a worker process.

Each exit gets one kind: *finished* (code 0); *crashed* (killed by a signal) or
*evicted* (code :data:`EXIT_EVICTED`), both worth a replacement; *store_lost* (code
:data:`EXIT_STORE_LOST`: the job's store stopped answering), replaced once the agent
reaches the store again; *raised* (the worker
left the traceback of an uncaught exception: a bug, never restarted); *terminated*
(stopped by the agent); *failed* (any other code). A raised exit is reported with the
user's traceback, once: a worker that wrote the traceback for the agent does not
print it too, and when several workers raise the same exception the later reports
point at the first one instead of repeating it.
"""

from __future__ import annotations

import signal
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal

__all__ = [
    "EXIT_EVICTED",
    "EXIT_STORE_LOST",
    "ExitKind",
    "WorkerExit",
    "classify_exit",
    "exit_message",
    "job_exit_code",
]

EXIT_EVICTED = 75
"""Exit code of a worker that found itself fenced out of the group (replace it)."""

EXIT_STORE_LOST = 76
"""Exit code of a worker whose store did not answer for the store timeout
(:class:`~torchnext.errors.StoreLostError`): its host is down, or this one cut off."""

ExitKind = Literal["finished", "crashed", "evicted", "store_lost", "raised", "failed", "terminated"]


@dataclass(frozen=True, kw_only=True)
class WorkerExit:
    """How one worker process ended."""

    member_id: str
    slot: int
    pid: int
    returncode: int
    kind: ExitKind
    traceback: str = ""
    runtime_s: float = 0.0
    role: str = "worker"
    """``worker``, or ``spare`` for a warm spare that exited before it was assigned."""

    def describe(self) -> str:
        if self.kind == "finished":
            how = "finished"
        elif self.kind == "crashed":
            try:
                name = signal.Signals(-self.returncode).name
            except ValueError:
                name = f"signal {-self.returncode}"
            how = f"killed by {name}"
        elif self.kind == "evicted":
            how = "was evicted by the group (it hung or was cut off) and exited"
        elif self.kind == "store_lost":
            how = "lost the job's store (no answer for the store timeout) and exited"
        elif self.kind == "terminated":
            how = "was stopped by the agent"
        elif self.kind == "raised":
            how = "raised an exception (a bug; not restarted)"
        else:
            how = f"exited with code {self.returncode}"
        return f"{self.role} {self.member_id} (pid {self.pid}) {how} after {self.runtime_s:.1f} s"


def classify_exit(returncode: int, *, raised: bool, stopping: bool) -> ExitKind:
    """The kind of an exit; ``raised``: the worker left a traceback; ``stopping``: the
    agent was stopping its workers when this one exited."""
    if raised:
        return "raised"
    if returncode == 0:
        return "finished"
    if stopping:
        return "terminated"
    if returncode < 0:
        return "crashed"
    if returncode == EXIT_EVICTED:
        return "evicted"
    if returncode == EXIT_STORE_LOST:
        return "store_lost"
    return "failed"


def exit_message(info: WorkerExit, shown: dict[str, str]) -> str:
    """The report of one exit: its description, then its traceback unless already shown.

    ``shown`` maps each traceback text reported so far to the member that showed it;
    this call adds ``info``'s traceback to it.
    """
    message = info.describe()
    if not info.traceback:
        return message
    first = shown.setdefault(info.traceback, info.member_id)
    if first == info.member_id:
        return message + "\n" + info.traceback.rstrip()
    return message + f"; the same traceback as {first}'s, shown above"


def job_exit_code(exits: Iterable[WorkerExit], *, job_finished: bool = False) -> int:
    """0 when the job finished (a worker finished, here or, with ``job_finished``, on
    another node) and none raised here; 1 otherwise."""
    kinds = [e.kind for e in exits]
    if "raised" in kinds or ("finished" not in kinds and not job_finished):
        return 1
    return 0
