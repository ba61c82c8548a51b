"""Worker side of the multi-process harness: the context a worker function receives.

Each worker is a fresh process (forkserver or spawn), in its own session so the
harness can signal the worker and everything it started at once, with a parent-death
signal so it cannot outlive the harness. It reports to the harness over a pipe:
events, fired faults, and finally its return value or its exception with the remote
traceback. Faults are self-inflicted at the point (exact placement); the harness is
told first, so it can tell "killed by the test" from "crashed".
"""

from __future__ import annotations

import ctypes
import faulthandler
import os
import pickle
import signal
import sys
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta
from multiprocessing.connection import Connection
from typing import Any

from torchnext.testing.faults import Fault

__all__ = ["WorkerContext", "WorkerSpec", "worker_main"]

_PR_SET_PDEATHSIG = 1


@dataclass(frozen=True, kw_only=True)
class WorkerSpec:
    """What the harness tells one worker process: its rank, the store, its fault plan."""

    rank: int
    world_size: int
    store_host: str
    store_port: int
    store_timeout: timedelta
    faults: tuple[Fault, ...]
    env: dict[str, str] = field(default_factory=dict)
    stack_dump_path: str = ""
    threads: int = 1


class WorkerContext:
    """What a worker function ``fn(ctx, *args)`` gets: its rank, the store, fault points.

    ``rank``/``world_size`` are the harness's numbering (initial workers 0..N-1, later
    :meth:`MultiProcessHarness.spawn` workers N, N+1...), not a group's rank.
    ``member_id`` (``"w<rank>"``) is also set as ``TORCHNEXT_MEMBER_ID``, with
    ``TORCHNEXT_STORE_ADDR`` and ``TORCHNEXT_WORLD_SIZE``, so
    ``FaultTolerantGroup.from_env()`` works inside a worker.
    """

    def __init__(self, spec: WorkerSpec, conn: Connection) -> None:
        self._spec = spec
        self._conn = conn
        self._send_lock = threading.Lock()
        self._pending = {f.at: f for f in spec.faults if f.rank == spec.rank}
        self._op_counts: dict[str, int] = {}
        self._open_ops: dict[int, str] = {}
        self._next_token = 0
        self._store: Any = None

    @property
    def rank(self) -> int:
        return self._spec.rank

    @property
    def world_size(self) -> int:
        return self._spec.world_size

    @property
    def member_id(self) -> str:
        return f"w{self._spec.rank}"

    @property
    def store_addr(self) -> str:
        """``host:port`` of the harness's TCPStore (hosted outside every worker)."""
        return f"{self._spec.store_host}:{self._spec.store_port}"

    @property
    def store(self) -> Any:
        """A client of the harness's TCPStore (created on first use)."""
        if self._store is None:
            import torch.distributed as dist

            self._store = dist.TCPStore(
                self._spec.store_host,
                self._spec.store_port,
                is_master=False,
                timeout=self._spec.store_timeout,
            )
        return self._store

    def checkpoint(self, point: str) -> None:
        """Pass named point ``point``; fires the fault declared for it, if any."""
        fault = self._pending.pop(point, None)
        if fault is None:
            return
        delay = fault.effective_delay()
        if delay > timedelta(0):
            timer = threading.Timer(delay.total_seconds(), self._fire, args=(fault,))
            timer.daemon = True
            timer.start()
        else:
            self._fire(fault)

    def emit(self, name: str, **data: Any) -> None:
        """Send an event (name, data, ``time.monotonic()``) to the harness's result."""
        self._send(("event", name, data, time.monotonic()))

    def _send(self, message: tuple[Any, ...]) -> None:
        with self._send_lock:
            self._conn.send(message)

    def _fire(self, fault: Fault) -> None:
        self._send(("fault", fault.at, fault.kind, time.monotonic()))
        sig = signal.SIGKILL if fault.kind == "kill" else signal.SIGSTOP
        # The whole process group: the worker and anything it started fail together.
        os.killpg(os.getpgrp(), sig)

    # Op observer protocol (torchnext.distributed.group.hooks): ops become fault points.
    def on_start(self, info: Any) -> int:
        k = self._op_counts.get(info.op, 0)
        self._op_counts[info.op] = k + 1
        self._next_token += 1
        self._open_ops[self._next_token] = f"{info.op}:{k}"
        self.checkpoint(f"{info.op}:{k}:before")
        self.checkpoint(f"{info.op}:{k}:during")
        return self._next_token

    def on_finish(self, token: int, state: str) -> None:
        name = self._open_ops.pop(token, None)
        if name is not None:
            self.checkpoint(f"{name}:after")


def _set_parent_death_signal() -> None:
    if not sys.platform.startswith("linux"):
        return
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):
        return


def _format_exception(exc: BaseException) -> tuple[Any, ...]:
    tb = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    payload: bytes | None
    try:
        payload = pickle.dumps(exc)
        pickle.loads(payload)
    except Exception:  # noqa: BLE001 - any unpicklable exception is reported as text only
        payload = None
    return ("error", f"{type(exc).__module__}.{type(exc).__qualname__}", str(exc), tb, payload)


def worker_main(
    spec: WorkerSpec, conn: Connection, fn: Callable[..., Any], args: tuple[Any, ...]
) -> None:
    """Entry point of a harness worker process (runs in the child)."""
    os.setsid()
    _set_parent_death_signal()
    if spec.stack_dump_path:
        # The harness sends SIGUSR1 to a worker that overran the timeout to learn where it hung.
        dump = open(spec.stack_dump_path, "w")  # noqa: SIM115 - must stay open for the handler
        faulthandler.register(signal.SIGUSR1, file=dump, all_threads=True)
        # A crash (SIGSEGV, SIGABRT...) leaves its Python stacks there too.
        faulthandler.enable(file=dump, all_threads=True)
    from torchnext import _env

    os.environ[_env.TORCHNEXT_STORE_ADDR.name] = f"{spec.store_host}:{spec.store_port}"
    os.environ[_env.TORCHNEXT_MEMBER_ID.name] = f"w{spec.rank}"
    os.environ[_env.TORCHNEXT_WORLD_SIZE.name] = str(spec.world_size)
    os.environ.update(spec.env)
    import torch

    if spec.threads > 0:
        torch.set_num_threads(spec.threads)
    ctx = WorkerContext(spec, conn)
    if ctx._pending:
        from torchnext.distributed.group import hooks as _hooks

        _hooks.register_observer(ctx)
    try:
        value = fn(ctx, *args)
    except BaseException as exc:  # noqa: BLE001 - everything is reported to the harness
        ctx._send(_format_exception(exc))
        return
    try:
        ctx._send(("result", value))
    except Exception as exc:  # noqa: BLE001 - e.g. an unpicklable return value
        ctx._send(_format_exception(exc))
