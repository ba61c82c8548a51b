"""Revoking an epoch on every member: publish once, mark locally, run the callbacks.

ULFM semantics: the first member that sees a failure writes the epoch's revoke key
with ``compare_set`` (the first reason wins); every member's monitor polls that key,
so every survivor's pending and future ops in the epoch raise
:class:`~torchnext.errors.CommRevokedError` with the same epoch, suspects and reason.

A :class:`Revoker` belongs to one group (a split sub-group has its own, with its own
callbacks). The group wires its monitor's revoke keys and the failure detector to
:meth:`Revoker.mark` and :meth:`Revoker.revoke`; ops that fail locally call
:meth:`Revoker.on_op_failure`.

What not to assume: revoking never waits for the other members; a revoked epoch
never recovers (agree, then shrink); with NCCL a revoke also aborts the native group.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any

from torchnext.distributed.group.epoch import Epoch, revoke_payload
from torchnext.distributed.group.heartbeat import Monitor
from torchnext.distributed.group.membership import Keys
from torchnext.errors import CommRevokedError

__all__ = ["Revoker"]

logger = logging.getLogger(__name__)


class Revoker:
    """Revokes the epochs of one group; see the module docstring."""

    def __init__(
        self, store: Any, keys: Keys, monitor: Monitor, *, member_id: str, name: str, backend: str
    ) -> None:
        self.store = store
        self.keys = keys
        self.monitor = monitor
        self.member_id = member_id
        self.name = name
        self.backend = backend
        self.callbacks: list[Callable[[CommRevokedError], None]] = []
        """Called once per revoked epoch with its error (see ``add_revoke_callback``)."""
        self.last_error: BaseException | None = None
        """The last local op failure, if any (``FaultTolerantGroup.errored``)."""

    def revoke(
        self, epoch: Epoch, reason: str, suspects: Sequence[str], *, local_first: bool = False
    ) -> CommRevokedError:
        """Publish the revoke of ``epoch`` (first reason wins) and apply it here; with
        ``local_first``, apply it here before publishing (the store is away: ops stop now,
        and the revoke is published once the store takes it)."""
        if epoch.revoked is not None:
            return epoch.revoked
        payload = revoke_payload(reason, list(suspects), self.member_id)
        if local_first:
            self.mark(epoch, payload)
        key = self.keys.revoked(epoch.number, epoch.sub)
        try:
            winner = self.store.compare_set(key, "", payload)
        except (RuntimeError, OSError) as exc:
            logger.warning("could not publish the revoke of %s (store error: %s)", key, exc)
            winner = payload
        self.mark(epoch, winner)
        revoked = epoch.revoked
        if revoked is None:  # pragma: no cover - mark always sets it
            raise RuntimeError("internal error: epoch not revoked after mark")
        return revoked

    def mark(self, epoch: Epoch, raw: bytes | str) -> None:
        """Apply the published revoke ``raw`` to ``epoch`` here (idempotent)."""
        children = epoch.mark_revoked(raw, f"{self.name}{epoch.sub}")
        if children is None:
            return
        if self.backend == "nccl" and epoch.pg is not None:
            try:
                epoch.pg.abort()
            except RuntimeError:
                pass
        for revoke_child in children:
            revoke_child(raw)
        error = epoch.revoked
        if not epoch.callbacks_done and error is not None:
            epoch.callbacks_done = True
            for fn in list(self.callbacks):
                try:
                    fn(error)
                except Exception:  # noqa: BLE001 - a callback must not break the revoke
                    logger.exception("revoke callback %r raised", fn)

    def retire(self, epoch: Epoch, reason: str, *, publish: bool = False) -> None:
        """End ``epoch`` here (it was superseded or left); with ``publish``, also tell
        members still in it, which revokes it there unless it already was (best effort:
        the next epoch fences them anyway)."""
        payload = revoke_payload(reason, [], self.member_id)
        self.mark(epoch, payload)
        if publish:
            try:
                self.store.compare_set(self.keys.revoked(epoch.number, epoch.sub), "", payload)
            except (RuntimeError, OSError):
                pass

    def on_op_failure(
        self, epoch: Epoch, reason: str, exc: BaseException | None
    ) -> CommRevokedError:
        """An op of ``epoch`` failed locally: revoke the epoch, naming likely culprits."""
        self.last_error = exc
        suspects = self.monitor.failed_members(epoch.members) if exc is not None else []
        return self.revoke(epoch, f"{self.member_id}: {reason}", suspects)

    def suspected(self, epoch: Epoch, current: Epoch, failed: list[str], why: str) -> None:
        """The failure detector suspects ``failed`` while ``current`` is the group's epoch."""
        if epoch.revoked is None and epoch is current:
            # While the store does not answer the suspicion came from heartbeat datagrams:
            # publishing waits for the store, stopping this member's ops must not.
            away = not self.monitor.store_answering()
            reason = f"failure detected by {self.member_id}: {why}"
            self.revoke(epoch, reason, failed, local_first=away)

    def superseded(self, epoch: Epoch, current: Epoch, latest: int) -> None:
        """The group moved on to epoch ``latest`` without this member."""
        if epoch is current and epoch.revoked is None:
            self.revoke(
                epoch,
                f"epoch {epoch.number} was superseded by epoch {latest} without this member",
                (),
            )
