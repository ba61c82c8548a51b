"""The jobs of ``ft-vs-torchft`` as the harness drives them, and the figures from their logs.

A :class:`Job` is 4 replicas of one system (torchnext under its agent, or torchft's 4
processes and a Lighthouse): started, held at or released to a step, killed slot by slot
(restarted cold), closed. The functions below turn the workers' logs into the figures:
step windows, false failures, the recovery and replacement times of a kill, goodput.
"""

from __future__ import annotations

import abc
import dataclasses
import json
import os
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import IO, Any

from _ft_vs_torchft_workers import FOREVER, NPROC, TUNE_WINDOW_STEPS, FtSetting

# ----------------------------------------------------------------------------- logs


class Logs:
    """Reads a job's worker logs incrementally; records get their writer's ``pid``."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.records: list[dict[str, Any]] = []
        self.by_pid: dict[int, list[dict[str, Any]]] = {}
        self._steps: list[dict[str, Any]] = []
        self._steps_by_pid: dict[int, list[dict[str, Any]]] = {}
        self._kinds: dict[int, set[str]] = {}
        self._offsets: dict[Path, int] = {}

    def refresh(self) -> None:
        for path in sorted(self.folder.glob("p*.jsonl")):
            pid = int(path.stem[1:])
            with open(path, "rb") as fh:
                fh.seek(self._offsets.get(path, 0))
                chunk = fh.read()
            end = chunk.rfind(b"\n") + 1  # a line still being written waits for next time
            self._offsets[path] = self._offsets.get(path, 0) + end
            for line in chunk[:end].splitlines():
                rec = json.loads(line)
                rec["pid"] = pid
                self.records.append(rec)
                self.by_pid.setdefault(pid, []).append(rec)
                self._kinds.setdefault(pid, set()).add(rec["k"])
                if rec["k"] == "step":
                    self._steps.append(rec)
                    self._steps_by_pid.setdefault(pid, []).append(rec)

    def steps(self, pid: int | None = None) -> list[dict[str, Any]]:
        """Step records, of one worker or all (in reading order; do not modify)."""
        return self._steps if pid is None else self._steps_by_pid.get(pid, [])

    def has(self, pid: int, kind: str) -> bool:
        return kind in self._kinds.get(pid, ())

    def max_step(self) -> int:
        return max((int(r["step"]) for r in self._steps if r["committed"]), default=0)


def full_step(rec: dict[str, Any]) -> bool:
    return bool(rec["ok"] and rec["committed"] and rec["world"] == NPROC)


# ----------------------------------------------------------------------------- jobs


class Job(abc.ABC):
    """One 4-replica training job of either system, held or released at step boundaries."""

    system = ""

    def __init__(self, name: str, root: Path, script: str, ctl: Any, ctl_addr: str) -> None:
        self.name = name
        self.folder = root / name
        self.logs = Logs(self.folder)
        self.script = script
        self.ctl = ctl
        self.ctl_addr = ctl_addr
        self.kills = 0
        self.exits_unplanned = 0
        self.exited: dict[int, float] = {}
        """Pid -> when the harness saw it gone (killed or exited on its own)."""
        self.assigned: dict[int, float] = {}
        """Pid of a warm spare -> when the agent gave it a dead worker's place."""
        ctl.set(f"{name}/target", "0")

    def worker_args(self) -> list[str]:
        return ["--log-dir", str(self.folder), "--ctl", self.ctl_addr, "--job", self.name]

    def release(self, target: int = FOREVER) -> None:
        self.ctl.set(f"{self.name}/target", str(target))

    @abc.abstractmethod
    def start(self) -> None: ...

    @abc.abstractmethod
    def poll(self) -> None: ...

    @abc.abstractmethod
    def live(self) -> dict[int, int]:
        """Slot -> pid of every running worker."""
        ...

    @abc.abstractmethod
    def kill(self, slot: int) -> float:
        """SIGKILL the worker in ``slot``; returns the monotonic time just before the signal."""
        ...

    @abc.abstractmethod
    def close(self) -> None: ...

    def members(self) -> dict[int, int]:
        """Slot -> pid of the running workers that passed their manager's construction."""
        return {s: p for s, p in self.live().items() if self.logs.has(p, "member")}

    def steady(self) -> bool:
        """Every slot's worker committed a full-membership step, all in the same membership."""
        self.logs.refresh()
        members = self.members()
        if len(members) < NPROC:
            return False
        last = []
        for pid in members.values():
            steps = self.logs.steps(pid)
            if not steps or not full_step(steps[-1]):
                return False
            last.append(steps[-1])
        return len({r["mid"] for r in last}) == 1

    def wait(self, cond: Callable[[], bool], timeout_s: float, what: str) -> None:
        deadline = time.monotonic() + timeout_s
        while not cond():
            self.poll()
            if time.monotonic() > deadline:
                raise TimeoutError(f"{self.name}: {what} not reached in {timeout_s:.0f} s; {self}")
            time.sleep(0.1)

    def settle(self, timeout_s: float, what: str) -> bool:
        """Wait until the job is steady; False (and a message) if it is not in time."""
        try:
            self.wait(self.steady, timeout_s, what)
        except TimeoutError as exc:
            print(f"ft-vs-torchft: {exc}; going on", file=sys.stderr, flush=True)
            return False
        return True

    def hold(self) -> None:
        """Stop every worker at the same step boundary (once the job is steady, if it gets so)."""
        self.settle(180, "steady state before holding")
        self.release(self.logs.max_step() + 2)
        self.wait(self.at_target, 120, "the hold step")

    def at_target(self) -> bool:
        self.logs.refresh()
        target = int(self.ctl.add(f"{self.name}/target", 0))
        return all(
            bool(self.logs.steps(p)) and int(self.logs.steps(p)[-1]["step"]) >= target
            for p in self.members().values()
        )

    def __repr__(self) -> str:
        return f"<{self.name}: logs in {self.folder}, live {self.live()}>"


