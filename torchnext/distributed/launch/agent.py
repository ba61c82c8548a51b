"""The agent behind ``torchnext run``: hosts the store, starts workers, replaces dead ones.

Use :class:`Agent` (or the ``torchnext run`` command) to run a fault-tolerant training
script on one machine, or as one agent per machine of a multi-node job. The agent:

* hosts the rendezvous ``TCPStore`` itself (outside the workers, so any worker, rank 0
  included, can die), bound to loopback unless told otherwise; or connects to the
  store of another node's agent (``store_addr``);
* starts ``nproc`` workers with ``TORCHNEXT_STORE_ADDR``, ``TORCHNEXT_MEMBER_ID`` and
  ``TORCHNEXT_WORLD_SIZE`` set, which is all ``FaultTolerantGroup.from_env()`` and the
  training :class:`~torchnext.distributed.manager.Manager` need;
* reports and classifies every exit: finished (code 0); crashed (a signal) or evicted
  (:data:`EXIT_EVICTED`: it hung or was cut off, and was fenced out) - both replaced, up
  to ``max_restarts`` in all, by a new process (new member id, ``TORCHNEXT_JOIN=1``)
  that joins the running group and heals from a live peer; raised (an uncaught
  exception: a bug) - shown with its traceback, never restarted; the job stops if an
  initial worker raised (it would recur everywhere), not if a replacement did;
* lets a worker the survivors evicted exit by itself (``EXIT_EVICTED``: it learns of
  its eviction from its group), and kills (SIGKILL) one that cannot within
  ``evict_grace`` or is stopped (SIGSTOP), so that it can be replaced
  (:mod:`~torchnext.distributed.launch.evictions`);
* checks, when it starts, that no other agent of the job holds its node rank and that
  every agent runs the same job shape (:mod:`~torchnext.distributed.launch.claims`);
* keeps supervising when the store does not answer: its own store calls are bounded,
  an outage pauses its checks until the store answers again (a host cut off and
  reconnected resumes), and an outage longer than the store timeout is reported as a
  lost store, with the fix (:mod:`~torchnext.distributed.launch.store_link`). Workers
  whose store was lost exit with ``EXIT_STORE_LOST``; they are replaced once the store
  answers again, and an agent left without workers stops after twice the store timeout;
* with ``--group-size G`` (HSDP) kills a dead process's replica group (G consecutive
  slots) at once and restarts it whole (:mod:`~torchnext.distributed.launch.replica_slots`);
* with ``spares`` (``--spares S``), keeps S warm spares waiting in ``Manager.from_env``
  and hands a dead worker's replacement id to one of them instead of starting a cold
  process (:mod:`torchnext.distributed.launch.spares`).

On a multi-node job the agents leave the store in order (:mod:`.store`): each
non-hosting agent says goodbye once its workers are done, and the hosting agent keeps
the store up until every other agent did, or fell silent for ``detach_timeout``.

What not to assume: the agent is a single point of failure for its node's workers
and, on the node that hosts a TCP store, for the store (as torchft's lighthouse is; an
``etcd://`` store has none). It never leaves a process behind:
:meth:`Agent.shutdown` terminates, then kills, every worker.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import tempfile
import time
from collections.abc import Callable, Sequence
from datetime import timedelta
from pathlib import Path
from typing import IO, Any

from torchnext.distributed.flight_recorder.exits import write_exit_record
from torchnext.distributed.launch.claims import JobShape, claim_node
from torchnext.distributed.launch.config import AgentConfig, AgentEvent, EventKind, print_event
from torchnext.distributed.launch.evictions import EvictionWatch
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
from torchnext.distributed.launch.replica_slots import ReplicaSlots, stop_siblings
from torchnext.distributed.launch.spares import SparePool
from torchnext.distributed.launch.store import (
    AgentSightings,
    announce_alive,
    connect_store,
    host_store,
    leave_store,
)
from torchnext.distributed.launch.store_link import StoreLink, lost_store_message

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
        self.on_event = on_event or print_event
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
        self._finished_elsewhere = False
        self._next_finish_check = 0.0
        self._replacement_counter = 0
        g, node = config.group_size, config.node_rank
        self._groups = (
            ReplicaSlots(group_size=g, node_rank=node, nproc=config.nproc) if g > 1 else None
        )
        self._dropping: set[str] = set()
        """Members the agent killed because their replica group lost a process."""
        self._hosting = False
        self._detached = False
        self._next_alive = 0.0
        self.link: StoreLink | None = None
        """The agent's store and whether it answers (None before :meth:`start`)."""
        self._evictions: EvictionWatch | None = None
        self._sightings: AgentSightings | None = None
        self._next_sighting = self._next_store_read = 0.0
        self._orphans: list[WorkerProcess] = []
        """Workers that exited because the store was lost: replaced once it answers."""
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
            # The agent's own calls are bounded tighter than a connection: one that
            # fails pauses its checks (StoreLink), never its supervision.
            self.store.set_timeout(cfg.store_call_timeout)
            self.store_addr = cfg.store_addr
        else:
            self.store = host_store(cfg.store_host, cfg.store_port, cfg.store_timeout)
            self._hosting = True
            port = int(self.store.port)  # type: ignore[attr-defined]
            self.store_addr = f"{cfg.store_host}:{port}"
            self._emit("store", f"store listening on {self.store_addr}")
        self.link = StoreLink(
            self.store,
            self.store_addr,
            hosted=self._hosting,
            store_timeout=cfg.store_timeout,
            emit=lambda message: self._emit("store", message),
        )
        self._evictions = EvictionWatch(
            self.link,
            grace=cfg.evict_grace,
            emit=lambda message, member: self._emit("evicting", message, member),
        )
        claim_node(
            self.store,
            node_rank=cfg.node_rank,
            shape=JobShape(
                nnodes=cfg.node_count,
                nproc=cfg.nproc,
                world_size=cfg.world_size or cfg.nproc,
            ),
        )
        if self._hosting and cfg.node_count > 1:
            others = [r for r in range(cfg.node_count) if r != cfg.node_rank]
            self._sightings = AgentSightings(others)
        self._announce_alive()
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
            extra_env={**cfg.extra_env, **(self._groups.env(slot) if self._groups else {})},
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

    def _store_up(self) -> bool:
        return self.link is not None and self.link.up and self.store is not None

    def _read_job_events(self) -> None:
        if self._job_events is None or not self._store_up():
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
        if self.link is not None:
            self.link.poll()
        self._announce_alive()
        self._watch_agents()
        # Exits are seen at every poll; the store is read twice a second (load on etcd).
        store_due = time.monotonic() >= self._next_store_read
        if store_due:
            self._next_store_read = time.monotonic() + 0.5
            self._read_job_events()
        for slot, worker in list(self.workers.items()):
            if self.workers.get(slot) is not worker:
                # An exit handled earlier in this pass stopped the job, and shutdown()
                # has reaped and reported this worker already.
                continue
            code = worker.proc.poll()
            if code is None:
                continue
            self._reap(worker, code)
        if store_due and self._evictions is not None and self._store_up():
            self._evictions.check([w for w in self.workers.values() if w.proc.poll() is None])
        self._poll_spares()
        self._note_finish_elsewhere()
        if self._orphans and not self.workers:
            return self._await_store_for_orphans()
        if self._orphans and self._store_up():
            self._replace_orphans()
        if self._first_finish is not None and self.workers:
            if time.monotonic() - self._first_finish > self.config.finish_grace.total_seconds():
                names = ", ".join(w.member_id for w in self.workers.values())
                self._emit(
                    "stopping", f"training finished; stopping workers still running: {names}"
                )
                self.shutdown()
        return bool(self.workers)

    def _note_finish_elsewhere(self) -> None:
        """The job finished on another node: this node's workers (a replacement still
        waiting to be admitted, say) get ``finish_grace`` too, then are stopped."""
        now = time.monotonic()
        if self._first_finish is not None or not self.workers or now < self._next_finish_check:
            return
        self._next_finish_check = now + 0.5
        if self._job_finished():
            self._first_finish = now
            self._finished_elsewhere = True

    def _poll_spares(self) -> None:
        pool = self.spare_pool
        if pool is None or self._stopping or not self._store_up() or self.link is None:
            return
        job_over = self._first_finish is not None or self._job_finished()
        try:
            pool.poll(job_over=job_over)
        except Exception as exc:  # noqa: BLE001 - a store failure must not kill the agent
            self.link.failed(exc)

    def _announce_alive(self) -> None:
        """A non-hosting agent of a multi-node job shows the hosting one it still runs."""
        cfg = self.config
        if self._hosting or not self._store_up() or self.link is None or cfg.node_count < 2:
            return
        now = time.monotonic()
        if now < self._next_alive:
            return
        # Several beats per detach_timeout, so a busy poll loop is never taken for silence.
        self._next_alive = now + min(1.0, cfg.detach_timeout.total_seconds() / 4)
        self.link.call(lambda store: announce_alive(store, cfg.node_rank), None)

    def _watch_agents(self) -> None:
        """The hosting agent notes the other agents' signs of life (for :meth:`detach`)."""
        sightings = self._sightings
        if sightings is None or self.link is None or time.monotonic() < self._next_sighting:
            return
        self._next_sighting = time.monotonic() + 1.0
        self.link.call(sightings.observe, None)

    def _await_store_for_orphans(self) -> bool:
        """No worker runs and some lost the store: replace them once it answers, for a
        while; then stop (the store, and with it the job, is gone from here)."""
        if self._store_up():
            self._replace_orphans()
            return bool(self.workers)
        link = self.link
        limit = 2 * self.config.store_timeout
        if link is None or link.down_for_s() > limit.total_seconds():
            names = ", ".join(w.member_id for w in self._orphans)
            self._orphans.clear()
            self._emit(
                "gave_up",
                f"stopping: no worker left ({names} lost the store) and "
                + lost_store_message(self.store_addr, limit),
            )
            return False
        return True

    def _replace_orphans(self) -> None:
        orphans, self._orphans = self._orphans, []
        if self._first_finish is not None or self._job_finished():
            return
        for worker in orphans:
            if worker.slot not in self.workers:
                self._replace(worker)

    def _reap(self, worker: WorkerProcess, code: int) -> None:
        """Forget an exited worker and report its exit (exactly once per worker)."""
        del self.workers[worker.slot]
        self._handle_exit(worker, code, collect_traceback(worker))

    def _handle_exit(self, worker: WorkerProcess, code: int, tb: str) -> None:
        runtime = time.monotonic() - worker.started
        kind = classify_exit(code, raised=bool(tb), stopping=self._stopping)
        if self._evictions is not None:
            kind = self._evictions.exited(worker, kind)  # a killed evictee was evicted
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
        if self._stopping or worker.member_id in self._dropping:
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
        if kind == "store_lost" and not self._store_up():
            self._orphans.append(worker)
            self._emit(
                "replacing",
                f"{worker.member_id} will be replaced if the store at {self.store_addr} "
                "answers again",
                worker.member_id,
            )
            return
        if (
            kind in ("crashed", "evicted", "store_lost")
            and self._first_finish is None
            and not self._job_finished()
        ):
            self._replace(worker)

    def _replace(self, worker: WorkerProcess) -> None:
        """Start (or promote a spare as) the replacement of ``worker``, restarts allowing;
        with replica groups, kill the rest of its group and restart the group whole."""
        groups = self._groups
        slots = [worker.slot] if groups is None else groups.slots(worker.slot)
        self._dropping.update(self.workers[s].member_id for s in slots if s in self.workers)
        for sibling, code in stop_siblings(self.workers, slots, worker):
            self._handle_exit(sibling, code, collect_traceback(sibling))
        what = worker.member_id if groups is None else f"replica group {groups.name(worker.slot)}"
        if self.restarts >= self.config.max_restarts:
            self._emit(
                "gave_up",
                f"not replacing {what}: --max-restarts={self.config.max_restarts} "
                "used up; the survivors continue without it",
                worker.member_id,
            )
            return
        self.restarts += 1
        self._replacement_counter += 1
        base = worker.member_id.split(".r")[0]
        new_id = f"{base}.r{self._replacement_counter}"
        restart = f"(restart {self.restarts}/{self.config.max_restarts})"
        if groups is not None:
            self._emit("replacing", f"restarting {what} as {groups.restart(worker.slot)} {restart}")
            for slot in slots:
                self._spawn(
                    slot,
                    f"n{self.config.node_rank}w{slot}.r{self._replacement_counter}",
                    replacement=True,
                )
            return
        if self._promote_spare(worker, new_id, restart):
            return
        self._emit(
            "replacing", f"starting replacement {new_id} for {worker.member_id} {restart}", new_id
        )
        self._spawn(worker.slot, new_id, replacement=True)

    def _promote_spare(self, dead: WorkerProcess, new_id: str, restart: str) -> bool:
        """Hand ``new_id`` to a warm spare in ``dead``'s slot; False: none at hand."""
        pool = self.spare_pool
        if pool is None or not self._store_up() or self.link is None:
            return False
        try:
            spare = pool.take_over(dead, new_id, restart)
        except Exception as exc:  # noqa: BLE001 - a store failure: start a cold one
            self.link.failed(exc)
            return False
        if spare is not None:
            self.workers[dead.slot] = spare
        return spare is not None

    def _job_finished(self) -> bool:
        if not self._store_up() or self.link is None:
            return False
        return self.link.call(lambda store: bool(store.check([FINISHED_KEY])), False)

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
        return job_exit_code(self.exits, job_finished=self._finished_elsewhere)

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
        link = self.link
        if link is not None:
            link.close()
        if store is None or link is None or not link.up or cfg.node_count < 2:
            return
        leave_store(
            store,
            hosting=self._hosting,
            node_rank=cfg.node_rank,
            node_count=cfg.node_count,
            silence=cfg.detach_timeout,
            seen=self._sightings,
            emit=lambda message: self._emit("detach", message),
            call=lambda fn: link.call(fn, None),
        )
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
