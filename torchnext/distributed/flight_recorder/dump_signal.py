"""Serve signal-requested dumps on a thread of their own, so a rank blocked in C++ still dumps.

Python runs a signal's handler on the main thread, between two bytecodes. A rank
whose main thread waits inside a gloo collective runs no bytecode until the
collective returns or times out (30 minutes by default): the handler would run
exactly too late. The C-level handler Python installs does run at once, in
whichever thread the kernel picks, and writes the signal's number to the *wakeup
fd* (:func:`signal.set_wakeup_fd`). :func:`install` points the wakeup fd at a pipe
that a daemon thread reads; that thread runs the dump, taking the GIL that the
blocked main thread released. The Python-level handler left on the main thread
only chains the handler that was there before, unless the wakeup fd is no longer
ours, in which case it dumps itself, between bytecodes, as before.

Why not ``sigwait`` in a thread: it needs the signal blocked in every other thread,
and the threads that C++ libraries started earlier do not block it; one of them
receiving it would take the default action (SIGUSR1's ends the process). Blocking
it in the main thread would also pass the blocked mask on to every child process.

What not to assume: a process has one wakeup fd. One set before :func:`install`
(an asyncio loop's) keeps receiving every byte, which the thread forwards; one set
after it (``loop.add_signal_handler``) takes the bytes away, and dumps are back on
the main thread. A thread that holds the GIL for long inside C code delays the
dump as much.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import threading
from collections.abc import Callable
from dataclasses import dataclass
from types import FrameType
from typing import Any

__all__ = ["install", "installed_signals"]

logger: logging.Logger = logging.getLogger(__name__)

_Handler = Callable[[int, FrameType | None], Any]


@dataclass
class _Server:
    """The pipe the C-level handler writes to, and the fd that had the job before us."""

    read_fd: int
    write_fd: int
    forward_fd: int
    thread: threading.Thread | None = None


_lock = threading.Lock()
_server: _Server | None = None
_handlers: dict[int, _Handler] = {}  # signum -> our Python-level handler
_callbacks: dict[int, Callable[[int], None]] = {}
_fork_hook = False


def installed_signals() -> list[int]:
    """The signal numbers :func:`install` serves in this process."""
    return sorted(_handlers)


def install(signum: int, callback: Callable[[int], None]) -> None:
    """Call ``callback(signum)`` on a daemon thread whenever the process receives ``signum``.

    Main thread only (Python's rule for :func:`signal.signal`). Idempotent per signal:
    the first callback stays. The handler that was installed before is still called,
    on the main thread, as Python calls handlers.
    """
    global _server, _fork_hook
    if threading.current_thread() is not threading.main_thread():
        raise RuntimeError(
            "install_signal_handler: call it from the main thread (Python installs signal "
            "handlers only there)"
        )
    with _lock:
        if signum in _handlers:
            return
        if _server is None:
            _server = _start(forward_fd=None)
            if not _fork_hook:
                os.register_at_fork(after_in_child=_after_fork_in_child)
                _fork_hook = True
        previous = signal.getsignal(signum)

        def handler(sig: int, frame: FrameType | None) -> None:
            if not _served_by_thread():
                _run(sig)
            if callable(previous):
                previous(sig, frame)

        # Registered before signal.signal: the thread must know the signal once it can come.
        _callbacks[signum] = callback
        _handlers[signum] = handler
        try:
            signal.signal(signum, handler)
        except BaseException:
            del _callbacks[signum], _handlers[signum]
            raise


def _start(forward_fd: int | None) -> _Server:
    """Open the pipe, make it the wakeup fd and start the thread that reads it."""
    read_fd, write_fd = os.pipe()
    try:
        # Python requires a non-blocking wakeup fd: the C-level handler must never block.
        os.set_blocking(write_fd, False)
        before = signal.set_wakeup_fd(write_fd, warn_on_full_buffer=False)
    except BaseException:
        os.close(read_fd)
        os.close(write_fd)
        raise
    server = _Server(read_fd, write_fd, before if forward_fd is None else forward_fd)
    server.thread = threading.Thread(
        target=_serve, args=(server,), name="torchnext-fr-signal", daemon=True
    )
    server.thread.start()
    return server


def _serve(server: _Server) -> None:
    while True:
        try:
            data = os.read(server.read_fd, 256)
        except OSError:  # the pipe was closed: nothing to serve any more
            return
        if not data:
            return
        if server.forward_fd >= 0:
            # Give the earlier owner of the wakeup fd the bytes it would have had. If its
            # pipe is full it loses this wake-up, as it would have without us.
            with contextlib.suppress(OSError):
                os.write(server.forward_fd, data)
        # One dump per signal and wake-up: a burst of the same signal is one request.
        for signum in dict.fromkeys(data):
            handler = _handlers.get(signum)
            # Serve it only while our handler is the installed one: code that replaced
            # it took the signal over.
            if handler is not None and signal.getsignal(signum) is handler:
                _run(signum)


def _run(signum: int) -> None:
    callback = _callbacks.get(signum)
    if callback is None:
        return
    try:
        callback(signum)
    except Exception:  # noqa: BLE001 - a failed dump must not end the thread or reach user code
        logger.exception("flight recorder: dump on signal %d failed", signum)


def _served_by_thread() -> bool:
    """True when the thread got this signal's byte (main thread only: it swaps the wakeup fd)."""
    server = _server
    if server is None or server.thread is None or not server.thread.is_alive():
        return False
    # Setting our own fd again is a no-op that returns the current one atomically.
    current = signal.set_wakeup_fd(server.write_fd, warn_on_full_buffer=False)
    if current == server.write_fd:
        return True
    signal.set_wakeup_fd(current)  # someone else's now: leave it to them
    return False


def _after_fork_in_child() -> None:
    """Give a forked child its own pipe and thread: the inherited pipe is the parent's."""
    global _server, _lock
    _lock = threading.Lock()  # another thread may have held it at the fork
    inherited = _server
    if inherited is None:
        return
    _server = None
    try:
        # Swap the wakeup fd first, then close: a signal never finds a closed fd.
        _server = _start(forward_fd=inherited.forward_fd)
    except Exception:  # noqa: BLE001 - the child still dumps, on its main thread
        logger.warning("flight recorder: no signal thread in forked child", exc_info=True)
        with contextlib.suppress(Exception):
            signal.set_wakeup_fd(inherited.forward_fd)
    for fd in (inherited.read_fd, inherited.write_fd):
        with contextlib.suppress(OSError):
            os.close(fd)