class TorchnextJob(Job):
    system = "torchnext"

    def __init__(self, *a: Any, spares: int = 0) -> None:
        super().__init__(*a)
        self.spares = spares
        self.agent: Any = None

    def start(self) -> None:
        from torchnext.distributed.launch.agent import Agent, AgentConfig

        extra: dict[str, Any] = {"spares": self.spares} if self.spares else {}
        cfg = AgentConfig(
            nproc=NPROC,
            max_restarts=1000,
            log_dir=str(self.folder / "agent"),
            term_grace=timedelta(seconds=2),
            **extra,
        )
        command = [self.script, "--worker", "torchnext", *self.worker_args()]
        self.agent = Agent(command, cfg, on_event=self._on_agent_event)
        self.agent.start()

    def _on_agent_event(self, event: Any) -> None:
        # A promoted spare is in the agent's workers when "replacing" is reported; a cold
        # replacement is not started yet (its request to join is its "ready" record).
        if event.kind == "replacing" and self.agent is not None:
            for w in self.agent.workers.values():
                if w.member_id == event.member_id and w.proc.poll() is None:
                    self.assigned[w.proc.pid] = time.monotonic()

    def poll(self) -> None:
        before = len(self.agent.exits)
        self.agent.poll()
        new = self.agent.exits[before:]
        self.exits_unplanned += len(new) - sum(1 for e in new if e.pid in self.exited)
        for e in new:
            self.exited.setdefault(e.pid, time.monotonic())

    def live(self) -> dict[int, int]:
        return {s: w.proc.pid for s, w in self.agent.workers.items() if w.proc.poll() is None}

    def kill(self, slot: int) -> float:
        t0 = time.monotonic()
        victim = self.agent.signal_worker(slot, signal.SIGKILL)
        self.exited[victim] = t0
        self.kills += 1
        # Let the agent see the exit and start the replacement (or promote a spare) at
        # once, as TorchftJob.kill restarts its worker.
        while self.live().get(slot) in (None, victim):
            self.poll()
            if time.monotonic() > t0 + 10:
                raise TimeoutError(f"{self.name}: no replacement for slot {slot} in 10 s")
            time.sleep(0.002)
        return t0

    def close(self) -> None:
        if self.agent is not None:
            self.agent.close()


