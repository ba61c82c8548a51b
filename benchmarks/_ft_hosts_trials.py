"""The measurements of ``torchnext bench ft-hosts``: fault-free windows and host faults.

Each function takes a running :class:`~_ft_hosts_job.Job` and reads what its workers
wrote (their JSON lines: committed steps and manager events, stamped with
``time.time()``, one clock for every test host) against the moment the fault began
(:class:`~torchnext.testing.HostFault`):

* :func:`window`: the fault-free step time over a window, and the failures the workers
  suspected since the job started (in a fault-free run every one is false);
* :func:`host_fault`: ``power_off``, ``freeze`` or ``partition`` of one host. Detection
  is the first survivor's ``failure_detected`` naming a worker of that host; t3 runs
  from there to the moment *every* survivor committed a step in a later epoch; steps
  lost are committed steps the survivors did not keep (their first new step number
  against the last one committed before the fault). A frozen or partitioned host is then
  thawed or reconnected, and its workers must exit (fenced) without a step the
  survivors did not commit;
* :func:`tcp_store_loss`: ``power_off`` of the host whose agent holds the TCP store;
  whether any survivor commits again within a bound.

What not to assume: a bound that runs out raises :class:`~_ft_hosts_job.BenchTimeout`
only where the benchmark cannot go on (no first step, no recovery); a fenced host that
never exits is a measured result (``fenced_s`` None), not a crash.
"""

from __future__ import annotations

import re
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, Literal

from _ft_hosts_job import BenchTimeout, Job, node_of, process_gone, wait_until

__all__ = ["Trial", "Window", "host_fault", "steady", "tcp_store_loss", "window"]

FaultKind = Literal["power_off", "freeze", "partition", "store_power_off"]

# The suspects of a revoke's reason: "failure detected by n2w0: n1w0: unresponsive: ...;
# n1w1: ...". The detector ("by n2w0:") is not a suspect.
_SUSPECT = re.compile(r"(?<!by )\b(n\d+w\d+(?:\.r\d+)?): ")


@dataclass
class Window:
    """The fault-free part of one job."""

    job: str
    store: str
    nproc: int
    steps: int
    seconds: float
    step_s: float
    """Median over workers of (last - first commit) / (commits - 1) in the window."""
    false_suspicions: int
    """Failures suspected (distinct revoked epochs) from the go to the window's end."""


@dataclass
class Trial:
    """One host fault and what the job did about it."""

    job: str
    store: str
    kind: str
    host: str
    nproc: int
    world_before: int
    survived: bool = False
    detection_s: float | None = None
    t3_s: float | None = None
    steps_lost: int = 0
    shrinks: int = 0
    """Distinct shrink epochs among the survivors between the fault and recovery."""
    removed: list[str] = field(default_factory=list)
    agreement_s: float | None = None
    """The longest ``shrink`` event's own agreement time among the survivors."""
    wrong_suspicions: int = 0
    """Members suspected that were not on the faulted host."""
    fenced_s: float | None = None
    """Thaw or reconnect to the moment every worker of the host had exited."""
    split_brain_commits: int = 0
    """Steps the faulted host's workers began after the fault and committed (the survivors
    did not)."""
    in_flight_commits: int = 0
    """Steps the cut-off host began before the fault and committed after it, alone."""
    replace_s: float | None = None
    heal_s: float | None = None
    note: str = ""


_RECENT_S = 30.0
"""How far back "the newest epoch" is looked for: a steady job commits every step time."""


def _latest(job: Job) -> tuple[int, set[str], int]:
    """The newest epoch with committed steps, its members, their world size."""
    steps = job.records.select("step", since=time.time() - _RECENT_S)
    if not steps:
        return -1, set(), 0
    epoch = max(r["epoch"] for r in steps)
    members = {r["member"] for r in steps if r["epoch"] == epoch}
    world = max(r["world"] for r in steps if r["epoch"] == epoch)
    return epoch, members, world


def steady(job: Job, timeout: timedelta, *, min_steps: int = 3, world: int = 0) -> int:
    """Wait until every member of the newest epoch committed ``min_steps`` steps in it
    (and its size is ``world``, if given); returns that epoch."""

    def done() -> bool:
        epoch, members, size = _latest(job)
        if epoch < 0 or len(members) < size or (world and size != world):
            return False
        counts = dict.fromkeys(members, 0)
        for r in job.records.select("step", since=time.time() - _RECENT_S):
            if r["epoch"] == epoch:
                counts[r["member"]] += 1
        return min(counts.values()) >= min_steps

    try:
        wait_until(done, timeout, f"{job.spec.name}: a steady epoch", poll_s=0.05)
    except BenchTimeout as exc:
        raise BenchTimeout(f"{exc}\n{job.log_tail()}") from None
    return _latest(job)[0]


