"""The store collectives of one RMA window's members: an all-gather and a barrier.

Window creation exchanges each member's segment name, doorbell and progress-server
address (:meth:`StoreRendezvous.all_gather`) and :meth:`Window.fence` ends an epoch
(:meth:`StoreRendezvous.barrier`); both run over the group's store under a prefix
that is unique to the window, so windows of one group (or of sub-groups of a split)
never read each other's keys.

Every wait is bounded and re-checks the window (``check_live``) while it polls, so a
revoked group fails a creation or a fence at once rather than at the timeout. What
not to assume: the keys are never deleted (a store lives as long as its job), and a
barrier tag may be used once per window.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any

from torchnext.errors import CommTimeoutError

__all__ = ["StoreRendezvous"]


class StoreRendezvous:
    """All-gather and barrier of ``size`` members over ``store`` under ``prefix``."""

    def __init__(
        self,
        store: Any,
        prefix: str,
        *,
        rank: int,
        size: int,
        timeout: timedelta,
        check_live: Callable[[], None],
    ) -> None:
        self._store = store
        self._prefix = prefix
        self.rank = rank
        self.size = size
        self._timeout_s = timeout.total_seconds()
        self._check_live = check_live

    def _deadline(self, timeout: timedelta | None) -> float:
        return time.monotonic() + (
            timeout.total_seconds() if timeout is not None else self._timeout_s
        )

    def _wait_key(self, key: str, deadline: float, what: str) -> None:
        attempt = 0
        while not self._store.check([key]):
            self._check_live()
            if time.monotonic() > deadline:
                raise CommTimeoutError(
                    f"RMA window: {what} did not complete within the timeout ({key})"
                )
            time.sleep(min(0.005, 0.0002 * (attempt + 1)))
            attempt += 1

    def all_gather(self, tag: str, value: str) -> list[str]:
        """Every member's ``value`` for ``tag``, in rank order (bounded by the timeout)."""
        deadline = self._deadline(None)
        self._store.set(f"{self._prefix}/{tag}/{self.rank}", value)
        out = []
        for r in range(self.size):
            key = f"{self._prefix}/{tag}/{r}"
            self._wait_key(key, deadline, f"window creation ({tag}) waiting for rank {r}")
            out.append(self._store.get(key).decode())
        return out

    def barrier(self, tag: str, timeout: timedelta | None = None) -> None:
        """Return once every member reached barrier ``tag`` (default bound: the timeout)."""
        deadline = self._deadline(timeout)
        key = f"{self._prefix}/barrier/{tag}"
        if int(self._store.add(key, 1)) == self.size:
            self._store.set(f"{key}/done", "1")
        self._wait_key(f"{key}/done", deadline, f"barrier {tag!r}")
