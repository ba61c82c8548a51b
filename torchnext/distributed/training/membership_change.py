"""The training manager's two membership changes: shrink to the survivors, admit joiners.

Use it from :class:`~torchnext.distributed.training.manager.Manager`, which decides
*when* (after a failed step; when the commit vote saw joiners waiting) and keeps the
counts; these functions do the change on the group, tell the launcher's agent which
members left (so it replaces them), and report the change as a manager event with its
duration.

What not to assume: marking a member evicted in the store is best effort (a store
that is gone only delays its replacement); a grow that fails is reported to the
caller, which recovers on its next step, while a stale epoch (this member was fenced
out) is raised.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from datetime import timedelta

from torchnext.distributed.group.fault_tolerant_group import FaultTolerantGroup
from torchnext.distributed.launch.keys import EVICTED_KEY_PREFIX
from torchnext.errors import CommError, CommTimeoutError, StaleEpochError

__all__ = ["admit_joiners", "mark_evicted", "shrink_to_survivors"]

Emit = Callable[..., None]
"""``emit(kind, **detail)``: reports a manager event."""


def mark_evicted(group: FaultTolerantGroup, members: Iterable[str]) -> None:
    """Tell the agents that ``members`` left the group (they replace them)."""
    for member in members:
        try:
            group.store.set(EVICTED_KEY_PREFIX + member, "1")
        except Exception:  # noqa: BLE001 - the agent's cleanup is best effort
            pass


def shrink_to_survivors(
    group: FaultTolerantGroup, *, reason: str, timeout: timedelta, emit: Emit
) -> None:
    """Revoke (if nobody has yet), agree on the survivors and shrink to them."""
    t0 = time.monotonic()
    if not group.is_revoked:
        group.revoke(reason)
    decision = group.shrink(timeout=timeout)
    removed = list(decision.failed)
    mark_evicted(group, removed)
    emit(
        "shrink",
        removed=removed,
        members=list(group.members),
        reason=reason,
        seconds=time.monotonic() - t0,
    )


def admit_joiners(group: FaultTolerantGroup, *, timeout: timedelta, emit: Emit) -> str:
    """Grow the group by its pending joiners; ``""`` on success, else why it failed."""
    t0 = time.monotonic()
    try:
        decision = group.grow(timeout=timeout)
    except StaleEpochError:
        raise
    except (CommError, CommTimeoutError) as exc:
        return f"grow failed: {exc}"
    mark_evicted(group, decision.failed)
    emit(
        "grow",
        added=list(decision.joined),
        removed=list(decision.failed),
        members=list(decision.members),
        seconds=time.monotonic() - t0,
    )
    return ""
