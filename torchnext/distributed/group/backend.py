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

What not to assume: a builder never sees the group; it gets the epoch, the settings
and a failure callback, and returns the native group (or raises the revoke error).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from torchnext import _env
from torchnext.compat.distributed_internals import (
    has_native_reconfigure,
    reconfigure_options,
    set_nccl_timeout,
)
from torchnext.distributed.group.config import GroupConfig
from torchnext.distributed.group.epoch import Epoch
from torchnext.distributed.group.membership import Keys
from torchnext.errors import (
    CommRevokedError,
    CommTimeoutError,
    LaunchEnvironmentError,
    StoreUnreachableError,
)

__all__ = [
    "BuildConnection",
    "EpochBuilder",
    "NativeReconfigure",
    "OnBuildFailure",
    "build_backend",
    "check_native_reconfigure",
    "clone_store",
    "connect_from_env",
    "connect_store",
]

OnBuildFailure = Callable[[str], CommRevokedError]
"""Revoke the epoch being built, with this reason, and return the revoke error."""


def connect_store(addr: str, timeout: timedelta) -> dist.Store:
    """A client of the TCPStore at ``host:port`` whose every call is bounded by ``timeout``
    (:class:`~torchnext.distributed.launch.bounded_store.BoundedTCPStore`);
    :class:`StoreUnreachableError` if none.

    ``etcd://h1:2379,h2:2379/namespace`` gives an etcd-backed store instead
    (:mod:`torchnext.distributed.launch.etcd_store`).
    """
    if addr.startswith("etcd://"):
        from torchnext.distributed.launch.etcd_store import connect_etcd_store

        return connect_etcd_store(addr, timeout)
    host, sep, port = addr.rpartition(":")
    if not sep or not host or not port.isdigit():
        raise ValueError(
            f"store address {addr!r} is not host:port; set {_env.TORCHNEXT_STORE_ADDR.name} "
            "like '10.0.0.1:29500' (or etcd://h1:2379,h2:2379,h3:2379/job for an etcd store)"
        )
    from torchnext.distributed.launch.bounded_store import BoundedTCPStore

    try:
        # Bounded: a plain TCPStore client blocks for ever on a store host that went silent.
        return BoundedTCPStore(host, int(port), timeout=timeout)
    except (RuntimeError, OSError) as exc:
        raise StoreUnreachableError(
            f"cannot reach the store at {addr} within {timeout}: {exc}. Check that the "
            "launcher (or whatever hosts the store) is running and the address is right."
        ) from exc


def connect_from_env(timeout: timedelta) -> tuple[dist.Store, str, int]:
    """The store, member id and world size the launcher put in the environment."""
    addr = _env.TORCHNEXT_STORE_ADDR.get()
    member = _env.TORCHNEXT_MEMBER_ID.get()
    size = _env.TORCHNEXT_WORLD_SIZE.get()
    if _env.TORCHNEXT_SPARE.get():
        raise LaunchEnvironmentError(
            f"FaultTolerantGroup.from_env in warm spare {_env.TORCHNEXT_SPARE.get()}: a spare "
            "of `torchnext run --spares` gets its member id in Manager.from_env, which waits "
            "for it; build the script on Manager.from_env, or run it without --spares"
        )
    missing = [
        v.name
        for v, val in (
            (_env.TORCHNEXT_STORE_ADDR, addr),
            (_env.TORCHNEXT_MEMBER_ID, member),
            (_env.TORCHNEXT_WORLD_SIZE, size),
        )
        if not val
    ]
    if missing:
        from torchnext.distributed.launch.torchrun import torchrun_env, worker_launch_error

        torchrun = torchrun_env()
        if torchrun is not None:
            if torchrun.rank != 0:
                # Rank 0 says why, once. The others wait (bounded) for torchrun to stop
                # them when rank 0 fails, so it is never stopped before it has said it.
                time.sleep(30)
                raise SystemExit(2)
            raise LaunchEnvironmentError(
                worker_launch_error(torchrun, "FaultTolerantGroup.from_env")
            )
        raise LaunchEnvironmentError(
            f"FaultTolerantGroup.from_env: {', '.join(missing)} unset; start the process "
            "with `torchnext run` or set them (store host:port, member id, world size)"
        )
    return connect_store(addr, timeout), member, size


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


def build_backend(
    epoch: Epoch,
    prefix: str,
    *,
    backend: str,
    config: GroupConfig,
    group_name: str,
    connection: BuildConnection,
    on_failure: OnBuildFailure,
) -> Any:
    """Create ``epoch``'s native group under store ``prefix``, on a helper thread.

    The wait is bounded by ``config.store_timeout`` and ends early when the epoch is
    revoked; a build that fails or times out calls ``on_failure`` (which revokes the
    epoch) and raises.
    """
    box: dict[str, Any] = {}
    done = threading.Event()
    timeout = config.collective_timeout

    def build() -> None:
        try:
            conn = connection.take()
            store = dist.PrefixStore(prefix, conn)
            if backend == "gloo":
                box["pg"] = dist.ProcessGroupGloo(store, epoch.rank, epoch.size, timeout)
            else:
                opts = dist.ProcessGroupNCCL.Options()
                set_nccl_timeout(opts, timeout)
                box["pg"] = dist.ProcessGroupNCCL(store, epoch.rank, epoch.size, opts)
            # The rendezvous is over: the next build may use this connection (even if
            # this epoch was revoked meanwhile). Not after an error: its state is unknown.
            connection.give_back(conn)
        except BaseException as exc:  # noqa: BLE001 - handed to the waiting thread
            box["error"] = exc
        finally:
            done.set()

    thread = threading.Thread(target=build, name="torchnext-ft-connect", daemon=True)
    thread.start()
    deadline = time.monotonic() + config.store_timeout.total_seconds()
    slice_s = config.wait_slice.total_seconds()
    while not done.wait(slice_s):
        if epoch.revoked is not None:
            raise epoch.revoked
        if time.monotonic() >= deadline:
            err = on_failure(f"connecting epoch {epoch.number} did not finish within store_timeout")
            raise CommTimeoutError(
                f"group {group_name!r}: members {list(epoch.members)} did not all connect for "
                f"epoch {epoch.number} within store_timeout={config.store_timeout}"
            ) from err
    if "error" in box:
        err = on_failure(f"connecting epoch {epoch.number} failed: {box['error']}")
        raise err from box["error"]
    if epoch.revoked is not None:
        raise epoch.revoked
    return box["pg"]


