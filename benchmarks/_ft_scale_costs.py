"""The arithmetic of ``torchnext bench ft-scale-model``: one function per modelled quantity.

Everything here is a closed form of the inputs :mod:`ft_scale_model` reads from
``ft-hosts.json`` (no I/O, no randomness), so ``tests/test_ft_scale_model.py`` can check
each formula by hand. The protocol modelled is the one the code runs
(``torchnext/distributed/group``): the module docstring of ``ft_scale_model.py`` states it
in words; the docstrings here say which line of it each function is.

What not to assume: "store" is one server that serves requests one at a time with the
measured service time; a network of many machines adds round-trip time that the
single-machine measurement does not contain (``rtt_extra_s`` adds it back).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

__all__ = [
    "Design",
    "StoreCosts",
    "Timing",
    "TorchftCosts",
    "agreement_iteration_s",
    "agreement_ops",
    "agreement_s",
    "detection_s",
    "goodput",
    "open_epoch_s",
    "restart_goodput",
    "heartbeat_period_s",
    "liveness_holds",
    "offered_load",
    "request_latency",
    "step_at",
    "steady_ops_per_s",
    "t3_s",
    "torchft_lost_s",
    "torchft_quorum",
    "young_daly_interval_s",
]


@dataclass(frozen=True)
class StoreCosts:
    """One store's measured costs (seconds)."""

    check_s: float
    get_s: float
    set_s: float
    add_s: float
    cas_s: float
    mget_base_s: float
    """A ``multi_get`` of 8 keys."""
    mget_key_s: float
    """Each key beyond those, as one caller sees it (client and server)."""
    service_s: float
    """Server time per request (its CPU per ``check``, or 1 / several callers' throughput)."""
    key_service_s: float
    """Server time per key of a ``multi_get`` (from 64-key reads, less a ``check``)."""
    pg_build_s: float
    """Building a 2-rank gloo group through this store."""
    rtt_extra_s: float = 0.0
    """Round-trip time to add per request (a real network; 0 on test hosts)."""

    def rtt(self, op_s: float) -> float:
        return op_s + self.rtt_extra_s


@dataclass(frozen=True)
class Timing:
    """The group's settings and the job's step (seconds)."""

    heartbeat_interval_s: float
    heartbeat_timeout_s: float
    poll_s: float
    step_s: float
    """Fault-free step time (compute, all-reduce, commit vote)."""
    compute_s: float
    """The part of a step that a revoke cannot interrupt (the closure's compute)."""


VOTE_REQUESTS = 7
"""Store requests of one member's commit vote per step (an ``add``, about three
``check``\\ s while waiting, a ``get`` or ``compare_set``, two deletes of old keys)."""


def steady_ops_per_s(members: int, t: Timing) -> float:
    """Requests per second the store is asked for in fault-free training, at the nominal
    periods: per member a revoke ``check`` every poll; every heartbeat interval an
    ``add`` (its counter), a ``multi_get`` (every member's) and an ``add`` of the latest
    epoch; per step the commit vote."""
    per_member = 1 / t.poll_s + 3 / t.heartbeat_interval_s + VOTE_REQUESTS / t.step_s
    return members * per_member


def offered_load(members: int, t: Timing, store: StoreCosts) -> float:
    """Server time asked for per second: every request, and every key each heartbeat
    ``multi_get`` reads (``members - 1`` per member per interval). 1 fills the store."""
    keys_per_s = members * max(0, members - 1) / t.heartbeat_interval_s
    return steady_ops_per_s(members, t) * store.service_s + keys_per_s * store.key_service_s


def request_latency(members: int, t: Timing, store: StoreCosts, op_s: float) -> float:
    """One request's latency under the fault-free load: its round trip plus the queue.

    Below saturation an M/M/1 wait (service * U / (1 - U)); the callers are a closed
    loop (each of the 2 threads per member waits for its answer before the next
    request), so the queue never holds more than every caller once: the wait is at
    most ``2 * members * service``, which is also its value once the load exceeds 1.
    """
    load = offered_load(members, t, store)
    ceiling = 2 * members * store.service_s
    queue = store.service_s * load / (1 - load) if load < 1 else math.inf
    return store.rtt(op_s) + min(queue, ceiling)


