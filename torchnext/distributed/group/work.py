"""Work handles of fault-tolerant ops: bounded waits that a revoke interrupts.

A :class:`Work` wraps the backend's work object of one op. Its :meth:`Work.wait`
waits in slices of ``GroupConfig.wait_slice``; between slices it looks at one
attribute, the epoch's revoke state, which the group's monitor thread sets when the
epoch is revoked anywhere. So a pending op fails with
:class:`~torchnext.errors.CommRevokedError` within a poll interval plus a slice of the
revoke, whatever the collective timeout; the backend op itself is abandoned (gloo
cannot abort it) and left to end in the background with its own timeout.

Errors:

* the epoch was revoked (here or elsewhere): :class:`~torchnext.errors.CommRevokedError`;
* the backend op failed (a peer's connection closed...): the epoch is revoked with
  that reason, then :class:`~torchnext.errors.CommRevokedError` (``__cause__`` is the
  backend error);
* the op's own ``timeout`` passed: the epoch is revoked (its state is unknown) and
  :class:`~torchnext.errors.CommTimeoutError` is raised here;
* ``wait(timeout)`` with a shorter bound than the op's: :class:`CommTimeoutError`
  without revoking; the op goes on and may be waited on again.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from torchnext.distributed.group import hooks as _hooks
from torchnext.errors import CommRevokedError, CommTimeoutError

if TYPE_CHECKING:
    from torchnext.distributed.group.epoch import Epoch

__all__ = ["Work"]


class Work:
    """Handle of one nonblocking op of a fault-tolerant group."""

    __slots__ = (
        "_epoch",
        "_work",
        "_op",
        "_tokens",
        "_deadline",
        "_timeout",
        "_finish",
        "_state",
        "_error",
        "_slice",
        "_on_failure",
        "result",
    )

    def __init__(
        self,
        epoch: Epoch,
        work: Any,
        op: str,
        tokens: Any,
        timeout: timedelta,
        wait_slice: timedelta,
        on_failure: Callable[[Epoch, str, BaseException | None], CommRevokedError],
        finish: Callable[[], Any] | None = None,
    ) -> None:
        self._epoch = epoch
        self._work = work
        epoch.pending.add(work)
        self._op = op
        self._tokens = tokens
        self._timeout = timeout
        self._deadline = time.monotonic() + timeout.total_seconds()
        self._finish = finish
        self._state = "pending"
        self._error: BaseException | None = None
        self._slice = wait_slice
        self._on_failure = on_failure
        self.result: Any = None
        """What the op produced when it has a value beyond its output tensors."""

    def wait(self, timeout: timedelta | None = None) -> bool:
        """Block until the op completes (True) or raise its typed error; bounded by
        ``timeout`` if given, else by the op's own timeout."""
        if self._state != "pending":
            if self._error is not None:
                raise self._error
            return True
        user_deadline = None if timeout is None else time.monotonic() + timeout.total_seconds()
        epoch = self._epoch
        work = self._work
        completed_seen = False
        while True:
            revoked = epoch.revoked
            if revoked is not None:
                self._end("revoked", revoked)
                raise revoked
            try:
                work.wait(self._slice)
            except RuntimeError as exc:
                if work.is_completed():
                    if not completed_seen:
                        # The op may have finished just as the slice ran out: wait once
                        # more (it returns at once) to tell success from failure.
                        completed_seen = True
                        continue
                    err = self._on_failure(epoch, f"{self._op} failed: {exc}", exc)
                    self._end("failed", err)
                    raise err from exc
                now = time.monotonic()
                if now >= self._deadline:
                    self._on_failure(epoch, f"{self._op} timed out after {self._timeout}", None)
                    err2 = CommTimeoutError(
                        f"{self._op} in epoch {epoch.number} did not complete within its "
                        f"timeout={self._timeout}; the epoch was revoked. Raise the op's "
                        "timeout (or GroupConfig.collective_timeout) if it is legitimately "
                        "slow, else agree() and shrink() to drop the failed member."
                    )
                    self._end("timed_out", err2)
                    raise err2 from None
                if user_deadline is not None and now >= user_deadline:
                    raise CommTimeoutError(
                        f"wait(timeout={timeout}) on {self._op} ran out; the op is still "
                        "pending (not revoked): wait again, or revoke() the group"
                    ) from None
                continue
            if self._finish is not None:
                self.result = self._finish()
            self._end("completed", None)
            return True

    def is_completed(self) -> bool:
        """True once the op completed, failed or was revoked (never blocks)."""
        if self._state != "pending":
            return True
        if self._epoch.revoked is not None:
            self._end("revoked", self._epoch.revoked)
            return True
        if self._work.is_completed():
            try:
                self.wait()
            except (CommRevokedError, CommTimeoutError):
                pass
            return True
        return False

    def exception(self) -> BaseException | None:
        """The op's error once it ended in error, else None (never blocks)."""
        self.is_completed()
        return self._error

    def is_success(self) -> bool:
        return self.is_completed() and self._error is None

    def native_future(self) -> Any:
        """The backend work's future (for callbacks that must not block a thread)."""
        return self._work.get_future()

    def complete_from_callback(self) -> None:
        """The backend reported completion (on its thread): finish without waiting."""
        if self._state != "pending":
            return
        if self._finish is not None:
            self.result = self._finish()
        self._end("completed", None)

    def fail_from_callback(self, exc: BaseException) -> BaseException:
        """The backend reported failure (on its thread): revoke, return the typed error."""
        if self._state != "pending":
            return self._error or exc
        err = self._on_failure(self._epoch, f"{self._op} failed: {exc}", exc)
        self._end("failed", err)
        return err

    def _end(self, state: _hooks.OpState, error: BaseException | None) -> None:
        if self._state != "pending":
            return
        self._state = state
        self._error = error
        if self._work.is_completed():
            # A revoked or timed-out op may still run in the backend: it stays tracked
            # until it ends, so its group is not released under it.
            self._epoch.pending.discard(self._work)
        _hooks.op_finished(self._tokens, state)

    def __repr__(self) -> str:
        return f"Work(op={self._op!r}, epoch={self._epoch.number}, state={self._state!r})"
