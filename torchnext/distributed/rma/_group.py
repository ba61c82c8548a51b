"""The group surface an RMA window needs, and a small group for plain torch.distributed jobs.

A window needs very little from its group: the caller's ``rank``, the ``size``, the
membership ``epoch`` (a window dies when it changes), a ``store`` to exchange segment
names and addresses and to run fences on, a ``name`` that is the same on every member,
and, optionally, ``add_revoke_callback`` so that a group failure fails the window's
pending operations at once. :class:`~torchnext.distributed.FaultTolerantGroup` has all
of it; :class:`StoreGroup` gives it to a job that uses plain ``torch.distributed``.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any, Protocol, runtime_checkable

from torchnext.errors import CommRevokedError

__all__ = ["WindowGroup", "StoreGroup"]


@runtime_checkable
class WindowGroup(Protocol):
    """Structural type of a window's group."""

    @property
    def rank(self) -> int: ...
    @property
    def size(self) -> int: ...
    @property
    def epoch(self) -> int: ...
    @property
    def store(self) -> Any: ...
    @property
    def name(self) -> str: ...


class StoreGroup:
    """A fixed membership over a ``torch.distributed`` store: enough to create windows.

    Use :meth:`from_process_group` in a job that called ``init_process_group``.
    :meth:`revoke` fails every window of the group (for instance from your own failure
    handling), like a fault-tolerant group's revoke does.
    """

    def __init__(
        self, store: Any, rank: int, size: int, *, name: str = "default", epoch: int = 0
    ) -> None:
        if not 0 <= rank < size:
            raise ValueError(f"StoreGroup: rank={rank} is outside 0..{size - 1} (size={size})")
        self.store = store
        self.rank = rank
        self.size = size
        self.name = name
        self.epoch = epoch
        self._callbacks: list[Callable[[CommRevokedError], None]] = []
        self._revoked: CommRevokedError | None = None
        self._lock = threading.Lock()

    @classmethod
    def from_process_group(cls, store: Any, group: Any = None) -> StoreGroup:
        """The members of a ``torch.distributed`` group (default: the world), over ``store``.

        ``store`` must be reachable by every member (the store you passed to
        ``init_process_group``, or a ``PrefixStore`` of it); the window adds its own prefix.
        """
        import torch.distributed as dist

        from torchnext.compat.distributed_internals import default_group, process_group_name

        pg = group if group is not None else default_group()
        return cls(
            store,
            dist.get_rank(pg),
            dist.get_world_size(pg),
            name=f"pg{process_group_name(pg)}",
        )

    @property
    def is_revoked(self) -> bool:
        return self._revoked is not None

    def add_revoke_callback(self, fn: Callable[[CommRevokedError], None]) -> None:
        with self._lock:
            self._callbacks.append(fn)
            revoked = self._revoked
        if revoked is not None:
            fn(revoked)

    def revoke(self, reason: str = "revoked by the application") -> None:
        """Fail every window of this group (idempotent)."""
        with self._lock:
            if self._revoked is not None:
                return
            self._revoked = CommRevokedError(
                f"group {self.name!r} revoked: {reason}", epoch=self.epoch, reason=reason
            )
            callbacks = list(self._callbacks)
        for fn in callbacks:
            fn(self._revoked)
