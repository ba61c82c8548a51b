"""Nonblocking RMA operations: the handle a caller waits on, and the queue that runs them.

``win.put(..., async_op=True)`` (and get, accumulate, signal) returns an
:class:`RmaWork` at once; the operation itself runs on one background thread per
window (:class:`OpQueue`), in the order the operations were issued, so a put issued
before a signal lands before it. :meth:`Window.flush` waits for every pending handle.

When the window is revoked or closed, every pending handle fails with the window's
error and the thread stops. What not to assume: the thread is started on the first
nonblocking operation only, and an operation already running when the window is
revoked may still complete (its handle then reports the revocation).
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from datetime import timedelta
from typing import Any

from torchnext.errors import CommTimeoutError

__all__ = ["OpQueue", "RmaWork"]


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


class OpQueue:
    """Runs one window's nonblocking operations, in order, on one background thread.

    ``check_live`` raises the window's error when it is revoked or closed; it is called
    before an operation is queued and again before it runs.
    """

    def __init__(self, check_live: Callable[[], None]) -> None:
        self._check_live = check_live
        # Re-entrant: check_live may revoke the window, which fails the pending handles.
        self._lock = threading.RLock()
        self._pending: set[RmaWork] = set()
        self._queue: queue.Queue[tuple[Callable[[], Any], RmaWork] | None] = queue.Queue()
        self._worker: threading.Thread | None = None

    def submit(self, fn: Callable[[], Any], value: Any = None) -> RmaWork:
        """Queue ``fn``; the returned handle completes when it has run."""
        work = RmaWork(value)
        with self._lock:
            # Checked and registered under one lock: a revocation either precedes the
            # check (which raises) or sees the handle in ``pending`` and fails it.
            self._check_live()
            self._pending.add(work)
            if self._worker is None:
                self._worker = threading.Thread(
                    target=self._run, name="torchnext-rma-async", daemon=True
                )
                self._worker.start()
        self._queue.put((fn, work))
        return work

    def pending(self) -> list[RmaWork]:
        """The handles queued or running now."""
        with self._lock:
            return list(self._pending)

    def fail_pending(self, error: Callable[[], BaseException]) -> None:
        """Fail every pending handle with ``error()`` and stop the thread."""
        for work in self.pending():
            if not work.is_completed():
                work._finish(error())
        self._queue.put(None)

    def _run(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            fn, work = item
            if work.is_completed():
                continue
            try:
                self._check_live()
                fn()
            except BaseException as exc:  # noqa: BLE001 - delivered through the handle
                work._finish(exc)
            else:
                work._finish()
            with self._lock:
                self._pending.discard(work)
