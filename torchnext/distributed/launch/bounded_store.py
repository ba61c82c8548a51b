"""A ``TCPStore`` client whose every call ends within its timeout, even when the server is silent.

Use :class:`BoundedTCPStore` (``connect_store`` returns one for a ``host:port`` address)
wherever a process talks to a store on *another machine*. torch's ``TCPStore`` client
bounds only its waits for keys: any other call to a server that stopped answering (its
host lost power or its network, its process is stopped) blocks in ``recv`` for ever, and
so does opening a connection to a server that accepts but never answers. So a worker or
an agent whose store host vanished would hang, never report anything.

How it is bounded: the client's socket gets a receive timeout (``SO_RCVTIMEO``) equal to
the store's timeout, so a call on a silent server fails within that time (a wait for
keys: within its own timeout plus that time); a connection is opened on a helper thread
and given up after the timeout. A call that failed may leave a late reply on its
connection, which the next call would read as its own answer, so the connection of a
failed call is never used again: the next call opens a fresh one.

:meth:`~BoundedTCPStore.reset` ends the current connection at once (a call blocked on it
fails; the next call reconnects): after a network outage, a call still in flight on the
old connection could otherwise wait seconds for TCP's retransmission back-off.
:meth:`~BoundedTCPStore.abort` does the same for good: every later call raises the given
error (a store that is lost, so nothing waits on it again).

At interpreter exit, every such store is closed after the fault-tolerant groups of the
process are shut down, and the exit waits (a few seconds at most) for calls still inside
torch's code: a daemon thread caught there by the interpreter's end aborts the process.

What not to assume: this relies on the client's socket being a plain blocking socket that
torch reads with ``recv`` (true of torch 2.13 and 2.14's ``TCPStore``); the socket is
found by its peer address among the descriptors that appear while the client is made,
under a process-wide lock, so two connections are never opened at once in one process.
A connection attempt that hangs (a server stopped mid-handshake) keeps that lock until
the server answers or dies: later attempts in the process fail within their timeout.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import socket
import struct
import sys
import threading
import time
from collections.abc import Callable, Iterator
from datetime import timedelta
from typing import Any, TypeVar

import torch.distributed as dist

from torchnext.errors import StoreUnreachableError

__all__ = ["BoundedTCPStore"]

T = TypeVar("T")

_CONNECT_LOCK = threading.Lock()
_OPEN: dict[int, BoundedTCPStore] = {}
"""Stores not closed yet: torch's C++ side (``PrefixStore``, gloo) keeps a Python store's
C++ half only, so the Python object must outlive it (as for the etcd store)."""
_OPEN_LOCK = threading.Lock()
_STORE_TIMEOUT: Any = vars(dist.Store)["timeout"]
_BUSY = threading.Condition()
_busy_threads: set[threading.Thread] = set()
"""Threads inside a call or a connection attempt of a store (waited for at exit)."""
_EXIT_WAIT_S = 5.0


class BoundedTCPStore(dist.Store):  # type: ignore[misc]
    """A client of the ``TCPStore`` at ``host:port`` whose calls are bounded (module docstring)."""

    def __init__(self, host: str, port: int, *, timeout: timedelta) -> None:
        super().__init__()
        if timeout <= timedelta(0):
            raise ValueError(f"BoundedTCPStore: timeout={timeout} must be a positive timedelta.")
        super().set_timeout(timeout)
        self.host = host
        self.port = int(port)
        self._lock = threading.Lock()
        self._client: Any = None
        self._fds: list[int] = []
        """Duplicates of the connection's socket descriptors (its options, its shutdown)."""
        self._failed: BaseException | None = None
        self._cut: tuple[Any, BaseException] | None = None
        """The connection last ended by ``reset(reason)``, and the reason."""
        self._connect()
        with _OPEN_LOCK:
            _OPEN[id(self)] = self

    # ------------------------------------------------------------------ identity

    def __repr__(self) -> str:
        return f"BoundedTCPStore('{self.host}:{self.port}', timeout={self.timeout})"

    @property
    def timeout(self) -> timedelta:
        """The bound on each call (``set_timeout``, also through a ``PrefixStore``)."""
        return timedelta(seconds=_STORE_TIMEOUT.__get__(self).total_seconds())

    def set_timeout(self, timeout: timedelta) -> None:
        super().set_timeout(timeout)
        with self._lock:
            client, fds = self._client, list(self._fds)
        if client is not None:
            client.set_timeout(timeout)
        for fd in fds:
            _set_recv_timeout(fd, timeout)

    def clone(self) -> BoundedTCPStore:
        """Another client of the same store, on a connection of its own."""
        return BoundedTCPStore(self.host, self.port, timeout=self.timeout)

    # ------------------------------------------------------------------ ending connections

    def reset(self, reason: BaseException | None = None) -> None:
        """End the current connection now: a call blocked on it fails, the next reconnects.

        With ``reason``, the call cut short raises it (why the connection was ended, e.g.
        this process was evicted) instead of a :class:`StoreUnreachableError`, which would
        wrongly blame a store that is fine."""
        with self._lock:
            client, self._client, fds, self._fds = self._client, None, self._fds, []
            if reason is not None and client is not None:
                self._cut = (client, reason)
        _shut(fds)

    def abort(self, error: BaseException) -> None:
        """End the connection for good: blocked and later calls raise ``error``."""
        with self._lock:
            self._failed = error
        self.reset()

    def close(self) -> None:
        """Drop the connection; the store is unusable after (also for C++ holders)."""
        with _OPEN_LOCK:
            _OPEN.pop(id(self), None)
        self.abort(StoreUnreachableError(f"the client of the store at {self._addr} was closed"))

    # ------------------------------------------------------------------ c10d API

    def set(self, key: str, value: str | bytes) -> None:
        self._call(f"set({key!r})", lambda c: c.set(key, value))

    def get(self, key: str) -> bytes:
        return bytes(self._call(f"get({key!r})", lambda c: c.get(key)))

    def add(self, key: str, amount: int) -> int:
        return int(self._call(f"add({key!r}, {amount})", lambda c: c.add(key, amount)))

    def compare_set(self, key: str, expected: str | bytes, desired: str | bytes) -> bytes:
        what = f"compare_set({key!r})"
        return bytes(self._call(what, lambda c: c.compare_set(key, expected, desired)))

    def check(self, keys: list[str]) -> bool:
        return bool(self._call(f"check({list(keys)!r})", lambda c: c.check(list(keys))))

    def wait(self, keys: list[str], timeout: timedelta | None = None) -> None:
        what = f"wait({list(keys)!r})"
        if timeout is None:
            self._call(what, lambda c: c.wait(list(keys)))
        else:
            self._call(what, lambda c: c.wait(list(keys), timeout))

    def multi_get(self, keys: list[str]) -> list[bytes]:
        values = self._call(f"multi_get({list(keys)!r})", lambda c: c.multi_get(list(keys)))
        return [bytes(v) for v in values]

    def multi_set(self, keys: list[str], values: list[str | bytes]) -> None:
        self._call("multi_set", lambda c: c.multi_set(list(keys), list(values)))

    def delete_key(self, key: str) -> bool:
        return bool(self._call(f"delete_key({key!r})", lambda c: c.delete_key(key)))

    def num_keys(self) -> int:
        return int(self._call("num_keys", lambda c: c.num_keys()))

    # The names torch's C++ code calls on a Python store (via PrefixStore, gloo...).
    deleteKey = delete_key  # noqa: N815
    getNumKeys = num_keys  # noqa: N815

    # ------------------------------------------------------------------ internals

    @property
    def _addr(self) -> str:
        return f"{self.host}:{self.port}"

    def _call(self, what: str, fn: Callable[[Any], T]) -> T:
        with self._lock:
            failed, client = self._failed, self._client
        if failed is not None:
            raise failed
        if client is None:
            client = self._connect()
        try:
            with _busy():
                return fn(client)
        except (RuntimeError, OSError) as exc:
            self._drop(client)
            with self._lock:
                failed, cut = self._failed, self._cut
            if failed is not None:
                raise failed from None
            if cut is not None and cut[0] is client:
                raise cut[1] from None
            if isinstance(exc, dist.DistStoreError):
                raise  # a wait for keys that ran out: the server answered
            first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            raise StoreUnreachableError(
                f"the store at {self._addr} did not answer {what} within {self.timeout} "
                f"({first}): its host may be down, stopped or cut off from this one"
            ) from None

    def _drop(self, client: Any) -> None:
        """Never reuse ``client``'s connection: a late reply may be waiting on it."""
        with self._lock:
            if self._client is not client:
                return
            self._client, fds, self._fds = None, self._fds, []
        _shut(fds)

    def _connect(self) -> Any:
        """Open a connection (bounded by the timeout) and make it the current one."""
        timeout = self.timeout
        box: dict[str, Any] = {}
        handoff = threading.Lock()
        done = threading.Event()

        def attempt() -> None:
            try:
                with _busy():
                    outcome: tuple[str, Any] = (
                        "result",
                        _open_client(self.host, self.port, timeout),
                    )
            except BaseException as exc:  # noqa: BLE001 - handed to the caller
                outcome = ("error", exc)
            with handoff:
                if box.get("abandoned"):
                    if outcome[0] == "result":
                        _shut(outcome[1][1])  # the caller gave up: nobody uses it
                    return
                box[outcome[0]] = outcome[1]
            done.set()

        threading.Thread(target=attempt, name="torchnext-store-connect", daemon=True).start()
        # The attempt's own connect is bounded by the timeout; the margin covers the
        # handshake's reply, which only abandoning the attempt bounds.
        deadline = time.monotonic() + timeout.total_seconds() + 1.0
        while not done.wait(0.05) and time.monotonic() < deadline and self._failed is None:
            pass  # an abort() ends the wait at once
        with handoff:
            if not ("result" in box or "error" in box):
                box["abandoned"] = True
                if self._failed is not None:
                    raise self._failed
                raise StoreUnreachableError(
                    f"cannot reach the store at {self._addr} within {timeout}: no answer (its "
                    "host may be down, stopped or cut off). Check that the agent hosting it "
                    "runs and that host and port are right."
                )
        if "error" in box:
            exc = box["error"]
            if isinstance(exc, StoreUnreachableError):
                raise exc
            first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            raise StoreUnreachableError(
                f"cannot reach the store at {self._addr} within {timeout}: {first}. Check "
                "that the agent hosting it runs and that host and port are right."
            ) from None
        client, fds = box["result"]
        with self._lock:
            if self._failed is not None:
                failed = self._failed
                _shut(fds)
                raise failed
            old, self._client, self._fds = self._fds, client, fds
        _shut(old)
        return client


