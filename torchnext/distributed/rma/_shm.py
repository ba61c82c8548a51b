"""Shared-memory segments of RMA windows, and the locks that guard them across processes.

One segment per window member: a file in ``/dev/shm`` (a tmpfs; the system temp folder
elsewhere) mapped ``MAP_SHARED`` by the owner and by every member on the same host, so
a put is one ``memcpy`` into the target's memory with no help from the target. Layout
(byte offsets; every part 64-byte aligned)::

    0    header  int64[8]: magic, revoked flag, exclusive holder (rank + 1), shared count
    64   signals int64[world]: slot s counts signals received from rank s
    D    data    the window's elements

Names carry 64 random bits, so two jobs (or two windows) never collide, and the owner
unlinks its file as soon as every member has mapped it: a mapping outlives its name,
so nothing is left in ``/dev/shm`` even if every process is SIGKILLed later.

Locks are POSIX byte-range locks (``fcntl``) on the segment file, which the kernel
drops when the holding process dies, plus a per-process ``threading.Lock`` because
POSIX locks do not exclude threads of one process. Waits poll with back-off against a
deadline: nothing here blocks without a bound.
"""

from __future__ import annotations

import fcntl
import os
import secrets
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import torch

from torchnext.errors import CommTimeoutError

__all__ = ["Segment", "segment_dir", "host_id", "MUTEX_TABLE", "MUTEX_ACCUMULATE"]

MAGIC = 0x746E78726D6131  # "tnxrma1"
HEADER_BYTES = 64
H_MAGIC, H_REVOKED, H_EXCL, H_SHARED = 0, 1, 2, 3

MUTEX_TABLE = 0
"""Byte range guarding the lock table (held for a few loads and stores)."""
MUTEX_ACCUMULATE = 1
"""Byte range serialising accumulates into one target (held for the whole update)."""

_thread_locks: dict[tuple[str, int], threading.Lock] = {}
_thread_locks_guard = threading.Lock()


def _align(n: int) -> int:
    return (n + 63) // 64 * 64


def segment_dir() -> Path:
    shm = Path("/dev/shm")
    return shm if shm.is_dir() and os.access(shm, os.W_OK) else Path(tempfile.gettempdir())


def host_id() -> str:
    """Identifies a host *and* its shared-memory namespace (containers on one host differ)."""
    import socket

    try:
        boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        boot = ""
    st = os.stat(segment_dir())
    return f"{socket.gethostname()}/{boot}/{st.st_dev}:{st.st_ino}"


def backoff_sleep(attempt: int) -> None:
    """Yield a little, then sleep up to 200 us: a waiter notices a signal within about
    0.3 ms (signal latency is what fences and put-with-signal pay) without burning a core."""
    if attempt < 20:
        time.sleep(0)
    else:
        time.sleep(min(2e-4, 1e-5 * (attempt - 19)))


class Segment:
    """A mapped window segment (own or a peer's on this host)."""

    def __init__(
        self,
        path: Path,
        *,
        fd: int,
        buf_u8: torch.Tensor,
        world: int,
        dtype: torch.dtype,
        numel: int,
    ) -> None:
        self.path = path
        self.fd = fd
        self.buf_u8 = buf_u8
        self.world = world
        self.dtype = dtype
        self.numel = numel
        self.header = buf_u8[:HEADER_BYTES].view(torch.int64)
        self.signals = buf_u8[HEADER_BYTES : HEADER_BYTES + 8 * world].view(torch.int64)
        self.data_offset = self.data_offset_for(world)
        itemsize = torch.empty((), dtype=dtype).element_size()
        self.data = buf_u8[self.data_offset : self.data_offset + numel * itemsize].view(dtype)
        self.closed = False

    @staticmethod
    def data_offset_for(world: int) -> int:
        return HEADER_BYTES + _align(8 * world)

    @classmethod
    def create(cls, *, world: int, dtype: torch.dtype, numel: int) -> Segment:
        itemsize = torch.empty((), dtype=dtype).element_size()
        total = cls.data_offset_for(world) + _align(max(numel * itemsize, 1))
        path = segment_dir() / f"torchnext-rma-{secrets.token_hex(8)}-{os.getpid()}"
        fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
        try:
            os.ftruncate(fd, total)
            buf = torch.from_file(str(path), shared=True, size=total, dtype=torch.uint8)
        except BaseException:
            os.close(fd)
            path.unlink(missing_ok=True)
            raise
        seg = cls(path, fd=fd, buf_u8=buf, world=world, dtype=dtype, numel=numel)
        seg.header[H_MAGIC] = MAGIC
        return seg

    @classmethod
    def open(cls, path: str, *, world: int, dtype: torch.dtype, numel: int) -> Segment:
        fd = os.open(path, os.O_RDWR)
        try:
            total = os.fstat(fd).st_size
            buf = torch.from_file(path, shared=True, size=total, dtype=torch.uint8)
        except BaseException:
            os.close(fd)
            raise
        seg = cls(Path(path), fd=fd, buf_u8=buf, world=world, dtype=dtype, numel=numel)
        if int(seg.header[H_MAGIC]) != MAGIC:
            seg.close()
            raise OSError(f"{path} is not an RMA window segment (bad magic)")
        return seg

    def unlink(self) -> None:
        self.path.unlink(missing_ok=True)

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            os.close(self.fd)

    @property
    def revoked(self) -> bool:
        return bool(int(self.header[H_REVOKED]))

    def mark_revoked(self) -> None:
        self.header[H_REVOKED] = 1

    @contextmanager
    def mutex(
        self, which: int, deadline: float, on_wait: Callable[[], None] | None = None
    ) -> Iterator[None]:
        """Hold byte-range mutex ``which`` of this segment (all processes and threads)."""
        key = (str(self.path), which)
        with _thread_locks_guard:
            tlock = _thread_locks.setdefault(key, threading.Lock())
        if not tlock.acquire(timeout=max(0.0, deadline - time.monotonic())):
            raise CommTimeoutError(f"RMA window: timed out waiting for a lock on {self.path.name}")
        try:
            attempt = 0
            while True:
                try:
                    fcntl.lockf(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB, 1, which)
                    break
                except OSError:
                    if time.monotonic() > deadline:
                        raise CommTimeoutError(
                            f"RMA window: timed out waiting for a lock on {self.path.name}; "
                            "another process holds it"
                        ) from None
                    if on_wait is not None:
                        on_wait()
                    backoff_sleep(attempt)
                    attempt += 1
            try:
                yield
            finally:
                fcntl.lockf(self.fd, fcntl.LOCK_UN, 1, which)
        finally:
            tlock.release()

    def try_lock(self, rank: int, exclusive: bool, deadline: float) -> bool:
        """One attempt to take the passive-target lock for ``rank``; True if taken."""
        with self.mutex(MUTEX_TABLE, deadline):
            excl, shared = int(self.header[H_EXCL]), int(self.header[H_SHARED])
            if exclusive:
                if excl == 0 and shared == 0:
                    self.header[H_EXCL] = rank + 1
                    return True
                return False
            if excl == 0:
                self.header[H_SHARED] = shared + 1
                return True
            return False

    def release_lock(self, rank: int, exclusive: bool, deadline: float) -> None:
        with self.mutex(MUTEX_TABLE, deadline):
            if exclusive:
                if int(self.header[H_EXCL]) == rank + 1:
                    self.header[H_EXCL] = 0
            else:
                self.header[H_SHARED] = max(0, int(self.header[H_SHARED]) - 1)
