"""Run N real worker processes on loopback around a store hosted by the test process.

Use it to test fault-tolerant code the way it fails in production: real processes,
real sockets, real SIGKILL and SIGSTOP. The TCPStore lives in the harness (the
calling process), outside every worker, so any worker, rank 0 included, can die.

    def work(ctx):                       # module-level, picklable
        group = FaultTolerantGroup.from_env()
        ...
        ctx.checkpoint(f"step:{i}")      # a named fault point

    with MultiProcessHarness(world_size=4, faults=[Fault(rank=2, at="step:5")]) as h:
        result = h.run(work, timeout=timedelta(seconds=30))
    assert result[2].outcome == "killed"
    assert all(r.outcome == "returned" for r in result.survivors())

Guarantees: every wait is bounded (``timeout`` of :meth:`join`; overrunning workers are
reported ``"timed_out"`` with their Python stacks, then killed); leaving the ``with``
block (normally, on an exception, or on a pytest timeout) SIGKILLs every worker's
whole process group and reaps it; workers also die with the harness process
(parent-death signal). Worker functions and their arguments must be picklable
(module-level functions); workers start through a forkserver that has torch
imported, so a start costs tens of milliseconds rather than a torch import.

Do not assume timing precision below a few milliseconds: a fault point is exact in
program order, but other workers keep running until the signal lands.
"""

from __future__ import annotations

import multiprocessing
import os
import pickle
import signal
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from multiprocessing.connection import Connection, wait
from typing import Any, Literal

from torchnext.distributed.launch.agent import host_store
from torchnext.errors import WorkerFailedError
from torchnext.testing._worker import WorkerSpec, worker_main
from torchnext.testing.faults import Fault

__all__ = ["MultiProcessHarness", "RankResult", "HarnessResult", "Outcome", "run_workers"]

Outcome = Literal["returned", "raised", "killed", "stopped", "exited", "timed_out"]

_EXIT_GRACE_S = 5.0
_STACK_DUMP_WAIT_S = 0.3


@dataclass
class RankResult:
    """How one worker ended.

    ``outcome`` is one of: ``"returned"`` (``value`` holds the return value),
    ``"raised"`` (``error_type``, ``message``, ``traceback``; ``error`` is the exception
    object when it could be pickled), ``"killed"`` (ended by SIGKILL), ``"stopped"``
    (SIGSTOPped by a fault and never resumed), ``"exited"`` (ended without a result:
    ``exitcode``; after a crash such as SIGSEGV, ``traceback`` holds the Python stacks
    at the crash), ``"timed_out"`` (still running at the deadline; ``traceback`` holds
    its threads' stacks when they could be dumped).
    """

    rank: int
    outcome: Outcome = "timed_out"
    value: Any = None
    error: BaseException | None = None
    error_type: str = ""
    message: str = ""
    traceback: str = ""
    exitcode: int | None = None
    faults_fired: list[tuple[str, str, float]] = field(default_factory=list)
    """(point, kind, ``time.monotonic()``) of each fault that fired in this worker."""
    events: list[tuple[str, dict[str, Any], float]] = field(default_factory=list)
    """(name, data, ``time.monotonic()``) sent with ``ctx.emit``."""

    def raise_if_failed(self) -> None:
        """Re-raise a worker exception as :class:`WorkerFailedError` with its traceback."""
        if self.outcome == "raised":
            raise WorkerFailedError(
                f"worker {self.rank} raised {self.error_type}: {self.message}\n"
                f"--- remote traceback ---\n{self.traceback}",
                rank=self.rank,
                remote_traceback=self.traceback,
            )
        if self.outcome != "returned":
            raise WorkerFailedError(
                f"worker {self.rank} did not return: outcome={self.outcome}, "
                f"exitcode={self.exitcode}\n{self.traceback}",
                rank=self.rank,
                remote_traceback=self.traceback,
            )


