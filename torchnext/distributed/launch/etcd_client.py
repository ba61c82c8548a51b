"""A minimal client of etcd v3's HTTP/JSON gateway: bounded requests, member failover, watches.

Use it through :class:`~torchnext.distributed.launch.etcd_store.EtcdStore`; this module
only reads ``etcd://`` URLs (:func:`parse_etcd_url`, without importing torch, so the
agent's config can check one) and moves JSON requests to etcd members and back. Every
etcd v3 server (3.4 and later) serves the gRPC API as JSON over HTTP/1.1 on its client
port (``POST /v3/kv/range``, ``/v3/kv/put``, ``/v3/kv/txn``, ``/v3/kv/deleterange``,
``/v3/lease/grant``, ``/v3/watch``; keys and values base64), documented and stable.

Why the gateway and not a Python etcd package: the gRPC ones on the package index are
``etcd3`` (last released in 2020, its generated code predates protobuf 4) and forks of
it, or asyncio-only (``aetcd``); the store needs blocking calls with a deadline on each
one, from threads that torch's C++ code calls into. The gateway needs nothing beyond
the standard library (``http.client``), so the ``[etcd]`` extra carries only the server
binary.

Failure handling: each request goes to one member and is bounded by
``min(request_timeout, time left)``; a member that refuses, does not answer in time or
answers "unavailable" (no leader, no quorum, request timed out) is left for the next
one, round and round with a short backoff, until the caller's deadline, when
:class:`~torchnext.errors.StoreUnreachableError` names every member and its last error.
A request that was sent but got no answer may have been applied: callers say whether
their request may simply be repeated (``idempotent``); if not, :class:`AmbiguousResult`
is raised and the caller checks (the store's ``add`` records each increment under a
key of its own for that).

What not to assume: plain HTTP only (no TLS, no authentication); reads are
linearizable, so a member cut off from the quorum answers nothing rather than stale
data; one client is safe to share between threads (each request takes its own pooled
connection).
"""

from __future__ import annotations

import base64
import http.client
import json
import re
import threading
import time
import weakref
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from torchnext.errors import StoreRequestError, StoreUnreachableError

__all__ = [
    "AmbiguousResult",
    "Deadline",
    "EtcdClient",
    "Endpoint",
    "LeaseNotFound",
    "b64",
    "is_etcd_url",
    "parse_etcd_url",
    "unb64",
]

SCHEME = "etcd://"
_NAMESPACE = re.compile(r"^[A-Za-z0-9._-]+(/[A-Za-z0-9._-]+)*$")

# gRPC status codes etcd answers with when another member (or a later try) may succeed:
# CANCELED, UNKNOWN, DEADLINE_EXCEEDED, RESOURCE_EXHAUSTED, ABORTED, INTERNAL, UNAVAILABLE.
_RETRYABLE_CODES = frozenset({1, 2, 4, 8, 10, 13, 14})
_NOT_FOUND = 5
_MAX_IDLE_PER_MEMBER = 8
# gRPC metadata through the gateway: a member that has no leader (an election runs)
# refuses at once ("no leader") instead of holding the request until it times out, so
# the client goes on to the next member and is answered as soon as a leader is elected.
_HEADERS = {"Content-Type": "application/json", "Grpc-Metadata-hasleader": "true"}
_BACKOFF_START_S = 0.02
_BACKOFF_MAX_S = 0.1  # retries stay close together, so a re-elected cluster is seen at once


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def unb64(text: str) -> bytes:
    return base64.b64decode(text)


@dataclass(frozen=True)
class Endpoint:
    """One etcd member's client address."""

    host: str
    port: int

    def __str__(self) -> str:
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"


def is_etcd_url(addr: str) -> bool:
    """True for a store address that names an etcd cluster (``etcd://...``)."""
    return addr.startswith(SCHEME)


def parse_etcd_url(url: str) -> tuple[tuple[Endpoint, ...], str]:
    """``etcd://h1:2379,h2:2379[/namespace]`` -> its members and namespace (or ValueError)."""
    form = "etcd://host:port[,host:port...][/namespace], e.g. etcd://h1:2379,h2:2379,h3:2379/job7"
    if not is_etcd_url(url):
        raise ValueError(f"store URL {url!r} does not start with {SCHEME!r}; write it as {form}")
    rest = url[len(SCHEME) :]
    hosts, _, namespace = rest.partition("/")
    namespace = namespace.strip("/") or "torchnext"
    if not _NAMESPACE.match(namespace):
        raise ValueError(
            f"store URL {url!r}: namespace {namespace!r} may hold only letters, digits, "
            "'.', '_', '-' and '/' between names; write it as " + form
        )
    endpoints: list[Endpoint] = []
    for part in hosts.split(","):
        host, sep, port = part.strip().rpartition(":")
        host = host.strip("[]")
        if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ValueError(
                f"store URL {url!r}: member {part!r} is not host:port; write it as {form}"
            )
        endpoints.append(Endpoint(host, int(port)))
    if len(set(endpoints)) != len(endpoints):
        raise ValueError(f"store URL {url!r} names a member twice; list each member once")
    return tuple(endpoints), namespace


