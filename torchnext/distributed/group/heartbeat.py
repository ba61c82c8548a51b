"""The per-process monitor thread of a fault-tolerant group: heartbeats, revoke watch.

One daemon thread per group does, every ``poll_interval``, one store round trip to
see whether the current epoch (or one of its split sub-groups) was revoked; and every
``heartbeat_interval`` it bumps this member's heartbeat counter, reads every peer's
counter in one ``multi_get``, probes same-host peers' processes in ``/proc``, reads
the latest epoch (fencing), and tracks pending joiners.

Liveness is judged by *change*, in this process's monotonic clock: a peer whose
counter has not moved for ``heartbeat_timeout`` is suspected. No wall clocks are
compared across hosts, so clock skew cannot cause false suspicions.

The monitor never sits on an op's critical path: ops read one attribute (is my epoch
revoked?) and the monitor writes it. Its callbacks run on the monitor thread and must
not block for long. Do not assume it sees a revoke instantly: allow ``poll_interval``.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from torchnext.distributed.group.config import GroupConfig
from torchnext.distributed.group.membership import Keys, ProcessRecord, probe_process

__all__ = ["Monitor", "Watch"]

logger = logging.getLogger(__name__)


@dataclass
class Watch:
    """What the monitor watches for the current epoch."""

    epoch: int
    members: tuple[str, ...]
    revoke_keys: dict[str, Callable[[bytes], None]]
    """Store key -> callback(value) when it appears (epoch and sub-group revokes)."""
    on_suspects: Callable[[list[str], str], None]
    """Called with failed members and a reason (once per member per epoch)."""
    on_stale: Callable[[int], None]
    """Called with the latest epoch when it is newer than ``epoch`` (fencing)."""


class Monitor:
    """Background heartbeat writer and failure watcher; see the module docstring."""

    def __init__(self, store: Any, keys: Keys, member_id: str, config: GroupConfig) -> None:
        self._store = store
        self._keys = keys
        self._me = member_id
        self._config = config
        self._watch: Watch | None = None
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._counts: dict[str, bytes] = {}
        self._changed_at: dict[str, float] = {}
        self._records: dict[str, ProcessRecord | None] = {}
        self._reported: set[tuple[int, str]] = set()
        self._joiners: list[str] = []
        self._joiner_count = 0
        self._admitted: set[str] = set()
        self._store_error_since: float | None = None
        self.store_error: BaseException | None = None
        self.track_joiners = False
        self._housekeeping: list[Callable[[], None]] = []

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> None:
        self._beat()
        self._thread = threading.Thread(
            target=self._run, name=f"torchnext-ft-monitor-{self._me}", daemon=True
        )
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=max(1.0, 3 * self._config.poll_interval.total_seconds()))

    def set_watch(self, watch: Watch | None) -> None:
        with self._lock:
            self._watch = watch
            if watch is not None:
                now = time.monotonic()
                for m in watch.members:
                    # A member first seen now gets a full heartbeat_timeout of credit.
                    self._changed_at.setdefault(m, now)

    def add_revoke_key(self, key: str, callback: Callable[[bytes], None]) -> None:
        with self._lock:
            if self._watch is not None:
                self._watch.revoke_keys[key] = callback

    def add_housekeeping(self, fn: Callable[[], None]) -> None:
        self._housekeeping.append(fn)

    # ------------------------------------------------------------------ queries

    def failure_of(self, member: str) -> str | None:
        """Why ``member`` is considered failed now, or None if it looks alive."""
        if member == self._me:
            return None
        state = self._probe(member)
        if state == "dead":
            return "process is gone"
        changed = self._changed_at.get(member)
        timeout_s = self._config.heartbeat_timeout.total_seconds()
        if changed is not None and time.monotonic() - changed > timeout_s:
            what = "stopped" if state == "stopped" else "unresponsive"
            return f"{what}: no heartbeat for over {self._config.heartbeat_timeout}"
        return None

    def is_dead(self, member: str) -> bool:
        """True only when a same-host probe shows ``member``'s process is gone."""
        return member != self._me and self._probe(member) == "dead"

    def failed_members(self, members: tuple[str, ...]) -> list[str]:
        return [m for m in members if self.failure_of(m) is not None]

    def pending_joiners(self) -> list[str]:
        """Registered joiners that are not admitted yet and look alive, in registration order."""
        self.track_joiners = True
        with self._lock:
            joiners = [j for j in self._joiners if j not in self._admitted]
        return [j for j in joiners if self.failure_of(j) is None]

    def refresh_joiners(self) -> None:
        """Re-read the joiner registry now (the monitor also does it every heartbeat)."""
        self.track_joiners = True
        self._poll_joiners()

    # ------------------------------------------------------------------ internals

    def _probe(self, member: str) -> str:
        if not self._config.probe_local_pids:
            return "unknown"
        if member not in self._records:
            key = self._keys.process(member)
            try:
                record = (
                    ProcessRecord.decode(self._store.get(key)) if self._store.check([key]) else None
                )
            except Exception:  # noqa: BLE001 - no record: rely on heartbeats
                record = None
            if record is None:
                return "unknown"
            self._records[member] = record
        record = self._records[member]
        return "unknown" if record is None else probe_process(record)

    def _beat(self) -> None:
        self._store.add(self._keys.heartbeat(self._me), 1)

    def _run(self) -> None:
        poll_s = self._config.poll_interval.total_seconds()
        beat_s = self._config.heartbeat_interval.total_seconds()
        next_beat = time.monotonic() + beat_s
        while not self._stop.wait(poll_s):
            try:
                self._check_revokes()
                now = time.monotonic()
                if now >= next_beat:
                    next_beat = now + beat_s
                    self._beat()
                    self._check_liveness()
                    for fn in self._housekeeping:
                        fn()
                self._store_error_since = None
            except Exception as exc:  # noqa: BLE001 - the store may be briefly unreachable
                if self._stop.is_set():
                    return
                now = time.monotonic()
                if self._store_error_since is None:
                    self._store_error_since = now
                elif now - self._store_error_since > self._config.store_timeout.total_seconds():
                    self.store_error = exc
                    watch = self._watch
                    if watch is not None:
                        watch.on_suspects(
                            [], f"store unreachable for over {self._config.store_timeout}: {exc}"
                        )
                    self._store_error_since = now

    def _check_revokes(self) -> None:
        watch = self._watch
        if watch is None:
            return
        for key, callback in list(watch.revoke_keys.items()):
            if self._store.check([key]):
                value = self._store.get(key)
                with self._lock:
                    watch.revoke_keys.pop(key, None)
                callback(value)

    def _check_liveness(self) -> None:
        watch = self._watch
        if watch is None:
            return
        if self.track_joiners:
            self._poll_joiners()
        with self._lock:
            pending = [j for j in self._joiners if j not in self._admitted]
        peers = [m for m in watch.members if m != self._me] + pending
        if peers:
            values = self._store.multi_get([self._keys.heartbeat(m) for m in peers])
            now = time.monotonic()
            for m, v in zip(peers, values, strict=True):
                if self._counts.get(m) != v:
                    self._counts[m] = v
                    self._changed_at[m] = now
        latest = self._store.add(self._keys.latest_epoch(), 0)
        if latest > watch.epoch:
            watch.on_stale(latest)
        failed: list[str] = []
        reasons: list[str] = []
        for m in watch.members:
            if (watch.epoch, m) in self._reported:
                continue
            why = self.failure_of(m)
            if why is not None:
                self._reported.add((watch.epoch, m))
                failed.append(m)
                reasons.append(f"{m}: {why}")
        if failed:
            watch.on_suspects(failed, "; ".join(reasons))

    def _poll_joiners(self) -> None:
        count = int(self._store.add(self._keys.joiner_count(), 0))
        if count > self._joiner_count:
            slots = [self._keys.joiner_slot(i) for i in range(self._joiner_count, count)]
            ids = [v.decode() for v in self._store.multi_get(slots)]
            now = time.monotonic()
            with self._lock:
                for j in ids:
                    if j not in self._joiners:
                        self._joiners.append(j)
                        self._changed_at.setdefault(j, now)
            self._joiner_count = count
        for j in list(self._joiners):
            if j not in self._admitted and self._store.check([self._keys.admitted(j)]):
                with self._lock:
                    self._admitted.add(j)
