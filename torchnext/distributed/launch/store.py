"""The agents' store: hosting it, connecting to it, and leaving it in order.

A job's ``TCPStore`` is hosted by one agent (node 0's, or the only one) and used by
every agent and worker of the job (or, with an ``etcd://`` address, it is an etcd
cluster that no agent hosts: :mod:`~torchnext.distributed.launch.etcd_store`). This
module makes and reaches it (:func:`host_store`, :func:`connect_store`) and holds the
shutdown handshake between agents: a store that closes while another node's agent or
workers still talk to it makes each of their store clients print a C++ stack trace
(``recvValue failed``, ``Broken pipe``) on every later call, and makes their workers'
exits look like crashes. So, on a multi-node job:

* every agent that does not host the store bumps its *alive* counter while it runs
  (:func:`announce_alive`) and, once its workers have all exited, says goodbye
  (:func:`say_goodbye`) before it drops its store client;
* the hosting agent, once its own workers are done, keeps the store up until every
  other agent said goodbye (:func:`await_goodbyes`). An agent that neither says
  goodbye nor bumps its counter for the silence bound is taken for gone, so a dead
  node cannot keep the host waiting forever; a live one, still training, keeps it. The
  hosting agent watches the counters while the job runs (:class:`AgentSightings`), so
  the silence of a node that died long before is counted from its death.

Liveness is judged by change of the counter in the host's monotonic clock, never by
comparing clocks across machines.
"""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Callable, Iterable
from datetime import timedelta
from typing import Any

from torchnext.distributed.launch.keys import AGENT_ALIVE_KEY_PREFIX, AGENT_DETACHED_KEY_PREFIX
from torchnext.errors import StoreUnreachableError

__all__ = [
    "AGENT_ALIVE_KEY_PREFIX",
    "AGENT_DETACHED_KEY_PREFIX",
    "AgentSightings",
    "announce_alive",
    "await_goodbyes",
    "connect_store",
    "hold_for_goodbyes",
    "host_store",
    "leave_store",
    "say_goodbye",
]


def host_store(host: str, port: int, timeout: timedelta) -> Any:
    """A ``TCPStore`` server on ``host:port``; a port in use raises with the fix.

    For an IPv4 address the listening socket is made here, IPv4-only, and handed to the
    store: torch's own listener is dual-stack, so every client appears as a v4-mapped
    IPv6 address, which ``/etc/hosts`` does not list, and the server's per-connection
    reverse lookup of it goes to DNS on the store's event loop. One lost DNS packet then
    stalls every client's store traffic for the resolver's retry timeout (5 s).
    """
    import torch.distributed as dist

    listen_fd: int | None = None
    try:
        listen_fd = _ipv4_listener(host, port)
        if listen_fd is None:
            return dist.TCPStore(
                host, port, is_master=True, wait_for_workers=False, timeout=timeout
            )
        return dist.TCPStore(
            host,
            port,
            is_master=True,
            wait_for_workers=False,
            timeout=timeout,
            master_listen_fd=listen_fd,
        )
    except (RuntimeError, OSError) as exc:
        if listen_fd is not None:
            os.close(listen_fd)
        text = str(exc)
        if "EADDRINUSE" in text or "in use" in text:
            raise StoreUnreachableError(
                f"cannot host the store on {host}:{port}: the address is already in use. "
                "Pass another --store-port (0 picks a free one), or stop the process using it."
            ) from None
        raise StoreUnreachableError(f"cannot host the store on {host}:{port}: {text}") from None


def _ipv4_listener(host: str, port: int) -> int | None:
    """A listening IPv4 socket's fd, owned by the caller; None if ``host`` is not IPv4."""
    addr = "127.0.0.1" if host == "localhost" else host
    try:
        socket.inet_aton(addr)
    except OSError:
        return None
    if addr.count(".") != 3:  # inet_aton also accepts shorthands like "127.1"
        return None
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((addr, port))
        sock.listen(socket.SOMAXCONN)
    except OSError:
        sock.close()
        raise  # "Address already in use" is reported by host_store like torch's own error
    # The store owns the descriptor from here on; the Python object must not close it.
    return sock.detach()


def connect_store(addr: str, timeout: timedelta) -> Any:
    """A client of the ``TCPStore`` at ``host:port`` whose every call (the connection too)
    ends within ``timeout``, even on a store host that went silent (a
    :class:`~torchnext.distributed.launch.bounded_store.BoundedTCPStore`).

    An ``etcd://h1:2379,h2:2379,h3:2379/namespace`` address gives an
    :class:`~torchnext.distributed.launch.etcd_store.EtcdStore` on that etcd cluster.
    """
    if addr.startswith("etcd://"):
        from torchnext.distributed.launch.etcd_store import connect_etcd_store

        return connect_etcd_store(addr, timeout)
    from torchnext.distributed.launch.bounded_store import BoundedTCPStore

    host, _, port = addr.rpartition(":")
    try:
        return BoundedTCPStore(host, int(port), timeout=timeout)
    except (RuntimeError, OSError, ValueError) as exc:
        raise StoreUnreachableError(
            f"cannot reach the store at {addr!r} within {timeout}: {exc}. Check that the "
            "agent hosting it runs and that host and port are right."
        ) from None


