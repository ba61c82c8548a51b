"""An agent's link to the job's store: bounded calls, outages retried in the background.

Use :class:`StoreLink` for every store call an agent makes on its own behalf (eviction and
finish checks, its liveness counter, the job's events, its spares). Each call is bounded
by the store client's timeout (``AgentConfig.store_call_timeout``); a call that fails
marks the link *down*, and while it is down the agent makes no store call at all (its
supervision of local processes goes on undisturbed) while a background thread probes the
store. When the store answers again the link is *up* and the agent resumes its checks,
however long the outage was (a host cut off from the others and reconnected).

An outage longer than the store timeout is reported once, with what it most likely means
and the fix: with a TCP store, that the host holding it (node 0's agent) is down and the
job with it, and that ``--store etcd://...`` keeps the store on a cluster that survives
losing any one host. The agent decides what to do about it (:mod:`.agent`).

What not to assume: a hosting agent's link never goes down (the store is its own); a
call that failed may still have been applied by the store (its request may arrive late),
so calls made through the link must be harmless to repeat or to lose.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any, TypeVar

from torchnext.distributed.launch.keys import FINISHED_KEY

__all__ = ["StoreLink", "lost_store_message"]

T = TypeVar("T")

_PROBE_INTERVAL_S = 0.25


def lost_store_message(addr: str, silent_for: timedelta) -> str:
    """What an agent says when the store at ``addr`` has not answered for ``silent_for``."""
    if addr.startswith("etcd://"):
        return (
            f"the etcd store {addr} has not answered for over {silent_for}: no member with "
            "quorum is reachable from this host. Bring a majority of the cluster's members "
            "back (a 3-member cluster survives losing one), or check this host's network."
        )
    return (
        f"the store at {addr} has not answered for over {silent_for}: its host is down, or "
        "this host is cut off from it. A TCP store lives on node 0's agent, so losing that "
        "host loses the job. To survive losing any one host, keep the store on an etcd "
        "cluster: torchnext run --store etcd://h1:2379,h2:2379,h3:2379/JOB ..."
    )


class StoreLink:
    """The agent's store and whether it answers (see the module docstring).

    Args:
        store: the agent's store client (the server itself on the hosting agent).
        addr: how the job names the store (``host:port`` or an ``etcd://`` URL).
        hosted: this agent hosts the store: a failed call is a hiccup, never an outage.
        store_timeout: an outage longer than this is reported as a lost store.
        emit: reports a line (the agent's ``store`` event).
    """

    def __init__(
        self,
        store: Any,
        addr: str,
        *,
        hosted: bool,
        store_timeout: timedelta,
        emit: Callable[[str], None],
    ) -> None:
        self.store = store
        self.addr = addr
        self.hosted = hosted
        self.store_timeout = store_timeout
        self._emit = emit
        self._down_since: float | None = None
        self._answered = threading.Event()
        self._stop = threading.Event()
        self._prober: threading.Thread | None = None
        self._reported_lost = False

    @property
    def up(self) -> bool:
        return self._down_since is None

    def down_for_s(self) -> float:
        """Seconds since the link went down; 0 while it is up."""
        return 0.0 if self._down_since is None else time.monotonic() - self._down_since

    @property
    def lost(self) -> bool:
        """Down for longer than the store timeout."""
        return self.down_for_s() > self.store_timeout.total_seconds()

    def call(self, fn: Callable[[Any], T], default: T) -> T:
        """``fn(store)``, or ``default`` when the link is down or the call fails."""
        if self._down_since is not None:
            return default
        try:
            return fn(self.store)
        except Exception as exc:  # noqa: BLE001 - a store failure must not kill the agent
            self.failed(exc)
            return default

    def failed(self, exc: BaseException) -> None:
        """A call through this link failed: the link goes down (not on the hosting agent)."""
        if self.hosted or self._down_since is not None or self._stop.is_set():
            return
        self._down_since = time.monotonic()
        self._reported_lost = False
        self._answered.clear()
        reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        self._emit(
            f"the store at {self.addr} does not answer ({reason}); pausing this node's "
            "eviction and finish checks until it does"
        )
        self._prober = threading.Thread(
            target=self._probe, name="torchnext-agent-store-probe", daemon=True
        )
        self._prober.start()

    def poll(self) -> None:
        """Bring the link up if the store answered again; report a long outage once."""
        if self._down_since is None:
            return
        if self._answered.is_set():
            took = time.monotonic() - self._down_since
            self._down_since = None
            self._emit(
                f"the store at {self.addr} answers again after {took:.1f} s; resuming "
                "this node's eviction and finish checks"
            )
            return
        if self.lost and not self._reported_lost:
            self._reported_lost = True
            self._emit(lost_store_message(self.addr, self.store_timeout))

    def close(self) -> None:
        """Stop probing (the agent is leaving)."""
        self._stop.set()

    def _probe(self) -> None:
        while not self._stop.wait(_PROBE_INTERVAL_S):
            try:
                self.store.check([FINISHED_KEY])
            except Exception:  # noqa: BLE001 - still unreachable: try again
                continue
            self._answered.set()
            return