class Deadline:
    """The end of one store operation, in this process's monotonic clock."""

    def __init__(self, timeout: timedelta) -> None:
        self.timeout = timeout
        self.end = time.monotonic() + timeout.total_seconds()

    def left_s(self) -> float:
        return max(0.0, self.end - time.monotonic())

    @property
    def expired(self) -> bool:
        return time.monotonic() >= self.end


class AmbiguousResult(Exception):
    """A request that is not safe to repeat was sent, and no answer came: it may have
    been applied. Internal to the store, which checks and retries."""


class LeaseNotFound(Exception):
    """A request named a lease that expired; the store grants a new one and retries."""


class _NoAnswer(Exception):
    def __init__(self, reason: str, *, sent: bool) -> None:
        super().__init__(reason)
        self.sent = sent


_PREFERRED: dict[tuple[Endpoint, ...], int] = {}
"""Per cluster, the member that answered last in this process. Every client of the cluster
(a store and its clones: the monitor's, the revoker's, the builds') starts there, so a member
one client found silent is not tried first by the others: each such try costs a request
timeout, which a revoke or an agreement right after a member's host died would pay again."""


class EtcdClient:
    """JSON requests to the members of one etcd cluster (see the module docstring)."""

    def __init__(self, endpoints: tuple[Endpoint, ...], *, request_timeout: timedelta) -> None:
        if not endpoints:
            raise ValueError("EtcdClient: endpoints is empty; pass at least one host:port.")
        if request_timeout <= timedelta(0):
            raise ValueError(
                f"EtcdClient: request_timeout={request_timeout} must be positive "
                "(TORCHNEXT_ETCD_REQUEST_TIMEOUT, seconds)."
            )
        self.endpoints = endpoints
        self.request_timeout = request_timeout
        self._idle: dict[int, list[http.client.HTTPConnection]] = {
            i: [] for i in range(len(endpoints))
        }
        self._lock = threading.Lock()
        self._closed = False
        self.last_error: dict[Endpoint, str] = {}
        """Each member's latest failure, for errors raised before it was tried again."""
        # A store dropped without close() must not leave its sockets to the collector.
        weakref.finalize(self, _close_idle, self._idle)

    @property
    def _preferred(self) -> int:
        return _PREFERRED.get(self.endpoints, 0)

    @_preferred.setter
    def _preferred(self, index: int) -> None:
        _PREFERRED[self.endpoints] = index  # one dict store: atomic under the GIL

    @property
    def preferred(self) -> Endpoint:
        """The member that answered last (requests go there first)."""
        return self.endpoints[self._preferred]

    def describe(self) -> str:
        return ",".join(str(e) for e in self.endpoints)

    # ------------------------------------------------------------------ requests

    def call(
        self, path: str, body: dict[str, Any], deadline: Deadline, *, what: str, idempotent: bool
    ) -> dict[str, Any]:
        """POST ``body`` to ``path`` on a member that answers; the decoded JSON answer.

        Bounded by ``deadline``; ``what`` names the store operation in errors.
        """
        payload = json.dumps(body).encode()
        errors: dict[Endpoint, str] = {}
        backoff = _BACKOFF_START_S
        start = self._preferred
        n = len(self.endpoints)
        while True:
            for k in range(n):
                i = (start + k) % n
                left = deadline.left_s()
                if left <= 0:
                    raise self._unreachable(what, deadline.timeout, errors)
                try:
                    answer = self._attempt(i, path, payload, min(left, self._request_s))
                except _NoAnswer as exc:
                    errors[self.endpoints[i]] = self.last_error[self.endpoints[i]] = str(exc)
                    if self._preferred == i:
                        self._preferred = (i + 1) % n  # the next call starts elsewhere
                    if exc.sent and not idempotent:
                        raise AmbiguousResult(str(exc)) from None
                    continue
                self._preferred = i
                return answer
            start = self._preferred
            time.sleep(min(backoff, deadline.left_s()))
            backoff = min(2 * backoff, _BACKOFF_MAX_S)

    @property
    def _request_s(self) -> float:
        return self.request_timeout.total_seconds()

    def _attempt(self, i: int, path: str, payload: bytes, timeout_s: float) -> dict[str, Any]:
        conn = self._take(i, timeout_s)
        sent = False
        try:
            if conn.sock is not None:
                conn.sock.settimeout(timeout_s)
            conn.request("POST", path, body=payload, headers=_HEADERS)
            sent = True
            response = conn.getresponse()
            data = response.read()
        except (OSError, http.client.HTTPException) as exc:
            conn.close()
            reason = "no answer within the request timeout" if _is_timeout(exc) else repr(exc)
            raise _NoAnswer(reason, sent=sent) from None
        self._give(i, conn, keep=not response.will_close)
        return self._decode(response.status, data)

    def _decode(self, status: int, data: bytes) -> dict[str, Any]:
        try:
            answer = json.loads(data) if data else {}
        except ValueError:
            answer = {}
        if status == 200 and isinstance(answer, dict):
            return answer
        message = str(answer.get("message") or answer.get("error") or data[:200])
        code = int(answer.get("code", -1)) if isinstance(answer, dict) else -1
        if code == _NOT_FOUND and "lease not found" in message:
            raise LeaseNotFound(message)
        if code in _RETRYABLE_CODES or status >= 500 or code == -1:
            # Applied or not is unknown (a proposal may commit after its request timed out).
            raise _NoAnswer(f"etcd answered {status}: {message}", sent=True)
        raise StoreRequestError(
            f"the etcd cluster at {self.describe()} refused the request ({status}, code "
            f"{code}): {message}. Keys and values must stay under the cluster's "
            "--max-request-bytes and transactions under --max-txn-ops."
        )

    def _take(self, i: int, timeout_s: float) -> http.client.HTTPConnection:
        with self._lock:
            if self._closed:
                raise _NoAnswer("the store was closed", sent=False)
            idle = self._idle[i]
            if idle:
                return idle.pop()
        ep = self.endpoints[i]
        conn = http.client.HTTPConnection(ep.host, ep.port, timeout=timeout_s)
        try:
            conn.connect()
        except OSError as exc:
            conn.close()
            reason = "no answer to connect" if _is_timeout(exc) else repr(exc)
            raise _NoAnswer(reason, sent=False) from None
        return conn

    def _give(self, i: int, conn: http.client.HTTPConnection, *, keep: bool) -> None:
        with self._lock:
            if keep and not self._closed and len(self._idle[i]) < _MAX_IDLE_PER_MEMBER:
                self._idle[i].append(conn)
                return
        conn.close()

    def _unreachable(
        self, what: str, timeout: timedelta, errors: dict[Endpoint, str]
    ) -> StoreUnreachableError:
        seen = "; ".join(
            f"{ep}: {errors.get(ep) or self.last_error.get(ep, 'not tried')}"
            for ep in self.endpoints
        )
        return StoreUnreachableError(
            f"etcd store: no member of etcd://{self.describe()} answered {what} within "
            f"{timeout} ({seen}). Check that etcd runs at these addresses and that a majority "
            "of its members are up and reach each other (`etcdctl --endpoints "
            f"{self.describe()} endpoint health`): a cluster without quorum answers nothing. "
            "To run etcd, install the server (pip install 'torchnext[etcd]', or Debian's "
            "etcd-server)."
        )

    # ------------------------------------------------------------------ watches

    def watch_put(self, key: bytes, start_revision: int, wait_s: float) -> bool:
        """Wait up to ``wait_s`` for a put of ``key`` at or after ``start_revision``.

        True when one was seen; False on timeout or any failure (the caller re-reads:
        a watch is only a wake-up, never the source of truth).
        """
        if wait_s <= 0:
            return False
        i = self._preferred
        ep = self.endpoints[i]
        body = {"create_request": {"key": b64(key), "start_revision": str(start_revision)}}
        conn = http.client.HTTPConnection(ep.host, ep.port, timeout=min(wait_s, self._request_s))
        deadline = time.monotonic() + wait_s

        def bound() -> bool:
            # Every step gets only the time left, so the watch never outlasts wait_s.
            left = deadline - time.monotonic()
            if left <= 0 or conn.sock is None:
                return False
            conn.sock.settimeout(left)
            return True

        try:
            conn.connect()
            if not bound():
                return False
            conn.request(
                "POST", "/v3/watch", body=json.dumps(body), headers={"Accept": "application/json"}
            )
            if not bound():
                return False
            response = conn.getresponse()
            if response.status != 200:
                return False
            while True:
                if not bound():
                    return False
                line = response.readline()
                if not line:
                    return False  # the member closed the stream
                result = json.loads(line).get("result", {})
                if result.get("canceled") or "compact_revision" in result:
                    return False
                for event in result.get("events", ()):
                    if event.get("type", "PUT") == "PUT":
                        return True
        except (OSError, ValueError, http.client.HTTPException):
            return False
        finally:
            conn.close()  # also ends the watch on the member

    def close(self) -> None:
        with self._lock:
            self._closed = True
            conns = [c for idle in self._idle.values() for c in idle]
            for idle in self._idle.values():
                idle.clear()
        for conn in conns:
            conn.close()


def _close_idle(idle: dict[int, list[http.client.HTTPConnection]]) -> None:
    for conns in idle.values():
        for conn in conns:
            conn.close()
        conns.clear()


def _is_timeout(exc: BaseException) -> bool:
    return isinstance(exc, TimeoutError)