def announce_alive(store: Any, node_rank: int) -> None:
    """Bump this agent's liveness counter (a non-hosting agent, while it runs)."""
    store.add(f"{AGENT_ALIVE_KEY_PREFIX}{node_rank}", 1)


def say_goodbye(store: Any, node_rank: int) -> None:
    """Tell the hosting agent that this agent and its workers are done with the store."""
    store.set(f"{AGENT_DETACHED_KEY_PREFIX}{node_rank}", "1")


class AgentSightings:
    """When each other agent's liveness counter was last seen to change (the hosting agent).

    The hosting agent reads the counters (:meth:`observe`) while the job runs, so that at the
    end :func:`await_goodbyes` counts an agent's silence from its last sign of life, not
    from the moment it starts waiting: a node that died long before costs nothing extra.
    """

    def __init__(
        self, node_ranks: Iterable[int], *, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._clock = clock
        now = clock()
        self.counts: dict[int, int] = {}
        self.changed_at: dict[int, float] = dict.fromkeys(sorted(set(node_ranks)), now)

    def observe(self, store: Any, ranks: Iterable[int] | None = None) -> None:
        """Read the counters of ``ranks`` (default: all); a store error propagates."""
        for rank in list(self.changed_at if ranks is None else ranks):
            beats = int(store.add(f"{AGENT_ALIVE_KEY_PREFIX}{rank}", 0))
            if self.counts.get(rank) != beats:
                if rank in self.counts or rank not in self.changed_at:
                    self.changed_at[rank] = self._clock()
                self.counts[rank] = beats

    def silent_s(self, rank: int) -> float:
        """Seconds since ``rank``'s counter was last seen to change."""
        return self._clock() - self.changed_at.setdefault(rank, self._clock())


def await_goodbyes(
    store: Any,
    node_ranks: Iterable[int],
    *,
    silence: timedelta,
    poll_interval: timedelta = timedelta(milliseconds=100),
    clock: Callable[[], float] = time.monotonic,
    seen: AgentSightings | None = None,
) -> list[int]:
    """Wait until every agent of ``node_ranks`` said goodbye or fell silent; returns the silent.

    An agent is silent once neither its goodbye nor a change of its liveness counter
    was seen for ``silence``, counted from its last change that ``seen`` recorded (from
    this call for an agent never heard of). A store error ends the wait: the remaining
    agents are returned as silent.
    """
    if silence < timedelta(0):
        raise ValueError(f"await_goodbyes: silence={silence} must be >= 0.")
    pending = sorted(set(node_ranks))
    sightings = seen if seen is not None else AgentSightings(pending, clock=clock)
    silent: list[int] = []
    while pending:
        still: list[int] = []
        for rank in pending:
            try:
                if store.check([f"{AGENT_DETACHED_KEY_PREFIX}{rank}"]):
                    continue
                sightings.observe(store, [rank])
            except Exception:  # noqa: BLE001 - our own store failing: stop waiting
                return sorted(silent + pending)
            if sightings.silent_s(rank) > silence.total_seconds():
                silent.append(rank)
            else:
                still.append(rank)
        pending = still
        if pending:
            time.sleep(poll_interval.total_seconds())
    return sorted(silent)


def hold_for_goodbyes(
    store: Any,
    node_ranks: list[int],
    *,
    silence: timedelta,
    seen: AgentSightings | None,
    emit: Callable[[str], None],
) -> list[int]:
    """The hosting agent's end: keep the store up while other agents may still use it
    (:func:`await_goodbyes`), saying so through ``emit``; returns the silent nodes."""
    emit(
        f"keeping the store until the agents of nodes {node_ranks} have left "
        f"(or been silent for {silence})"
    )
    silent = await_goodbyes(store, node_ranks, silence=silence, seen=seen)
    if silent:
        emit(
            f"closing the store without a goodbye from nodes {silent}: no sign of life for "
            f"{silence}"
        )
    return silent


def leave_store(
    store: Any,
    *,
    hosting: bool,
    node_rank: int,
    node_count: int,
    silence: timedelta,
    seen: AgentSightings | None,
    emit: Callable[[str], None],
    call: Callable[[Callable[[Any], None]], None],
) -> None:
    """An agent's leave of a multi-node job's store: the hosting agent holds it for the
    others (:func:`hold_for_goodbyes`), another says goodbye through ``call`` (its
    store link, which reports a host already gone once)."""
    if hosting:
        others = [r for r in range(node_count) if r != node_rank]
        hold_for_goodbyes(store, others, silence=silence, seen=seen, emit=emit)
    else:
        call(lambda s: say_goodbye(s, node_rank))
