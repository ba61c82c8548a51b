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
from typing import Any

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

    def check(self, workers: list[WorkerProcess]) -> None:
        """Look for the running ``workers``' eviction marks, in one store request where the
        store reads many keys at once (etcd: one transaction, not one per worker); end an
        evicted worker that cannot leave by itself."""
        fresh = [
            w for w in workers if w.member_id not in self._since and w.member_id not in self._killed
        ]
        if fresh:
            keys = [EVICTED_KEY_PREFIX + w.member_id for w in fresh]
            marks = self.link.call(lambda store: _present(store, keys), [False] * len(keys))
            for worker, marked in zip(fresh, marks, strict=True):
                if marked:
                    self._mark(worker)
        for worker in workers:
            member = worker.member_id
            if member in self._since and member not in self._killed:
                self._end_if_stuck(worker)

    def _mark(self, worker: WorkerProcess) -> None:
        self._since[worker.member_id] = time.monotonic()
        if not is_stopped(worker.proc):
            self._emit(
                f"{worker.member_id} was evicted by the group; giving it {self.grace} to exit "
                "by itself before killing it",
                worker.member_id,
            )

    def _end_if_stuck(self, worker: WorkerProcess) -> None:
        member = worker.member_id
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


def _present(store: Any, keys: list[str]) -> list[bool]:
    """Which of ``keys`` exist: one request on a store that reads many keys at once (etcd's
    ``read_many``), else a ``check`` each (a TCP store answers those in microseconds)."""
    read_many = getattr(store, "read_many", None)
    if callable(read_many):
        return [value is not None for value in read_many(keys)]
    return [bool(store.check([key])) for key in keys]
