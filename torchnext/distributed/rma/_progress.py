"""Progress engine of RMA windows for members on other hosts: a TCP server per window.

A member that some peer cannot map (another host, another shared-memory namespace, or
``transport="tcp"``) runs a :class:`ProgressServer`: a listening socket and one
thread per connected origin, which apply puts, gets, accumulates, signals and lock
requests to the member's own segment. The member's main thread takes no part, so it
can be busy computing while peers write into its window.

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
from typing import Protocol

from torchnext.errors import CommError, CommTimeoutError, WindowError, WindowRevokedError

__all__ = ["ProgressServer", "RemotePeer", "Op", "TargetOps"]

logger: logging.Logger = logging.getLogger(__name__)

_REQ = struct.Struct("<BBxxiqqd")
_RESP = struct.Struct("<Bxxxxxxxq")
_OK, _ERR, _REVOKED, _TIMEOUT = 0, 1, 2, 3


class Op:
    PUT = 1
    GET = 2
    ACC = 3
    SIGNAL = 4
    LOCK = 5
    UNLOCK = 6


class TargetOps(Protocol):
    """What the server needs from the window it serves (implemented by the Window)."""

    def _serve_check(self, op: int, src: int, offset: int, nelems: int, acc: int) -> None: ...
    def _serve_region(self, offset: int, nelems: int) -> memoryview: ...
    def _serve_accumulate(
        self, acc: int, offset: int, payload: bytearray, timeout_s: float
    ) -> None: ...
    def _serve_signal(self, src: int) -> None: ...
    def _serve_lock(self, src: int, exclusive: bool, timeout_s: float) -> None: ...
    def _serve_unlock(self, src: int, exclusive: bool, timeout_s: float) -> None: ...
    def _serve_revoked(self) -> bool: ...
    def _itemsize(self) -> int: ...


def _recv_exact(sock: socket.socket, view: memoryview) -> None:
    got = 0
    while got < len(view):
        n = sock.recv_into(view[got:])
        if n == 0:
            raise ConnectionError("peer closed the connection")
        got += n


class ProgressServer:
    """Serves one window's segment to remote origins from background threads."""

    def __init__(self, target: TargetOps, bind_addr: str) -> None:
        self._target = target
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
                _recv_exact(conn, hv)
                op, acc, src, offset, nelems, timeout_s = _REQ.unpack(header)
                status, reply = self._handle(conn, op, acc, src, offset, nelems, timeout_s)
                conn.sendall(_RESP.pack(status, len(reply)))
                if reply:
                    conn.sendall(reply)
        except (ConnectionError, OSError):
            pass
        finally:
            conn.close()

    def _handle(
        self,
        conn: socket.socket,
        op: int,
        acc: int,
        src: int,
        offset: int,
        nelems: int,
        timeout_s: float,
    ) -> tuple[int, bytes | memoryview]:
        t = self._target
        nbytes = nelems * t._itemsize() if op in (Op.PUT, Op.ACC) else 0
        try:
            t._serve_check(op, src, offset, nelems, acc)
        except WindowError as exc:
            _drain(conn, nbytes)  # keep the stream in step; the payload is discarded
            return _ERR, str(exc).encode()
        if t._serve_revoked():
            _drain(conn, nbytes)
            return _REVOKED, b"the target's window was revoked"
        try:
            if op == Op.PUT:
                _recv_exact(conn, t._serve_region(offset, nelems))
            elif op == Op.GET:
                return _OK, t._serve_region(offset, nelems)
            elif op == Op.ACC:
                payload = bytearray(nbytes)
                _recv_exact(conn, memoryview(payload))
                t._serve_accumulate(acc, offset, payload, timeout_s)
            elif op == Op.SIGNAL:
                t._serve_signal(src)
            elif op in (Op.LOCK, Op.UNLOCK):
                exclusive = bool(acc)
                if op == Op.LOCK:
                    t._serve_lock(src, exclusive, timeout_s)
                else:
                    t._serve_unlock(src, exclusive, timeout_s)
        except CommTimeoutError as exc:
            return _TIMEOUT, str(exc).encode()
        except WindowRevokedError as exc:
            return _REVOKED, str(exc).encode()
        return _OK, b""


def _drain(conn: socket.socket, nbytes: int) -> None:
    buf = bytearray(min(nbytes, 1 << 20))
    view = memoryview(buf)
    while nbytes > 0:
        n = conn.recv_into(view[: min(nbytes, len(buf))])
        if n == 0:
            raise ConnectionError("peer closed the connection")
        nbytes -= n


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
                _recv_exact(sock, memoryview(head))
                status, length = _RESP.unpack(head)
                if status == _OK and out is not None:
                    _recv_exact(sock, out)
                    return
                body = bytearray(length)
                if length:
                    _recv_exact(sock, memoryview(body))
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
        if status == _OK:
            return
        if status == _REVOKED:
            raise WindowRevokedError(f"RMA window: rank {self.rank}: {text}", epoch=-1)
        if status == _TIMEOUT:
            raise CommTimeoutError(f"RMA window: rank {self.rank}: {text}")
        raise WindowError(f"RMA window: rank {self.rank} refused the request: {text}")

    def _drop(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None
