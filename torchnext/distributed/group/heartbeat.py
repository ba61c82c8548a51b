"""The per-process monitor thread of a fault-tolerant group: heartbeats, revoke watch.

One daemon thread per group does, every ``poll_interval``, one store round trip to
see whether the current epoch (or one of its split sub-groups) was revoked; and every
``heartbeat_interval`` it bumps this member's heartbeat counter, reads every peer's
counter in one ``multi_get``, probes same-host peers' processes in ``/proc``, reads
the latest epoch (fencing), and tracks pending joiners.

Liveness is judged by *change*, in this process's monotonic clock: a peer whose
counter has not moved for ``heartbeat_timeout`` is suspected. No wall clocks are
compared across hosts, so clock skew cannot cause false suspicions. Silence is counted
only while this monitor watches: a peer's silence is measured up to this monitor's
latest successful read; of a long gap between two reads (this process was
descheduled, the store was slow) only half a ``heartbeat_timeout`` is counted against a
peer that did not beat meanwhile; and after a store outage (calls failed) every peer
starts again as after such a gap, showing half a ``heartbeat_timeout`` of silence. So a
loaded machine, or a store that paused or failed over, delays detection (by at most the
pause) instead of causing false suspicions.

Fencing: when the latest epoch is newer than this member's and the decision that ended
its epoch leaves it out, the member was evicted (a host cut off from the others that
came back): the watch's ``on_evicted`` is told at once, so the process learns it within
a heartbeat interval of reaching the store again and can exit for a replacement.

The store itself: the monitor's calls are bounded by a short timeout (about
``heartbeat_timeout``); a call that fails starts an outage, and an outage longer than
``store_timeout`` means the store is lost (its host is down, or this host is cut off):
the watch's ``on_store_lost`` gets a :class:`~torchnext.errors.StoreLostError` naming
the store and the fix, and the monitor stops.

On an etcd store a second thread waits for the epoch's revoke key (an etcd watch) and
wakes the monitor, which then polls only at each heartbeat: polling every
``poll_interval`` would cost the cluster 50 requests a second per member.

The monitor never sits on an op's critical path: ops read one attribute (is my epoch
revoked?) and the monitor writes it. Its callbacks run on the monitor thread and must
not block for long. Do not assume it sees a revoke instantly: allow ``poll_interval``.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from torchnext.distributed.group.beacon import Beacon, advertised_ip
from torchnext.distributed.group.config import GroupConfig
from torchnext.distributed.group.membership import Keys, Membership, ProcessRecord, probe_process
from torchnext.distributed.group.monitor_bounds import (
    gap_allowance_s,
    monitor_call_timeout,
    normal_gap_s,
    store_lost_error,
    waits_cheaply,
)
from torchnext.errors import StoreLostError

__all__ = ["Monitor", "Watch"]

logger = logging.getLogger(__name__)

_HOST_SIBLING_FRACTION = 0.5
"""A member silent for this fraction of ``heartbeat_timeout`` fails with a host sibling
that is silent for all of it (a live member is silent for about one heartbeat interval)."""

_REVOKE_WAIT_SLICE = timedelta(seconds=1)
"""How long one wait for a revoke key lasts before it is re-armed (on a new epoch's key)."""


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
    on_evicted: Callable[[Membership], None] | None = None
    """Called once with the decision that ended ``epoch`` without this member."""
    on_store_lost: Callable[[StoreLostError], None] | None = None
    """Called once when the store has not answered for ``store_timeout``."""


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
        self._counts: dict[str, bytes | None] = {}
        self._changed_at: dict[str, float] = {}
        self._observed_at: float | None = None
        """When the last read of every peer's counter returned (silence is counted to it)."""
        self._records: dict[str, ProcessRecord | None] = {}
        self._reported: set[tuple[int, str]] = set()
        self._evicted_epochs: set[int] = set()
        self._joiners: list[str] = []
        self._joiner_count = 0
        self._admitted: set[str] = set()
        self._last_ok = time.monotonic()
        self._outage: BaseException | None = None
        self.store_error: StoreLostError | None = None
        """Set once the store has not answered for ``store_timeout`` (the monitor then stops)."""
        self.longest_silence_s = 0.0
        """The longest silence of a peer that then beat again (how close live peers came
        to ``heartbeat_timeout``; a diagnostic)."""
        self.track_joiners = False
        self._housekeeping: list[Callable[[], None]] = []
        self._beats = 0
        self._set_and_read: Callable[[str, str, list[str]], list[bytes | None]] | None = getattr(
            store, "set_and_read", None
        )
        """One request that beats and reads everything a heartbeat needs (etcd), if the
        store has it; else one call each (cheap on a ``TCPStore``)."""
        self._wake = threading.Event()
        self._waiter: threading.Thread | None = None
        try:
            store.set_timeout(monitor_call_timeout(config))
        except (AttributeError, RuntimeError):
            pass  # a store without set_timeout keeps its own bounds
        self._beacon: Beacon | None = None
        self._beacon_refresh_at = 0.0
        if config.beacons:
            allowance = timedelta(seconds=gap_allowance_s(config))
            self._beacon = Beacon(
                tag=keys.root,
                member=member_id,
                interval=config.heartbeat_interval,
                stall_allowance=allowance,
                ip=advertised_ip(store),
            )
            self._beacon.on_look = self._judge_by_beacon

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> None:
        if self._beacon is not None:
            try:
                self._beacon.start()
            except OSError as exc:
                logger.warning("%s: no heartbeat datagrams (%s): the store judges", self._me, exc)
                self._beacon = None
            else:
                record = ProcessRecord.current(self._beacon.address)
                self._store.set(self._keys.process(self._me), record.encode())
        self._beat()
        self._last_ok = time.monotonic()
        if waits_cheaply(self._store):
            self._waiter = threading.Thread(
                target=self._wait_for_revokes, name=f"torchnext-ft-revokes-{self._me}", daemon=True
            )
            self._waiter.start()
        self._thread = threading.Thread(
            target=self._run, name=f"torchnext-ft-monitor-{self._me}", daemon=True
        )
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        if self._beacon is not None:
            self._beacon.stop()
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

    @property
    def beacon_address(self) -> str:
        """``ip:port`` of this member's heartbeat datagrams; empty without them."""
        return "" if self._beacon is None else self._beacon.address

    def store_answering(self) -> bool:
        """False once the store has not answered this monitor for longer than a stall."""
        return time.monotonic() - self._last_ok <= gap_allowance_s(self._config)

    def silence_s(self, member: str) -> float:
        """How long ``member``'s counter has not moved, as of this monitor's last read."""
        changed, observed = self._changed_at.get(member), self._observed_at
        if changed is None or observed is None:
            return 0.0
        return max(0.0, observed - changed)

    def failure_of(self, member: str) -> str | None:
        """Why ``member`` is considered failed now, or None if it looks alive.

        A member silent for over ``heartbeat_timeout`` has failed; so has one on another
        host silent for over half of it when a member of the same host is silent for over
        all of it: a host that lost power or its network takes its members together, and
        they are ruled out together (one agreement, one shrink) instead of each at its
        own timeout.
        """
        if member == self._me:
            return None
        state = self._probe(member)
        if state == "dead":
            return "process is gone"
        timeout_s = self._config.heartbeat_timeout.total_seconds()
        silence = self.silence_s(member)
        if silence > timeout_s:
            what = "stopped" if state == "stopped" else "unresponsive"
            return f"{what}: no heartbeat for over {self._config.heartbeat_timeout}"
        if silence > timeout_s * _HOST_SIBLING_FRACTION:
            sibling = self._silent_sibling(member, timeout_s)
            if sibling is not None:
                return (
                    f"unresponsive: no heartbeat for {silence:.2f} s, like {sibling} of the "
                    f"same host (none for over {self._config.heartbeat_timeout}): the host is silent"
                )
        return None

    def _silent_sibling(self, member: str, timeout_s: float) -> str | None:
        """Another member of the current epoch on ``member``'s host, silent for over
        ``timeout_s``, if any. Never on this monitor's own host: there a process that
        is alive is seen alive (``/proc``), so one silent process says nothing of others."""
        host, watch = self._host_of(member), self._watch
        if host is None or host == socket.gethostname() or watch is None:
            return None
        for other in watch.members:
            if other in (member, self._me) or self.silence_s(other) <= timeout_s:
                continue
            if self._host_of(other) == host:
                return other
        return None

    def _host_of(self, member: str) -> str | None:
        record = self._record(member)
        return None if record is None else record.host

    def is_dead(self, member: str) -> bool:
        """True only when a same-host probe shows ``member``'s process is gone."""
        return member != self._me and self._probe(member) == "dead"

    def failed_members(self, members: tuple[str, ...]) -> list[str]:
        return [m for m in members if self.failure_of(m) is not None]

    def pending_joiners(self) -> list[str]:
        """Registered joiners that are not admitted yet and look alive, in registration order."""
        self.track_joiners = True
        with self._lock:
            # A joiner the last grow admitted is a member now, even before this monitor
            # reads its admission key (the registry is read once a heartbeat).
            members = set(self._watch.members) if self._watch is not None else set()
            joiners = [j for j in self._joiners if j not in self._admitted and j not in members]
        return [j for j in joiners if self.failure_of(j) is None]

    def refresh_joiners(self) -> None:
        """Re-read the joiner registry now (the monitor also does it every heartbeat)."""
        self.track_joiners = True
        self._poll_joiners()

    # ------------------------------------------------------------------ internals

    def _record(self, member: str) -> ProcessRecord | None:
        """Where ``member`` runs (its published record; cached once found)."""
        if member not in self._records:
            key = self._keys.process(member)
            try:
                record = (
                    ProcessRecord.decode(self._store.get(key)) if self._store.check([key]) else None
                )
            except Exception:  # noqa: BLE001 - no record: rely on heartbeats
                record = None
            if record is None:
                return None
            self._records[member] = record
        return self._records[member]

    def _probe(self, member: str) -> str:
        if not self._config.probe_local_pids:
            return "unknown"
        record = self._record(member)
        return "unknown" if record is None else probe_process(record)

    def _beat_value(self) -> str:
        # Each member is its key's only writer, so a plain set does (no atomic add: on
        # etcd that is a compare-and-swap); the pid tells a restarted process's count apart.
        self._beats += 1
        return f"{os.getpid()}.{self._beats}"

    def _beat(self) -> None:
        self._store.set(self._keys.heartbeat(self._me), self._beat_value())

    def _run(self) -> None:
        poll_s = self._config.poll_interval.total_seconds()
        beat_s = self._config.heartbeat_interval.total_seconds()
        if self._waiter is not None:
            poll_s = max(poll_s, beat_s)  # the waiter wakes the loop; polling is a fallback
        next_beat = time.monotonic() + beat_s
        while True:
            self._wake.wait(poll_s)
            self._wake.clear()
            if self._stop.is_set():
                return
            try:
                now = time.monotonic()
                beat_due = now + poll_s / 2 >= next_beat  # a wait may end a hair early
                if beat_due:
                    next_beat = now + beat_s
                if beat_due and self._set_and_read is not None:
                    self._heartbeat_in_one_request()
                else:
                    self._check_revokes()
                    if beat_due:
                        self._beat()
                        self._check_liveness()
                if beat_due:
                    for fn in self._housekeeping:
                        fn()
                self._store_answered()
            except Exception as exc:  # noqa: BLE001 - the store may be briefly unreachable
                if self._stop.is_set():
                    return
                if self._store_failed(exc):
                    return

    def _store_answered(self) -> None:
        self._last_ok = time.monotonic()
        if self._outage is not None:
            # Nothing this monitor could not see is held against anyone: every peer
            # starts again as after a stall, with the stall allowance of silence, so a
            # peer that died with the store's host is suspected heartbeat_timeout minus
            # that allowance after the store answers, not a whole timeout later. A live
            # peer's outage ends at most one store call after this one's (a request held
            # by a member that died, a retry pause: under 0.5 s on etcd with its 0.3 s
            # request timeout), well within what is left of the timeout.
            logger.info("%s: the store answers again after an outage", self._me)
            self._outage = None
            self._observed_at = None
            shown = self._last_ok - gap_allowance_s(self._config)
            self._changed_at = dict.fromkeys(self._changed_at, shown)

    def _store_failed(self, exc: BaseException) -> bool:
        """Note a failed store call; True once the store is lost (the monitor stops)."""
        if self._outage is None:
            logger.warning("%s: store call failed, retrying: %s", self._me, exc)
        self._outage = exc
        silent = time.monotonic() - self._last_ok
        if silent <= self._config.store_timeout.total_seconds():
            # A client may reconnect on its next call; pace the retries a little.
            self._stop.wait(self._config.poll_interval.total_seconds() * 5)
            return False
        error = store_lost_error(self._store, self._config.store_timeout, exc)
        self.store_error = error
        watch = self._watch
        if watch is not None:
            if watch.on_store_lost is not None:
                watch.on_store_lost(error)
            else:
                watch.on_suspects([], str(error))
        return True

    def _wait_for_revokes(self) -> None:
        """On a store whose waits are cheap server-side watches (etcd), wait for the
        epoch's revoke key and wake the monitor at once, instead of polling for it every
        ``poll_interval`` (50 requests a second per member, most of an etcd cluster's
        capacity on a small machine). Each slice is one read and one watch
        (``wait_for_value``); the monitor still reads the key at every heartbeat, which
        covers a key that changed (a new epoch) while a slice on the old one ran."""
        store = self._store.clone()
        wait_for_value = getattr(store, "wait_for_value", None)
        pause_s = self._config.poll_interval.total_seconds()
        while not self._stop.is_set():
            watch = self._watch
            keys = list(watch.revoke_keys)[:1] if watch is not None else []
            if not keys:
                self._stop.wait(pause_s)
                continue
            try:
                if wait_for_value is not None:
                    if wait_for_value(keys[0], _REVOKE_WAIT_SLICE) is None:
                        continue  # the slice ran out: watch again
                else:
                    store.wait(keys, _REVOKE_WAIT_SLICE)
            except Exception:  # noqa: BLE001 - no revoke within the slice, or a failing store
                self._stop.wait(pause_s)
                continue
            self._wake.set()
            self._stop.wait(pause_s)  # the monitor takes the key off the watch meanwhile
        close = getattr(store, "close", None)
        if callable(close):
            close()

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

    def _read_counters(self, peers: list[str]) -> None:
        """Read every peer's counter. A gap since the previous read longer than
        :func:`_gap_allowance_s` (this process stalled, the store was slow or away) is
        credited to every peer that did not beat meanwhile, so that what this monitor
        could not watch is not held against anyone."""
        self._note_counters(peers, self._store.multi_get([self._keys.heartbeat(m) for m in peers]))

    def _note_counters(self, peers: list[str], values: list[bytes] | list[bytes | None]) -> None:
        """Record the counters just read (None: a peer that has not beaten yet)."""
        now = time.monotonic()
        credit = 0.0
        if self._observed_at is not None:
            credit = max(0.0, (now - self._observed_at) - gap_allowance_s(self._config))
        for m, v in zip(peers, values, strict=True):
            if self._counts.get(m) != v:
                if m in self._counts and self._observed_at is not None:
                    silent = self._observed_at - self._changed_at.get(m, self._observed_at)
                    self.longest_silence_s = max(self.longest_silence_s, silent)
                self._counts[m] = v
                self._changed_at[m] = now
            elif credit:
                self._changed_at[m] = min(now, self._changed_at.get(m, now) + credit)
        self._observed_at = now

    def _peers(self, watch: Watch) -> list[str]:
        """The members and the pending joiners whose counters this monitor reads."""
        with self._lock:
            pending = [j for j in self._joiners if j not in self._admitted]
        return [m for m in watch.members if m != self._me] + pending

    def _check_liveness(self) -> None:
        watch = self._watch
        if watch is None:
            return
        if self.track_joiners:
            self._poll_joiners()
        peers = self._peers(watch)
        if peers:
            self._read_counters(peers)
        else:
            self._observed_at = time.monotonic()
        self._judge(watch, int(self._store.add(self._keys.latest_epoch(), 0)))

    def _heartbeat_in_one_request(self) -> None:
        """Beat, and read the revoke keys, every peer's counter, the latest epoch and the
        joiner count, in one store request (:attr:`_set_and_read`): on etcd a heartbeat
        then costs the cluster one transaction instead of five requests."""
        if self._set_and_read is None:
            raise RuntimeError("_heartbeat_in_one_request needs a store with set_and_read")
        watch = self._watch
        me = self._keys.heartbeat(self._me)
        if watch is None:
            self._set_and_read(me, self._beat_value(), [])
            return
        with self._lock:
            revokes = list(watch.revoke_keys.items())
        peers = self._peers(watch)
        keys = [key for key, _ in revokes] + [self._keys.heartbeat(m) for m in peers]
        keys += [self._keys.latest_epoch(), self._keys.joiner_count()]
        values = self._set_and_read(me, self._beat_value(), keys)
        for (key, callback), value in zip(revokes, values, strict=False):
            if value is not None:
                with self._lock:
                    watch.revoke_keys.pop(key, None)
                callback(value)
        self._note_counters(peers, values[len(revokes) : len(revokes) + len(peers)])
        latest, joiners = values[-2:]
        if self.track_joiners:
            self._poll_joiners(count=int(joiners or 0))
        self._judge(watch, int(latest or 0))

    def _judge(self, watch: Watch, latest: int) -> None:
        """Act on what the last reads showed: a newer epoch (fencing), silent members."""
        if latest > watch.epoch:
            if self._left_out(watch):
                return
            watch.on_stale(latest)
        self._update_beacon(watch)
        failed: list[str] = []
        reasons: list[str] = []
        for m in watch.members:
            why = self.failure_of(m)
            if why is not None and self._first_report(watch.epoch, m):
                failed.append(m)
                reasons.append(f"{m}: {why}")
        if failed:
            watch.on_suspects(failed, "; ".join(reasons))

    def _first_report(self, epoch: int, member: str) -> bool:
        """True the first time ``member`` is reported failed in ``epoch`` (by either judge)."""
        with self._lock:
            new = (epoch, member) not in self._reported
            self._reported.add((epoch, member))
        return new

    def _update_beacon(self, watch: Watch) -> None:
        """Tell the beacon where the members listen (their records; one without a beacon
        address, written before its monitor started, is read again every few seconds)."""
        if self._beacon is None:
            return
        now = time.monotonic()
        if now >= self._beacon_refresh_at:
            self._beacon_refresh_at = now + 5 * self._config.heartbeat_timeout.total_seconds()
            for m in watch.members:
                if m != self._me and not getattr(self._records.get(m), "beacon", "-"):
                    self._records.pop(m, None)
        records = {m: self._record(m) for m in watch.members if m != self._me}
        self._beacon.set_peers(
            {m: (r.host, r.beacon) for m, r in records.items() if r and r.beacon}
        )

    def _judge_by_beacon(self) -> None:
        """On the beacon's thread: a member heard before and silent since on datagrams for a
        heartbeat timeout has failed, while the store has not answered for longer than a
        stall, or while the store's counters also show it silent for more than a few beats.

        The second case is the store's return after an outage: the counters then show the
        member only the stall allowance of silence (what the monitor could not watch is
        credited), while its datagrams tell how long it has really been gone. A live member
        whose datagrams are lost is never behind on the counters as well, so it is left to
        them."""
        watch, beacon = self._watch, self._beacon
        if watch is None or beacon is None or self._stop.is_set():
            return
        timeout = self._config.heartbeat_timeout
        silent = beacon.silent(list(watch.members), timeout, socket.gethostname())
        if silent and self.store_answering():
            lag_s = max(normal_gap_s(self._config), timeout.total_seconds() / 4)
            silent = [m for m in silent if self.silence_s(m) > lag_s]
        failed = [m for m in silent if self._first_report(watch.epoch, m)]
        if failed:  # the revoke's store call may block: never on the beacon's thread
            args = (failed, beacon.reason(failed, timeout))
            threading.Thread(target=watch.on_suspects, args=args, daemon=True).start()

    def _left_out(self, watch: Watch) -> bool:
        """True when the decision that ended ``watch.epoch`` evicted this member (told once)."""
        if watch.on_evicted is None or watch.epoch in self._evicted_epochs:
            return watch.epoch in self._evicted_epochs
        key = self._keys.decision(watch.epoch)
        if not self._store.check([key]):
            return False  # moved on without a decision here: a grow this member is in
        decision = Membership.from_json(self._store.get(key))
        # A member that a reconfigure leaves out is released by that call, not evicted.
        if self._me in decision.members or decision.kind == "reconfigure":
            return False
        self._evicted_epochs.add(watch.epoch)
        watch.on_evicted(decision)
        return True

    def _poll_joiners(self, count: int | None = None) -> None:
        if count is None:
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