def check_native_reconfigure(backend: str) -> None:
    """Raise unless ``GroupConfig.native_reconfigure`` can work with ``backend`` here."""
    if backend != "gloo" or not has_native_reconfigure():
        raise ValueError(
            "GroupConfig.native_reconfigure=True needs backend='gloo' on torch >= 2.14 "
            f"(this is torch {torch.__version__}, backend={backend!r}); leave it False to "
            "use fresh gloo groups per epoch, which works on every version"
        )


class NativeReconfigure:
    """torch 2.14: the one reconfigurable gloo group, moved to each epoch's members.

    Owns that group for the lifetime of a fault-tolerant group; :meth:`build` is the
    counterpart of :func:`build_backend` for ``GroupConfig.native_reconfigure``.
    """

    def __init__(self, store: Any, keys: Keys, *, member_id: str, config: GroupConfig) -> None:
        self._store = store
        self._keys = keys
        self._member_id = member_id
        self._config = config
        self._pg: Any = None

    def build(self, epoch: Epoch, *, group_name: str, on_failure: OnBuildFailure) -> Any:
        """Move the group to ``epoch``'s members (creating it for the first epoch)."""
        cfg, store, keys = self._config, self._store, self._keys
        if self._pg is None:
            self._pg = dist.ProcessGroupGloo(
                dist.PrefixStore(f"{keys.root}/native", clone_store(store, cfg.store_timeout)),
                epoch.rank,
                epoch.size,
                cfg.collective_timeout,
                enable_reconfigure=True,  # type: ignore[call-arg]
            )
        pg = self._pg
        store.set(keys.handle(epoch.number, self._member_id), pg.get_reconfigure_handle())
        wanted = [keys.handle(epoch.number, m) for m in epoch.members]
        deadline = time.monotonic() + cfg.store_timeout.total_seconds()
        while not store.check(wanted):
            if epoch.revoked is not None:
                raise epoch.revoked
            if time.monotonic() >= deadline:
                err = on_failure("reconfigure handles missing")
                raise CommTimeoutError(
                    f"group {group_name!r}: not every member of epoch {epoch.number} published "
                    f"its reconfigure handle within store_timeout={cfg.store_timeout}"
                ) from err
            time.sleep(cfg.poll_interval.total_seconds() / 4)
        opts = reconfigure_options()
        opts.uuid = epoch.number + 1  # must be fresh for every reconfigure; epochs are
        opts.handles = [h.decode() for h in store.multi_get(wanted)]
        opts.timeout = cfg.store_timeout
        work = pg.reconfigure(opts)
        # This work has no bounded wait(); wait on its future, in revocable slices.
        done = threading.Event()
        future = work.get_future()
        future.add_done_callback(lambda _: done.set())
        slice_s = cfg.wait_slice.total_seconds()
        while not done.wait(slice_s):
            if epoch.revoked is not None:
                raise epoch.revoked
        try:
            future.value()
        except RuntimeError as exc:
            err = on_failure(f"native reconfigure failed: {exc}")
            raise err from exc
        return pg


class EpochBuilder:
    """Builds every epoch's native group of one fault-tolerant group and its splits.

    Picks :class:`NativeReconfigure` for the group's own epochs when
    ``config.native_reconfigure`` is set (split sub-groups always get fresh groups),
    else :func:`build_backend` over one shared :class:`BuildConnection`.
    """

    def __init__(
        self,
        store: Any,
        keys: Keys,
        *,
        member_id: str,
        backend: str,
        config: GroupConfig,
        group_name: str,
    ) -> None:
        if config.native_reconfigure:
            check_native_reconfigure(backend)
        self._backend = backend
        self._config = config
        self._group_name = group_name
        self._connection = BuildConnection(store, config.store_timeout)
        self._native = (
            NativeReconfigure(store, keys, member_id=member_id, config=config)
            if config.native_reconfigure
            else None
        )

    def build(self, epoch: Epoch, prefix: str, on_failure: OnBuildFailure) -> Any:
        """``epoch``'s native group, under store ``prefix`` (bounded; see the module)."""
        if self._native is not None and not epoch.sub:
            return self._native.build(epoch, group_name=self._group_name, on_failure=on_failure)
        return build_backend(
            epoch,
            prefix,
            backend=self._backend,
            config=self._config,
            group_name=self._group_name,
            connection=self._connection,
            on_failure=on_failure,
        )