def heartbeat_period_s(members: int, t: Timing, store: StoreCosts) -> float:
    """How often a member's counter really moves: the interval, stretched by the factor
    the offered load exceeds the store's capacity (every caller's loop slows alike)."""
    return t.heartbeat_interval_s * max(1.0, offered_load(members, t, store))


def liveness_holds(members: int, t: Timing, store: StoreCosts) -> bool:
    """Whether live members keep beating well inside the timeout (period <= timeout/2);
    beyond that, live members are suspected: the control plane cannot run the job."""
    return 2 * heartbeat_period_s(members, t, store) <= t.heartbeat_timeout_s


def detection_s(survivors: int, t: Timing, store: StoreCosts, members: int) -> float:
    """First survivor's suspicion after a silent host loss.

    The heartbeat timeout, less the victim's last beat's age at the fault (P/2 on
    average, P the heartbeat period), plus the first survivor's observation and check
    phases (each up to P; the minimum over S survivors of their sum shrinks as
    P*sqrt(2/S)), plus half a poll (the monitor wakes every poll) and the liveness
    check's own requests (a ``multi_get`` of every member's counter, an ``add``).
    """
    period = heartbeat_period_s(members, t, store)
    phase = period * (math.sqrt(2.0 / max(1, survivors)) - 0.5)
    mget = request_latency(
        members, t, store, store.mget_base_s + max(0, members - 8) * store.mget_key_s
    )
    add = request_latency(members, t, store, store.add_s)
    return t.heartbeat_timeout_s + phase + t.poll_s / 2 + mget + add


def step_at(
    members: int, base_members: int, base_step_s: float, t: Timing, store: StoreCosts
) -> float:
    """The step time at ``members``, from the one measured at ``base_members``: the
    commit vote's requests take longer as the store's queue grows."""
    later = request_latency(members, t, store, store.check_s)
    now = request_latency(base_members, t, store, store.check_s)
    return base_step_s + VOTE_REQUESTS * (later - now)


def agreement_iteration_s(members: int, t: Timing, store: StoreCosts) -> float:
    """One pass of the agreement loop: a sleep of half a poll, one ``check`` of the
    decision and one ``check`` of each member's ack, one after the other."""
    return t.poll_s / 2 + (members + 1) * request_latency(members, t, store, store.check_s)


def agreement_ops(members: int, failed: int, t: Timing, store: StoreCosts) -> int:
    """Store requests of one agreement and the epoch it opens, all survivors together.

    Per survivor: 1 ack ``set``; every loop pass ``members + 1`` checks, for as many
    passes as it waits for the others (arrivals spread over a poll plus the compute a
    revoke cannot cut short, so half that on average) and two more (the proposal, and
    seeing it); a ``compare_set``; a ``get`` of
    the decision; one eviction mark per failed member; then gloo's rendezvous of the new
    epoch (its address ``set`` and a ``get`` of every other survivor's) and the latest
    epoch ``set``.
    """
    s = members - failed
    wait = (t.poll_s + t.compute_s) / 2
    passes = math.ceil(wait / agreement_iteration_s(members, t, store)) + 2
    per_survivor = 1 + passes * (members + 1) + 2 + failed + 1 + (s - 1) + 1
    return s * per_survivor


def agreement_s(members: int, failed: int, t: Timing, store: StoreCosts) -> tuple[float, float]:
    """(latency, work time) of the agreement after the last survivor arrived.

    Latency: two loop passes (someone proposes, the last one sees it), the
    ``compare_set`` and the ``get``. Work time: every request of :func:`agreement_ops`
    at the service time, on the share of the store the fault-free load leaves (at least
    the survivors' share of all callers). The agreement takes the longer of the two.
    """
    latency = 2 * agreement_iteration_s(members, t, store)
    latency += request_latency(members, t, store, store.cas_s)
    latency += request_latency(members, t, store, store.get_s)
    s = members - failed
    share = max(1 - offered_load(members, t, store), s / (s + members))
    work = agreement_ops(members, failed, t, store) * store.service_s / share
    return latency, work


def open_epoch_s(members: int, survivors: int, t: Timing, store: StoreCosts) -> float:
    """Building the new epoch's gloo group: the measured 2-rank build, plus a ``get`` of
    each further peer's address and a connection to it (counted as one more request)."""
    each = request_latency(members, t, store, store.get_s)
    each += request_latency(members, t, store, store.check_s)
    return store.pg_build_s + max(0, survivors - 2) * each


