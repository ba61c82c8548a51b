"""One-sided communication (RMA) windows on CPU: put, get, accumulate, signals, fences, locks.

Every member of a group registers a tensor (collectively, :meth:`Window.create` or
:meth:`Window.allocate`); afterwards any member reads and writes any member's window
without the target doing anything: members on the same host write straight into the
target's shared memory (one ``memcpy``, zero copies in between); members on other hosts
go through the target's progress thread over TCP. The target's main thread can be
computing all along.

Synchronisation follows MPI: :meth:`Window.fence` (collective; completes every
operation issued before it, everywhere) for active-target epochs, and
:meth:`Window.lock`/:meth:`Window.unlock` (shared or exclusive, per target) for
passive-target ones; :meth:`Window.signal`/:meth:`Window.wait_signal` are 2.14's
point-to-point notifications (a put followed by a signal is seen in that order on
x86 and through TCP). Accumulates into one target are atomic with respect to each
other. Every wait is bounded (``timeout``); every operation checks its arguments at
the caller before touching the target.

A window is tied to its group's epoch: when the group is revoked or reconfigured,
pending and later operations raise :class:`~torchnext.errors.WindowRevokedError`;
create a new window on the new membership.

What not to assume: ``win.tensor`` is the shared memory (your tensor was copied into it
at creation); reading or writing a region while another rank writes it, outside a
fence or lock epoch, is a race, as in MPI; CPU tensors only.

Legend: ``n`` counts elements; offsets are in elements of the flattened window.
"""

from __future__ import annotations

import itertools
import json
import os
import queue
import threading
import time
import weakref
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Literal

import torch

from torchnext.distributed.rma._doorbell import Doorbell, ring
from torchnext.distributed.rma._group import WindowGroup
from torchnext.distributed.rma._progress import Op, ProgressServer, RemotePeer
from torchnext.distributed.rma._shm import MUTEX_ACCUMULATE, Segment, backoff_sleep, host_id
from torchnext.errors import CommTimeoutError, WindowError, WindowRevokedError

__all__ = ["Window", "WindowConfig", "RmaWork", "AccumulateOp"]

AccumulateOp = Literal["sum", "min", "max", "replace"]
_ACC_CODES: dict[str, int] = {"sum": 1, "min": 2, "max": 3, "replace": 4}
_ACC_NAMES = {v: k for k, v in _ACC_CODES.items()}
_window_counters: dict[str, itertools.count[int]] = {}
_counters_lock = threading.Lock()


@dataclass(frozen=True, kw_only=True)
class WindowConfig:
    """How a window is reached and how long its operations may wait."""

    timeout: timedelta = timedelta(seconds=60)
    """Default bound of every wait (creation, locks, signals, fences, remote replies)."""
    transport: Literal["auto", "shm", "tcp"] = "auto"
    """``auto``: shared memory with members on this host, TCP with the others;
    ``tcp``: TCP with everyone (tests the cross-host path on one host); ``shm``:
    shared memory only (creation fails if a member is on another host)."""
    bind_addr: str = ""
    """Address the progress server listens on; empty: ``TORCHNEXT_RMA_ADDR``, else
    127.0.0.1 when every member is on this host, else this host's name's address."""

    def __post_init__(self) -> None:
        if self.timeout <= timedelta(0):
            raise ValueError(f"WindowConfig.timeout={self.timeout}; pass a positive timedelta")
        if self.transport not in ("auto", "shm", "tcp"):
            raise ValueError(
                f"WindowConfig.transport={self.transport!r}; use 'auto', 'shm' or 'tcp'"
            )