class TorchftJob(Job):
    system = "torchft"

    def __init__(self, *a: Any, setting: FtSetting) -> None:
        super().__init__(*a)
        self.setting = setting
        self.procs: dict[int, subprocess.Popen[bytes]] = {}
        self.lighthouse: subprocess.Popen[str] | None = None
        self.address = ""
        self._outputs: list[IO[bytes]] = []

    def start(self) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)
        log = open(self.folder / "lighthouse.log", "ab")  # noqa: SIM115 - closed in close()
        self._outputs.append(log)
        self.lighthouse = subprocess.Popen(
            [
                sys.executable,
                self.script,
                "--run-lighthouse",
                "--ft-setting",
                self.setting.to_json(),
            ],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=log,
            text=True,
            start_new_session=True,
        )
        assert self.lighthouse.stdout is not None
        self.address = _readline(self.lighthouse.stdout, 60.0, "the Lighthouse's address")
        for slot in range(NPROC):
            self._spawn(slot)

    def _spawn(self, slot: int) -> None:
        out = open(self.folder / f"slot{slot}.out", "ab")  # noqa: SIM115 - closed in close()
        self._outputs.append(out)
        self.procs[slot] = subprocess.Popen(
            [
                sys.executable,
                self.script,
                "--worker",
                "torchft",
                "--slot",
                str(slot),
                "--lighthouse",
                self.address,
                "--ft-setting",
                self.setting.to_json(),
                *self.worker_args(),
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    def poll(self) -> None:
        for slot, proc in list(self.procs.items()):
            if proc.poll() is not None:
                # Not killed by the harness (kill() restarts those itself): a worker gave
                # up, e.g. a quorum timed out. Restarted cold all the same.
                self.exits_unplanned += 1
                self.exited[proc.pid] = time.monotonic()
                self._spawn(slot)

    def live(self) -> dict[int, int]:
        return {s: p.pid for s, p in self.procs.items() if p.poll() is None}

    def kill(self, slot: int) -> float:
        proc = self.procs[slot]
        t0 = time.monotonic()
        os.kill(proc.pid, signal.SIGKILL)
        self.exited[proc.pid] = t0
        proc.wait(10)
        self.kills += 1
        self._spawn(slot)  # cold, as torchnext's agent does
        return t0

    def close(self) -> None:
        for proc in self.procs.values():
            _kill_group(proc)
        if self.lighthouse is not None:
            _kill_group(self.lighthouse)
        for out in self._outputs:
            out.close()


def _kill_group(proc: subprocess.Popen[Any]) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        pass


def _readline(stream: IO[str], timeout_s: float, what: str) -> str:
    import selectors

    with selectors.DefaultSelector() as sel:
        sel.register(stream, selectors.EVENT_READ)
        if not sel.select(timeout_s):
            raise TimeoutError(f"no {what} in {timeout_s:.0f} s")
    line = stream.readline().strip()
    if not line:
        raise RuntimeError(f"no {what}: the process exited")
    return line


# ----------------------------------------------------------------------------- measurements


@dataclass
class Kill:
    t0: float
    victim: int
    survivors: list[int]
    steady: bool
    until: float = 0.0
    """End of the span this kill's effects are looked for in (next kill or phase end)."""


def kill_figures(
    logs: Logs, kill: Kill, exited: dict[int, float], assigned: dict[int, float]
) -> dict[str, float | None]:
    """One kill's figures, from the logs (seconds from the SIGKILL; see the module docstring).

    ``ready_s``/``resume_s``: the last survivor's membership ready / first committed
    gradient all-reduce in it; a survivor still not there at ``kill.until`` counts as
    that long (``censored``: the figure is a lower bound). A survivor that exits before
    it resumes (a collateral failure: torchft's quorum request can time out) is counted
    in ``collateral``, not waited for.
    ``replacement_raw_s``: until the replacement holds the healed state;
    ``replacement_s``: the same less the survivors' step compute it waited through
    (from its request to join, ``assigned`` for a warm spare, to its admission at a step
    boundary).
    """
    steps = logs.steps()
    mid0 = max((r["mid"] for r in steps if r["t_ar"] <= kill.t0), default=-1)
    resume: list[float] = []
    ready: list[float] = []
    collateral = censored = 0
    span = kill.until - kill.t0
    for pid in kill.survivors:
        first = next(
            (
                r
                for r in logs.steps(pid)
                if kill.t0 < r["t_ar"] <= kill.until
                and r["mid"] > mid0
                and r["ok"]
                and r["committed"]
            ),
            None,
        )
        if first is None:
            if exited.get(pid, float("inf")) <= kill.until:
                collateral += 1
            else:
                censored += 1
                resume.append(span)
                ready.append(span)
            continue
        resume.append(first["t_ar"] - kill.t0)
        ready.append(max(0.0, first["t_ready"] - kill.t0))
    old = {kill.victim, *kill.survivors}
    healed = sorted(
        (
            r
            for r in logs.records
            if _healed(r) and r["pid"] not in old and kill.t0 < r["t"] <= kill.until
        ),
        key=lambda r: r["t"],
    )
    raw = waited = None
    if healed:
        joiner, t_healed = healed[0]["pid"], healed[0]["t"]
        raw = t_healed - kill.t0
        asked = assigned.get(joiner)
        if asked is None:
            asked = next(
                (r["t"] for r in logs.by_pid.get(joiner, []) if r["k"] == "ready"), kill.t0
            )
        waited = _compute_waited(logs, kill.survivors, max(asked, kill.t0), t_healed)
    return {
        "ready_s": max(ready) if ready else None,
        "resume_s": max(resume) if resume else None,
        "replacement_s": raw - waited if raw is not None and waited is not None else None,
        "replacement_raw_s": raw,
        "collateral": float(collateral),
        "censored": float(censored),
    }


def _compute_waited(logs: Logs, survivors: list[int], asked: float, healed: float) -> float:
    """Step compute of the survivors between a joiner's request and its admission.

    The admission follows the survivors' last commit before the joiner healed; the
    compute of their steps (start to commit) inside ``[asked, that commit]`` is what the
    joiner waited through. Taken on the survivor that waited least (every survivor runs
    the same steps).
    """
    best: float | None = None
    for pid in survivors:
        steps = [r for r in logs.steps(pid) if r["committed"] and r["t"] < healed]
        if not steps:
            continue
        boundary = steps[-1]["t"]
        total = sum(
            max(0.0, min(r["t"], boundary) - max(r["t_start"], asked))
            for r in steps
            if r["t"] > asked
        )
        best = total if best is None else min(best, total)
    return best or 0.0


def survivors_of(job: Job, slot: int) -> list[int]:
    job.logs.refresh()
    return [
        p
        for s, p in job.members().items()
        if s != slot and any(r["committed"] for r in job.logs.steps(p))
    ]


def step_window(job: Job, steps: int) -> float:
    """Seconds per step over ``steps`` steps (the first, staggered by the release, skipped)."""
    job.logs.refresh()
    start = job.logs.max_step()
    job.release(start + steps)
    job.wait(job.at_target, 30 + 10 * steps, f"{steps} steps")
    per_pid = []
    for pid in job.members().values():
        t = {int(r["step"]): r["t"] for r in job.logs.steps(pid) if r["committed"]}
        if start + 1 in t and start + steps in t:
            per_pid.append((t[start + steps] - t[start + 1]) / (steps - 1))
    if not per_pid:
        raise RuntimeError(f"{job.name}: no worker logged steps {start + 1}..{start + steps}")
    return statistics.median(per_pid)


def checked_window(job: Job, since: float) -> list[str]:
    """Run one window of the tuning check; stop at the first false failure since ``since``."""
    job.logs.refresh()
    job.release(job.logs.max_step() + TUNE_WINDOW_STEPS)
    limit_s = 30 + 10 * TUNE_WINDOW_STEPS
    deadline = time.monotonic() + limit_s
    while True:
        job.poll()
        problems = false_failures(job, since, time.monotonic())
        if job.exits_unplanned:
            problems.append(f"{job.exits_unplanned} worker exit(s)")
        if problems or job.at_target():
            return problems
        if time.monotonic() > deadline:
            return [f"{TUNE_WINDOW_STEPS} steps took over {limit_s} s"]
        time.sleep(0.1)


def false_failures(job: Job, since: float, until: float) -> list[str]:
    """What went wrong in a fault-free span: failed or uncommitted steps, membership changes."""
    job.logs.refresh()
    out = []
    steps = [r for r in job.logs.steps() if since < r["t"] <= until]
    mids = {r["mid"] for r in steps}
    if len(mids) > 1:
        out.append(f"membership changed {len(mids) - 1} time(s)")
    bad = [r for r in steps if not full_step(r)]
    if bad:
        r = bad[0]
        out.append(
            f"{len(bad)} step(s) failed or short, first: step {r['step']} ok={r['ok']} "
            f"committed={r['committed']} world={r['world']}"
        )
    evs = [
        r
        for r in job.logs.records
        if r["k"] == "ev"
        and r["kind"] in ("failure_detected", "step_aborted", "shrink")
        and since < r["t"] <= until
    ]
    if evs:
        out.append(f"{len(evs)} failure event(s), first: {evs[0]['kind']}")
    return out


def _healed(rec: dict[str, Any]) -> bool:
    """The record a replacement writes once it holds the healed state."""
    return rec["k"] == "heal_received" or (rec["k"] == "ev" and rec["kind"] == "healed")


def committed_samples(job: Job, t_start: float, t_end: float) -> float:
    per_step: dict[int, int] = {}
    for r in job.logs.steps():
        if r["committed"] and t_start < r["t"] <= t_end:
            per_step[int(r["step"])] = max(per_step.get(int(r["step"]), 0), int(r["samples"]))
    return float(sum(per_step.values()))


def slot_of(job: Job, index: int) -> int:
    slots = sorted(job.members()) or sorted(job.live())
    return slots[index % len(slots)]


def free_step_s(job: Job) -> float | None:
    """Median seconds between consecutive committed full-membership steps of one worker."""
    gaps = []
    for pid in list(job.logs.by_pid):
        steps = [r for r in job.logs.steps(pid) if full_step(r)]
        for a, b in zip(steps, steps[1:], strict=False):
            if b["step"] == a["step"] + 1 and b["mid"] == a["mid"]:
                gaps.append(b["t"] - a["t"])
    return statistics.median(gaps) if gaps else None


def spare_ready(job: Job) -> bool:
    """A warm spare has waited in Manager.from_env for at least a second."""
    job.logs.refresh()
    now = time.monotonic()
    for pid, recs in job.logs.by_pid.items():
        start = next((r for r in recs if r["k"] == "start"), None)
        ready = next((r for r in recs if r["k"] == "ready"), None)
        if start is None or ready is None or not start.get("spare"):
            continue
        if any(r["k"] == "member" for r in recs) or now - ready["t"] < 1.0:
            continue
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            continue
        return True
    return False


def spares_supported() -> str:
    """Empty when ``AgentConfig(spares=...)`` exists, else why the spare figure is null."""
    from torchnext.distributed.launch.agent import AgentConfig

    if "spares" in {f.name for f in dataclasses.fields(AgentConfig)}:
        return ""
    return (
        "this torchnext has no warm spares (AgentConfig has no 'spares' field, "
        "torchnext run no --spares); spare_replacement_s is null"
    )
