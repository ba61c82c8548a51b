"""The heartbeat monitor across a store outage: who is suspected when the store answers again.

A store that fails every call for longer than the heartbeat timeout (an etcd leader's host
lost power and the cluster elects a new leader) hides every peer's beats. Afterwards a
peer that died with it must be suspected soon, without waiting a whole timeout more, while
a live peer whose own calls come back a little later than this monitor's is not. One
monitor thread on a real in-memory store that the test switches off and on; the peers'
beats are written by the test.
"""

from __future__ import annotations

import threading
import time
from datetime import timedelta
from typing import Any

import pytest
import torch.distributed as dist

from torchnext.distributed.group.config import GroupConfig
from torchnext.distributed.group.heartbeat import Monitor, Watch
from torchnext.distributed.group.membership import Keys

TIMEOUT = timedelta(seconds=1)
CONFIG = GroupConfig(
    heartbeat_interval=timedelta(milliseconds=50),
    heartbeat_timeout=TIMEOUT,
    store_timeout=timedelta(seconds=10),
    probe_local_pids=False,
)


class SwitchedStore:
    """A ``HashStore`` whose every call raises while ``down`` is set (an outage)."""

    def __init__(self) -> None:
        self.inner = dist.HashStore()
        self.down = threading.Event()

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self.inner, name)
        if not callable(attr) or name == "set_timeout":
            return attr

        def call(*args: Any, **kwargs: Any) -> Any:
            if self.down.is_set():
                raise RuntimeError("store down (test outage)")
            return attr(*args, **kwargs)

        return call


class Suspicions:
    """The watch's ``on_suspects``: when each member was first suspected, and why."""

    def __init__(self) -> None:
        self.at: dict[str, float] = {}
        self.reasons: list[str] = []
        self.seen = threading.Event()

    def __call__(self, members: list[str], reason: str) -> None:
        for m in members:
            self.at.setdefault(m, time.monotonic())
        self.reasons.append(reason)
        self.seen.set()


def test_after_an_outage_a_dead_peer_is_suspected_early_and_a_late_live_peer_is_not() -> None:
    store, keys = SwitchedStore(), Keys("outage")
    on_suspects = Suspicions()
    suspected, seen = on_suspects.at, on_suspects.seen

    monitor = Monitor(store, keys, "a", CONFIG)
    live_pauses = threading.Event()  # set: the live peer's calls fail too
    stop = threading.Event()

    def live_peer() -> None:
        n = 0
        while not stop.wait(0.05):
            if not live_pauses.is_set():
                n += 1
                store.inner.set(keys.heartbeat("live"), str(n))

    for m in ("live", "dead"):
        store.inner.set(keys.heartbeat(m), "0")
    beater = threading.Thread(target=live_peer, daemon=True)
    beater.start()
    monitor.start()
    monitor.set_watch(Watch(0, ("a", "live", "dead"), {}, on_suspects, lambda epoch: None))
    try:
        time.sleep(0.3)  # both seen alive first (the dead one beat once, at "0")
        live_pauses.set()  # the outage: nobody's calls get through for longer than TIMEOUT
        store.down.set()
        time.sleep(1.5)
        assert not suspected, suspected  # nothing is judged while the store is away
        store.down.clear()
        back = time.monotonic()
        time.sleep(0.3)  # the live peer's own outage ends a store call later
        live_pauses.clear()
        assert seen.wait(3.0), "the dead peer was never suspected"
        time.sleep(0.5)
    finally:
        stop.set()
        monitor.stop()
        beater.join(timeout=5)
    assert set(suspected) == {"dead"}, suspected
    after = suspected["dead"] - back
    # Suspected once the rest of the timeout past the stall allowance ran out after the
    # store came back (0.5 s here), not a whole timeout (1 s) later.
    assert 0.3 < after < 0.9, after


