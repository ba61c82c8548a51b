"""``EtcdStore``: the job's ``torch.distributed.Store`` kept by an etcd v3 cluster.

Use it when the store must survive the loss of any one machine: ``torchnext run --store
etcd://h1:2379,h2:2379,h3:2379/myjob`` makes every agent and worker use an etcd
cluster (3 or 5 members, on different hosts) instead of a ``TCPStore`` hosted by node
0's agent, whose loss ends the job. :func:`connect_etcd_store` opens one from such a
URL; :func:`parse_etcd_url` checks one. Without ``etcd://`` nothing here is used.

It is a c10d store written in Python (a subclass of ``torch.distributed.Store``), so
gloo's and NCCL's rendezvous, ``PrefixStore`` and torchnext's group code use it like a
``TCPStore``, with the same semantics: ``get``, ``wait`` and ``multi_get`` block until
the keys exist, up to the store's timeout, then raise ``DistStoreError`` as a
``TCPStore`` does; ``add`` is atomic (a transaction that compares the key's
modification revision, repeated on conflict); ``compare_set`` is a transaction; waits
are etcd watches, re-armed in bounded slices. Every operation is bounded by the
store's timeout and raises :class:`~torchnext.errors.StoreUnreachableError`, naming the
members, when no member with quorum answers in time (the transport is
:mod:`~torchnext.distributed.launch.etcd_client`: etcd's HTTP/JSON gateway, no extra
package).

Keys live under ``/<namespace>/k/`` (the URL's path; ``torchnext`` when none): give each
job its own (a scheduler's job id), since a new job must not see an old one's keys.

Leases: the group's heartbeats stay values that each member rewrites (its own key,
with :meth:`EtcdStore.set_and_read`, which reads its peers' in the same transaction)
and that peers judge by *change* in their own monotonic clock. An etcd lease is judged by
the leader's clock with a granularity of its TTL, and a key that vanishes on expiry
would make a peer's ``multi_get`` of it block instead of showing silence, so leases do
not carry liveness here. They carry this client's bookkeeping: each ``add`` applies
only on the key's revision it read, and also writes its sequence number and result
under a per-thread key attached to a lease of this client, which a failed attempt reads
back; so an increment whose answer was lost (the member died mid-request) is recognised
and never applied twice, and those keys vanish with the process that wrote them.

The fast paths the group uses: ``set_and_read`` (a heartbeat: one transaction that
writes this member's key and reads every peer's, the revoke keys and the latest epoch),
``read_many`` (an agreement's poll of every ack), ``wait_for_value`` (a watch in short
slices) and ``delete_prefix``; each is one request where a ``TCPStore`` needs several.

What not to assume: each call is one or two HTTP round trips to a member (about a
millisecond on a LAN, more on a loaded machine), slower than a ``TCPStore``; values
must stay under etcd's request size limit (1.5 MiB by default); the cluster should
compact its history (``--auto-compaction-retention``), since heartbeats write often. A
store lives until :meth:`EtcdStore.close` even without references (torch's C++ side
calls its Python methods; see ``_OPEN``), so close the ones you open.
"""

from __future__ import annotations

import itertools
import threading
import time
import uuid
from collections import OrderedDict
from collections.abc import Sequence
from datetime import timedelta
from typing import Any

import torch.distributed as dist

from torchnext import _env
from torchnext.distributed.launch.etcd_client import (
    AmbiguousResult,
    Deadline,
    Endpoint,
    EtcdClient,
    LeaseNotFound,
    b64,
    is_etcd_url,
    parse_etcd_url,
    unb64,
)

__all__ = ["EtcdStore", "connect_etcd_store", "is_etcd_url", "parse_etcd_url"]

_TXN_CHUNK = 64  # etcd refuses transactions over --max-txn-ops (128 by default)
_LEASE_TTL_S = 120
_WATCH_SLICE_S = 1.0  # a watch is re-armed this often, so a member that died is left
_ADD_CACHE = 256
_OPEN: dict[int, EtcdStore] = {}
"""Every store not closed yet. torch's C++ side (``PrefixStore``, gloo) keeps a Python
store's C++ half but not its Python half, whose methods it calls: a store whose last
Python reference went away fails there with "Not implemented". So a store lives until
:meth:`EtcdStore.close`."""
_OPEN_LOCK = threading.Lock()
_STORE_TIMEOUT: Any = vars(dist.Store)["timeout"]
"""The C++ base's timeout property: ``set_timeout`` from C++ (``PrefixStore``) sets it."""


