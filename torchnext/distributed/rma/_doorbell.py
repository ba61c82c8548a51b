"""Wake-ups for RMA signal waiters on one host: a datagram "doorbell" per window member.

A signal is a counter increment in the target's shared memory; a waiter that only
polled that counter would either burn a core or notice late (sleep granularity on a
busy host is a millisecond or more). Each member therefore binds a Unix datagram socket
in Linux's abstract namespace (no file, nothing to clean up, gone when the process
dies); a signaller increments the counter *then* rings the target's doorbell, and the
waiter blocks in ``select`` until the ring or a short slice passes. Datagrams queue, so
a ring that lands between the waiter's check and its ``select`` is not lost; stale rings
only cause an extra check of the counter.

Not on Linux (no abstract namespace) or if the socket cannot be created, there is no
doorbell and waiters poll; correctness never depends on a ring arriving.
"""

from __future__ import annotations

import secrets
import select
import socket
import sys

__all__ = ["Doorbell", "ring"]

_sender: socket.socket | None = None


class Doorbell:
    """This member's doorbell; ``address`` is what peers pass to :func:`ring`."""

    def __init__(self) -> None:
        self.address = ""
        self._sock: socket.socket | None = None
        if not sys.platform.startswith("linux"):
            return
        try:
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
            name = f"torchnext-rma-{secrets.token_hex(8)}"
            sock.bind("\0" + name)
            sock.setblocking(False)
        except OSError:
            return
        self._sock = sock
        self.address = name

    def wait(self, timeout_s: float) -> None:
        """Block until a ring or ``timeout_s``; then drop queued rings."""
        if self._sock is None:
            return
        ready, _, _ = select.select([self._sock], [], [], max(0.0, timeout_s))
        if ready:
            try:
                while True:
                    self._sock.recv(64)
            except (BlockingIOError, OSError):
                pass

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None


def ring(address: str) -> None:
    """Ring the doorbell at ``address`` (best effort; never blocks, never raises)."""
    global _sender
    if not address:
        return
    try:
        if _sender is None:
            _sender = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
            _sender.setblocking(False)
        _sender.sendto(b"\0", "\0" + address)
    except OSError:
        pass  # full queue (the waiter has rings pending anyway) or the peer is gone
