"""The agent behind ``torchnext run``: hosts the store, starts workers, replaces dead ones.

Use :class:`Agent` (or the ``torchnext run`` command) to run a fault-tolerant training
script on one machine, or as one agent per machine of a multi-node job. The agent:

* hosts the rendezvous ``TCPStore`` itself (outside the workers, so any worker, rank 0
  included, can die), bound to loopback unless told otherwise; or connects to the
  store of another node's agent (``store_addr``);
* starts ``nproc`` workers with ``TORCHNEXT_STORE_ADDR``, ``TORCHNEXT_MEMBER_ID`` and
  ``TORCHNEXT_WORLD_SIZE`` set, which is all ``FaultTolerantGroup.from_env()`` and the
  training :class:`~torchnext.distributed.manager.Manager` need;
* reports every exit, and classifies it: finished (code 0); crashed (killed by a
  signal) or evicted (code :data:`EXIT_EVICTED`, a worker that hung and was fenced
  out) - both replaced, up to ``max_restarts`` in all, by a new process with a new
  member id and ``TORCHNEXT_JOIN=1`` that joins the running group and heals from a
  live peer; raised (an uncaught exception: a bug) - reported with its traceback and
  never restarted; if an initial worker raised, the job is stopped (the bug would
  recur everywhere), if a replacement raised, the job goes on without it;
* kills (SIGKILL) a worker the survivors evicted while it was hung (e.g. SIGSTOPped),
  so that it can be replaced;
* with ``spares`` (``--spares S``), keeps S warm spares waiting in ``Manager.from_env``
  and hands a dead worker's replacement id to one of them instead of starting a cold
  process (:mod:`torchnext.distributed.launch.spares`).

On a multi-node job the agents leave the store in order (see
:mod:`torchnext.distributed.launch.store`): each non-hosting agent says goodbye once
its workers are done, and the hosting agent keeps the store up, when it closes, until
every other agent did, or fell silent for ``detach_timeout``.

What not to assume: the agent is a single point of failure for its node's workers
and, on the node that hosts it, for the store (as torchft's lighthouse is). It never
leaves a process behind: :meth:`Agent.shutdown` terminates, then kills, every worker.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from datetime import timedelta
from pathlib import Path
from typing import IO, Any

from torchnext.distributed.flight_recorder.exits import write_exit_record
from torchnext.distributed.launch.config import AgentConfig, AgentEvent, EventKind
from torchnext.distributed.launch.exits import (
    EXIT_EVICTED,
    WorkerExit,
    classify_exit,
    exit_message,
    job_exit_code,
)
from torchnext.distributed.launch.job_events import JobEventReader
from torchnext.distributed.launch.keys import EVICTED_KEY_PREFIX, FINISHED_KEY
from torchnext.distributed.launch.process import (
    WorkerProcess,
    collect_traceback,
    signal_process,
    start_worker,
)
from torchnext.distributed.launch.spares import SparePool
from torchnext.distributed.launch.store import (
    announce_alive,
    await_goodbyes,
    connect_store,
    host_store,
    say_goodbye,
)

__all__ = [
    "EXIT_EVICTED",
    "EVICTED_KEY_PREFIX",
    "FINISHED_KEY",
    "AgentConfig",
    "AgentEvent",
    "WorkerExit",
    "Agent",
    "host_store",
    "connect_store",
]


class Agent:
    """Supervises this node's workers of one fault-tolerant job (see the module docstring)."""

    def __init__(
        self,
        command: Sequence[str],
        config: AgentConfig,
        *,
        on_event: Callable[[AgentEvent], None] | None = None,
    ) -> None:
        if not command:
            raise ValueError("Agent: command is empty; pass the worker's argv (script and args).")
        self.command = list(command)
        self.config = config
        self.on_event = on_event or _print_event
        self.store: Any = None
        self.store_addr = ""
        self.workers: dict[int, WorkerProcess] = {}
        self.exits: list[WorkerExit] = []
        self.restarts = 0
        self.spare_pool: SparePool | None = None
        """The warm spares (``AgentConfig.spares``); their exits are in ``spare_pool.exits``."""
        self._t0 = time.monotonic()
        self._tmp = tempfile.TemporaryDirectory(prefix="torchnext-agent-")
        self._stopping = False
        self._first_finish: float | None = None
        self._replacement_counter = 0
        self._hosting = False
        self._store_lost = False
        self._detached = False
        self._next_alive = 0.0
        self._shown_tracebacks: dict[str, str] = {}
        """Traceback text -> the member whose exit showed it (each is printed once)."""
        self._job_events: JobEventReader | None = None
        self._events_out: IO[str] | None = None
        if config.events_file:
            self._events_out = open(config.events_file, "a", encoding="utf-8")  # noqa: SIM115

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> None:
        """Host or connect to the store, then start every worker."""
        cfg = self.config
        if cfg.store_addr and cfg.node_rank == 0 and not cfg.store_hosted_elsewhere:
            # Multi-node, every node with the same command line: node 0 hosts the store
            # at the shared endpoint's port, bound to store_host.
            port = int(cfg.store_addr.rpartition(":")[2])
            self.store = host_store(cfg.store_host, port, cfg.store_timeout)
            self.store_addr = cfg.store_addr
            self._hosting = True
            self._emit(
                "store", f"store listening on {cfg.store_host}:{port} (shared as {cfg.store_addr})"
            )
        elif cfg.store_addr:
            self.store = connect_store(cfg.store_addr, cfg.store_timeout)
            self.store_addr = cfg.store_addr
            self._announce_alive()
        else:
            self.store = host_store(cfg.store_host, cfg.store_port, cfg.store_timeout)
            self._hosting = True
            port = int(self.store.port)  # type: ignore[attr-defined]
            self.store_addr = f"{cfg.store_host}:{port}"
            self._emit("store", f"store listening on {self.store_addr}")
        self._job_events = JobEventReader(self.store)
        for slot in range(cfg.nproc):
            self._spawn(slot, f"n{cfg.node_rank}w{slot}", replacement=False)
        if cfg.spares:
            self.spare_pool = SparePool(
                cfg.spares,
                node_rank=cfg.node_rank,
                store=self.store,
                start=lambda name: self._start_process(
                    name, slot=-1, replacement=False, spare=True
                ),
                emit=self._emit,
                shown=self._shown_tracebacks,
            )
            self.spare_pool.fill()

    def _spawn(self, slot: int, member_id: str, *, replacement: bool) -> None:
        self.workers[slot] = self._start_process(member_id, slot=slot, replacement=replacement)
        what = "replacement" if replacement else "worker"
        pid = self.workers[slot].proc.pid
        self._emit("started", f"started {what} {member_id} (pid {pid})", member_id)

    def _start_process(
        self, name: str, *, slot: int, replacement: bool, spare: bool = False
    ) -> WorkerProcess:
        cfg = self.config
        return start_worker(
            self.command,
            name=name,
            store_addr=self.store_addr,
            world_size=cfg.world_size or cfg.nproc,
            error_file=Path(self._tmp.name) / f"{name}.error",
            extra_env=cfg.extra_env,
            log_dir=cfg.log_dir,
            slot=slot,
            join=replacement,
            spare=spare,
        )

    def _emit(
        self, kind: EventKind, message: str, member_id: str = "", exit: WorkerExit | None = None
    ) -> None:
        event = AgentEvent(
            kind=kind,
            message=message,
            time_s=time.monotonic() - self._t0,
            member_id=member_id,
            exit=exit,
        )
        if kind != "job":
            self._write_record(
                {"source": "agent", "kind": kind, "message": message, "member_id": member_id}
            )
        self.on_event(event)

    def _write_record(self, record: dict[str, Any]) -> None:
        if self._events_out is not None:
            record = {"time_s": round(time.monotonic() - self._t0, 4), **record}
            self._events_out.write(json.dumps(record, default=str) + "\n")
            self._events_out.flush()

    def _read_job_events(self) -> None:
        if self._job_events is None or self._store_lost:
            return
        for record, line in self._job_events.poll():
            self._write_record({"source": "worker", **record})
            if record.get("kind") == "healed" and self.spare_pool is not None:
                self.spare_pool.healed()  # the recovery is over: start the next spare
            if line is not None:
                self._emit("job", line, str(record.get("member_id", "")))

    # ------------------------------------------------------------------ supervision

    def poll(self) -> bool:
        """Handle exits and evictions once; returns False when no worker is left."""
        self._announce_alive()
        self._read_job_events()
        for slot, worker in list(self.workers.items()):
            if self.workers.get(slot) is not worker:
                # An exit handled earlier in this pass stopped the job, and shutdown()
                # has reaped and reported this worker already.
                continue
            code = worker.proc.poll()
            if code is None:
                self._check_evicted(worker)
                continue
            self._reap(worker, code)
        self._poll_spares()
        if self._first_finish is not None and self.workers:
            if time.monotonic() - self._first_finish > self.config.finish_grace.total_seconds():
                names = ", ".join(w.member_id for w in self.workers.values())
                self._emit(
                    "stopping", f"training finished; stopping workers still running: {names}"
                )
                self.shutdown()
        return bool(self.workers)

    def _poll_spares(self) -> None:
        pool = self.spare_pool
        if pool is None or self._stopping or self._store_lost:
            return
        try:
            pool.poll(job_over=self._first_finish is not None or self._job_finished())
        except Exception as exc:  # noqa: BLE001 - a store failure must not kill the agent
            self._lost_store(exc)

    def _announce_alive(self) -> None:
        """A non-hosting agent of a multi-node job shows the hosting one it still runs."""
        cfg = self.config
        if self._hosting or self.store is None or self._store_lost or cfg.node_count < 2:
            return
        now = time.monotonic()
        if now < self._next_alive:
            return
        # Several beats per detach_timeout, so a busy poll loop is never taken for silence.
        self._next_alive = now + min(1.0, cfg.detach_timeout.total_seconds() / 4)
        try:
            announce_alive(self.store, cfg.node_rank)
        except Exception as exc:  # noqa: BLE001 - a store failure must not kill the agent
            self._lost_store(exc)

    def _lost_store(self, exc: BaseException) -> None:
        # Every later call on a store client whose server is gone fails again and makes
        # torch print a C++ stack trace, so the agent stops using the store at once.
        if self._hosting:
            return  # our own server is up; a failed call is a hiccup, not a loss
        self._store_lost = True
        reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        self._emit(
            "store",
            f"lost the store at {self.store_addr} ({reason}); no more eviction or finish "
            "checks on this node",
        )

    def _check_evicted(self, worker: WorkerProcess) -> None:
        if self.store is None or self._store_lost:
            return
        key = EVICTED_KEY_PREFIX + worker.member_id
        try:
            evicted = self.store.check([key])  # type: ignore[attr-defined]
        except Exception as exc:  # noqa: BLE001 - a store hiccup must not kill the agent
            self._lost_store(exc)
            return
        if evicted:
            self._emit(
                "evicting",
                f"{worker.member_id} was evicted by the group; killing it",
                worker.member_id,
            )
            signal_process(worker.proc, signal.SIGKILL)
            try:
                self.store.delete_key(key)  # type: ignore[attr-defined]
            except Exception:  # noqa: BLE001
                pass

    def _reap(self, worker: WorkerProcess, code: int) -> None:
        """Forget an exited worker and report its exit (exactly once per worker)."""
        del self.workers[worker.slot]
        self._handle_exit(worker, code, collect_traceback(worker))

    def _handle_exit(self, worker: WorkerProcess, code: int, tb: str) -> None:
        runtime = time.monotonic() - worker.started
        kind = classify_exit(code, raised=bool(tb), stopping=self._stopping)
        info = WorkerExit(
            member_id=worker.member_id,
            slot=worker.slot,
            pid=worker.proc.pid,
            returncode=code,
            kind=kind,
            traceback=tb,
            runtime_s=runtime,
        )
        self.exits.append(info)
        if kind in ("crashed", "failed"):
            # The flight recorder's analyzer reports a dead rank as crashed, not as a
            # hang to wait for, from this record (when the worker's recorder ran).
            write_exit_record(worker.error_file, pid=info.pid, returncode=code)
        message = exit_message(info, self._shown_tracebacks)
        self._emit("exited", message, worker.member_id, info)
        if self._stopping:
            return
        if kind == "finished":
            if self._first_finish is None:
                self._first_finish = time.monotonic()
            return
        if kind == "raised":
            if worker.replacement:
                # A replacement that raises (e.g. refused: its model differs) must not
                # take the healthy job down; it is simply not restarted.
                self._emit(
                    "gave_up",
                    f"not replacing {worker.member_id} again: it raised (a bug); the job goes on",
                    worker.member_id,
                )
                return
            self._emit(
                "stopping",
                f"stopping the job: {worker.member_id} raised; a restart would raise again",
            )
            self.shutdown()
            return
        if (
            kind in ("crashed", "evicted")
            and self._first_finish is None
            and not self._job_finished()
        ):
            if self.restarts < self.config.max_restarts:
                self.restarts += 1
                self._replacement_counter += 1
                base = worker.member_id.split(".r")[0]
                new_id = f"{base}.r{self._replacement_counter}"
                restart = f"(restart {self.restarts}/{self.config.max_restarts})"
                if self._promote_spare(worker, new_id, restart):
                    return
                self._emit(
                    "replacing",
                    f"starting replacement {new_id} for {worker.member_id} {restart}",
                    new_id,
                )
                self._spawn(worker.slot, new_id, replacement=True)
            else:
                self._emit(
                    "gave_up",
                    f"not replacing {worker.member_id}: --max-restarts={self.config.max_restarts} used up; "
                    "the survivors continue without it",
                    worker.member_id,
                )

    def _promote_spare(self, dead: WorkerProcess, new_id: str, restart: str) -> bool:
        """Hand ``new_id`` to a warm spare in ``dead``'s slot; False: none at hand."""
        pool = self.spare_pool
        if pool is None or self._store_lost:
            return False
        try:
            spare = pool.promote(new_id)
        except Exception as exc:  # noqa: BLE001 - a store failure: start a cold one
            self._lost_store(exc)
            return False
        if spare is None:
            return False
        state = "" if pool.is_ready(spare) else " (still starting)"
        self.workers[dead.slot] = replace(spare, slot=dead.slot, member_id=new_id, replacement=True)
        self._emit(
            "replacing",
            f"replacing {dead.member_id} with warm spare {spare.member_id}{state} as {new_id} "
            f"{restart}",
            new_id,
        )
        return True

    def _job_finished(self) -> bool:
        if self.store is None or self._store_lost:
            return False
        try:
            return bool(self.store.check([FINISHED_KEY]))
        except Exception as exc:  # noqa: BLE001
            self._lost_store(exc)
            return False

    def run(self, poll_interval: timedelta = timedelta(milliseconds=100)) -> int:
        """Start (if needed) and supervise until every worker exited; returns the exit code.

        0 when the job finished (at least one worker finished and none raised), 1 otherwise.
        """
        if not self.workers and not self.exits:
            self.start()
        try:
            while self.poll():
                time.sleep(poll_interval.total_seconds())
        finally:
            self._read_job_events()  # what the last workers said before they exited
            self.shutdown()
        return self.exit_code()

    def exit_code(self) -> int:
        return job_exit_code(self.exits)

    def signal_worker(self, slot: int, sig: signal.Signals) -> int:
        """Send ``sig`` to the worker in ``slot`` (fault injection); returns its pid."""
        worker = self.workers.get(slot)
        if worker is None:
            raise ValueError(
                f"Agent.signal_worker: slot={slot} has no running worker; running: {sorted(self.workers)}"
            )
        os.kill(worker.proc.pid, sig)
        return worker.proc.pid

    def shutdown(self) -> None:
        """Stop every worker (SIGTERM, then SIGKILL after ``term_grace``); idempotent."""
        self._stopping = True
        if self.spare_pool is not None:
            self.spare_pool.release()  # waiting spares leave by themselves meanwhile
        live = [w for w in self.workers.values() if w.proc.poll() is None]
        for w in live:
            signal_process(w.proc, signal.SIGCONT)
            signal_process(w.proc, signal.SIGTERM)
        deadline = time.monotonic() + self.config.term_grace.total_seconds()
        for w in live:
            try:
                w.proc.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                signal_process(w.proc, signal.SIGKILL)
                w.proc.wait(5)
        for w in list(self.workers.values()):
            if w.proc.poll() is not None:
                self._reap(w, int(w.proc.returncode))
        if self.spare_pool is not None:
            self.spare_pool.stop(self.config.term_grace)

    def detach(self) -> None:
        """Leave the job's store in order, then drop it; idempotent (``close`` calls it).

        On a multi-node job a non-hosting agent says goodbye; the hosting agent waits
        until every other agent said goodbye, or showed no sign of life for
        ``detach_timeout``, and only then closes the store. Call after ``shutdown``.
        """
        if self._detached:
            return
        self._detached = True
        store, self.store = self.store, None
        cfg = self.config
        if store is None or self._store_lost or cfg.node_count < 2:
            return
        if self._hosting:
            others = [r for r in range(cfg.node_count) if r != cfg.node_rank]
            self._emit(
                "detach",
                f"keeping the store until the agents of nodes {others} have left "
                f"(or been silent for {cfg.detach_timeout})",
            )
            silent = await_goodbyes(store, others, silence=cfg.detach_timeout)
            if silent:
                self._emit(
                    "detach",
                    f"closing the store without a goodbye from nodes {silent}: "
                    f"no sign of life for {cfg.detach_timeout}",
                )
        else:
            try:
                say_goodbye(store, cfg.node_rank)
            except Exception as exc:  # noqa: BLE001 - the host may be gone already
                self._lost_store(exc)
        # Dropping the last reference here disconnects the client, or closes the server.

    def close(self) -> None:
        """Stop every worker, leave the store (see :meth:`detach`), remove temporary files."""
        self.shutdown()
        self.detach()
        self._tmp.cleanup()
        if self._events_out is not None:
            self._events_out.close()
            self._events_out = None

    def __enter__(self) -> Agent:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _print_event(event: AgentEvent) -> None:
    print(f"torchnext run [{event.time_s:7.2f}s] {event.message}", file=sys.stderr, flush=True)