@pytest.mark.parametrize("outage_s", [None, 0.9], ids=["store-still-away", "store-back-at-0.9s"])
def test_a_host_silent_with_the_store_is_suspected_a_timeout_after_its_last_datagram(
    outage_s: float | None,
) -> None:
    """The etcd leader's host dies with its members and the store is away. Peers' beacons
    still reach this member's monitor; the dead one's stop. It is suspected a timeout (1 s)
    after its last datagram: while the store is still away, or, when the store came back
    at 0.9 s, before the counters would (they show it only the stall allowance, 0.5 s, of
    silence then: 1.4 s). The live peer (another host, still heard) is never suspected."""
    from torchnext.distributed.group.beacon import Beacon
    from torchnext.distributed.group.membership import ProcessRecord

    store, keys = SwitchedStore(), Keys("beacons")
    on_suspects = Suspicions()
    suspected, seen = on_suspects.at, on_suspects.seen

    peers = {
        m: Beacon(
            tag=keys.root,
            member=m,
            interval=CONFIG.heartbeat_interval,
            stall_allowance=timedelta(milliseconds=500),
            ip="127.0.0.1",
        )  # fmt: skip
        for m in ("live", "dead")
    }
    for m, host in (("live", "hostL"), ("dead", "hostD")):
        peers[m].start()
        store.inner.set(keys.heartbeat(m), "0")
        store.inner.set(keys.process(m), ProcessRecord(host, 1, 0, peers[m].address).encode())
    monitor = Monitor(store, keys, "a", CONFIG)
    stop = threading.Event()

    def live_store_beats() -> None:
        n = 0
        while not stop.wait(0.05):
            if not store.down.is_set():
                n += 1
                store.inner.set(keys.heartbeat("live"), str(n))

    beater = threading.Thread(target=live_store_beats, daemon=True)
    beater.start()
    assert monitor.beacon_address == ""  # no socket before start
    monitor.start()
    assert ProcessRecord.decode(store.inner.get(keys.process("a"))).beacon
    for beacon in peers.values():
        beacon.set_peers({"a": ("hostA", monitor.beacon_address)})
    # The epoch's revoke key is watched, as in a group: every poll then asks the store.
    revokes: dict[str, Any] = {keys.revoked(0, ""): lambda value: None}
    monitor.set_watch(Watch(0, ("a", "live", "dead"), revokes, on_suspects, lambda epoch: None))
    back = threading.Timer(outage_s or 60.0, store.down.clear)
    try:
        time.sleep(0.5)  # the monitor reads the records and hears both beacons
        store.down.set()  # the store's host (with "dead") goes silent
        fault = time.monotonic()
        peers["dead"].stop()
        back.start()
        assert seen.wait(3.0), "the silent host was never suspected"
        still_down = store.down.is_set()
        time.sleep(0.3)
    finally:
        back.cancel()
        store.down.clear()
        stop.set()
        monitor.stop()
        peers["live"].stop()
        beater.join(timeout=5)
    assert still_down == (outage_s is None)
    assert set(suspected) == {"dead"}, suspected
    # By the datagrams, not the counters (whose reason names no datagram).
    assert all("datagram" in r for r in on_suspects.reasons), on_suspects.reasons
    after = suspected["dead"] - fault
    assert 0.9 < after < 1.3, after  # TIMEOUT (1 s) after its last datagram


class _StoreAway:
    """A monitor whose store has not answered (as the revoker asks it)."""

    def store_answering(self) -> bool:
        return False

    def failed_members(self, members: tuple[str, ...]) -> list[str]:
        return []


class _LeaderlessStore:
    """A store whose calls wait until it is back (an etcd client retrying until a new
    leader is elected)."""

    def __init__(self) -> None:
        self.inner = dist.HashStore()
        self.back = threading.Event()

    def compare_set(self, key: str, expected: str, desired: str) -> bytes:
        if not self.back.wait(10):
            raise RuntimeError("store still away after 10 s (test)")
        return bytes(self.inner.compare_set(key, expected, desired))


def test_a_suspicion_while_the_store_is_away_stops_ops_before_it_is_published() -> None:
    """Publishing the revoke waits for the store; the member's own ops stop at once."""
    from torchnext.distributed.group.epoch import Epoch
    from torchnext.distributed.group.revoke import Revoker

    store, keys = _LeaderlessStore(), Keys("away")
    monitor: Any = _StoreAway()
    revoker = Revoker(store, keys, monitor, member_id="a", name="g", backend="gloo")
    seen: list[str] = []
    revoked_here = threading.Event()

    def on_revoke(error: BaseException) -> None:
        seen.append(str(error))
        revoked_here.set()

    revoker.callbacks.append(on_revoke)
    epoch = Epoch(3, ("a", "b"), 0)
    why = "b: unresponsive: no heartbeat datagram"
    thread = threading.Thread(
        target=revoker.suspected, args=(epoch, epoch, ["b"], why), daemon=True
    )
    thread.start()
    try:
        assert revoked_here.wait(5), "the epoch was not revoked while the store was away"
        assert thread.is_alive()  # still waiting to publish
        assert epoch.revoked is not None and epoch.revoked.suspects == (1,)
        assert "no heartbeat datagram" in seen[0]
    finally:
        store.back.set()
        thread.join(timeout=10)
    published = store.inner.get(keys.revoked(3, ""))
    assert b"no heartbeat datagram" in published and len(seen) == 1
