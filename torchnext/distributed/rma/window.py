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

This module is the caller's side. What answers peers that reach this member over TCP
is :class:`~torchnext.distributed.rma.server.WindowServer`, which the window owns;
creation's exchange is :mod:`~torchnext.distributed.rma.connect`, nonblocking handles
are :mod:`~torchnext.distributed.rma.work`.

Legend: ``n`` counts elements; offsets are in elements of the flattened window.
"""

from __future__ import annotations

import itertools
import threading
import time
import weakref
import zlib
from collections.abc import Callable, Sequence
from datetime import timedelta
from typing import Any

import torch

from torchnext.distributed.rma._doorbell import Doorbell, ring
from torchnext.distributed.rma._elementwise import (
    ACCUMULATE_CODES,
    AccumulateOp,
    bytes_of,
    check_region,
    combine,
)
from torchnext.distributed.rma._group import WindowGroup
from torchnext.distributed.rma._progress import Op, ProgressServer, RemotePeer
from torchnext.distributed.rma._shm import MUTEX_ACCUMULATE, Segment, backoff_sleep
from torchnext.distributed.rma.config import WindowConfig
from torchnext.distributed.rma.connect import connect
from torchnext.distributed.rma.rendezvous import StoreRendezvous
from torchnext.distributed.rma.server import WindowServer
from torchnext.distributed.rma.work import OpQueue, RmaWork
from torchnext.errors import CommTimeoutError, WindowError, WindowRevokedError

__all__ = ["Window", "WindowConfig", "RmaWork", "AccumulateOp"]

_window_counters: dict[str, itertools.count[int]] = {}
_counters_lock = threading.Lock()


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
        win._rendezvous.barrier("ready")
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
        win._rendezvous.barrier("ready")
        return win

    def __init__(
        self, group: WindowGroup, shape: tuple[int, ...], dtype: torch.dtype, config: WindowConfig
    ) -> None:
        self._group = group
        self.config = config
        self.rank = int(group.rank)
        self.size = int(group.size)
        self.epoch = int(group.epoch)
        # Sub-groups of a split share their parent's name and epoch: the member list
        # tells them apart, so their windows never share store keys.
        members = getattr(group, "members", None) or tuple(range(self.size))
        ident = f"{group.name}/e{self.epoch}/m{zlib.crc32(repr(tuple(members)).encode()):08x}"
        with _counters_lock:
            counter = _window_counters.setdefault(ident, itertools.count())
            index = next(counter)
        self._timeout_s = config.timeout.total_seconds()
        self._revoked: str | None = None
        self._closed = False
        self._lock = threading.RLock()  # revoke() may run inside a locked section
        self._held: dict[int, bool] = {}  # target -> exclusive
        self._consumed = [0] * self.size
        self._fence_n = 0
        self._ops = OpQueue(self._ensure_live)
        self._rendezvous = StoreRendezvous(
            group.store,
            f"torchnext/rma/{ident}/w{index}",
            rank=self.rank,
            size=self.size,
            timeout=config.timeout,
            check_live=self._ensure_live,
        )
        self._server: ProgressServer | None = None
        self._peers: dict[int, Segment | RemotePeer] = {}
        numel = 1
        for s in shape:
            numel *= s
        self._shape = shape
        self._bell = Doorbell()
        self._bells = [""] * self.size
        self._own = Segment.create(world=self.size, dtype=dtype, numel=numel)
        # The serving side answers peers that reach this member over TCP; it is told
        # only to stop when the window is revoked or closed.
        self._serving = WindowServer(
            self._own,
            rank=self.rank,
            size=self.size,
            epoch=self.epoch,
            bell_address=self._bell.address,
        )
        try:
            conns = connect(
                self._rendezvous,
                rank=self.rank,
                size=self.size,
                config=config,
                own=self._own,
                bell_address=self._bell.address,
                handler=self._serving,
            )
        except BaseException:
            self._own.unlink()
            self.close()
            raise
        self._numels = conns.numels
        self._bells = conns.bells
        self._peers = conns.peers
        self._server = conns.server
        add_cb = getattr(group, "add_revoke_callback", None)
        if callable(add_cb):
            # A weak reference: the group must not keep closed windows alive.
            ref = weakref.ref(self)

            def on_revoke(err: BaseException) -> None:
                win = ref()
                if win is not None:
                    win.revoke(f"group revoked: {err}")

            add_cb(on_revoke)

    def _deadline(self, timeout: timedelta | None) -> float:
        return time.monotonic() + (
            timeout.total_seconds() if timeout is not None else self._timeout_s
        )

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
            self._serving.stop()  # peers' requests are refused from here on
        self._own.mark_revoked()
        ring(self._bell.address)  # wake this process's waiters now
        err = self._revoked_error()
        self._ops.fail_pending(lambda: err)
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
            self._serving.stop()
        self._ops.fail_pending(
            lambda: WindowError("RMA window was closed with this operation pending")
        )
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
        check_region(name, target, offset, n, self._numels[target])

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
        return self._ops.submit(fn, value)

    def flush(self, timeout: timedelta | None = None) -> None:
        """Wait until every nonblocking operation this member issued has completed."""
        deadline = self._deadline(timeout)
        for work in self._ops.pending():
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
                payload=bytes_of(src),
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
                out=bytes_of(out),
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
        if op not in ACCUMULATE_CODES:
            raise WindowError(f"accumulate: op={op!r}; use one of {sorted(ACCUMULATE_CODES)}")
        dst = self._check_rank(dst_rank, "accumulate: dst_rank")
        src = self._check_tensor(tensor, "accumulate")
        self._check_region(dst, target_offset_nelems, src.numel(), "accumulate")
        return self._submit(lambda: self._accumulate(src, dst, target_offset_nelems, op), async_op)

    def _accumulate(self, src: torch.Tensor, dst: int, offset: int, op: str) -> None:
        target = self._target(dst)
        if isinstance(target, Segment):
            with target.mutex(MUTEX_ACCUMULATE, self._deadline(None), self._ensure_live):
                combine(target.data[offset : offset + src.numel()], src, op)
        else:
            target.request(
                Op.ACC,
                src=self.rank,
                offset=offset,
                nelems=src.numel(),
                acc=ACCUMULATE_CODES[op],
                timeout_s=self._timeout_s,
                payload=bytes_of(src),
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
        self._rendezvous.barrier(
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
