"""Heartbeat datagrams between members: who is alive while the store cannot be read.

What it is: each member's :class:`Beacon` binds a UDP socket, and its thread sends one small
datagram (the group's key root and the member's id) to every peer whose address it knows,
every ``heartbeat_interval``, and notes when each peer was last heard, in this process's
monotonic clock. The address travels in the member's process record in the store.

When it is used: the heartbeat monitor (:mod:`torchnext.distributed.group.heartbeat`) judges
liveness from the store's counters. While the store does not answer (its host, or the etcd
leader's host, went down with the members on it), those counters cannot move for anyone, and
the monitor credits that time to everyone, also once the store is back. The beacon is what
still tells a dead host from a live one then: :meth:`Beacon.silent` names the peers heard
before and silent for over the timeout, so a host that died with the store is suspected a
heartbeat timeout after its last datagram instead of after the store's recovery plus half a
timeout. The monitor acts on it only while the store is away or the counters also show the
peer silent for a few beats.

What not to assume:
- Datagrams can be dropped (a firewall between hosts, a full buffer). A peer never heard is
  never judged by datagrams, and silence is only judged while some peer on another host is
  still heard: a member that hears no other host is more likely cut off itself, and leaves
  the verdict to the store.
- Silence counts only while this beacon's thread runs: a stall of this process (SIGSTOP, a
  loaded machine) is credited to every peer beyond a short allowance, as the monitor does.
- It sends to every peer: O(members) datagrams per interval per member, fine for hundreds of
  members on a LAN, not meant for tens of thousands.
"""

from __future__ import annotations

import logging
import socket
import threading
import time
from collections.abc import Callable
from datetime import timedelta

__all__ = ["Beacon", "advertised_ip"]

logger = logging.getLogger(__name__)

_MAX_DATAGRAM = 512


def advertised_ip(store: object) -> str:
    """The local address peers can reach this process at: the one its traffic to the
    store leaves from (the store is on a host every member reaches). Loopback on a store
    that is local; the hostname's address if the store's host is not known."""
    host = getattr(store, "host", None)
    url = str(getattr(store, "url", "") or "")
    if url.startswith("etcd://"):
        first = url.removeprefix("etcd://").split("/", 1)[0].split(",")[0]
        host = first.rpartition(":")[0].strip("[]") or None
    if isinstance(host, str) and host:
        try:
            with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
                probe.connect((host, 9))  # a UDP connect sends nothing; it picks the route
                return str(probe.getsockname()[0])
        except OSError:
            pass
    try:
        return socket.gethostbyname(socket.gethostname())
    except OSError:
        return "127.0.0.1"


