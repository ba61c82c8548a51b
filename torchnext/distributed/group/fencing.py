"""The two ends of a member's part in a group that no retry undoes: eviction, a lost store.

Use :class:`Fence` from :class:`~torchnext.distributed.FaultTolerantGroup` (one per group,
shared with its split sub-groups). Every op of a member checks it first
(:meth:`Fence.check`), and it is set from two places:

* **eviction** - the agreement that ended this member's epoch left it out. The member
  finds out in ``agree``/``shrink`` (:meth:`Fence.evict`), or, when it was cut off from
  the others (a partitioned host that came back, a process that was stopped), from its
  monitor, which reads the decision as soon as it reaches the store again
  (:meth:`Fence.evicted_by`): its epoch is retired, so blocked ops end, and a store call
  still in flight on a connection that lived through the outage is cut short, so the
  process learns of its eviction at once instead of after TCP's retransmission back-off;
* **a lost store** - the monitor got no answer from the store for ``store_timeout``
  (:meth:`Fence.lose_store`): the store client is aborted (blocked calls end, later ones
  fail at once) and the epoch revoked, so every op raises the
  :class:`~torchnext.errors.StoreLostError`, which names the store and the fix.

Either way the process should exit: ``torchnext run``'s workers exit with
``EXIT_EVICTED`` (and are replaced) or ``EXIT_STORE_LOST``. What not to assume: a member
left out by a ``reconfigure`` is released by that call, not evicted; fencing is local (it
never writes to the store), the store's decision keys being the authority.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from torchnext.distributed.group.agreement import eviction_error
from torchnext.distributed.group.epoch import Epoch, revoke_payload
from torchnext.distributed.group.membership import Membership
from torchnext.errors import StaleEpochError, StoreLostError

__all__ = ["Fence"]

Retire = Callable[[Epoch, str], None]
"""Ends an epoch on this member with a reason (the group's ``_retire``)."""

Mark = Callable[[Epoch, str], None]
"""Applies a revoke payload to an epoch on this member (``Revoker.mark``)."""


class Fence:
    """Whether this member is out of its group for good, and why (see the module docstring)."""

    def __init__(self, store: Any, *, member_id: str, name: str) -> None:
        self.store = store
        self.member_id = member_id
        self.name = name
        self.evicted: StaleEpochError | None = None
        self.store_lost: StoreLostError | None = None

    @property
    def error(self) -> StaleEpochError | StoreLostError | None:
        """Why this member is out (a lost store first), or None."""
        return self.store_lost or self.evicted

    def check(self) -> None:
        """Raise why this member is out, if it is."""
        error = self.error
        if error is not None:
            raise error

    def evict(self, decision: Membership, epoch: Epoch, retire: Retire) -> StaleEpochError:
        """``decision`` left this member out: ``epoch`` ends here; returns the error its
        ops raise from now on."""
        self.evicted = eviction_error(decision, member_id=self.member_id, name=self.name)
        retire(epoch, "this member was evicted")
        return self.evicted

    def evicted_by(
        self, epoch: Epoch, current: Epoch, decision: Membership, retire: Retire
    ) -> None:
        """The monitor found ``epoch`` ended by ``decision`` without this member."""
        if epoch is not current or self.evicted is not None:
            return
        error = self.evict(decision, epoch, retire)
        reset = getattr(self.store, "reset", None)
        if callable(reset):
            # A call still in flight on a connection of before the outage ends now, and
            # raises the eviction (not a store failure: the store is fine).
            reset(error)

    def lose_store(self, current: Epoch, error: StoreLostError, mark: Mark) -> None:
        """The monitor gave up on the store: every op raises ``error`` from now on
        (``mark`` revokes ``current`` here with a payload, as the group's revoker does)."""
        if self.store_lost is not None:
            return
        self.store_lost = error
        abort = getattr(self.store, "abort", None)
        if callable(abort):
            abort(error)  # blocked calls end now; later ones (revoke callbacks') fail fast
        mark(current, revoke_payload(str(error), [], self.member_id))