def _suspicions(
    job: Job, since: float, until: float, among: set[str] | None = None
) -> list[dict[str, Any]]:
    return [
        r
        for r in job.records.select("event", since=since, event="failure_detected")
        if since <= float(r["et"]) <= until and (among is None or r["member"] in among)
    ]


def window(job: Job, seconds: float, timeout: timedelta) -> Window:
    """Fault-free step time over ``seconds`` once the job is steady."""
    epoch = steady(job, timeout, min_steps=5)
    start = time.time()
    time.sleep(seconds)  # the measured interval itself, not a wait for an event
    end = time.time()
    by_member: dict[str, list[float]] = {}
    for r in job.records.select("step", since=start):
        if r["t"] <= end and r["epoch"] == epoch:
            by_member.setdefault(r["member"], []).append(float(r["t"]))
    per = [(max(t) - min(t)) / (len(t) - 1) for t in by_member.values() if len(t) >= 2]
    if not per:
        raise BenchTimeout(f"{job.spec.name}: no steps committed in a {seconds} s window")
    revoked = {r["detail"].get("revoked_epoch") for r in _suspicions(job, job.go_time, end)}
    return Window(
        job=job.spec.name,
        store=job.spec.store,
        nproc=job.spec.nproc,
        steps=max(len(t) for t in by_member.values()),
        seconds=end - start,
        step_s=statistics.median(per),
        false_suspicions=len(revoked),
    )


def _inject(job: Job, host: int, kind: FaultKind) -> Any:
    if kind in ("power_off", "store_power_off"):
        return job.hosts.power_off(host)
    if kind == "freeze":
        return job.hosts.freeze(host)
    return job.hosts.partition(host)


def host_fault(
    job: Job,
    host: int,
    kind: FaultKind,
    *,
    heartbeat_timeout: timedelta,
    bound: timedelta,
    replace: bool = False,
) -> Trial:
    """Inject ``kind`` on ``host`` and measure detection, t3, steps lost and fencing."""
    epoch = steady(job, bound)
    _, members, world = _latest(job)
    victims = {m for m in members if node_of(m) == host}
    survivors = members - victims
    trial = Trial(job.spec.name, job.spec.store, kind, f"h{host}", job.spec.nproc, world)
    fault = _inject(job, host, kind)
    detect_bound = heartbeat_timeout * 3 + timedelta(seconds=10)

    def naming_victims() -> list[dict[str, Any]]:
        found = _suspicions(job, fault.time_s, time.time() + 1, survivors)
        return [r for r in found if victims & set(_SUSPECT.findall(r["detail"].get("reason", "")))]

    def first_new_steps() -> dict[str, dict[str, Any]]:
        first: dict[str, dict[str, Any]] = {}
        for r in job.records.select("step", since=fault.time_s):
            if r["member"] in survivors and r["epoch"] > epoch and r["member"] not in first:
                first[r["member"]] = r
        return first

    try:
        wait_until(lambda: bool(naming_victims()), detect_bound, f"detection of {kind} h{host}")
        wait_until(
            lambda: len(first_new_steps()) == len(survivors), bound, f"recovery from {kind} h{host}"
        )
    except BenchTimeout as exc:
        trial.note = str(exc)
        _restore(job, host, kind)
        return trial
    detected_at = min(float(r["et"]) for r in naming_victims())
    new = first_new_steps()
    recovered_at = max(float(r["t"]) for r in new.values())
    trial.survived = True
    trial.detection_s = detected_at - fault.time_s
    trial.t3_s = recovered_at - detected_at
    before = [
        r["step"]
        for r in job.records.select("step", since=fault.time_s - _RECENT_S)
        if r["t"] <= fault.time_s
    ]
    trial.steps_lost = max(0, max(before, default=0) + 1 - min(r["step"] for r in new.values()))
    shrinks = [
        r
        for r in job.records.select("event", since=fault.time_s, event="shrink")
        if r["member"] in survivors and float(r["et"]) <= recovered_at
    ]
    trial.shrinks = len({r["epoch"] for r in shrinks})
    trial.removed = sorted({m for r in shrinks for m in r["detail"].get("removed", [])})
    trial.agreement_s = max((float(r["detail"].get("seconds", 0.0)) for r in shrinks), default=None)
    named = {
        m
        for r in _suspicions(job, fault.time_s, recovered_at, survivors)
        for m in _SUSPECT.findall(r["detail"].get("reason", ""))
    }
    trial.wrong_suspicions = len(named - victims)
    if kind in ("freeze", "partition"):
        _fence(job, host, kind, trial, fault.time_s, survivors, heartbeat_timeout, bound)
        if replace and trial.fenced_s is not None:
            _replacement(job, host, trial, bound)
    return trial


