"""The serving side of an RMA window: answers the requests peers send to this member.

A :class:`~torchnext.distributed.rma.window.Window` is what a caller uses (put, get,
accumulate, signal, lock...). When some peer cannot map this member's shared memory
(another host, or ``transport="tcp"``), that peer's operations arrive as requests
through the progress server of :mod:`~torchnext.distributed.rma._progress`, and this
module answers them: :class:`WindowServer` checks each request, then applies it to the
member's own segment (the data, the signal counters and the lock table all live
there), from the progress server's threads while the member's main thread computes.

The window owns one ``WindowServer`` and tells it only one thing after creation: to
:meth:`~WindowServer.stop` (the window was revoked or closed), after which every
request is refused with a "revoked" reply.

What not to assume: a request is answered only after it has been validated here again
(the origin checked it too), so a malformed or hostile request never touches memory,
but the channel itself is neither authenticated nor encrypted.
"""

from __future__ import annotations

import socket
import time

import torch

from torchnext.distributed.rma._doorbell import ring
from torchnext.distributed.rma._elementwise import ACCUMULATE_NAMES, bytes_of, check_region, combine
from torchnext.distributed.rma._progress import Op, Request, Status, drain, recv_exact
from torchnext.distributed.rma._shm import MUTEX_ACCUMULATE, Segment, backoff_sleep
from torchnext.errors import CommTimeoutError, WindowError, WindowRevokedError

__all__ = ["WindowServer"]


class WindowServer:
    """Applies peers' requests to this member's segment; see the module docstring.

    Args:
        segment: this member's own window segment (data, signal slots, lock table).
        rank: this member's rank in the window's group.
        size: the group's size (origin ranks outside ``0..size-1`` are refused).
        epoch: the group's epoch the window belongs to (reported in revocations).
        bell_address: this member's doorbell, rung after a signal lands ("" for none).
    """

    def __init__(
        self, segment: Segment, *, rank: int, size: int, epoch: int, bell_address: str
    ) -> None:
        self._segment = segment
        self.rank = rank
        self.size = size
        self.epoch = epoch
        self._bell_address = bell_address
        self._stopped = False

    def stop(self) -> None:
        """Refuse every later request (the window was revoked or closed); idempotent."""
        self._stopped = True

    @property
    def stopped(self) -> bool:
        return self._stopped

    # ------------------------------------------------------------------ dispatch

    def handle(self, conn: socket.socket, request: Request) -> tuple[int, bytes | memoryview]:
        """Answer one request read from ``conn``: ``(status, reply body)``."""
        op, acc, src, offset, nelems, timeout_s = request
        itemsize = self._segment.data.element_size()
        nbytes = nelems * itemsize if op in (Op.PUT, Op.ACC) else 0
        try:
            self._check(op, src, offset, nelems, acc)
        except WindowError as exc:
            drain(conn, nbytes)  # keep the stream in step; the payload is discarded
            return Status.ERR, str(exc).encode()
        if self._stopped:
            drain(conn, nbytes)
            return Status.REVOKED, b"the target's window was revoked"
        try:
            if op == Op.PUT:
                # Received straight into the window's memory: no staging copy.
                recv_exact(conn, self._region(offset, nelems))
            elif op == Op.GET:
                return Status.OK, self._region(offset, nelems)
            elif op == Op.ACC:
                payload = bytearray(nbytes)
                recv_exact(conn, memoryview(payload))
                self._accumulate(acc, offset, payload, timeout_s)
            elif op == Op.SIGNAL:
                self._signal(src)
            elif op == Op.LOCK:
                self._lock(src, bool(acc), timeout_s)
            elif op == Op.UNLOCK:
                self._segment.release_lock(src, bool(acc), time.monotonic() + timeout_s)
        except CommTimeoutError as exc:
            return Status.TIMEOUT, str(exc).encode()
        except WindowRevokedError as exc:
            return Status.REVOKED, str(exc).encode()
        return Status.OK, b""

    # ------------------------------------------------------------------ operations

    def _check(self, op: int, src: int, offset: int, nelems: int, acc: int) -> None:
        if not 0 <= src < self.size:
            raise WindowError(f"origin rank {src} is outside the group")
        if op in (Op.PUT, Op.GET, Op.ACC):
            check_region("remote request", self.rank, offset, nelems, self._segment.numel)
        if op == Op.ACC and acc not in ACCUMULATE_NAMES:
            raise WindowError(f"unknown accumulate op code {acc}")

    def _region(self, offset: int, nelems: int) -> memoryview:
        return bytes_of(self._segment.data[offset : offset + nelems])

    def _accumulate(self, acc: int, offset: int, payload: bytearray, timeout_s: float) -> None:
        dtype = self._segment.dtype
        src = torch.frombuffer(payload, dtype=dtype) if payload else torch.empty(0, dtype=dtype)
        with self._segment.mutex(MUTEX_ACCUMULATE, time.monotonic() + timeout_s):
            combine(self._segment.data[offset : offset + src.numel()], src, ACCUMULATE_NAMES[acc])

    def _signal(self, src: int) -> None:
        signals = self._segment.signals
        signals[src] = int(signals[src]) + 1
        ring(self._bell_address)  # after the increment: the waiter re-checks on waking

    def _lock(self, src: int, exclusive: bool, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        attempt = 0
        while not self._segment.try_lock(src, exclusive, deadline):
            if self._stopped:
                raise WindowRevokedError("the target's window was revoked", epoch=self.epoch)
            if time.monotonic() > deadline:
                raise CommTimeoutError(
                    f"lock: rank {self.rank}'s window stayed locked past the timeout"
                )
            backoff_sleep(attempt)
            attempt += 1
