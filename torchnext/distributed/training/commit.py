"""The commit vote: a training step counts only if every member finished it.

Use :class:`CommitVote` (the :class:`~torchnext.distributed.manager.Manager` does) at
the end of each step, after the gradient all-reduce, to decide *consistently on every
member* whether the step is applied (optimizer step, data cursor advanced) or
discarded and redone on the next membership.

Why the store and not a collective: a collective vote can itself complete on some
members and fail on others (a member dies between sending its last chunk and
receiving), so survivors could disagree - the two-generals problem. The store lives
outside the workers and offers an atomic compare-and-set, which makes it a single
authority: every member counts itself in under ``.../ok``; whoever sees the count
reach the membership size proposes ``commit``, whoever sees a failure (its own error,
a revoke of the group, the bound running out) proposes ``abort``; the first proposal
wins (``compare_set`` on an absent key) and every member adopts the winner. A member
that counted itself in and then died does not hurt: the survivors' state is what
they all agreed on.

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

    def keys(self, epoch: int, step: int) -> tuple[str, str]:
        base = f"{_PREFIX}/{epoch}/{step}"
        return f"{base}/ok", f"{base}/decision"

    def decide(
        self,
        *,
        epoch: int,
        step: int,
        size: int,
        ok: bool,
        timeout: timedelta,
        failed: Callable[[], str],
        joiners_pending: Callable[[], bool],
        local_reason: str = "",
    ) -> Decision:
        """Vote ``ok`` for ``(epoch, step)`` among ``size`` members; block (bounded) for the outcome.

        ``failed()`` returns a non-empty reason once this member knows the group failed
        (it is polled while waiting); ``joiners_pending()`` is asked by the member that
        proposes ``commit``.
        """
        start = time.monotonic()
        ok_key, decision_key = self.keys(epoch, step)
        if ok:
            if int(self.store.add(ok_key, 1)) >= size:
                return self._propose(decision_key, _encode(True, joiners_pending(), ""), start)
        else:
            return self._propose(
                decision_key,
                _encode(False, False, local_reason or "a member failed the step"),
                start,
            )
        deadline = start + timeout.total_seconds()
        # Poll with check() rather than a timed store.wait(): a TCPStore client whose
        # wait timed out can read the late reply as the answer to its next request.
        sleep_s = 0.0002
        while True:
            if self.store.check([decision_key]):
                return _decode(self.store.get(decision_key), time.monotonic() - start)
            reason = failed()
            if reason:
                return self._propose(decision_key, _encode(False, False, reason), start)
            if time.monotonic() > deadline:
                return self._propose(
                    decision_key,
                    _encode(False, False, f"commit vote not complete within {timeout}"),
                    start,
                )
            time.sleep(sleep_s)
            sleep_s = min(sleep_s * 2, self.poll.total_seconds())

    def _propose(self, key: str, value: str, start: float) -> Decision:
        won = self.store.compare_set(key, "", value)
        return _decode(won, time.monotonic() - start)

    def cleanup(self, epoch: int, step: int) -> None:
        """Delete an old step's keys (keeps the store small on long runs); best effort."""
        for key in self.keys(epoch, step):
            try:
                self.store.delete_key(key)
            except Exception:  # noqa: BLE001 - cleanup never fails a step
                pass