def _restore(job: Job, host: int, kind: FaultKind) -> None:
    h = job.hosts[host]
    if kind == "freeze" and h.frozen:
        job.hosts.thaw(host)
    elif kind == "partition" and not h.linked and h.powered:
        job.hosts.reconnect(host)


def _fence(
    job: Job,
    host: int,
    kind: FaultKind,
    trial: Trial,
    fault_time: float,
    survivors: set[str],
    heartbeat_timeout: timedelta,
    bound: timedelta,
) -> None:
    """Thaw or reconnect ``host``; time until its workers exited; count split-brain commits."""
    pids = job.pids(host)
    back = job.hosts.thaw(host) if kind == "freeze" else job.hosts.reconnect(host)
    fence_bound = heartbeat_timeout * 2 + timedelta(seconds=10)
    try:
        gone = wait_until(
            lambda: all(process_gone(p) for p in pids),
            fence_bound,
            f"the fenced workers of h{host} exiting",
        )
        trial.fenced_s = gone - back.time_s
    except BenchTimeout as exc:
        trial.note = str(exc)
    kept = {
        (r["epoch"], r["step"])
        for r in job.records.select("step", since=fault_time - _RECENT_S)
        if r["member"] in survivors
    }
    # A step the cut-off host *ran* after the fault (began after it) and committed. One it
    # began before and whose all-reduce completed as the link went down may commit there
    # while the survivors redo it (the collective vote is not atomic; the member is then
    # fenced and its state never reaches anyone): that one is counted apart.
    late = [
        r
        for r in job.records.select("step", since=fault_time)
        if node_of(r["member"]) == host and (r["epoch"], r["step"]) not in kept
    ]
    trial.split_brain_commits = sum(1 for r in late if float(r.get("t0", r["t"])) >= fault_time)
    trial.in_flight_commits = len(late) - trial.split_brain_commits


def _replacement(job: Job, host: int, trial: Trial, bound: timedelta) -> None:
    """Wait for the host agent's replacements to be back in the job (a cold start + heal)."""
    since = time.time()
    try:
        steady(job, bound + timedelta(seconds=60), world=job.spec.workers)
    except BenchTimeout as exc:
        trial.note = str(exc)
        return
    back = [r for r in job.records.select("step", since=since) if r["world"] == job.spec.workers]
    if back and trial.fenced_s is not None:
        trial.replace_s = min(float(r["t"]) for r in back) - since
    healed = [
        float(r["detail"].get("seconds", 0.0))
        for r in job.records.select("event", since=since, event="healed")
        if node_of(r["member"]) == host
    ]
    trial.heal_s = max(healed, default=None)


def tcp_store_loss(
    job: Job, *, bound: timedelta, lost_after: timedelta, meanwhile: Callable[[], None]
) -> Trial:
    """Power off ``h0`` (its agent holds the TCP store); ``meanwhile`` runs during the wait.

    The job survived if a survivor commits a step in a later epoch within ``lost_after``
    (measured from the fault, however long ``meanwhile`` takes).
    """
    epoch = steady(job, bound)
    _, members, world = _latest(job)
    survivors = {m for m in members if node_of(m) != 0}
    trial = Trial(job.spec.name, job.spec.store, "store_power_off", "h0", job.spec.nproc, world)
    fault = job.hosts.power_off(0)
    meanwhile()
    deadline = fault.time_s + lost_after.total_seconds()
    time.sleep(max(0.0, deadline - time.time()))  # a bounded observation, not an event wait
    later = [
        r
        for r in job.records.select("step", since=fault.time_s)
        if r["member"] in survivors and r["epoch"] > epoch and r["t"] <= deadline
    ]
    trial.survived = bool(later)
    exits = [
        r["t"] for r in job.records.select("error", since=fault.time_s) if r["member"] in survivors
    ]
    trial.note = (
        f"no survivor committed a step within {lost_after} of the store host's loss"
        if not later
        else "a survivor committed after the store host's loss"
    )
    if exits:
        trial.note += f"; first survivor error after {min(exits) - fault.time_s:.1f} s"
    return trial