class RmaWork:
    """Handle of a nonblocking window operation (like ``torch.distributed.Work``)."""

    def __init__(self, value: Any = None) -> None:
        self._done = threading.Event()
        self._error: BaseException | None = None
        self.value = value
        """The result once complete: the tensor of a ``get``, None otherwise."""

    def _finish(self, error: BaseException | None = None) -> None:
        self._error = error
        self._done.set()

    def is_completed(self) -> bool:
        return self._done.is_set()

    def exception(self) -> BaseException | None:
        return self._error if self._done.is_set() else None

    def wait(self, timeout: timedelta | None = None) -> Any:
        """Wait (bounded; default 60 s) and return ``value``; re-raises the op's error."""
        bound = (timeout or timedelta(seconds=60)).total_seconds()
        if not self._done.wait(bound):
            raise CommTimeoutError(
                f"RmaWork.wait: the operation did not complete within {bound:.1f} s"
            )
        if self._error is not None:
            raise self._error
        return self.value


class Window:
    """An RMA window over a group; see the module docstring. Build with :meth:`create`."""

    # ------------------------------------------------------------------ creation

    @classmethod
    def create(
        cls, group: WindowGroup, tensor: torch.Tensor, config: WindowConfig | None = None
    ) -> Window:
        """Collective: every member registers ``tensor`` (its contents are copied in).

        Members may register different sizes, but one dtype. Use :attr:`tensor`
        afterwards: it is the shared memory other members read and write.
        """
        if not isinstance(tensor, torch.Tensor) or tensor.device.type != "cpu":
            raise WindowError(
                f"Window.create: tensor must be a CPU tensor; got {type(tensor).__name__} on "
                f"{getattr(tensor, 'device', '?')}. Copy it to the CPU first."
            )
        win = cls(group, tuple(tensor.shape), tensor.dtype, config or WindowConfig())
        win.tensor.copy_(tensor.detach())
        win._barrier("ready")
        return win

    @classmethod
    def allocate(
        cls,
        group: WindowGroup,
        shape: Sequence[int],
        dtype: torch.dtype,
        config: WindowConfig | None = None,
    ) -> Window:
        """Collective: every member gets a zero-filled shared window of ``shape`` and ``dtype``."""
        win = cls(group, tuple(int(s) for s in shape), dtype, config or WindowConfig())
        win._barrier("ready")
        return win

    def __init__(
        self, group: WindowGroup, shape: tuple[int, ...], dtype: torch.dtype, config: WindowConfig
    ) -> None:
        self._group = group
        self.config = config
        self.rank = int(group.rank)
        self.size = int(group.size)
        self.epoch = int(group.epoch)
        self._store = group.store
        # Sub-groups of a split share their parent's name and epoch: the member list
        # tells them apart, so their windows never share store keys.
        members = getattr(group, "members", None) or tuple(range(self.size))
        ident = f"{group.name}/e{self.epoch}/m{zlib.crc32(repr(tuple(members)).encode()):08x}"
        with _counters_lock:
            counter = _window_counters.setdefault(ident, itertools.count())
            index = next(counter)
        self._prefix = f"torchnext/rma/{ident}/w{index}"
        self._timeout_s = config.timeout.total_seconds()
        self._revoked: str | None = None
        self._closed = False
        self._lock = threading.RLock()  # revoke() may run inside a locked section
        self._held: dict[int, bool] = {}  # target -> exclusive
        self._consumed = [0] * self.size
        self._fence_n = 0
        self._pending: set[RmaWork] = set()
        self._queue: queue.Queue[tuple[Callable[[], None], RmaWork] | None] = queue.Queue()
        self._worker: threading.Thread | None = None
        self._server: ProgressServer | None = None
        self._peers: dict[int, Segment | RemotePeer] = {}
        numel = 1
        for s in shape:
            numel *= s
        self._shape = shape
        self._bell = Doorbell()
        self._bells = [""] * self.size
        self._own = Segment.create(world=self.size, dtype=dtype, numel=numel)
        try:
            self._connect(shape, dtype, numel)
        except BaseException:
            self._own.unlink()
            self.close()
            raise
        add_cb = getattr(group, "add_revoke_callback", None)
        if callable(add_cb):
            # A weak reference: the group must not keep closed windows alive.
            ref = weakref.ref(self)

            def on_revoke(err: BaseException) -> None:
                win = ref()
                if win is not None:
                    win.revoke(f"group revoked: {err}")

            add_cb(on_revoke)

    def _connect(self, shape: tuple[int, ...], dtype: torch.dtype, numel: int) -> None:
        me: dict[str, Any] = {
            "host": host_id(),
            "path": str(self._own.path),
            "dtype": str(dtype),
            "numel": numel,
            "pid": os.getpid(),
            "bell": self._bell.address,
        }
        infos = self._all_gather("info", json.dumps(me))
        peers = [json.loads(s) for s in infos]
        for r, p in enumerate(peers):
            if p["dtype"] != str(dtype):
                raise WindowError(
                    f"Window creation: rank {r} registered dtype {p['dtype']}, this rank {dtype}; "
                    "every member must register the same dtype"
                )
        self._numels = [int(p["numel"]) for p in peers]
        # Doorbells are reachable on this host only (abstract Unix sockets).
        self._bells = [str(p.get("bell", "")) if p["host"] == me["host"] else "" for p in peers]
        transport = self.config.transport
        remote = [
            r
            for r, p in enumerate(peers)
            if r != self.rank and (transport == "tcp" or p["host"] != me["host"])
        ]
        if transport == "shm" and remote:
            raise WindowError(
                f"Window creation: transport='shm' but ranks {remote} are on another host; use 'auto'"
            )
        served_by_me = transport == "tcp" or any(p["host"] != me["host"] for p in peers)
        if served_by_me:
            self._server = ProgressServer(self, self._bind_addr(peers, me["host"]))
        addrs = self._all_gather("addr", self._server.address if self._server else "")
        for r, p in enumerate(peers):
            if r == self.rank:
                continue
            if r in remote:
                if not addrs[r]:
                    raise WindowError(
                        f"Window creation: rank {r} is remote but runs no progress server"
                    )
                self._peers[r] = RemotePeer(addrs[r], r)
            else:
                try:
                    self._peers[r] = Segment.open(
                        p["path"], world=self.size, dtype=dtype, numel=int(p["numel"])
                    )
                except OSError as exc:
                    raise WindowError(
                        f"Window creation: cannot map rank {r}'s segment {p['path']} ({exc}); the "
                        "members do not share /dev/shm (separate containers?): pass "
                        "WindowConfig(transport='tcp')"
                    ) from None
        self._barrier("mapped")
        self._own.unlink()  # every member has mapped it: no name left behind, even after SIGKILL

    def _bind_addr(self, peers: list[dict[str, Any]], my_host: str) -> str:
        if self.config.bind_addr:
            return self.config.bind_addr
        from torchnext._env import TORCHNEXT_RMA_ADDR

        configured = TORCHNEXT_RMA_ADDR.get()
        if configured:
            return configured
        if all(p["host"] == my_host for p in peers):
            return "127.0.0.1"
        import socket

        return socket.gethostbyname(socket.gethostname())

    # ------------------------------------------------------------------ store helpers

    def _deadline(self, timeout: timedelta | None) -> float:
        return time.monotonic() + (
            timeout.total_seconds() if timeout is not None else self._timeout_s
        )

    def _wait_key(self, key: str, deadline: float, what: str) -> None:
        attempt = 0
        while not self._store.check([key]):
            self._ensure_live()
            if time.monotonic() > deadline:
                raise CommTimeoutError(
                    f"RMA window: {what} did not complete within the timeout ({key})"
                )
            time.sleep(min(0.005, 0.0002 * (attempt + 1)))
            attempt += 1

    def _all_gather(self, tag: str, value: str) -> list[str]:
        deadline = self._deadline(None)
        self._store.set(f"{self._prefix}/{tag}/{self.rank}", value)
        out = []
        for r in range(self.size):
            key = f"{self._prefix}/{tag}/{r}"
            self._wait_key(key, deadline, f"window creation ({tag}) waiting for rank {r}")
            out.append(self._store.get(key).decode())
        return out

    def _barrier(self, tag: str, timeout: timedelta | None = None) -> None:
        deadline = self._deadline(timeout)
        key = f"{self._prefix}/barrier/{tag}"
        if int(self._store.add(key, 1)) == self.size:
            self._store.set(f"{key}/done", "1")
        self._wait_key(f"{key}/done", deadline, f"barrier {tag!r}")

    # ------------------------------------------------------------------ state

    @property
    def tensor(self) -> torch.Tensor:
        """This member's window memory, in the registered shape (peers' writes land here)."""
        return self._own.data.view(self._shape)

    @property
    def dtype(self) -> torch.dtype:
        return self._own.dtype

    def numel(self, rank: int) -> int:
        """Elements in ``rank``'s window."""
        return self._numels[self._check_rank(rank, "rank")]

    @property
    def is_revoked(self) -> bool:
        return self._revoked is not None

    def revoke(self, reason: str = "revoked") -> None:
        """Fail pending and future operations with :class:`WindowRevokedError` (idempotent)."""
        with self._lock:
            if self._revoked is not None or self._closed:
                return
            self._revoked = reason
            pending = list(self._pending)
        self._own.mark_revoked()
        ring(self._bell.address)  # wake this process's waiters now
        err = self._revoked_error()
        for work in pending:
            if not work.is_completed():
                work._finish(err)
        self._queue.put(None)
        if self._server is not None:
            self._server.close()
        for p in self._peers.values():
            if isinstance(p, RemotePeer):
                p.close()

    def _revoked_error(self) -> WindowRevokedError:
        return WindowRevokedError(
            f"RMA window (group {self._group.name!r}, epoch {self.epoch}) is revoked: {self._revoked}; "
            "create a new window on the group's new membership",
            epoch=self.epoch,
            reason=str(self._revoked),
        )

    def _ensure_live(self) -> None:
        if self._closed:
            raise WindowError("RMA window is closed; create a new one")
        if self._revoked is None:
            if int(self._group.epoch) != self.epoch:
                self.revoke(f"the group moved to epoch {self._group.epoch}")
            elif getattr(self._group, "is_revoked", False):
                self.revoke("the group is revoked")
        if self._revoked is not None:
            raise self._revoked_error()

    def close(self) -> None:
        """Release this member's resources (local; peers' later accesses to it fail cleanly)."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            pending = list(self._pending)
        for work in pending:
            if not work.is_completed():
                work._finish(WindowError("RMA window was closed with this operation pending"))
        self._queue.put(None)
        if self._server is not None:
            self._server.close()
        for p in self._peers.values():
            p.close()
        self._own.close()
        self._bell.close()

    def __enter__(self) -> Window:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------ validation

    def _check_rank(self, rank: int, name: str) -> int:
        if not isinstance(rank, int) or not 0 <= rank < self.size:
            raise WindowError(
                f"{name}={rank!r} is outside the window's group; pass 0..{self.size - 1}"
            )
        return rank

    def _check_region(self, target: int, offset: int, n: int, name: str) -> None:
        size = self._numels[target]
        if not isinstance(offset, int) or offset < 0 or n < 0 or offset + n > size:
            raise WindowError(
                f"{name}: target_offset_nelems={offset!r} with {n} elements overruns rank {target}'s "
                f"window of {size} elements; need 0 <= offset and offset + n <= {size}"
            )

    def _check_tensor(self, tensor: torch.Tensor, name: str) -> torch.Tensor:
        if not isinstance(tensor, torch.Tensor) or tensor.device.type != "cpu":
            raise WindowError(
                f"{name}: expected a CPU tensor; got {getattr(tensor, 'device', type(tensor).__name__)}"
            )
        if tensor.dtype != self.dtype:
            raise WindowError(
                f"{name}: tensor dtype {tensor.dtype} does not match the window dtype {self.dtype}; "
                f"convert it with .to({self.dtype})"
            )
        # Detached: window traffic is data movement, never part of an autograd graph.
        return tensor.detach().reshape(-1).contiguous()

    # ------------------------------------------------------------------ async plumbing

    def _submit(self, fn: Callable[[], Any], async_op: bool, value: Any = None) -> RmaWork | None:
        if not async_op:
            fn()
            return None
        work = RmaWork(value)
        with self._lock:
            self._ensure_live()
            self._pending.add(work)
            if self._worker is None:
                self._worker = threading.Thread(
                    target=self._run_queue, name="torchnext-rma-async", daemon=True
                )
                self._worker.start()
        self._queue.put((fn, work))
        return work

    def _run_queue(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            fn, work = item
            if work.is_completed():
                continue
            try:
                self._ensure_live()
                fn()
            except BaseException as exc:  # noqa: BLE001 - delivered through the handle
                work._finish(exc)
            else:
                work._finish()
            with self._lock:
                self._pending.discard(work)

    def flush(self, timeout: timedelta | None = None) -> None:
        """Wait until every nonblocking operation this member issued has completed."""
        deadline = self._deadline(timeout)
        with self._lock:
            pending = list(self._pending)
        for work in pending:
            work.wait(timedelta(seconds=max(0.0, deadline - time.monotonic())))

    # ------------------------------------------------------------------ operations

    def put(
        self,
        tensor: torch.Tensor,
        dst_rank: int,
        target_offset_nelems: int = 0,
        *,
        async_op: bool = False,
    ) -> RmaWork | None:
        """Write ``tensor`` (flattened) into ``dst_rank``'s window at the offset."""
        self._ensure_live()
        dst = self._check_rank(dst_rank, "put: dst_rank")
        src = self._check_tensor(tensor, "put")
        self._check_region(dst, target_offset_nelems, src.numel(), "put")
        return self._submit(lambda: self._put(src, dst, target_offset_nelems), async_op)

    def _put(self, src: torch.Tensor, dst: int, offset: int) -> None:
        target = self._target(dst)
        if isinstance(target, Segment):
            target.data[offset : offset + src.numel()].copy_(src)
        else:
            target.request(
                Op.PUT,
                src=self.rank,
                offset=offset,
                nelems=src.numel(),
                timeout_s=self._timeout_s,
                payload=_bytes_of(src),
            )

    def get(
        self,
        src_rank: int,
        target_offset_nelems: int,
        nelems: int,
        *,
        out: torch.Tensor | None = None,
        async_op: bool = False,
    ) -> Any:
        """Read ``nelems`` elements of ``src_rank``'s window; returns the tensor (or a handle)."""
        self._ensure_live()
        src = self._check_rank(src_rank, "get: src_rank")
        self._check_region(src, target_offset_nelems, nelems, "get")
        if out is None:
            out = torch.empty(nelems, dtype=self.dtype)
        elif out.numel() != nelems or not out.is_contiguous():
            raise WindowError(
                f"get: out must be contiguous with {nelems} elements; got shape {tuple(out.shape)}"
            )
        dest = self._check_tensor(out, "get(out=)")
        work = self._submit(lambda: self._get(src, target_offset_nelems, dest), async_op, value=out)
        return work if async_op else out

    def _get(self, src: int, offset: int, out: torch.Tensor) -> None:
        target = self._target(src)
        if isinstance(target, Segment):
            out.copy_(target.data[offset : offset + out.numel()])
        else:
            target.request(
                Op.GET,
                src=self.rank,
                offset=offset,
                nelems=out.numel(),
                timeout_s=self._timeout_s,
                out=_bytes_of(out),
            )

    def accumulate(
        self,
        tensor: torch.Tensor,
        dst_rank: int,
        target_offset_nelems: int = 0,
        *,
        op: AccumulateOp = "sum",
        async_op: bool = False,
    ) -> RmaWork | None:
        """Combine ``tensor`` into ``dst_rank``'s window with ``op``, atomically per target."""
        self._ensure_live()
        if op not in _ACC_CODES:
            raise WindowError(f"accumulate: op={op!r}; use one of {sorted(_ACC_CODES)}")
        dst = self._check_rank(dst_rank, "accumulate: dst_rank")
        src = self._check_tensor(tensor, "accumulate")
        self._check_region(dst, target_offset_nelems, src.numel(), "accumulate")
        return self._submit(lambda: self._accumulate(src, dst, target_offset_nelems, op), async_op)

    def _accumulate(self, src: torch.Tensor, dst: int, offset: int, op: str) -> None:
        target = self._target(dst)
        if isinstance(target, Segment):
            with target.mutex(MUTEX_ACCUMULATE, self._deadline(None), self._ensure_live):
                _combine(target.data[offset : offset + src.numel()], src, op)
        else:
            target.request(
                Op.ACC,
                src=self.rank,
                offset=offset,
                nelems=src.numel(),
                acc=_ACC_CODES[op],
                timeout_s=self._timeout_s,
                payload=_bytes_of(src),
            )

    def signal(self, peer_rank: int, *, async_op: bool = False) -> RmaWork | None:
        """Notify ``peer_rank`` (it consumes the notification with :meth:`wait_signal`)."""
        self._ensure_live()
        peer = self._check_rank(peer_rank, "signal: peer_rank")
        return self._submit(lambda: self._signal(peer), async_op)

    def _signal(self, peer: int) -> None:
        target = self._target(peer)
        if isinstance(target, Segment):
            with self._lock:  # one writer per slot: this process, serialised here
                target.signals[self.rank] = int(target.signals[self.rank]) + 1
            ring(self._bells[peer])  # after the increment: the waiter re-checks on waking
        else:
            target.request(Op.SIGNAL, src=self.rank, timeout_s=self._timeout_s)

    def wait_signal(self, peer_rank: int, *, timeout: timedelta | None = None) -> None:
        """Wait (bounded) for the next notification from ``peer_rank``."""
        self._ensure_live()
        peer = self._check_rank(peer_rank, "wait_signal: peer_rank")
        deadline = self._deadline(timeout)
        mine = self._own.signals
        attempt = 0
        while int(mine[peer]) <= self._consumed[peer]:
            self._ensure_live()
            other = self._peers.get(peer)
            if isinstance(other, Segment) and other.revoked:
                self.revoke(f"rank {peer}'s window was revoked")
                self._ensure_live()
            remaining = deadline - time.monotonic()
            if remaining < 0:
                raise CommTimeoutError(
                    f"wait_signal: no signal from rank {peer} within the timeout"
                )
            if self._bell.address and attempt >= 20:
                # Block until a peer rings (signals from other hosts ring through the
                # progress thread); the 1 ms slice only bounds a ring that got lost.
                self._bell.wait(min(remaining, 1e-3))
            else:
                backoff_sleep(attempt)
            attempt += 1
        self._consumed[peer] += 1

    def fence(self, timeout: timedelta | None = None) -> None:
        """Collective: complete every operation issued by every member before the fence."""
        self._ensure_live()
        deadline = self._deadline(timeout)
        self.flush(timedelta(seconds=max(0.0, deadline - time.monotonic())))
        self._fence_n += 1
        self._barrier(
            f"fence{self._fence_n}", timedelta(seconds=max(0.0, deadline - time.monotonic()))
        )

    def lock(self, rank: int, *, exclusive: bool = True, timeout: timedelta | None = None) -> None:
        """Open a passive-target epoch on ``rank`` (exclusive: alone; shared: with readers)."""
        self._ensure_live()
        target_rank = self._check_rank(rank, "lock: rank")
        if target_rank in self._held:
            kind = "an exclusive" if self._held[target_rank] else "a shared"
            raise WindowError(
                f"lock: this rank already holds {kind} lock on rank {target_rank}; unlock it first (locks do not nest)"
            )
        deadline = self._deadline(timeout)
        target = self._target(target_rank)
        if isinstance(target, Segment):
            attempt = 0
            while not target.try_lock(self.rank, exclusive, deadline):
                self._ensure_live()
                if time.monotonic() > deadline:
                    raise CommTimeoutError(
                        f"lock: rank {target_rank}'s window stayed locked past the timeout"
                    )
                backoff_sleep(attempt)
                attempt += 1
        else:
            target.request(
                Op.LOCK,
                src=self.rank,
                acc=int(exclusive),
                timeout_s=max(0.0, deadline - time.monotonic()),
            )
        self._held[target_rank] = exclusive

    def unlock(self, rank: int, *, timeout: timedelta | None = None) -> None:
        """Close the epoch opened by :meth:`lock` on ``rank``, after completing its operations."""
        target_rank = self._check_rank(rank, "unlock: rank")
        if target_rank not in self._held:
            raise WindowError(
                f"unlock: this rank holds no lock on rank {target_rank}; call lock({target_rank}) first"
            )
        self.flush(timeout)
        exclusive = self._held.pop(target_rank)
        self._ensure_live()
        target = self._target(target_rank)
        if isinstance(target, Segment):
            target.release_lock(self.rank, exclusive, self._deadline(timeout))
        else:
            target.request(Op.UNLOCK, src=self.rank, acc=int(exclusive), timeout_s=self._timeout_s)

    def map_remote_tensor(self, rank: int) -> torch.Tensor:
        """``rank``'s window memory for direct loads and stores (same-host members only)."""
        target = self._target(self._check_rank(rank, "map_remote_tensor: rank"))
        if not isinstance(target, Segment):
            raise WindowError(f"map_remote_tensor: rank {rank} is reached over TCP; use get/put")
        return target.data

    def _target(self, rank: int) -> Segment | RemotePeer:
        return self._own if rank == self.rank else self._peers[rank]

    # ------------------------------------------------------------------ progress-server side

    def _itemsize(self) -> int:
        return self._own.data.element_size()

    def _serve_check(self, op: int, src: int, offset: int, nelems: int, acc: int) -> None:
        if not 0 <= src < self.size:
            raise WindowError(f"origin rank {src} is outside the group")
        if op in (Op.PUT, Op.GET, Op.ACC):
            self._check_region(self.rank, offset, nelems, "remote request")
        if op == Op.ACC and acc not in _ACC_NAMES:
            raise WindowError(f"unknown accumulate op code {acc}")

    def _serve_revoked(self) -> bool:
        return self._revoked is not None or self._closed

    def _serve_region(self, offset: int, nelems: int) -> memoryview:
        return _bytes_of(self._own.data[offset : offset + nelems])

    def _serve_accumulate(
        self, acc: int, offset: int, payload: bytearray, timeout_s: float
    ) -> None:
        src = (
            torch.frombuffer(payload, dtype=self.dtype)
            if payload
            else torch.empty(0, dtype=self.dtype)
        )
        with self._own.mutex(MUTEX_ACCUMULATE, time.monotonic() + timeout_s):
            _combine(self._own.data[offset : offset + src.numel()], src, _ACC_NAMES[acc])

    def _serve_signal(self, src: int) -> None:
        self._own.signals[src] = int(self._own.signals[src]) + 1
        ring(self._bell.address)

    def _serve_lock(self, src: int, exclusive: bool, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        attempt = 0
        while not self._own.try_lock(src, exclusive, deadline):
            if self._serve_revoked():
                raise WindowRevokedError("the target's window was revoked", epoch=self.epoch)
            if time.monotonic() > deadline:
                raise CommTimeoutError(
                    f"lock: rank {self.rank}'s window stayed locked past the timeout"
                )
            backoff_sleep(attempt)
            attempt += 1

    def _serve_unlock(self, src: int, exclusive: bool, timeout_s: float) -> None:
        self._own.release_lock(src, exclusive, time.monotonic() + timeout_s)


def _bytes_of(t: torch.Tensor) -> memoryview:
    """The bytes of a contiguous CPU tensor, without a copy."""
    return t.reshape(-1).view(torch.uint8).numpy().data


def _combine(region: torch.Tensor, src: torch.Tensor, op: str) -> None:
    if op == "sum":
        region.add_(src)
    elif op == "min":
        torch.minimum(region, src, out=region)
    elif op == "max":
        torch.maximum(region, src, out=region)
    else:
        region.copy_(src)