@dataclass
class HarnessResult:
    """The outcome of every worker, indexable by harness rank."""

    ranks: list[RankResult]
    unfired_faults: list[Fault]
    elapsed_s: float

    def __getitem__(self, rank: int) -> RankResult:
        return self.ranks[rank]

    def __iter__(self) -> Iterator[RankResult]:
        return iter(self.ranks)

    def __len__(self) -> int:
        return len(self.ranks)

    def victims(self) -> list[RankResult]:
        """Workers a fault fired in."""
        return [r for r in self.ranks if r.faults_fired]

    def survivors(self) -> list[RankResult]:
        """Workers no fault fired in."""
        return [r for r in self.ranks if not r.faults_fired]

    def values(self) -> list[Any]:
        """Return values of the workers that returned, in rank order."""
        return [r.value for r in self.ranks if r.outcome == "returned"]

    def raise_if_failed(self, ranks: Sequence[int] | None = None) -> None:
        """:class:`WorkerFailedError` for the first of ``ranks`` (default: survivors) that
        did not return."""
        chosen = self.survivors() if ranks is None else [self.ranks[r] for r in ranks]
        for r in chosen:
            r.raise_if_failed()

    def describe(self) -> str:
        """One line per worker; handy in assertion messages."""
        lines = []
        for r in self.ranks:
            extra = r.message or (repr(r.value)[:200] if r.outcome == "returned" else "")
            lines.append(f"  rank {r.rank}: {r.outcome} {r.error_type} {extra}".rstrip())
            if r.outcome in ("raised", "timed_out") and r.traceback:
                lines.append("    " + r.traceback[-3000:].replace("\n", "\n    "))
        return "\n".join(lines)


@dataclass
class _Worker:
    rank: int
    process: Any
    conn: Connection
    result: RankResult
    done: bool = False
    stopped_at: float | None = None
    resume_at: float | None = None
    got_result: bool = False
    result_at: float | None = None
    stack_path: str = ""


