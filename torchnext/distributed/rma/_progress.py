"""Progress engine of RMA windows for members on other hosts: a TCP server per window.

A member that some peer cannot map (another host, another shared-memory namespace, or
``transport="tcp"``) runs a :class:`ProgressServer`: a listening socket and one
thread per connected origin, which read each request and hand it to a
:class:`RequestHandler` (the window's serving side,
:class:`~torchnext.distributed.rma.server.WindowServer`), which applies it to the
member's own segment. The member's main thread takes no part, so it can be busy
computing while peers write into its window. This module is the transport only: the
wire format, the server's threads and the origin's channel (:class:`RemotePeer`).

Wire format (little endian): a 32-byte request header ``op, acc_op, src, offset,
nelems, timeout_s`` followed, for put and accumulate, by the payload; a 16-byte reply
``status, length`` followed by the payload (get) or an error text. A put is received
straight into the target's memory (no staging copy). Requests are validated by the
origin before they are sent and again by the server, so a bad request never touches
the target's memory.

What not to assume: the channel is not authenticated or encrypted; bind it to an
interface of a trusted network (``TORCHNEXT_RMA_ADDR``).
"""

from __future__ import annotations

import logging
import socket
import struct
import threading
from typing import NamedTuple, Protocol

from torchnext.errors import CommError, CommTimeoutError, WindowError, WindowRevokedError

__all__ = [
    "Op",
    "ProgressServer",
    "RemotePeer",
    "Request",
    "RequestHandler",
    "Status",
    "drain",
    "recv_exact",
]

logger: logging.Logger = logging.getLogger(__name__)

_REQ = struct.Struct("<BBxxiqqd")
_RESP = struct.Struct("<Bxxxxxxxq")


class Op:
    PUT = 1
    GET = 2
    ACC = 3
    SIGNAL = 4
    LOCK = 5
    UNLOCK = 6


class Status:
    """Reply status codes (the first byte of a reply)."""

    OK = 0
    ERR = 1
    REVOKED = 2
    TIMEOUT = 3


class Request(NamedTuple):
    """One decoded request header (the payload, if any, still waits on the socket)."""

    op: int
    acc: int
    src: int
    offset: int
    nelems: int
    timeout_s: float


class RequestHandler(Protocol):
    """What the server needs from the window it serves: one answer per request.

    ``handle`` must read exactly the request's payload from ``conn`` (or drain it) so
    the stream stays in step, and returns ``(status, reply body)``.
    """

    def handle(self, conn: socket.socket, request: Request) -> tuple[int, bytes | memoryview]: ...


def recv_exact(sock: socket.socket, view: memoryview) -> None:
    """Fill ``view`` from ``sock``; raises :class:`ConnectionError` if the peer closes."""
    got = 0
    while got < len(view):
        n = sock.recv_into(view[got:])
        if n == 0:
            raise ConnectionError("peer closed the connection")
        got += n


def drain(conn: socket.socket, nbytes: int) -> None:
    """Read and discard ``nbytes`` (a refused request's payload) to keep the stream in step."""
    buf = bytearray(min(nbytes, 1 << 20))
    view = memoryview(buf)
    while nbytes > 0:
        n = conn.recv_into(view[: min(nbytes, len(buf))])
        if n == 0:
            raise ConnectionError("peer closed the connection")
        nbytes -= n


class ProgressServer:
    """Serves one window's segment to remote origins from background threads."""

    def __init__(self, handler: RequestHandler, bind_addr: str) -> None:
        self._handler = handler
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._sock.bind((bind_addr, 0))
        self._sock.listen(64)
        self._sock.settimeout(0.2)
        self.address = f"{bind_addr}:{self._sock.getsockname()[1]}"
        self._stop = threading.Event()
        self._conns: list[socket.socket] = []
        self._lock = threading.Lock()
        self._thread = threading.Thread(
            target=self._accept_loop, name="torchnext-rma-progress", daemon=True
        )
        self._thread.start()

    def close(self) -> None:
        self._stop.set()
        with self._lock:
            conns, self._conns = self._conns, []
        for c in conns:
            try:
                c.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            c.close()
        self._thread.join(timeout=2)
        self._sock.close()

    def _accept_loop(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self._sock.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            conn.settimeout(None)
            with self._lock:
                self._conns.append(conn)
            threading.Thread(
                target=self._serve, args=(conn,), name="torchnext-rma-serve", daemon=True
            ).start()

    def _serve(self, conn: socket.socket) -> None:
        header = bytearray(_REQ.size)
        hv = memoryview(header)
        try:
            while not self._stop.is_set():
                recv_exact(conn, hv)
                status, reply = self._handler.handle(conn, Request(*_REQ.unpack(header)))
                conn.sendall(_RESP.pack(status, len(reply)))
                if reply:
                    conn.sendall(reply)
        except (ConnectionError, OSError):
            pass
        finally:
            conn.close()


class RemotePeer:
    """Origin side of the channel to one remote target; one request at a time."""

    def __init__(self, address: str, rank: int) -> None:
        host, port = address.rsplit(":", 1)
        self._addr = (host, int(port))
        self.rank = rank
        self._sock: socket.socket | None = None
        self._lock = threading.Lock()

    def close(self) -> None:
        with self._lock:
            if self._sock is not None:
                self._sock.close()
                self._sock = None

    def request(
        self,
        op: int,
        *,
        src: int,
        offset: int = 0,
        nelems: int = 0,
        acc: int = 0,
        timeout_s: float,
        payload: memoryview | None = None,
        out: memoryview | None = None,
    ) -> None:
        """Send one request and wait (bounded by ``timeout_s`` plus a margin) for its reply."""
        with self._lock:
            try:
                if self._sock is None:
                    self._sock = socket.create_connection(self._addr, timeout=max(timeout_s, 1.0))
                    self._sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                sock = self._sock
                sock.settimeout(timeout_s + 5.0)
                sock.sendall(_REQ.pack(op, acc, src, offset, nelems, timeout_s))
                if payload is not None:
                    sock.sendall(payload)
                head = bytearray(_RESP.size)
                recv_exact(sock, memoryview(head))
                status, length = _RESP.unpack(head)
                if status == Status.OK and out is not None:
                    recv_exact(sock, out)
                    return
                body = bytearray(length)
                if length:
                    recv_exact(sock, memoryview(body))
            except TimeoutError:
                self._drop()
                raise CommTimeoutError(
                    f"RMA window: rank {self.rank} at {self._addr[0]}:{self._addr[1]} did not answer "
                    f"within {timeout_s:.1f} s"
                ) from None
            except OSError as exc:
                self._drop()
                raise CommError(
                    f"RMA window: lost the connection to rank {self.rank} at "
                    f"{self._addr[0]}:{self._addr[1]} ({exc}); the peer is gone or its window closed"
                ) from None
        text = body.decode(errors="replace")
        if status == Status.OK:
            return
        if status == Status.REVOKED:
            raise WindowRevokedError(f"RMA window: rank {self.rank}: {text}", epoch=-1)
        if status == Status.TIMEOUT:
            raise CommTimeoutError(f"RMA window: rank {self.rank}: {text}")
        raise WindowError(f"RMA window: rank {self.rank} refused the request: {text}")

    def _drop(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None