def connect_etcd_store(url: str, timeout: timedelta) -> EtcdStore:
    """An :class:`EtcdStore` for ``url``, once a member with quorum has answered (bounded)."""
    endpoints, namespace = parse_etcd_url(url)
    return EtcdStore(endpoints, namespace=namespace, timeout=timeout)


def _bytes(value: str | bytes | Sequence[int]) -> bytes:
    return value.encode() if isinstance(value, str) else bytes(value)


class EtcdStore(dist.Store):  # type: ignore[misc]
    """A c10d store on an etcd v3 cluster (see the module docstring)."""

    def __init__(
        self,
        endpoints: Sequence[Endpoint] | str,
        *,
        namespace: str = "torchnext",
        timeout: timedelta = timedelta(seconds=30),
        request_timeout: timedelta | None = None,
        probe: bool = True,
    ) -> None:
        super().__init__()
        if isinstance(endpoints, str):
            endpoints, namespace = parse_etcd_url(endpoints)
        if timeout <= timedelta(0):
            raise ValueError(f"EtcdStore: timeout={timeout} must be a positive timedelta.")
        super().set_timeout(timeout)
        self.namespace = namespace
        self._client = EtcdClient(
            tuple(endpoints),
            request_timeout=request_timeout or _env.TORCHNEXT_ETCD_REQUEST_TIMEOUT.get(),
        )
        root = f"/{namespace}/".encode()
        self._keys = root + b"k/"
        self._ops = root + b"op/" + uuid.uuid4().hex.encode() + b"/"
        self._seq = itertools.count(1)
        self._lock = threading.Lock()
        self._lease = 0
        self._lease_granted = 0.0
        self._known: OrderedDict[bytes, tuple[int, int]] = OrderedDict()
        """Key -> (value, mod revision) after this client's last add of it: the next add
        tries one transaction on that guess before it reads."""
        if probe:
            try:
                self._range(self._keys, Deadline(timeout), what="connect", count_only=True)
            except BaseException:
                self._client.close()
                raise
        with _OPEN_LOCK:
            _OPEN[id(self)] = self

    # ------------------------------------------------------------------ identity

    @property
    def url(self) -> str:
        return f"etcd://{self._client.describe()}/{self.namespace}"

    @property
    def host(self) -> str:
        """The member that answered last (heal servers pick the interface towards it)."""
        return self._client.preferred.host

    @property
    def port(self) -> int:
        return self._client.preferred.port

    def clone(self) -> EtcdStore:
        """Another client of the same store, with connections of its own."""
        return EtcdStore(
            self._client.endpoints,
            namespace=self.namespace,
            timeout=self.timeout,
            request_timeout=self._client.request_timeout,
            probe=False,
        )

    def close(self) -> None:
        """Drop the connections; the store is unusable after (also for C++ holders)."""
        with _OPEN_LOCK:
            _OPEN.pop(id(self), None)
        self._client.close()

    def __repr__(self) -> str:
        return f"EtcdStore({self.url!r}, timeout={self.timeout})"

    # ------------------------------------------------------------------ c10d API

    @property
    def timeout(self) -> timedelta:
        """The bound on each operation (``set_timeout``, also through a ``PrefixStore``)."""
        return timedelta(seconds=_STORE_TIMEOUT.__get__(self).total_seconds())

    def set_timeout(self, timeout: timedelta) -> None:
        super().set_timeout(timeout)

    def set(self, key: str, value: str | bytes) -> None:
        body = {"key": b64(self._k(key)), "value": b64(_bytes(value))}
        self._call("/v3/kv/put", body, Deadline(self.timeout), f"set({key!r})")

    def get(self, key: str) -> bytes:
        return self._wait_values([key], Deadline(self.timeout), "get")[0]

    def multi_get(self, keys: list[str]) -> list[bytes]:
        return self._wait_values(list(keys), Deadline(self.timeout), "multi_get")

    def multi_set(self, keys: list[str], values: list[str | bytes]) -> None:
        if len(keys) != len(values):
            raise ValueError(
                f"EtcdStore.multi_set: {len(keys)} keys but {len(values)} values; pass one "
                "value per key"
            )
        deadline = Deadline(self.timeout)
        pairs = list(zip(keys, values, strict=True))
        for start in range(0, len(pairs), _TXN_CHUNK):
            ops = [
                {"request_put": {"key": b64(self._k(k)), "value": b64(_bytes(v))}}
                for k, v in pairs[start : start + _TXN_CHUNK]
            ]
            self._call("/v3/kv/txn", {"success": ops}, deadline, "multi_set")

    def wait(self, keys: list[str], timeout: timedelta | None = None) -> None:
        self._wait_values(list(keys), Deadline(timeout or self.timeout), "wait", fetch=False)

    def set_and_read(self, key: str, value: str | bytes, keys: list[str]) -> list[bytes | None]:
        """``set(key, value)``, then the values of ``keys`` (None: missing), in one
        transaction when they fit in one (a heartbeat, a commit vote)."""
        what = f"set_and_read({key!r})"
        if len(keys) >= _TXN_CHUNK:
            self.set(key, value)
            return self._read(list(keys), Deadline(self.timeout), what)[0]
        ops: list[dict[str, Any]] = [
            {"request_put": {"key": b64(self._k(key)), "value": b64(_bytes(value))}}
        ]
        ops += [{"request_range": {"key": b64(self._k(k))}} for k in keys]
        answer = self._call("/v3/kv/txn", {"success": ops}, Deadline(self.timeout), what)
        values: list[bytes | None] = []
        for response in answer.get("responses", [])[1:]:
            kvs = response["response_range"].get("kvs", [])
            values.append(unb64(kvs[0].get("value", "")) if kvs else None)
        return values

    def read_many(self, keys: list[str]) -> list[bytes | None]:
        """The values of ``keys`` (None: missing), without waiting, in one request per 64
        keys (an agreement's poll of every member's ack)."""
        return self._read(list(keys), Deadline(self.timeout), f"read_many({len(keys)} keys)")[0]

    def wait_for_value(self, key: str, wait: timedelta) -> bytes | None:
        """``key``'s value, waiting up to ``wait`` for it to be set; None if it was not.

        Unlike a timed :meth:`wait`, a short ``wait`` is not a short bound on the
        requests (each keeps the store's timeout), so a slow answer is never mistaken
        for an absent key: callers wait in short slices and look at other conditions
        between them (the commit vote does).
        """
        what = f"wait_for_value({key!r})"
        (value,), revision = self._read([key], Deadline(self.timeout), what)
        if value is None and self._client.watch_put(
            self._k(key), revision + 1, wait.total_seconds()
        ):
            (value,), _ = self._read([key], Deadline(self.timeout), what)
        return value

    def check(self, keys: list[str]) -> bool:
        deadline = Deadline(self.timeout)
        return all(v is not None for v in self._read(list(keys), deadline, "check")[0])

    def add(self, key: str, amount: int) -> int:
        what = f"add({key!r}, {amount})"
        deadline = Deadline(self.timeout)
        k = self._k(key)
        if amount == 0:
            (raw,), _ = self._read([key], deadline, what)
            if raw is not None:
                return _as_int(raw, key)
        with self._lock:
            value, revision = self._known.get(k, (0, 0))
        # This thread's record of its last add: an attempt whose answer was lost may have
        # been applied, and the record (read atomically with the key) says so.
        record_key = b64(self._ops + str(threading.get_ident()).encode())
        seq = str(next(self._seq))
        while True:
            new = value + amount
            record = {"key": record_key, "value": b64(f"{seq}:{new}".encode())}
            body = {
                "compare": [_same_revision(k, revision)],
                "success": [
                    {"request_put": {"key": b64(k), "value": b64(str(new).encode())}},
                    {"request_put": {**record, "lease": self._lease_id(deadline)}},
                ],
                "failure": [
                    {"request_range": {"key": b64(k)}},
                    {"request_range": {"key": record_key}},
                ],
            }
            try:
                answer = self._client.call(
                    "/v3/kv/txn", body, deadline, what=what, idempotent=False
                )
            except AmbiguousResult:
                # Repeating is safe: it applies only on the revision read before, which
                # an earlier attempt that was applied has changed (then the record shows).
                continue
            except LeaseNotFound:
                self._lease = 0  # expired while this process was paused: a new one
                continue
            if answer.get("succeeded"):
                self._remember(k, new, int(answer["header"]["revision"]))
                return new
            current, mine = (r["response_range"].get("kvs", []) for r in answer["responses"])
            done, _, result = _value(mine).decode().partition(":")
            if done == seq:
                return int(result)  # an earlier attempt was applied; its answer was lost
            value = _as_int(_value(current), key) if current else 0
            revision = int(current[0]["mod_revision"]) if current else 0
            _check_contention(deadline, what)

    def compare_set(self, key: str, expected: str | bytes, desired: str | bytes) -> bytes:
        """TCPStore's rule: set ``desired`` if the value is ``expected`` (or the key is
        missing and ``expected`` is empty) and return it; else return the current value
        (``expected`` itself when the key is missing)."""
        deadline = Deadline(self.timeout)
        k, want, new = self._k(key), _bytes(expected), _bytes(desired)
        what = f"compare_set({key!r})"
        put = [{"request_put": {"key": b64(k), "value": b64(new)}}]
        create = {"key": b64(k), "target": "CREATE", "result": "EQUAL", "create_revision": "0"}
        compare: dict[str, Any] = (
            create
            if not want
            else {"key": b64(k), "target": "VALUE", "result": "EQUAL", "value": b64(want)}
        )
        while True:
            _check_contention(deadline, what)
            body = {
                "compare": [compare],
                "success": put,
                "failure": [{"request_range": {"key": b64(k)}}],
            }
            answer = self._call("/v3/kv/txn", body, deadline, what)
            if answer.get("succeeded"):
                return new
            kvs = answer["responses"][0]["response_range"].get("kvs", [])
            if not kvs:
                if want:
                    return want
                compare = create  # deleted meanwhile: try creating it again
                continue
            current = unb64(kvs[0].get("value", ""))
            if current != want:
                return current
            # Present with the empty value expected: swap on this exact revision.
            compare = _same_revision(k, int(kvs[0]["mod_revision"]))

    def delete_key(self, key: str) -> bool:
        k = self._k(key)
        with self._lock:
            self._known.pop(k, None)
        answer = self._call(
            "/v3/kv/deleterange", {"key": b64(k)}, Deadline(self.timeout), f"delete_key({key!r})"
        )
        return int(answer.get("deleted", 0)) > 0

    def delete_prefix(self, prefix: str) -> int:
        """Delete every key that starts with ``prefix`` in one request; the number deleted."""
        k = self._k(prefix)
        with self._lock:
            for known in [key for key in self._known if key.startswith(k)]:
                del self._known[known]
        end = k[:-1] + bytes([k[-1] + 1])
        body = {"key": b64(k), "range_end": b64(end)}
        answer = self._call(
            "/v3/kv/deleterange", body, Deadline(self.timeout), f"delete_prefix({prefix!r})"
        )
        return int(answer.get("deleted", 0))

    def num_keys(self) -> int:
        answer = self._range(self._keys, Deadline(self.timeout), what="num_keys", count_only=True)
        return int(answer.get("count", 0))

    # The names torch's C++ code calls on a Python store (via PrefixStore, gloo...).
    deleteKey = delete_key  # noqa: N815
    getNumKeys = num_keys  # noqa: N815

    # ------------------------------------------------------------------ internals

    def _k(self, key: str) -> bytes:
        return self._keys + _bytes(key)

    def _call(self, path: str, body: dict[str, Any], deadline: Deadline, what: str) -> Any:
        return self._client.call(path, body, deadline, what=what, idempotent=True)

    def _range(
        self, prefix: bytes, deadline: Deadline, *, what: str, count_only: bool
    ) -> dict[str, Any]:
        end = prefix[:-1] + bytes([prefix[-1] + 1])
        body = {"key": b64(prefix), "range_end": b64(end), "count_only": count_only}
        return dict(self._call("/v3/kv/range", body, deadline, what))

    def _read(
        self, keys: list[str], deadline: Deadline, what: str
    ) -> tuple[list[bytes | None], int]:
        """Each key's value (None: missing) and the store revision they were read at."""
        values: list[bytes | None] = []
        revision = 0
        for start in range(0, max(1, len(keys)), _TXN_CHUNK):
            chunk = keys[start : start + _TXN_CHUNK]
            if not chunk:
                break
            ops = [{"request_range": {"key": b64(self._k(key))}} for key in chunk]
            answer = self._call("/v3/kv/txn", {"success": ops}, deadline, what)
            revision = max(revision, int(answer["header"]["revision"]))
            for response in answer.get("responses", []):
                kvs = response["response_range"].get("kvs", [])
                values.append(unb64(kvs[0].get("value", "")) if kvs else None)
        return values, revision

    def _wait_values(
        self, keys: list[str], deadline: Deadline, op: str, *, fetch: bool = True
    ) -> list[bytes]:
        while True:
            started = time.monotonic()
            values, revision = self._read(keys, deadline, f"{op}({keys!r})")
            # The last read must fit in the bound too: stop watching a few reads' time
            # before the end (a read takes longer on a loaded machine).
            reserve_s = min(
                deadline.timeout.total_seconds() / 4, max(0.02, 3 * (time.monotonic() - started))
            )
            missing = [key for key, v in zip(keys, values, strict=True) if v is None]
            if not missing:
                return [v for v in values if v is not None] if fetch else []
            wait_s = deadline.left_s() - reserve_s
            if wait_s <= 0:
                ms = int(deadline.timeout.total_seconds() * 1000)
                raise dist.DistStoreError(
                    f"wait timeout after {ms}ms, keys: {', '.join(missing)} (etcd store {self.url})"
                )
            # Wake up on the first missing key's put; the loop re-reads every key.
            self._client.watch_put(self._k(missing[0]), revision + 1, min(wait_s, _WATCH_SLICE_S))

    def _lease_id(self, deadline: Deadline) -> str:
        """A lease of this client for its bookkeeping keys, granted anew every TTL/3.

        The TTL is at least three store timeouts, so a record outlives every retry of
        the add that wrote it.
        """
        ttl_s = max(_LEASE_TTL_S, int(3 * self.timeout.total_seconds()))
        with self._lock:
            if self._lease and time.monotonic() - self._lease_granted < ttl_s / 3:
                return str(self._lease)
        answer = self._call("/v3/lease/grant", {"TTL": ttl_s}, deadline, "lease grant")
        with self._lock:
            self._lease = int(answer["ID"])
            self._lease_granted = time.monotonic()
            return str(self._lease)

    def _remember(self, key: bytes, value: int, revision: int) -> None:
        with self._lock:
            self._known[key] = (value, revision)
            self._known.move_to_end(key)
            while len(self._known) > _ADD_CACHE:
                self._known.popitem(last=False)


def _value(kvs: list[dict[str, Any]]) -> bytes:
    """The value of a range answer's first key (empty when it found none)."""
    return unb64(kvs[0].get("value", "")) if kvs else b""


def _same_revision(key: bytes, revision: int) -> dict[str, str]:
    """A transaction compare: ``key`` was last modified at ``revision`` (0: missing)."""
    return {"key": b64(key), "target": "MOD", "result": "EQUAL", "mod_revision": str(revision)}


def _check_contention(deadline: Deadline, what: str) -> None:
    if deadline.expired:
        raise dist.DistStoreError(
            f"EtcdStore.{what}: the key kept changing under this update for "
            f"{deadline.timeout}; too many processes update it at once"
        )


def _as_int(raw: bytes, key: str) -> int:
    try:
        return int(raw)
    except ValueError:
        raise ValueError(
            f"EtcdStore.add({key!r}): the key holds {raw[:40]!r}, not an integer; add only "
            "to keys that add created, or that hold a decimal number"
        ) from None
