"""Building an epoch's backend group: fresh per epoch, or torch 2.14's native reconfigure.

Default: every epoch gets a brand-new backend group (gloo or NCCL) over a fresh store
namespace, built on a helper thread so the wait is bounded and a revoke interrupts
it (gloo's rendezvous cannot be cancelled; an abandoned build ends by its own
timeout). Builds use their own store connection (:class:`BuildConnection`), so gloo's
blocking rendezvous never delays the monitor's revoke polling on a shared client. That
connection is opened once and reused by every later build, not opened per epoch:
opening a TCPStore connection costs a reverse DNS lookup of the peer address on both
ends, and one lost DNS packet costs the resolver's retry timeout (5 s by default) -- on
the recovering member, and on the store host for every client. Only a build abandoned
while its rendezvous may still use the connection makes the next build open a new one.

With ``GroupConfig.native_reconfigure`` (torch >= 2.14, gloo), one group created with
``enable_reconfigure=True`` is moved between epochs by ``reconfigure``: handles are
exchanged through the store under the epoch's keys, ranks follow the decided member
order, and the uuid is the new epoch number (fresh by construction).
"""

from __future__ import annotations

import threading
import time
from datetime import timedelta
from typing import TYPE_CHECKING, Any

import torch.distributed as dist

from torchnext import _env
from torchnext.errors import CommTimeoutError, StoreUnreachableError

if TYPE_CHECKING:
    from torchnext.distributed.group import FaultTolerantGroup, _Epoch

__all__ = ["BuildConnection", "build_backend", "clone_store", "connect_store"]


def connect_store(addr: str, timeout: timedelta) -> dist.TCPStore:
    """A client of the TCPStore at ``host:port``; :class:`StoreUnreachableError` if none."""
    host, sep, port = addr.rpartition(":")
    if not sep or not host or not port.isdigit():
        raise ValueError(
            f"store address {addr!r} is not host:port; set {_env.TORCHNEXT_STORE_ADDR.name} "
            "like '10.0.0.1:29500'"
        )
    try:
        return dist.TCPStore(host, int(port), is_master=False, timeout=timeout)
    except (RuntimeError, OSError) as exc:
        raise StoreUnreachableError(
            f"cannot reach the store at {addr} within {timeout}: {exc}. Check that the "
            "launcher (or whatever hosts the store) is running and the address is right."
        ) from exc


def clone_store(store: Any, timeout: timedelta) -> Any:
    """A new client connection to ``store`` (the same store if it cannot be cloned)."""
    try:
        clone = store.clone()
        clone.set_timeout(timeout)
        return clone
    except (AttributeError, RuntimeError):
        return store


class BuildConnection:
    """The store connection that epoch builds use, handed from one build to the next.

    A build :meth:`take`s it (opening one if none is ready) and :meth:`give_back`s it
    once its rendezvous is over. A build that is abandoned keeps it, since gloo may
    still be blocked on it, so the next build opens a fresh one. Thread-safe.
    """

    def __init__(self, store: Any, timeout: timedelta) -> None:
        self._store = store
        self._timeout = timeout
        self._idle: Any = None
        self._lock = threading.Lock()

    def take(self) -> Any:
        with self._lock:
            conn, self._idle = self._idle, None
        return conn if conn is not None else clone_store(self._store, self._timeout)

    def give_back(self, conn: Any) -> None:
        with self._lock:
            if self._idle is None:
                self._idle = conn