@contextlib.contextmanager
def _busy() -> Iterator[None]:
    """Mark this thread as inside a store call (C++ code) until the block ends."""
    me = threading.current_thread()
    with _BUSY:
        _busy_threads.add(me)
    try:
        yield
    finally:
        with _BUSY:
            _busy_threads.discard(me)
            _BUSY.notify_all()


@atexit.register
def _end_calls_at_exit() -> None:
    # A daemon thread still inside a store call when the interpreter finalizes aborts
    # the process ("terminate called without an active exception"), which would turn a
    # clean exit into a crash. So stop what calls the store in the background (the
    # monitors of fault-tolerant groups: stopped first, they leave quietly), end every
    # connection (blocked calls return at once, later ones fail fast) and wait, bounded,
    # for the threads to leave torch's code.
    groups = sys.modules.get("torchnext.distributed.group.fault_tolerant_group")
    for group in groups.live_groups() if groups is not None else ():
        try:
            group.shutdown()
        except Exception:  # noqa: BLE001 - exiting anyway
            pass
    with _OPEN_LOCK:
        stores = list(_OPEN.values())
    for store in stores:
        store.abort(StoreUnreachableError(f"the store at {store._addr} was closed at exit"))
    deadline = time.monotonic() + _EXIT_WAIT_S
    with _BUSY:
        while _busy_threads - {threading.current_thread()}:
            left = deadline - time.monotonic()
            if left <= 0:
                break
            _BUSY.wait(left)


