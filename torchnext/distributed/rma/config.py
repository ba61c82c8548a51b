"""How an RMA window is reached and how long its operations may wait: :class:`WindowConfig`.

Pass one to :meth:`Window.create` / :meth:`Window.allocate`; the defaults suit members
on one host or on a trusted network. What not to assume: the config is read once, at
creation; changing the environment later (``TORCHNEXT_RMA_ADDR``) has no effect on a
window that exists.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from typing import Literal

__all__ = ["WindowConfig"]


@dataclass(frozen=True, kw_only=True)
class WindowConfig:
    """How a window is reached and how long its operations may wait."""

    timeout: timedelta = timedelta(seconds=60)
    """Default bound of every wait (creation, locks, signals, fences, remote replies)."""
    transport: Literal["auto", "shm", "tcp"] = "auto"
    """``auto``: shared memory with members on this host, TCP with the others;
    ``tcp``: TCP with everyone (tests the cross-host path on one host); ``shm``:
    shared memory only (creation fails if a member is on another host)."""
    bind_addr: str = ""
    """Address the progress server listens on; empty: ``TORCHNEXT_RMA_ADDR``, else
    127.0.0.1 when every member is on this host, else this host's name's address."""

    def __post_init__(self) -> None:
        if self.timeout <= timedelta(0):
            raise ValueError(f"WindowConfig.timeout={self.timeout}; pass a positive timedelta")
        if self.transport not in ("auto", "shm", "tcp"):
            raise ValueError(
                f"WindowConfig.transport={self.transport!r}; use 'auto', 'shm' or 'tcp'"
            )