def build_backend(group: FaultTolerantGroup, epoch: _Epoch, prefix: str) -> Any:
    """Create the epoch's backend group on a helper thread, bounded and revocable."""
    if group.config.native_reconfigure and not epoch.sub:
        return _native_reconfigure(group, epoch)
    box: dict[str, Any] = {}
    done = threading.Event()
    timeout = group.config.collective_timeout

    def build() -> None:
        try:
            conn = group._build_connection.take()
            store = dist.PrefixStore(prefix, conn)
            if group.backend == "gloo":
                box["pg"] = dist.ProcessGroupGloo(store, epoch.rank, epoch.size, timeout)
            else:
                opts = dist.ProcessGroupNCCL.Options()
                opts._timeout = timeout
                box["pg"] = dist.ProcessGroupNCCL(store, epoch.rank, epoch.size, opts)
            # The rendezvous is over: the next build may use this connection (even if
            # this epoch was revoked meanwhile). Not after an error: its state is unknown.
            group._build_connection.give_back(conn)
        except BaseException as exc:  # noqa: BLE001 - handed to the waiting thread
            box["error"] = exc
        finally:
            done.set()

    thread = threading.Thread(target=build, name="torchnext-ft-connect", daemon=True)
    thread.start()
    deadline = time.monotonic() + group.config.store_timeout.total_seconds()
    slice_s = group.config.wait_slice.total_seconds()
    while not done.wait(slice_s):
        if epoch.revoked is not None:
            raise epoch.revoked
        if time.monotonic() >= deadline:
            err = group._revoke_epoch(
                epoch,
                f"connecting epoch {epoch.number} did not finish within store_timeout",
                (),
            )
            raise CommTimeoutError(
                f"group {group.name!r}: members {list(epoch.members)} did not all connect for "
                f"epoch {epoch.number} within store_timeout={group.config.store_timeout}"
            ) from err
    if "error" in box:
        err = group._revoke_epoch(
            epoch, f"connecting epoch {epoch.number} failed: {box['error']}", ()
        )
        raise err from box["error"]
    if epoch.revoked is not None:
        raise epoch.revoked
    return box["pg"]


def _native_reconfigure(group: FaultTolerantGroup, epoch: _Epoch) -> Any:
    """torch 2.14: move the one reconfigurable gloo group to ``epoch``'s members."""
    from torch._C._distributed_c10d import ReconfigureOptions  # type: ignore[attr-defined]

    if group._native_pg is None:
        group._native_pg = dist.ProcessGroupGloo(
            dist.PrefixStore(
                f"{group._keys.root}/native", clone_store(group.store, group.config.store_timeout)
            ),
            epoch.rank,
            epoch.size,
            group.config.collective_timeout,
            enable_reconfigure=True,  # type: ignore[call-arg]
        )
    pg = group._native_pg
    keys = group._keys
    group.store.set(keys.handle(epoch.number, group.member_id), pg.get_reconfigure_handle())
    wanted = [keys.handle(epoch.number, m) for m in epoch.members]
    deadline = time.monotonic() + group.config.store_timeout.total_seconds()
    while not group.store.check(wanted):
        if epoch.revoked is not None:
            raise epoch.revoked
        if time.monotonic() >= deadline:
            err = group._revoke_epoch(epoch, "reconfigure handles missing", ())
            raise CommTimeoutError(
                f"group {group.name!r}: not every member of epoch {epoch.number} published "
                f"its reconfigure handle within store_timeout={group.config.store_timeout}"
            ) from err
        time.sleep(group.config.poll_interval.total_seconds() / 4)
    opts = ReconfigureOptions()
    opts.uuid = epoch.number + 1  # must be fresh for every reconfigure; epochs are
    opts.handles = [h.decode() for h in group.store.multi_get(wanted)]
    opts.timeout = group.config.store_timeout
    work = pg.reconfigure(opts)
    # This work has no bounded wait(); wait on its future, in revocable slices.
    done = threading.Event()
    future = work.get_future()
    future.add_done_callback(lambda _: done.set())
    slice_s = group.config.wait_slice.total_seconds()
    while not done.wait(slice_s):
        if epoch.revoked is not None:
            raise epoch.revoked
    try:
        future.value()
    except RuntimeError as exc:
        err = group._revoke_epoch(epoch, f"native reconfigure failed: {exc}", ())
        raise err from exc
    return pg