class MultiProcessHarness:
    """N worker processes around a TCPStore hosted here; see the module docstring.

    Args:
        world_size: number of initial workers (ranks 0..world_size-1).
        faults: faults to inject (see :class:`~torchnext.testing.Fault`).
        env: extra environment variables set in every worker before ``fn`` runs.
        start_method: ``"forkserver"`` (default; torch pre-imported, fast starts) or
            ``"spawn"``.
        store_timeout: bound on every store operation of workers and the harness.
        threads: ``torch.set_num_threads`` in each worker (0 leaves torch's default).
    """

    def __init__(
        self,
        world_size: int,
        *,
        faults: Sequence[Fault] = (),
        env: dict[str, str] | None = None,
        start_method: Literal["forkserver", "spawn"] = "forkserver",
        store_timeout: timedelta = timedelta(seconds=30),
        threads: int = 1,
    ) -> None:
        if world_size < 1:
            raise ValueError(f"world_size={world_size}; pass at least 1 worker")
        if start_method not in ("forkserver", "spawn"):
            raise ValueError(f"start_method={start_method!r}; use 'forkserver' or 'spawn'")
        self.world_size = world_size
        self.faults = tuple(faults)
        self.env = dict(env or {})
        self.store_timeout = store_timeout
        self.threads = threads
        self._ctx: Any = multiprocessing.get_context(start_method)
        if start_method == "forkserver":
            self._ctx.set_forkserver_preload(["torch", "torch.distributed"])
        self._workers: list[_Worker] = []
        self._tmp = tempfile.TemporaryDirectory(prefix="torchnext-harness-")
        self._started_at = time.monotonic()
        self._closed = False
        self.store = host_store("127.0.0.1", 0, store_timeout)
        """The harness's TCPStore (master), hosted in this process."""

    # ------------------------------------------------------------------ properties

    @property
    def store_addr(self) -> str:
        """``host:port`` of the store."""
        return f"127.0.0.1:{self.store.port}"

    @property
    def pids(self) -> list[int]:
        return [w.process.pid for w in self._workers]

    # ------------------------------------------------------------------ lifecycle

    def __enter__(self) -> MultiProcessHarness:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def start(self, fn: Callable[..., Any], *args: Any) -> None:
        """Start the initial ``world_size`` workers running ``fn(ctx, *args)``."""
        if self._workers:
            raise RuntimeError(
                "MultiProcessHarness.start was already called; use spawn() for more workers"
            )
        for _ in range(self.world_size):
            self.spawn(fn, *args)

    def spawn(self, fn: Callable[..., Any], *args: Any) -> int:
        """Start one more worker (e.g. a replacement) now; returns its harness rank."""
        if self._closed:
            raise RuntimeError("MultiProcessHarness is closed; create a new one")
        rank = len(self._workers)
        stack_path = os.path.join(self._tmp.name, f"stacks-{rank}.txt")
        spec = WorkerSpec(
            rank=rank,
            world_size=self.world_size,
            store_host="127.0.0.1",
            store_port=self.store.port,
            store_timeout=self.store_timeout,
            faults=tuple(f for f in self.faults if f.rank == rank),
            env=self.env,
            stack_dump_path=stack_path,
            threads=self.threads,
        )
        reader, writer = self._ctx.Pipe(duplex=False)
        process = self._ctx.Process(
            target=worker_main, args=(spec, writer, fn, args), name=f"torchnext-worker-{rank}"
        )
        process.start()
        writer.close()  # the child holds the only write end: EOF means it is gone
        self._workers.append(
            _Worker(rank, process, reader, RankResult(rank=rank), stack_path=stack_path)
        )
        return rank

    def kill(self, rank: int, sig: signal.Signals = signal.SIGKILL) -> None:
        """Signal worker ``rank``'s whole process group now (from the harness)."""
        worker = self._workers[rank]
        try:
            os.killpg(worker.process.pid, sig)
        except ProcessLookupError:
            return
        now = time.monotonic()
        kind = "kill" if sig == signal.SIGKILL else "stop" if sig == signal.SIGSTOP else sig.name
        worker.result.faults_fired.append(("harness", kind, now))
        if sig == signal.SIGSTOP:
            worker.stopped_at = now
        elif sig == signal.SIGCONT:
            worker.stopped_at = None

    def run(
        self, fn: Callable[..., Any], *args: Any, timeout: timedelta = timedelta(seconds=60)
    ) -> HarnessResult:
        """:meth:`start` then :meth:`join`."""
        self.start(fn, *args)
        return self.join(timeout)

    def join(self, timeout: timedelta = timedelta(seconds=60)) -> HarnessResult:
        """Wait (at most ``timeout``) until every worker returned, raised, died or stopped."""
        deadline = time.monotonic() + timeout.total_seconds()
        while True:
            self._resume_due()
            pending = [w for w in self._workers if not self._final(w)]
            if not pending:
                break
            now = time.monotonic()
            if now >= deadline:
                self._time_out(pending)
                break
            wake = [deadline] + [w.resume_at for w in self._workers if w.resume_at is not None]
            wait_s = max(0.0, min(min(wake) - now, 0.5))
            handles: list[Any] = []
            for w in pending:
                if not w.conn.closed:
                    handles.append(w.conn)
                handles.append(w.process.sentinel)
            for ready in wait(handles, timeout=wait_s):
                for w in pending:
                    if ready is w.conn:
                        self._drain(w)
                    elif ready == w.process.sentinel:
                        self._drain(w)
                        self._ended(w)
            self._reap_exited_after_result()
        for w in self._workers:
            if not w.done and w.stopped_at is not None and not w.got_result:
                w.result.outcome = "stopped"
        return HarnessResult(
            ranks=[w.result for w in self._workers],
            unfired_faults=self._unfired(),
            elapsed_s=time.monotonic() - self._started_at,
        )

    def close(self) -> None:
        """SIGKILL every worker's process group and reap it (bounded); idempotent."""
        if self._closed:
            return
        self._closed = True
        for w in self._workers:
            if w.process.exitcode is None:
                _kill_tree(w.process.pid)
        for w in self._workers:
            w.process.join(timeout=_EXIT_GRACE_S)
            if not w.conn.closed:
                w.conn.close()
        self._tmp.cleanup()

    # ------------------------------------------------------------------ internals

    def _final(self, w: _Worker) -> bool:
        if w.done:
            return True
        return w.stopped_at is not None and w.resume_at is None

    def _drain(self, w: _Worker) -> None:
        while not w.conn.closed:
            try:
                if not w.conn.poll():
                    return
                message = w.conn.recv()
            except (EOFError, OSError):
                w.conn.close()
                return
            self._handle(w, message)

    def _handle(self, w: _Worker, message: tuple[Any, ...]) -> None:
        tag = message[0]
        if tag == "event":
            w.result.events.append((message[1], message[2], message[3]))
        elif tag == "fault":
            _, point, kind, at = message
            w.result.faults_fired.append((point, kind, at))
            if kind == "stop":
                w.stopped_at = at
                fault = next((f for f in self.faults if f.rank == w.rank and f.at == point), None)
                if fault is not None and fault.resume_after is not None:
                    w.resume_at = at + fault.resume_after.total_seconds()
        elif tag == "result":
            w.result.outcome = "returned"
            w.result.value = message[1]
            w.got_result = True
        elif tag == "error":
            _, type_name, text, tb, payload = message
            w.result.outcome = "raised"
            w.result.error_type = type_name
            w.result.message = text
            w.result.traceback = tb
            if payload is not None:
                try:
                    w.result.error = pickle.loads(payload)
                except Exception:  # noqa: BLE001 - keep the text if the type is not importable here
                    w.result.error = None
            w.got_result = True

    def _ended(self, w: _Worker) -> None:
        w.process.join(timeout=_EXIT_GRACE_S)
        code = w.process.exitcode
        w.result.exitcode = code
        if not w.got_result:
            w.result.outcome = "killed" if code == -signal.SIGKILL else "exited"
            if w.result.outcome == "exited":
                w.result.traceback = _read(w.stack_path)
        w.stopped_at = None
        w.resume_at = None
        w.done = True

    def _reap_exited_after_result(self) -> None:
        # A worker that delivered its result but does not exit (a hung non-daemon thread)
        # is given a grace period, then killed: its result stands.
        now = time.monotonic()
        for w in self._workers:
            if w.done or not w.got_result or w.process.exitcode is not None:
                continue
            if w.result_at is None:
                w.result_at = now
            elif now - w.result_at > _EXIT_GRACE_S:
                _kill_tree(w.process.pid)

    def _resume_due(self) -> None:
        now = time.monotonic()
        for w in self._workers:
            if w.resume_at is not None and now >= w.resume_at and w.process.exitcode is None:
                try:
                    os.killpg(w.process.pid, signal.SIGCONT)
                except ProcessLookupError:
                    pass
                w.stopped_at = None
                w.resume_at = None

    def _time_out(self, pending: list[_Worker]) -> None:
        running = [w for w in pending if w.stopped_at is None]
        for w in running:
            try:
                os.kill(w.process.pid, signal.SIGUSR1)
            except ProcessLookupError:
                pass
        if running:
            time.sleep(_STACK_DUMP_WAIT_S)
        for w in pending:
            self._drain(w)
            if w.done:
                continue
            if w.stopped_at is not None:
                w.result.outcome = "stopped"
            elif not w.got_result:
                w.result.outcome = "timed_out"
                w.result.traceback = _read(w.stack_path)
            w.done = True

    def _unfired(self) -> list[Fault]:
        fired = {(w.rank, p) for w in self._workers for (p, _, _) in w.result.faults_fired}
        return [f for f in self.faults if (f.rank, f.at) not in fired]


def _read(path: str) -> str:
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return ""


def _kill_tree(pid: int) -> None:
    """SIGKILL the worker and its process group (the worker may not have made it yet)."""
    for kill in (os.killpg, os.kill):
        try:
            kill(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


def run_workers(
    fn: Callable[..., Any],
    *args: Any,
    world_size: int,
    faults: Sequence[Fault] = (),
    timeout: timedelta = timedelta(seconds=60),
    env: dict[str, str] | None = None,
) -> HarnessResult:
    """One-shot: start ``world_size`` workers running ``fn(ctx, *args)``, wait, clean up."""
    with MultiProcessHarness(world_size, faults=faults, env=env) as harness:
        return harness.run(fn, *args, timeout=timeout)