def _open_client(host: str, port: int, timeout: timedelta) -> tuple[Any, list[int]]:
    """A new ``TCPStore`` client and duplicates of its socket descriptors (found by peer
    port, under the lock, so no other connection of this process can be mistaken for it)."""
    if not _CONNECT_LOCK.acquire(timeout=timeout.total_seconds()):
        raise StoreUnreachableError(
            f"cannot reach the store at {host}:{port} within {timeout}: an earlier "
            "connection attempt of this process still waits for a silent store server"
        )
    try:
        before = _socket_inodes()
        client = dist.TCPStore(host, port, is_master=False, timeout=timeout)
        new = [fd for fd, ino in _socket_inodes().items() if before.get(fd) != ino]
    finally:
        _CONNECT_LOCK.release()
    fds: list[int] = []
    for fd in new:
        try:
            dup = os.dup(fd)
        except OSError:
            continue
        sock = socket.socket(fileno=dup)
        try:
            peer_port = sock.getpeername()[1]
        except (OSError, IndexError):
            peer_port = -1
        finally:
            sock.detach()  # the descriptor stays open, owned by the store
        if peer_port != port:
            os.close(dup)
            continue
        _set_recv_timeout(dup, timeout)
        fds.append(dup)
    return client, fds


def _socket_inodes() -> dict[int, int]:
    """This process's socket descriptors and their inodes."""
    found: dict[int, int] = {}
    for name in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{name}")
        except OSError:
            continue
        if target.startswith("socket:["):
            found[int(name)] = int(target[8:-1])
    return found


def _set_recv_timeout(fd: int, timeout: timedelta) -> None:
    seconds = max(timeout.total_seconds(), 0.001)
    whole = int(seconds)
    value = struct.pack("ll", whole, int((seconds - whole) * 1_000_000))
    sock = socket.socket(fileno=fd)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, value)
    except OSError:
        pass  # the connection is gone already
    finally:
        sock.detach()


def _shut(fds: list[int]) -> None:
    """End the connection of each descriptor (a call blocked on it returns), then close it."""
    for fd in fds:
        sock = socket.socket(fileno=fd)
        try:
            sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        finally:
            sock.detach()
        os.close(fd)
