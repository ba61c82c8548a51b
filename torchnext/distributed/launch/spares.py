"""Warm spares: processes started ahead of need that replace a dead worker within a second.

``torchnext run --spares S`` keeps S extra processes of the training script running on
each node, started with ``TORCHNEXT_SPARE=<name>`` (``n0s0``, ``n0s1``, ...) and no member
id. A spare runs the script like any worker (imports torch, loads data, builds the model
and the optimizer) up to ``Manager.from_env``, where :func:`await_assignment` blocks
until its agent gives it an identity through the job's store (keys under
:data:`~torchnext.distributed.launch.keys.SPARE_KEY_PREFIX`). When a worker dies and
restarts remain, the agent's :class:`SparePool` hands its member id (``n0w1.r1``) to a
waiting spare (or, if none waits yet, to the one furthest along in its start) instead
of starting a cold process; the spare then joins the group and heals from a live peer
exactly like a cold replacement, without the seconds a process start costs. A new spare
is started once the replacement healed (or ``refill_delay`` later), so its start does
not compete with the recovery. With no spare at hand the agent starts a cold
replacement, as without ``--spares``.

Use it when replacing a worker quickly matters more than the memory and start-up work
of S idle processes per node (each holds a model and an optimizer), with a script built
on ``Manager.from_env`` (``FaultTolerantDDP`` included; ``FaultTolerantGroup.from_env``
in a spare raises :class:`~torchnext.errors.LaunchEnvironmentError`). Taking a dead
worker's place is a restart (``--max-restarts``), as a cold replacement is. A spare's
own exit is not a fault of the job: at the end every spare is told to leave and exits
with code 0; a spare that dies while it waits is reported and started again (one that
raised is not: the pool stops and replacements start cold).

What not to assume: every line of the script before ``Manager.from_env`` also runs in
each spare, possibly minutes before the spare is used. Code there must not have side
effects that only a member may have (writing files, logging a run to a tracker, talking
to a service): move it after ``from_env``, or skip it when :func:`is_spare` is true. A
spare's output goes to its own log (``DIR/n0s0.log``), also after it became ``n0w1.r1``.
A spare waits as long as its agent lives: it leaves when the agent says so, when the
job finished, or when the agent is gone or silent for ``silence``.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import replace
from datetime import timedelta
from typing import Any, NoReturn

from torchnext._env import TORCHNEXT_MEMBER_ID, TORCHNEXT_SPARE, TORCHNEXT_STORE_ADDR
from torchnext.distributed.launch.config import EventKind
from torchnext.distributed.launch.exits import WorkerExit, classify_exit, exit_message
from torchnext.distributed.launch.keys import FINISHED_KEY, SPARE_KEY_PREFIX
from torchnext.distributed.launch.process import WorkerProcess, collect_traceback, signal_process
from torchnext.distributed.launch.store import connect_store

__all__ = ["SparePool", "await_assignment", "is_spare"]

MAX_DEATHS_IN_A_ROW = 3
"""Spares that may die one after the other, none getting ready, before the pool stops."""


def _key(name: str, what: str) -> str:
    return f"{SPARE_KEY_PREFIX}{name}/{what}"


# --------------------------------------------------------------------------- the spare


def is_spare() -> bool:
    """Whether this process is a warm spare still waiting for a member id.

    True in a process ``torchnext run --spares`` started as a spare, until
    ``Manager.from_env`` returns in it (it is then a replacement member). Code before
    ``from_env`` with side effects a spare must not have (writing files, network) checks
    it: ``if not is_spare(): wandb.init(...)``.
    """
    return bool(TORCHNEXT_SPARE.get())


def await_assignment(
    *,
    store_timeout: timedelta = timedelta(seconds=30),
    poll_interval: timedelta = timedelta(milliseconds=20),
    silence: timedelta = timedelta(seconds=60),
) -> tuple[Any, str] | None:
    """In a warm spare, wait until the agent assigns a member id; None in any other process.

    Returns the job's store and the member id to join as; the environment then says what
    a cold replacement's does (``TORCHNEXT_MEMBER_ID`` set, :func:`is_spare` false).
    Raises ``SystemExit(0)`` when the spare is not needed: the agent sent it away, the
    job finished, the agent or the store is gone, or the agent's heartbeat for this
    spare did not advance for ``silence`` (the bound on the wait: a spare waits as long
    as its agent lives, however long the job runs).
    """
    name = TORCHNEXT_SPARE.get()
    if not name:
        return None
    for arg, value in (("poll_interval", poll_interval), ("silence", silence)):
        if value <= timedelta(0):
            raise ValueError(f"await_assignment: {arg}={value} must be a positive timedelta.")
    store = connect_store(TORCHNEXT_STORE_ADDR.get(), store_timeout)
    store.set(_key(name, "ready"), str(os.getpid()))
    assign_key = _key(name, "assign")
    parent = os.getppid()
    beat, beat_seen, next_check = -1, time.monotonic(), 0.0
    try:
        while not store.check([assign_key]):
            now = time.monotonic()
            if now >= next_check:
                next_check = now + 1.0
                if store.check([FINISHED_KEY]):
                    raise SystemExit(0)  # the job is over; the agent releases us too
                count = int(store.add(_key(name, "beat"), 0))
                if count != beat:
                    beat, beat_seen = count, now
                if os.getppid() != parent:
                    _leave(name, "its agent is gone")
                if now - beat_seen > silence.total_seconds():
                    _leave(name, f"its agent showed no sign of life for {silence}")
            time.sleep(poll_interval.total_seconds())
    except (RuntimeError, OSError) as exc:  # the store is gone, and with it the job
        _leave(name, f"the job's store failed ({str(exc).splitlines()[0] if str(exc) else exc!r})")
    member_id = store.get(assign_key).decode()
    if not member_id:
        raise SystemExit(0)  # sent away: the job is over
    os.environ[TORCHNEXT_MEMBER_ID.name] = member_id
    os.environ.pop(TORCHNEXT_SPARE.name, None)
    return store, member_id


def _leave(name: str, why: str) -> NoReturn:
    print(f"torchnext spare {name}: {why}; exiting", file=sys.stderr, flush=True)
    raise SystemExit(0)


# --------------------------------------------------------------------------- the agent's pool


class SparePool:
    """The warm spares of one agent (see the module docstring).

    ``start(name)`` starts a spare process named ``name``; ``emit(kind, message,
    member_id, exit)`` reports, as the agent does; ``shown`` maps each traceback already
    printed to the process that showed it (shared with the agent's reports).
    """

    def __init__(
        self,
        size: int,
        *,
        node_rank: int,
        store: Any,
        start: Callable[[str], WorkerProcess],
        emit: Callable[[EventKind, str, str, WorkerExit | None], None],
        shown: dict[str, str],
        refill_delay: timedelta = timedelta(seconds=10),
    ) -> None:
        if size < 0:
            raise ValueError(f"SparePool: size={size} must be >= 0 (spares to keep started).")
        self.size = size
        self.exits: list[WorkerExit] = []
        """How every spare that was never assigned ended."""
        self.spares: list[WorkerProcess] = []
        """The spares running now, oldest first."""
        self._node_rank = node_rank
        self._store = store
        self._start = start
        self._emit = emit
        self._shown = shown
        self._ready: set[str] = set()
        self._started = 0
        self._deaths_in_a_row = 0
        self._closed = ""
        """Why the pool no longer starts spares ('' while it does)."""
        self._released = False
        self._next_beat = 0.0
        self._refill_delay = refill_delay
        self._refill_at = 0.0

    def fill(self) -> None:
        """Start spares until ``size`` run (unless the pool was closed, or waits to refill)."""
        if time.monotonic() < self._refill_at:
            return
        while not self._closed and len(self.spares) < self.size:
            name = f"n{self._node_rank}s{self._started}"
            self._started += 1
            spare = self._start(name)
            self.spares.append(spare)
            self._emit("spare", f"started spare {name} (pid {spare.proc.pid})", name, None)

    def poll(self, *, job_over: bool) -> None:
        """Reap dead spares, note ready ones, beat for the live ones, refill."""
        if job_over:
            self.release()
        for spare in list(self.spares):
            code = spare.proc.poll()
            if code is not None:
                self._reap(spare, code)
            elif spare.member_id not in self._ready and self._store.check(
                [_key(spare.member_id, "ready")]
            ):
                self._ready.add(spare.member_id)
                self._deaths_in_a_row = 0
                took = time.monotonic() - spare.started
                self._emit(
                    "spare",
                    f"spare {spare.member_id} ready ({took:.1f} s after its start)",
                    spare.member_id,
                    None,
                )
        now = time.monotonic()
        if self.spares and now >= self._next_beat:
            self._next_beat = now + 1.0
            for spare in self.spares:
                self._store.add(_key(spare.member_id, "beat"), 1)
        self.fill()

    def promote(self, member_id: str) -> WorkerProcess | None:
        """Give ``member_id`` to the spare furthest along and hand it over; None if none.

        Ready spares go first, then the oldest one still starting: it is ahead of a cold
        start, and finds its member id as soon as it reaches ``Manager.from_env``. The
        pool is refilled once the new member healed (:meth:`healed`), or after
        ``refill_delay``, so that starting a spare does not slow the recovery down.
        """
        live = [s for s in self.spares if s.proc.poll() is None]
        if self._released or not live:
            return None
        spare = ([s for s in live if s.member_id in self._ready] or live)[0]
        self._store.set(_key(spare.member_id, "assign"), member_id)
        self.spares.remove(spare)
        self._refill_at = time.monotonic() + self._refill_delay.total_seconds()
        return spare

    def take_over(self, dead: WorkerProcess, member_id: str, note: str) -> WorkerProcess | None:
        """:meth:`promote` a spare to ``member_id`` in ``dead``'s slot and report it; the
        spare's record as a worker, or None if none is at hand."""
        spare = self.promote(member_id)
        if spare is None:
            return None
        state = "" if self.is_ready(spare) else " (still starting)"
        message = f"replacing {dead.member_id} with warm spare {spare.member_id}{state} as "
        self._emit("replacing", f"{message}{member_id} {note}", member_id, None)
        return replace(spare, slot=dead.slot, member_id=member_id, replacement=True)

    def is_ready(self, spare: WorkerProcess) -> bool:
        """Whether ``spare`` was waiting in ``Manager.from_env`` at the last :meth:`poll`."""
        return spare.member_id in self._ready

    def healed(self) -> None:
        """A member healed: refill the pool at the next :meth:`poll`."""
        self._refill_at = 0.0

    def release(self) -> None:
        """Tell every spare to leave (they exit with code 0) and start no more; idempotent."""
        if self._released:
            return
        self._released = True
        self._closed = self._closed or "the job is over"
        for spare in self.spares:
            try:
                self._store.set(_key(spare.member_id, "assign"), "")
            except Exception:  # noqa: BLE001 - the store may be gone; stop() ends them
                pass

    def stop(self, grace: timedelta) -> None:
        """Release the spares, wait up to ``grace`` for them to leave, then kill the rest.

        A spare still starting cannot hear the release before it reaches
        ``Manager.from_env``; it is terminated at once.
        """
        self.release()
        for spare in self.spares:
            if not (spare.member_id in self._ready or self._reached_from_env(spare)):
                signal_process(spare.proc, signal.SIGTERM)
        deadline = time.monotonic() + grace.total_seconds()
        for spare in self.spares:
            try:
                spare.proc.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                signal_process(spare.proc, signal.SIGKILL)
                spare.proc.wait(5)
        for spare in list(self.spares):
            self._reap(spare, int(spare.proc.returncode))

    def _reached_from_env(self, spare: WorkerProcess) -> bool:
        try:
            return bool(self._store.check([_key(spare.member_id, "ready")]))
        except Exception:  # noqa: BLE001 - no store, no claim
            return True

    def _reap(self, spare: WorkerProcess, code: int) -> None:
        self.spares.remove(spare)
        was_ready = spare.member_id in self._ready
        self._ready.discard(spare.member_id)
        tb = collect_traceback(spare)
        kind = classify_exit(code, raised=bool(tb), stopping=self._released)
        info = WorkerExit(
            member_id=spare.member_id,
            slot=-1,
            pid=spare.proc.pid,
            returncode=code,
            kind=kind,
            traceback=tb,
            runtime_s=time.monotonic() - spare.started,
            role="spare",
        )
        self.exits.append(info)
        if kind == "finished":
            message = (
                f"spare {spare.member_id} (pid {info.pid}) left unused after {info.runtime_s:.1f} s"
            )
            if not (was_ready or self._reached_from_env(spare)):
                message += (
                    ": it ran the script to its end without reaching Manager.from_env, so it "
                    "could never be used (only scripts built on Manager can use --spares)"
                )
                message += "" if self._closed else "; no more spares"
            # Otherwise it saw the job finish, or its agent fall silent: no new one either.
            self._closed = self._closed or "a spare left"
            self._emit("spare", message, spare.member_id, info)
            return
        message = exit_message(info, self._shown)
        if kind == "raised" and not self._closed:
            self._closed = "a spare raised"
            message += (
                "\nno more spares: a new one would raise again; replacements start cold. "
                "Code before Manager.from_env runs in spares too (see torchnext.distributed.is_spare)."
            )
        elif not self._closed:
            self._deaths_in_a_row += 1
            if self._deaths_in_a_row >= MAX_DEATHS_IN_A_ROW:
                self._closed = "spares keep dying"
                message += (
                    f"; no more spares: {self._deaths_in_a_row} died one after the other, none "
                    "ready in between (replacements start cold)"
                )
            else:
                message += "; a new spare takes its place"
        self._emit("spare", message, spare.member_id, info)
