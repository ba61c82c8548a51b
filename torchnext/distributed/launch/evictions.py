"""Workers the group evicted: each leaves by itself, or the agent ends it.

Use :class:`EvictionWatch` from the agent. The survivors of a failure mark every member
they left out (``EVICTED_KEY_PREFIX + member``) so that the agent running it can replace
it. A member that can still act learns of its eviction by itself (its group's monitor
reads the decision that ended its epoch: a host cut off from the others that came back,
a process that was descheduled too long) and exits with ``EXIT_EVICTED``; the agent
gives it ``evict_grace`` to do so. One that cannot act - stopped (SIGSTOP, a debugger),
or still silent when the grace ends - is killed (SIGKILL), and its exit is reported as
an eviction, not a crash.

What not to assume: the eviction mark is best effort (the survivors may fail to write
it); a member that was evicted without a mark still exits by itself once it reaches the
store, so the agent replaces it from its exit code alone.
"""

from __future__ import annotations

import signal
import time
from collections.abc import Callable
from datetime import timedelta

from torchnext.distributed.launch.exits import ExitKind
from torchnext.distributed.launch.keys import EVICTED_KEY_PREFIX
from torchnext.distributed.launch.process import WorkerProcess, is_stopped, signal_process
from torchnext.distributed.launch.store_link import StoreLink

__all__ = ["EvictionWatch"]

Emit = Callable[[str, str], None]
"""``emit(message, member_id)``: reports an ``evicting`` event."""


class EvictionWatch:
    """Tracks this agent's evicted workers (see the module docstring)."""

    def __init__(self, link: StoreLink, *, grace: timedelta, emit: Emit) -> None:
        self.link = link
        self.grace = grace
        self._emit = emit
        self._since: dict[str, float] = {}
        """Member -> when the agent saw its eviction mark."""
        self._killed: set[str] = set()

    def check(self, worker: WorkerProcess) -> None:
        """Look for ``worker``'s eviction mark; end the worker if it cannot leave by itself."""
        member = worker.member_id
        if member in self._killed:
            return
        if member not in self._since:
            key = EVICTED_KEY_PREFIX + member
            if not self.link.call(lambda store: bool(store.check([key])), False):
                return
            self._since[member] = time.monotonic()
            if not is_stopped(worker.proc):
                self._emit(
                    f"{member} was evicted by the group; giving it {self.grace} to exit by "
                    "itself before killing it",
                    member,
                )
        stopped = is_stopped(worker.proc)
        if stopped or time.monotonic() - self._since[member] >= self.grace.total_seconds():
            why = "it is stopped" if stopped else f"it did not exit within {self.grace}"
            self._emit(f"{member} was evicted by the group and {why}; killing it", member)
            signal_process(worker.proc, signal.SIGKILL)
            self._killed.add(member)

    def exited(self, worker: WorkerProcess, kind: ExitKind) -> ExitKind:
        """Forget ``worker``'s mark; the kind of its exit (a killed evictee: evicted)."""
        member = worker.member_id
        if member not in self._since:
            return kind
        del self._since[member]
        key = EVICTED_KEY_PREFIX + member
        self.link.call(lambda store: store.delete_key(key), False)
        if member in self._killed:
            self._killed.discard(member)
            if kind == "crashed":
                return "evicted"
        return kind
