"""The commit vote: a training step counts only if every member finished it.

Use :class:`CommitVote` (the :class:`~torchnext.distributed.manager.Manager` does) at
the end of each step, after the gradient all-reduce, to decide *consistently on every
member* whether the step is applied (optimizer step, data cursor advanced) or
discarded and redone on the next membership.

Why the store and not a collective: a collective vote can itself complete on some
members and fail on others (a member dies between sending its last chunk and
receiving), so survivors could disagree - the two-generals problem. The store lives
outside the workers and offers an atomic compare-and-set, which makes it a single
authority: every member writes its own ``.../ok/<rank>`` key, then checks whether all
``size`` keys are there; whoever sees them all proposes ``commit``, whoever sees a
failure (its own error, a revoke of the group, the bound running out) proposes
``abort``; the first proposal wins (``compare_set`` on an absent key) and every member
adopts the winner. Store writes are linearizable, so the member whose write came last
always sees every key: a complete vote is never missed. A member that wrote its key
and then died does not hurt: the survivors' state is what they all agreed on.

Why a key per member and not one shared counter: members finish a step within
milliseconds of each other, and on an etcd store an ``add`` is a compare-and-swap that
conflicting members repeat, one round trip each; distinct keys never conflict. A member
waits for the decision with the store's ``wait_for_value`` where it has one (an etcd
watch, in slices), else by polling ``check``.

Keys are namespaced by epoch and step; the manager revokes the group after every
abort, so an ``(epoch, step)`` pair is never voted on twice.

What not to assume: ``commit`` also carries whether joiners are waiting (``grow``),
so every member admits them at the same step.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

__all__ = ["Decision", "CommitVote"]

_PREFIX = "torchnext/commit"
_WATCH_SLICE = timedelta(milliseconds=50)
"""How long one watch waits for the decision before ``failed()`` and the bound are looked at."""


@dataclass(frozen=True, kw_only=True)
class Decision:
    """The agreed outcome of one step, identical on every member."""

    commit: bool
    grow: bool = False
    """Joiners are pending: every member calls ``grow`` right after this step."""
    reason: str = ""
    """Why the step was aborted (empty on commit)."""
    wait_s: float = 0.0
    """Time this member spent in the vote (store round trips and waiting for others)."""


def _encode(commit: bool, grow: bool, reason: str) -> str:
    return (
        ("commit" if commit else "abort")
        + ("+grow" if grow else "")
        + ("|" + reason if reason else "")
    )


def _decode(raw: bytes | str, wait_s: float) -> Decision:
    text = raw.decode() if isinstance(raw, bytes) else raw
    head, _, reason = text.partition("|")
    return Decision(
        commit=head.startswith("commit"), grow=head.endswith("+grow"), reason=reason, wait_s=wait_s
    )


class CommitVote:
    """Store-based agreement on one step's outcome (see the module docstring)."""

    def __init__(self, store: Any, *, poll: timedelta = timedelta(milliseconds=5)) -> None:
        self.store = store
        self.poll = poll
        self._wait_for_value: Callable[[str, timedelta], bytes | None] | None = getattr(
            store, "wait_for_value", None
        )

    def prefix(self, epoch: int, step: int) -> str:
        return f"{_PREFIX}/{epoch}/{step}/"

    def keys(self, epoch: int, step: int, size: int) -> tuple[list[str], str]:
        """The members' ``ok`` keys (by rank) and the decision key of ``(epoch, step)``."""
        base = self.prefix(epoch, step)
        return [f"{base}ok/{r}" for r in range(size)], f"{base}decision"

    def decide(
        self,
        *,
        epoch: int,
        step: int,
        rank: int,
        size: int,
        ok: bool,
        timeout: timedelta,
        failed: Callable[[], str],
        joiners_pending: Callable[[], bool],
        local_reason: str = "",
    ) -> Decision:
        """Vote ``ok`` for ``(epoch, step)`` as ``rank`` of ``size`` members; block (bounded)
        for the outcome.

        ``failed()`` returns a non-empty reason once this member knows the group failed
        (it is polled while waiting); ``joiners_pending()`` is asked by a member that
        proposes ``commit``.
        """
        if not 0 <= rank < size:
            raise ValueError(f"CommitVote.decide(rank={rank}, size={size}): need 0 <= rank < size.")
        start = time.monotonic()
        ok_keys, decision_key = self.keys(epoch, step, size)
        if not ok:
            reason = local_reason or "a member failed the step"
            return self._propose(decision_key, _encode(False, False, reason), start)
        if self._set_and_check(ok_keys[rank], ok_keys):
            return self._propose(decision_key, _encode(True, joiners_pending(), ""), start)
        deadline = start + timeout.total_seconds()
        sleep_s = 0.0002
        while True:
            value = self._decided(decision_key)
            if value is not None:
                return _decode(value, time.monotonic() - start)
            reason = failed()
            if reason:
                return self._propose(decision_key, _encode(False, False, reason), start)
            if time.monotonic() > deadline:
                return self._propose(
                    decision_key,
                    _encode(False, False, f"commit vote not complete within {timeout}"),
                    start,
                )
            if self._wait_for_value is None:
                time.sleep(sleep_s)
                sleep_s = min(sleep_s * 2, self.poll.total_seconds())

    def _set_and_check(self, key: str, keys: list[str]) -> bool:
        """Write this member's key; whether every member's is there (one request on etcd)."""
        both = getattr(self.store, "set_and_read", None)
        if both is not None:
            return all(v is not None for v in both(key, "1", keys))
        self.store.set(key, "1")
        return bool(self.store.check(keys))

    def _decided(self, key: str) -> bytes | None:
        """The decision if one was made (waiting a short slice on stores that can)."""
        if self._wait_for_value is not None:
            return self._wait_for_value(key, _WATCH_SLICE)
        # Poll with check() rather than a timed store.wait(): a TCPStore client whose
        # wait timed out can read the late reply as the answer to its next request.
        return bytes(self.store.get(key)) if self.store.check([key]) else None

    def _propose(self, key: str, value: str, start: float) -> Decision:
        won = self.store.compare_set(key, "", value)
        return _decode(won, time.monotonic() - start)

    def cleanup(self, epoch: int, step: int, size: int) -> None:
        """Delete an old step's keys (keeps the store small on long runs); best effort.

        One member (rank 0) calls it; a store with ``delete_prefix`` (etcd) drops them
        in one request."""
        try:
            delete_prefix = getattr(self.store, "delete_prefix", None)
            if delete_prefix is not None:
                delete_prefix(self.prefix(epoch, step))
                return
            ok_keys, decision_key = self.keys(epoch, step, size)
            for key in [*ok_keys, decision_key]:
                self.store.delete_key(key)
        except Exception:  # noqa: BLE001 - cleanup never fails a step
            pass
