"""How the training manager reports what it does: the ``on_event`` callback, the log, the launcher.

Use it from :class:`~torchnext.distributed.training.manager.Manager`: every event goes
to the ``logging`` logger of the manager, to the user's ``on_event`` callback (whose
exceptions are logged, never raised into training) and, for the kinds the launcher
prints (:data:`~torchnext.distributed.launch.job_events.PUBLISHED_KINDS`), into the
job's store, where ``torchnext run`` reads them. It also keeps the time of the last
failure, so the first commit after it is reported as a ``recovered`` event with the
seconds in between.

What not to assume: ``failure_detected`` comes from the thread that noticed the failure
(a revoke callback), once per revoked epoch; the others from the training thread.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from torchnext.distributed.group.fault_tolerant_group import FaultTolerantGroup
from torchnext.distributed.launch.job_events import PUBLISHED_KINDS, publish
from torchnext.distributed.training.config import ManagerEvent

__all__ = ["EventReporter"]

logger = logging.getLogger("torchnext.distributed.training.manager")


class EventReporter:
    """One member's event reporting (see the module docstring)."""

    def __init__(
        self,
        group: FaultTolerantGroup,
        on_event: Callable[[ManagerEvent], None] | None,
        *,
        publish_events: bool = True,
    ) -> None:
        self.group = group
        self.on_event = on_event
        self.publish_events = publish_events
        self.failed_at: float | None = None
        """``time.time()`` of the failure not yet recovered from, if any."""
        self._failure_epoch = -1
        self._failed_in_epoch = -1  # a commit in this epoch or earlier is not a recovery

    def emit(self, kind: str, *, step: int, **detail: Any) -> None:
        event = ManagerEvent(
            kind=kind,
            step=step,
            epoch=int(self.group.epoch),
            world_size=int(self.group.size),
            member_id=str(self.group.member_id),
            time=time.time(),
            detail=detail,
        )
        logger.info("manager %s: %s %s", event.member_id, kind, detail)
        if self.publish_events and kind in PUBLISHED_KINDS:
            record = {
                "kind": kind,
                "step": step,
                "epoch": event.epoch,
                "world_size": event.world_size,
                "member_id": event.member_id,
                "time": event.time,
                "detail": detail,
            }
            publish(self.group.store, record)
        if self.on_event is not None:
            try:
                self.on_event(event)
            except Exception:  # noqa: BLE001 - a reporting callback must not break training
                logger.exception("on_event callback raised; ignoring")

    def on_revoke(self, exc: BaseException, *, step: int) -> None:
        """A revoke of the group: report it once per epoch unless it was planned."""
        reason = str(getattr(exc, "reason", "") or exc)
        if reason.startswith("superseded") or "was evicted" in reason:
            return  # a planned epoch change (grow, shrink), not a failure
        epoch = int(getattr(exc, "epoch", -1))
        if epoch != self._failure_epoch:
            self._failure_epoch = epoch
            self._note_failure()
            self.emit("failure_detected", step=step, reason=reason, revoked_epoch=epoch)

    def step_failed(self) -> None:
        """A step was aborted: recovery is timed from now unless a failure came first."""
        self._note_failure()

    def _note_failure(self) -> None:
        if self.failed_at is None:
            self.failed_at = time.time()
            self._failed_in_epoch = int(self.group.epoch)

    def step_committed(self, *, step: int) -> None:
        """A step committed: the first after a failure, in a later epoch, is ``recovered``.

        A step that was committing while the failure was noticed (same epoch) is not.
        """
        if self.failed_at is not None and int(self.group.epoch) > self._failed_in_epoch:
            seconds = time.time() - self.failed_at
            self.failed_at = None
            self.emit("recovered", step=step, seconds=seconds)