class Beacon:
    """One member's heartbeat datagrams: sent to its peers, and heard from them."""

    def __init__(
        self, *, tag: str, member: str, interval: timedelta, stall_allowance: timedelta, ip: str
    ) -> None:
        if interval <= timedelta(0):
            raise ValueError(f"Beacon interval={interval}: pass a positive timedelta")
        self._tag, self._me = tag, member
        self._interval_s = interval.total_seconds()
        self._allowance_s = max(stall_allowance.total_seconds(), 2 * self._interval_s)
        self._ip = ip
        self._sock: socket.socket | None = None
        self.address = ""
        """``ip:port`` this beacon listens on once started (published in the member's
        process record); empty before :meth:`start`, which opens the socket."""
        self._peers: dict[str, tuple[str, int]] = {}
        self._hosts: dict[str, str] = {}
        self._heard: dict[str, float] = {}
        self._observed_at = time.monotonic()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.on_look: Callable[[], None] | None = None
        """Called on the beacon's thread after each look (at least every interval)."""

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> None:
        """Open the socket (its address is then :attr:`address`) and start beating.

        Raises ``OSError`` when no UDP socket can be bound at the address given."""
        sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        try:
            sock.bind((self._ip, 0))
            sock.setblocking(False)
        except OSError:
            sock.close()
            raise
        self._sock = sock
        self.address = f"{self._ip}:{sock.getsockname()[1]}"
        self._thread = threading.Thread(
            target=self._run, name=f"torchnext-ft-beacon-{self._me}", daemon=True
        )
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=max(1.0, 3 * self._interval_s))
        if self._sock is not None:
            self._sock.close()

    def set_peers(self, peers: dict[str, tuple[str, str]]) -> None:
        """The members to beat to: ``member -> (its host name, "ip:port")``."""
        parsed: dict[str, tuple[str, int]] = {}
        for member, (_, address) in peers.items():
            ip, _, port = address.rpartition(":")
            if ip and port.isdigit():
                parsed[member] = (ip, int(port))
        with self._lock:
            self._peers = parsed
            self._hosts = {m: host for m, (host, _) in peers.items()}

    # ------------------------------------------------------------------ queries

    def silence_s(self, member: str) -> float | None:
        """How long ``member`` has not been heard, as of this beacon's latest look; None if
        it never was."""
        with self._lock:
            heard = self._heard.get(member)
            return None if heard is None else max(0.0, self._observed_at - heard)

    @staticmethod
    def reason(failed: list[str], timeout: timedelta) -> str:
        """What a revoke says of members :meth:`silent` named."""
        return "; ".join(
            f"{m}: unresponsive: no heartbeat datagram for over {timeout}, and the store "
            "did not answer or showed no beat either"
            for m in failed
        )

    def silent(self, members: list[str], timeout: timedelta, my_host: str) -> list[str]:
        """The ``members`` heard before and not for over ``timeout``, when a member on another
        host than this one (and than theirs) is still heard; else none (see the module's
        "what not to assume")."""
        timeout_s = timeout.total_seconds()
        quiet: list[str] = []
        witnesses: list[str] = []
        for m in members:
            if m == self._me:
                continue
            silence = self.silence_s(m)
            if silence is None:
                continue
            (quiet if silence > timeout_s else witnesses).append(m)
        with self._lock:
            hosts = dict(self._hosts)
        quiet_hosts = {hosts.get(m) for m in quiet}
        if not any(hosts.get(w) not in (my_host, None, *quiet_hosts) for w in witnesses):
            return []
        return quiet

    # ------------------------------------------------------------------ the thread

    def _run(self) -> None:
        sock = self._sock
        if sock is None:
            return
        payload = f"{self._tag}|{self._me}".encode()
        # Looks every half interval, draining what arrived meanwhile, rather than waking
        # for each datagram: with P peers that is 2 wake-ups an interval instead of P + 1
        # (on 2 cores with 16 members, the per-datagram wake-ups cost a fifth of a core).
        # A peer is then taken as heard up to half an interval late, which only makes its
        # silence look shorter: nothing is suspected sooner than the timeout.
        look_s = self._interval_s / 2
        next_send = time.monotonic()
        while not self._stop.is_set():
            now = time.monotonic()
            if now >= next_send:
                self._send(sock, payload)
                next_send = now + self._interval_s
            if self._stop.wait(max(0.0, min(look_s, next_send - now))):
                return
            try:
                self._receive(sock)
            except ValueError:
                return  # the socket was closed by stop()
            self._note_look()
            if self.on_look is not None:
                try:
                    self.on_look()
                except Exception:  # noqa: BLE001 - the beacon must keep beating
                    logger.exception("%s: the beacon's judge raised", self._me)

    def _send(self, sock: socket.socket, payload: bytes) -> None:
        with self._lock:
            targets = list(self._peers.values())
        for target in targets:
            try:
                sock.sendto(payload, target)
            except OSError:
                pass  # an unreachable peer is what the datagrams are there to notice

    def _receive(self, sock: socket.socket) -> None:
        now = time.monotonic()
        while True:
            try:
                data, _ = sock.recvfrom(_MAX_DATAGRAM)
            except (BlockingIOError, InterruptedError):
                return
            except OSError:
                return
            tag, sep, member = data.decode(errors="replace").partition("|")
            if sep and tag == self._tag and member != self._me:
                with self._lock:
                    self._heard[member] = now

    def _note_look(self) -> None:
        """Advance the time silence is measured to; a gap longer than the allowance (this
        process stalled) is credited to every peer not heard meanwhile."""
        now = time.monotonic()
        with self._lock:
            gap = now - self._observed_at
            credit = gap - self._allowance_s
            if credit > 0:
                for m, heard in self._heard.items():
                    if heard < now - gap:
                        self._heard[m] = min(now, heard + credit)
                logger.debug("%s: beacon thread stalled %.2f s; credited", self._me, gap)
            self._observed_at = now
