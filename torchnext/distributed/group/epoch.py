"""One epoch of a fault-tolerant group: its members, its native group, its revocation.

An :class:`Epoch` is what every op of a :class:`~torchnext.distributed.FaultTolerantGroup`
runs in. The group opens a new one for every membership (and one per split sub-group
inside it); the ops (:mod:`.collectives`, :mod:`.p2p`), their handles (:mod:`.work`)
and the backend builder (:mod:`.backend`) read it, and only :meth:`Epoch.mark_revoked`
writes its revocation. :class:`RetiredEpochs` keeps ended epochs until no op is
blocked in their native group any more.

What not to assume: an epoch never comes back once revoked; its ``pg`` may still have
ops blocked in it (gloo cannot abort them), which is why retired epochs are kept.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from typing import Any

from torchnext.errors import CommRevokedError

__all__ = ["Epoch", "RetiredEpochs", "revoke_payload"]


def revoke_payload(reason: str, suspects: list[str], by: str) -> str:
    """The store value that revokes an epoch: why, whom it suspects, who revoked it."""
    return json.dumps({"reason": reason, "suspects": suspects, "by": by})


class Epoch:
    """One membership of a group (or of a split sub-group) and its backend group."""

    __slots__ = (
        "number",
        "members",
        "rank",
        "size",
        "pg",
        "revoked",
        "sub",
        "children",
        "pending",
        "lock",
        "callbacks_done",
        "retired_at",
    )

    def __init__(self, number: int, members: tuple[str, ...], rank: int, sub: str = "") -> None:
        self.number = number
        """The epoch number (the group's count of membership changes)."""
        self.members = members
        """Member ids in rank order."""
        self.rank = rank
        """This process's rank in it."""
        self.size = len(members)
        self.pg: Any = None
        """The epoch's native process group, once built."""
        self.revoked: CommRevokedError | None = None
        """Set once, when the epoch is revoked; every op checks it."""
        self.sub = sub
        """``""`` for the group's own epoch, the split suffix for a sub-group's."""
        self.children: list[Callable[[bytes | str], None]] = []
        """Revoke the split sub-groups made in this epoch (called with the payload)."""
        self.pending: set[Any] = set()
        """Native works that may still block in ``pg``."""
        self.lock = threading.Lock()
        self.callbacks_done = False
        """Whether the group's revoke callbacks ran for this epoch."""
        self.retired_at: float | None = None

    def mark_revoked(
        self, raw: bytes | str, where: str
    ) -> list[Callable[[bytes | str], None]] | None:
        """Record the revoke ``raw`` (a :func:`revoke_payload`); the children to revoke.

        Returns ``None`` when the epoch was already revoked (the first revoke wins), else
        the sub-groups' revoke functions, which the caller runs outside the lock.
        """
        with self.lock:
            if self.revoked is not None:
                return None
            data = json.loads(raw)
            suspects = [m for m in data.get("suspects", []) if m in self.members]
            ranks = tuple(self.members.index(m) for m in suspects)
            self.revoked = CommRevokedError(
                f"group {where!r} epoch {self.number} was revoked by {data.get('by', '?')}: "
                f"{data.get('reason', '')}. Suspected failed: {suspects or 'unknown'} "
                f"(ranks {list(ranks)}). Call agree() and shrink() to continue without them.",
                epoch=self.number,
                suspects=ranks,
                reason=str(data.get("reason", "")),
            )
            return list(self.children)

    def has_blocked_ops(self) -> bool:
        """Whether a native op may still be blocked in this epoch's group."""
        return self.pg is not None and any(not w.is_completed() for w in list(self.pending))


class RetiredEpochs:
    """Ended epochs, kept until no op is blocked in their native group.

    :meth:`prune` runs on the monitor thread. A native group is released only once no
    op is blocked in it (gloo ops end by their timeout), and on a throwaway thread: its
    destructor joins the backend's threads and must never stall the heartbeats.
    """

    def __init__(self) -> None:
        self.epochs: list[Epoch] = []

    def add(self, epoch: Epoch) -> None:
        if epoch not in self.epochs:
            self.epochs.append(epoch)

    def on_revoke(
        self, mark: Callable[[Epoch, bytes | str], None], epoch: Epoch
    ) -> Callable[[bytes | str], None]:
        """A revoke callback for ``epoch`` (a split sub-group's) that applies ``mark`` and
        keeps the epoch here. A sub-group is dropped by whoever split it, and the garbage
        collector would free its native group on whatever thread it runs in: a gloo op
        still blocked there (until its timeout) would hold that thread, the monitor's
        included, in the group's destructor."""

        def end(raw: bytes | str) -> None:
            mark(epoch, raw)
            self.add(epoch)

        return end

    def prune(self) -> None:
        keep: list[Epoch] = []
        drop: list[Epoch] = []
        for epoch in self.epochs:
            epoch.pending = {w for w in list(epoch.pending) if not w.is_completed()}
            (keep if epoch.pending else drop).append(epoch)
        self.epochs = keep
        if drop:
            threading.Thread(target=drop.clear, name="torchnext-ft-release", daemon=True).start()