def t3_s(members: int, failed: int, t: Timing, store: StoreCosts) -> float:
    """Detection to every survivor's first commit: the revoke seen by the last survivor
    (one poll), the in-flight compute it cannot interrupt (compute^2 / (2 step) on
    average), the agreement (its latency or its work time, whichever is longer), the
    new epoch's group, and the redone step (``t.step_s``)."""
    latency, work = agreement_s(members, failed, t, store)
    residual = t.compute_s**2 / (2 * t.step_s)
    return (
        t.poll_s
        + residual
        + max(latency, work)
        + open_epoch_s(members, members - failed, t, store)
        + t.step_s
    )


@dataclass(frozen=True)
class TorchftCosts:
    """torchft's published design, as assumed (see ``ft_scale_model.py``)."""

    name: str
    heartbeat_interval_s: float
    heartbeat_timeout_s: float
    quorum_tick_s: float
    pg_timeout_s: float
    rpc_s: float
    """Lighthouse time per request (gRPC), assumed."""
    rtt_s: float
    scan_s: float = 50e-9
    """Lighthouse time per replica group each quorum check scans, assumed."""


def torchft_quorum(ranks: int, groups: int, c: TorchftCosts) -> tuple[int, float, float]:
    """(messages, latency, Lighthouse load) of one quorum of ``groups`` replica groups
    of ``ranks`` ranks in all.

    Every rank asks its group's manager, every manager asks the Lighthouse, and the
    answers come back: 2 * (ranks + groups) messages. The Lighthouse serves requests one
    at a time under its state lock, and each request runs a quorum check that scans
    every group's heartbeat (``src/lighthouse.rs``): the last answer comes after half a
    tick, two round trips each way and groups * (rpc + groups * scan). Its fault-free
    load is one heartbeat per group per interval.
    """
    messages = 2 * (ranks + groups)
    latency = c.quorum_tick_s / 2 + 4 * c.rtt_s + groups * (c.rpc_s + groups * c.scan_s)
    load = groups / c.heartbeat_interval_s * c.rpc_s
    return messages, latency, load


def torchft_lost_s(
    ranks: int, groups: int, c: TorchftCosts, pg_build_s: float, step_s: float
) -> float:
    """Whole-job seconds lost to one host failure: survivors blocked in the cross-group
    all-reduce until the process group's timeout (gloo cannot be told a peer died) or
    the Lighthouse's heartbeat timeout, whichever ends later, then a quorum, the
    process group's reconfiguration and the redone step."""
    _, quorum, _ = torchft_quorum(ranks, groups, c)
    return max(c.pg_timeout_s, c.heartbeat_timeout_s) + quorum + pg_build_s + step_s


def young_daly_interval_s(ckpt_write_s: float, job_mtbf_s: float) -> float:
    """The checkpoint interval that minimises lost time: sqrt(2 * write * MTBF)."""
    return math.sqrt(2 * ckpt_write_s * job_mtbf_s)


def restart_goodput(
    job_mtbf_s: float, restart_s: float, ckpt_write_s: float, interval_s: float
) -> float:
    """Full restart from a checkpoint: each failure costs the restart and half an
    interval of rework on average; each interval costs a checkpoint write."""
    return max(
        0.0, (1 - ckpt_write_s / interval_s) * (1 - (restart_s + interval_s / 2) / job_mtbf_s)
    )


@dataclass(frozen=True)
class Design:
    """One way to run the 1,000-host job, as the goodput table lists it."""

    name: str
    lost_s: float
    """Whole-job seconds lost per host failure (inf: the control plane cannot keep up)."""
    degraded_s: float = 0.0
    """Seconds one host's share of the job is missing per failure (until replaced)."""
    overhead: float = 0.0
    """Fraction of fault-free throughput the design costs."""


def goodput(d: Design, hosts: int, job_mtbf_s: float) -> float:
    """Useful fraction of the job's time: fault-free overhead, whole-job stalls and the
    missing host's share until it is replaced, per failure (one every ``job_mtbf_s``)."""
    if math.isinf(d.lost_s):
        return 0.0
    lost = d.lost_s + d.degraded_s / hosts
    return max(0.0, (1 - d.overhead) * (1 - lost / job_mtbf_s))
