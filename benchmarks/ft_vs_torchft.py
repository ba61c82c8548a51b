"""torchnext against torchft, its closest peer: step overhead, recovery, goodput, replacement.

Both systems train the same model, the character transformer of
``examples/fault_tolerant_transformer.py`` at d_model 128, 5 layers, sequence 64 (1.0 M
parameters, 12 MB of parameters and AdamW moments), with the same seed and data (global
batch 48, 12 samples per replica on 4 replicas), AdamW and gradient clipping, on 4
replicas, one process each, over gloo on CPU. torchnext runs under its agent
(:class:`~torchnext.distributed.Agent`, ``torchnext run``) at its defaults; torchft runs
as 4 processes plus a Lighthouse (``torchft.Manager``, ``ProcessGroupGloo``, its
``DistributedDataParallel`` and the optimizer wrapper's quorum/commit protocol). A killed
replica is restarted the same way for both: cold (a new interpreter), with no spares.

Every figure comes from timestamps the workers log (``time.monotonic``, one clock for the
whole machine) next to the moment the harness sent SIGKILL:

* fault-free step time: windows of ``--window-steps`` steps, the two jobs taking turns
  (both stay alive; the one not measured waits at a step boundary), ``--reps`` times;
* recovery (``ready``, the keys): from the kill -9 to the moment the last survivor's
  membership is usable: torchnext's first collective after the shrink completed,
  torchft's quorum and process-group reconfiguration done (its first collective is the
  gradient all-reduce, after the step's compute); ``resume`` beside it runs to the last
  survivor's first committed gradient all-reduce in the new membership (one step's
  compute included for both);
* replacement: from the kill to the moment the new process holds the healed state
  (torchnext: the manager's ``healed`` event; torchft: the checkpoint received from a
  peer), less the survivors' step compute it waited through to be admitted at a step
  boundary; with a warm spare (``AgentConfig(spares=1)``) and cold;
* goodput: committed samples per second over ``--goodput-s`` seconds (split in
  ``--goodput-rounds`` interleaved rounds) with a kill every ``--kill-every-s`` seconds,
  same victims and times for both systems.

torchft runs at its defaults (the Lighthouse binary's, with the ``--min_replicas 1`` of
its README, and ``Manager``'s) and at the fastest setting of a ladder that shows no false
failure in a fault-free run of ``--tune-s`` seconds (``--full-tune-check``: 300 s), both
reported with their values. Usage::

    torchnext bench ft-vs-torchft [--quick] [--full-tune-check] [--tune-only] [--reps 12]

Needs torchft: ``pip install 'torch==2.13.0' -e '.[bench]'``. The workers and the torchft
settings are in ``_ft_vs_torchft_workers.py``; the jobs and the figures read from the
workers' logs in ``_ft_vs_torchft_jobs.py``.
"""

from __future__ import annotations

import argparse
import importlib.util
import random
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from _ft_vs_torchft_jobs import (
    Job,
    Kill,
    TorchftJob,
    TorchnextJob,
    checked_window,
    committed_samples,
    false_failures,
    free_step_s,
    kill_figures,
    slot_of,
    spare_ready,
    spares_supported,
    step_window,
    survivors_of,
)
from _ft_vs_torchft_workers import (
    GLOBAL_BATCH,
    INSTALL_HINT,
    NPROC,
    SEED,
    TORCHFT_DEFAULT,
    TUNE_LADDER,
    FtSetting,
    build_model,
    run_lighthouse,
    torchft_worker,
    torchnext_worker,
)


@dataclass
class Race:
    """The run's plan (from the command line) and what it measured."""

    args: argparse.Namespace
    root: Path
    script: str
    ctl: Any
    ctl_addr: str
    jobs: list[Job] = field(default_factory=list)
    rng: random.Random = field(default_factory=lambda: random.Random(SEED))

    def job(self, system: str, name: str, **kw: Any) -> Job:
        cls = TorchnextJob if system == "torchnext" else TorchftJob
        job = cls(name, self.root, self.script, self.ctl, self.ctl_addr, **kw)
        self.jobs.append(job)
        return job

    def close(self, job: Job) -> None:
        job.close()
        if job in self.jobs:
            self.jobs.remove(job)

    def launch(self, job: Job) -> float:
        """Start ``job``, let it run until steady; returns the time it became steady."""
        _say(f"starting {job.name}")
        job.start()
        job.release()
        job.wait(job.steady, 240, "steady state after start")
        return time.monotonic()

    # ------------------------------------------------------------------ tuning

    def tune(self, tune_s: float) -> tuple[Job, FtSetting, list[dict[str, Any]]]:
        """The fastest setting of the ladder that runs ``tune_s`` s with no false failure.

        Fault-free, and run as the race runs a job: windows of steps, held in between
        (releasing a held job is a moment of skew between its replicas). The job of the
        chosen setting is returned running; the last setting is taken if none passes.
        """
        rows: list[dict[str, Any]] = []
        for i, setting in enumerate(TUNE_LADDER):
            job = self.job("torchft", f"ft-{setting.name}", setting=setting)
            problems: list[str] = []
            checked = 0.0
            try:
                t_steady = self.launch(job)
                while not problems and time.monotonic() - t_steady < tune_s:
                    problems = checked_window(job, t_steady)
                    time.sleep(0.5)  # held, as between the race's windows
                checked = time.monotonic() - t_steady
            except TimeoutError as exc:
                problems.append(f"stalled: {str(exc).splitlines()[0][:160]}")
            rows.append({"setting": setting, "checked_s": checked, "problems": problems})
            verdict = "; ".join(problems) or "no false failure"
            _say(f"tune {setting.name}: {checked:.0f} s fault-free: {verdict}")
            if not problems or i == len(TUNE_LADDER) - 1:
                return job, setting, rows
            self.close(job)
        raise AssertionError("TUNE_LADDER is empty")

    # ------------------------------------------------------------------ faults

    def kill_steady(self, job: Job, slot: int, span_s: float) -> Kill:
        """Kill ``slot`` once the job is steady (at a random moment of a step); wait ``span_s``."""
        job.wait(job.steady, 240, "steady state before a kill")
        time.sleep(self.rng.uniform(0.0, 0.3))
        survivors = survivors_of(job, slot)
        victim = job.live()[slot]
        kill = Kill(t0=job.kill(slot), victim=victim, survivors=survivors, steady=True)
        kill.until = kill.t0 + span_s

        def settled() -> bool:
            job.logs.refresh()
            f = kill_figures(job.logs, kill, job.exited, job.assigned)
            return (
                f["replacement_s"] is not None and f["resume_s"] is not None and not f["censored"]
            )

        try:
            job.wait(settled, span_s, "recovery and replacement")
        except TimeoutError as exc:
            _say(f"  {exc}")
        return kill

    def goodput_window(
        self, job: Job, schedule: list[tuple[float, int]], window_s: float
    ) -> tuple[float, float, list[Kill], int]:
        """Committed samples, seconds and membership changes over ``window_s`` with the kills.

        The job is held afterwards, once steady again (the last kill's replacement healed).
        """
        job.release()
        job.settle(240, "steady state before the goodput window")
        t_start = time.monotonic()
        kills: list[Kill] = []
        for offset, slot in schedule:
            while time.monotonic() < t_start + offset:
                job.poll()
                time.sleep(0.02)
            steady = job.steady()
            if slot not in job.live():
                _say(f"  {job.name}: slot {slot} not running at +{offset:.0f} s; kill skipped")
                continue
            survivors = survivors_of(job, slot)
            victim = job.live()[slot]
            kills.append(Kill(t0=job.kill(slot), victim=victim, survivors=survivors, steady=steady))
        while time.monotonic() < t_start + window_s:
            job.poll()
            time.sleep(0.05)
        t_end = time.monotonic()
        for k, nxt in zip(kills, [*kills[1:], None], strict=True):
            k.until = nxt.t0 if nxt is not None else t_end
        job.logs.refresh()
        samples = committed_samples(job, t_start, t_end)
        mids = {r["mid"] for r in job.logs.steps() if t_start < r["t"] <= t_end}
        job.hold()
        if kills:
            kills[-1].until = time.monotonic()
        return samples, t_end - t_start, kills, len(mids) - 1


def _say(message: str) -> None:
    print(f"ft-vs-torchft: {message}", file=sys.stderr, flush=True)


def _schedule(rng: random.Random, window_s: float, every_s: float) -> list[tuple[float, int]]:
    """One kill every ``every_s`` seconds, mid-period, of a random replica (by index)."""
    count = max(1, int(window_s // every_s))
    return [(every_s / 2 + i * every_s, rng.randrange(NPROC)) for i in range(count)]


@dataclass
class Outcome:
    """Per-system figures gathered by the phases of :func:`_race`."""

    step_s: dict[str, list[float]] = field(default_factory=dict)
    kills: dict[str, list[tuple[Kill, dict[str, float | None]]]] = field(default_factory=dict)
    goodput: dict[str, list[float]] = field(default_factory=dict)
    false_failures: dict[str, list[str]] = field(default_factory=dict)
    free_step_s: dict[str, float | None] = field(default_factory=dict)
    tuned: FtSetting | None = None
    tune_rows: list[dict[str, Any]] = field(default_factory=list)
    spare_note: str = ""

    def add_kills(self, case: str, job: Job, kills: list[Kill]) -> None:
        job.logs.refresh()
        out = self.kills.setdefault(case, [])
        for k in kills:
            figures = kill_figures(job.logs, k, job.exited, job.assigned)
            out.append((k, figures))
            _say(
                f"  {case}: kill {len(out)} (steady={k.steady}) resume={_fmt_s(figures['resume_s'])} "
                f"ready={_fmt_s(figures['ready_s'])} replacement={_fmt_s(figures['replacement_s'])}"
            )


def _fmt_s(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}s"


def _race(race: Race, outcome: Outcome) -> None:
    a = race.args
    tn = race.job("torchnext", "torchnext")
    race.launch(tn)
    tn.hold()
    ft, outcome.tuned, outcome.tune_rows = race.tune(a.tune_s)
    if a.tune_only:
        return
    tuned_case = f"torchft tuned ({outcome.tuned.name})"
    ft.hold()

    _say(f"fault-free step time: {a.reps} interleaved windows of {a.window_steps} steps")
    t0 = time.monotonic()
    for rep in range(a.reps):
        for job in [tn, ft] if rep % 2 == 0 else [ft, tn]:
            case = "torchnext" if job is tn else tuned_case
            outcome.step_s.setdefault(case, []).append(step_window(job, a.window_steps))
    t1 = time.monotonic()
    outcome.false_failures["torchnext"] = false_failures(tn, t0, t1)
    outcome.false_failures[tuned_case] = false_failures(ft, t0, t1)

    _say(f"goodput: {a.goodput_rounds} round(s) of {a.goodput_s / a.goodput_rounds:.0f} s each")
    window = a.goodput_s / a.goodput_rounds
    for rnd in range(a.goodput_rounds):
        schedule = _schedule(race.rng, window, a.kill_every_s)
        for job in [tn, ft] if rnd % 2 == 0 else [ft, tn]:
            case = "torchnext" if job is tn else tuned_case
            plan = [(offset, slot_of(job, index)) for offset, index in schedule]
            samples, seconds, kills, changes = race.goodput_window(job, plan, window)
            acc = outcome.goodput.setdefault(case, [0.0, 0.0, 0.0])
            acc[0] += samples
            acc[1] += seconds
            acc[2] += changes
            outcome.add_kills(case, job, kills)
    outcome.free_step_s["torchnext"] = free_step_s(tn)
    outcome.free_step_s[tuned_case] = free_step_s(ft)
    race.close(ft)

    fd = race.job("torchft", "ft-default", setting=TORCHFT_DEFAULT)
    race.launch(fd)
    kills = []
    budget_end = time.monotonic() + a.default_budget_s
    while len(kills) < a.default_kills and (not kills or time.monotonic() < budget_end):
        span = max(30.0, min(a.default_span_s, budget_end - time.monotonic()))
        try:
            kills.append(race.kill_steady(fd, slot_of(fd, race.rng.randrange(NPROC)), span))
        except TimeoutError as exc:  # never steady again after the last kill
            _say(f"  torchft defaults: no more kills: {str(exc).splitlines()[0][:160]}")
            break
    outcome.add_kills("torchft defaults", fd, kills)
    outcome.free_step_s["torchft defaults"] = free_step_s(fd)
    race.close(fd)
    race.close(tn)

    outcome.spare_note = spares_supported()
    if outcome.spare_note:
        _say(outcome.spare_note)
        return
    sp = race.job("torchnext", "torchnext-spare", spares=1)
    race.launch(sp)
    kills = []
    for _ in range(a.spare_kills):
        try:
            sp.wait(lambda: spare_ready(sp), 120, "a warm spare")
            kills.append(race.kill_steady(sp, slot_of(sp, race.rng.randrange(NPROC)), 60))
        except TimeoutError as exc:
            _say(f"  torchnext + warm spare: no more kills: {str(exc).splitlines()[0][:160]}")
            break
    outcome.add_kills("torchnext + warm spare", sp, kills)
    race.close(sp)


# ----------------------------------------------------------------------------- report


def _finite(values: list[float | None]) -> list[float]:
    return [v for v in values if v is not None and v != float("inf")]


def _median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def _ratio(num: float | None, den: float | None) -> float | None:
    return num / den if num is not None and den else None


def _case_figures(outcome: Outcome, case: str) -> dict[str, Any]:
    pairs = outcome.kills.get(case, [])
    # Kills that found the job training steadily; all of them if none did (a short run).
    steady = [f for k, f in pairs if k.steady] or [f for _k, f in pairs]
    ready = _finite([f["ready_s"] for f in steady])
    resume = _finite([f["resume_s"] for f in steady])
    gp = outcome.goodput.get(case)
    return {
        "kills": len(pairs),
        "steady_kills": sum(1 for k, _f in pairs if k.steady),
        "ready_p50_s": _median(ready),
        "ready_max_s": max(ready) if ready else None,
        "resume_p50_s": _median(resume),
        "resume_max_s": max(resume) if resume else None,
        "censored": int(sum(f["censored"] or 0 for f in steady)),
        "collateral_exits": int(sum(f["collateral"] or 0 for _k, f in pairs)),
        "replacement_p50_s": _median(_finite([f["replacement_s"] for _k, f in pairs])),
        "replacement_raw_p50_s": _median(_finite([f["replacement_raw_s"] for _k, f in pairs])),
        "goodput_samples_per_s": gp[0] / gp[1] if gp and gp[1] else None,
        "goodput_membership_changes": int(gp[2]) if gp else None,
    }


def _report(race: Race, outcome: Outcome, wall_s: float) -> int:
    from torchnext.benchmarking import Report, Timing, paired_difference

    a = race.args
    report = Report(
        name="ft-vs-torchft",
        columns=[
            "case",
            "step_s",
            "spread",
            "kills",
            "ready_p50_s",
            "ready_max_s",
            "resume_p50_s",
            "replace_s",
            "replace_raw_s",
            "goodput_sps",
            "changes",
            "false_fail",
            "collateral",
        ],
    )
    tuned = outcome.tuned
    tuned_case = f"torchft tuned ({tuned.name})" if tuned else ""
    figures: dict[str, dict[str, Any]] = {}
    cases = list(dict.fromkeys([*outcome.step_s, *outcome.kills, *outcome.free_step_s]))
    for case in cases:
        f = figures[case] = _case_figures(outcome, case)
        steps = outcome.step_s.get(case)
        timing = Timing(case, tuple(steps)) if steps else None
        step_s = timing.median_s if timing else outcome.free_step_s.get(case)
        f["step_s"] = step_s
        f["step_spread"] = timing.spread if timing else None
        report.add(
            case=case,
            step_s=_opt(step_s),
            spread=timing.spread if timing else ("free-run" if step_s else ""),
            kills=_kills_cell(f),
            ready_p50_s=_opt(f["ready_p50_s"]),
            ready_max_s=_opt(f["ready_max_s"]),
            resume_p50_s=_opt(f["resume_p50_s"]),
            replace_s=_opt(f["replacement_p50_s"]),
            replace_raw_s=_opt(f["replacement_raw_p50_s"]),
            goodput_sps=_opt(f["goodput_samples_per_s"]),
            changes=_opt(f["goodput_membership_changes"]),
            false_fail=len(outcome.false_failures[case]) if case in outcome.false_failures else "",
            collateral=f["collateral_exits"] if f["kills"] else "",
        )
    summary: dict[str, Any] = {}
    tn_steps = outcome.step_s.get("torchnext", [])
    ft_steps = outcome.step_s.get(tuned_case, [])
    if tn_steps and ft_steps:
        tn_med, ft_med = statistics.median(tn_steps), statistics.median(ft_steps)
        diff = paired_difference(ft_steps, tn_steps).relative_to(ft_med)
        summary["step_overhead_ratio_vs_torchft"] = tn_med / ft_med
        summary["step_overhead_ratio_ci95"] = [1 + diff.lo, 1 + diff.hi]
        summary["step_s_torchnext"] = tn_med
        summary["step_s_torchft_tuned"] = ft_med
        summary["step_spread_torchnext"] = Timing("tn", tuple(tn_steps)).spread
        summary["step_spread_torchft_tuned"] = Timing("ft", tuple(ft_steps)).spread
        summary["step_reps"] = len(tn_steps)
    tn = figures.get("torchnext", {})
    default = figures.get("torchft defaults", {})
    tuned_f = figures.get(tuned_case, {})
    summary["recovery_speedup_vs_torchft"] = _ratio(
        default.get("ready_p50_s"), tn.get("ready_p50_s")
    )
    summary["recovery_ratio_vs_tuned_torchft"] = _ratio(
        tuned_f.get("ready_p50_s"), tn.get("ready_p50_s")
    )
    summary["recovery_speedup_vs_torchft_with_step"] = _ratio(
        default.get("resume_p50_s"), tn.get("resume_p50_s")
    )
    summary["recovery_ratio_vs_tuned_torchft_with_step"] = _ratio(
        tuned_f.get("resume_p50_s"), tn.get("resume_p50_s")
    )
    summary["recovery_lower_bound_cases"] = [c for c, f in figures.items() if f["censored"]]
    summary["goodput_ratio_vs_torchft"] = _ratio(
        tn.get("goodput_samples_per_s"), tuned_f.get("goodput_samples_per_s")
    )
    spare = figures.get("torchnext + warm spare", {}).get("replacement_p50_s")
    summary["spare_replacement_s"] = spare
    if spare is None:
        summary["spare_replacement_note"] = outcome.spare_note or "no spare healed in time"
    summary["cold_replacement_s"] = tn.get("replacement_p50_s")
    summary["cold_replacement_torchft_tuned_s"] = tuned_f.get("replacement_p50_s")
    tune = _tune_summary(outcome)
    summary["torchft_default_setting"] = tune["torchft_default_setting"]
    summary["torchft_tuned_setting"] = tune["torchft_tuned_setting"]
    summary["torchft_tuned_false_failures"] = (
        len(outcome.tune_rows[-1]["problems"]) + len(outcome.false_failures.get(tuned_case, []))
        if outcome.tune_rows
        else None
    )
    summary["tune_check_s"] = a.tune_s
    summary["tune_ladder"] = tune["tune_ladder"]
    summary["false_failures_fault_free"] = outcome.false_failures
    summary["model"] = _model_size()
    summary["replicas"] = NPROC
    summary["global_batch"] = GLOBAL_BATCH
    summary["goodput_s"] = a.goodput_s
    summary["kill_every_s"] = a.kill_every_s
    summary["quick"] = bool(a.quick)
    summary["wall_s"] = round(wall_s, 1)
    report.summary = summary
    report.notes += NOTES
    if outcome.spare_note:
        report.notes.append(outcome.spare_note)
    report.write(_results_path(a))
    return 0


NOTES = [
    "ready: kill -9 to the last survivor's membership being usable, no step compute "
    "(torchnext: its first collective after the shrink; torchft: quorum and process-group "
    "reconfiguration done); the recovery keys use it; resume: to its first committed "
    "gradient all-reduce in the new membership (one step's compute included; torchft's "
    "async quorum overlaps its forward pass with the recovery); p50 over kills that found "
    "the job steady (steady/all kills in 'kills')",
    "replace: kill to the replacement holding the healed state, less the survivors' step "
    "compute it waited through for admission; replace_raw: with it; cold = a new "
    "interpreter started at once, no spare, for both systems",
    "step_s: median of interleaved fault-free windows, spread = (p90-p10)/median "
    "(free-run: median gap between steady steps); goodput: committed samples per second "
    "with kills on the same schedule for both; changes: membership changes in the goodput "
    "windows; false_fail: kinds of false failure in the fault-free windows; collateral: "
    "survivors that exited after a kill",
]


def _tune_summary(outcome: Outcome) -> dict[str, Any]:
    tuned = outcome.tuned
    return {
        "torchft_default_setting": TORCHFT_DEFAULT.values(),
        "torchft_tuned_setting": {"name": tuned.name, **tuned.values()} if tuned else None,
        "tune_ladder": [
            {
                "setting": r["setting"].name,
                **r["setting"].values(),
                "fault_free_s": round(r["checked_s"], 1),
                "false_failures": r["problems"],
            }
            for r in outcome.tune_rows
        ],
    }


def _tune_report(race: Race, outcome: Outcome) -> int:
    """``--tune-only``: the ladder, what each setting did fault-free, the chosen one."""
    from torchnext.benchmarking import Report

    report = Report(
        name="ft-vs-torchft-tune",
        columns=[
            "setting",
            "heartbeat_ms",
            "pg_ms",
            "join_ms",
            "tick_ms",
            "fault_free_s",
            "verdict",
        ],
    )
    for r in outcome.tune_rows:
        v = r["setting"].values()
        report.add(
            setting=r["setting"].name,
            heartbeat_ms=v["heartbeat_timeout_ms"],
            pg_ms=v["pg_timeout_ms"],
            join_ms=v["join_timeout_ms"],
            tick_ms=v["quorum_tick_ms"],
            fault_free_s=r["checked_s"],
            verdict="; ".join(r["problems"]) or "no false failure",
        )
    report.summary = {**_tune_summary(outcome), "tune_check_s": race.args.tune_s}
    report.summary.pop("tune_ladder")  # the table
    report.write(_results_path(race.args))
    return 0


def _kills_cell(f: dict[str, Any]) -> str:
    if not f["kills"]:
        return ""
    cell = f"{f['steady_kills']}/{f['kills']}"
    return cell + (f" ({f['censored']} >span)" if f["censored"] else "")


def _opt(value: float | None) -> float | str:
    return "" if value is None else value


def _results_path(args: argparse.Namespace) -> Path | None:
    if not args.quick and not args.tune_only:
        return None
    from torchnext.benchmarking import results_dir

    suffix = "quick" if args.quick else "tune"
    return results_dir() / f"ft-vs-torchft-{suffix}.json"


def _model_size() -> dict[str, float]:
    _data, model, opt = build_model()
    params = sum(p.numel() for p in model.parameters())
    return {"parameters": params, "state_mb": round(params * 4 * 3 / 1e6, 2)}


# ----------------------------------------------------------------------------- main


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="torchnext bench ft-vs-torchft",
        description="torchnext against torchft: step overhead, recovery, goodput, replacement",
    )
    p.add_argument("--quick", action="store_true", help="a short smoke run (a few minutes)")
    p.add_argument("--reps", type=int, default=12, help="interleaved fault-free windows (>= 10)")
    p.add_argument("--window-steps", type=int, default=12, help="steps per fault-free window")
    p.add_argument("--tune-s", type=float, default=60.0, help="fault-free check of each setting")
    p.add_argument(
        "--full-tune-check", action="store_true", help="check the tuned setting for 300 s"
    )
    p.add_argument("--tune-only", action="store_true", help="only run the tuning check")
    p.add_argument("--goodput-s", type=float, default=240.0, help="goodput window per system")
    p.add_argument("--goodput-rounds", type=int, default=2, help="interleaved goodput rounds")
    p.add_argument("--kill-every-s", type=float, default=30.0)
    p.add_argument("--default-kills", type=int, default=3, help="kills of torchft at defaults")
    p.add_argument(
        "--default-span-s", type=float, default=150.0, help="longest wait for one recovery"
    )
    p.add_argument(
        "--default-budget-s", type=float, default=240.0, help="time for the torchft-defaults kills"
    )
    p.add_argument("--spare-kills", type=int, default=3)
    p.add_argument("--seed", type=int, default=SEED)
    p.add_argument("--keep-logs", default="", help="write the worker logs here and keep them")
    # Worker and Lighthouse processes started by the harness.
    p.add_argument("--worker", choices=["torchnext", "torchft"], help=argparse.SUPPRESS)
    p.add_argument("--run-lighthouse", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--lighthouse", default="", help=argparse.SUPPRESS)
    p.add_argument("--ft-setting", default="", help=argparse.SUPPRESS)
    p.add_argument("--slot", type=int, default=0, help=argparse.SUPPRESS)
    p.add_argument("--log-dir", default="", help=argparse.SUPPRESS)
    p.add_argument("--ctl", default="", help=argparse.SUPPRESS)
    p.add_argument("--job", default="", help=argparse.SUPPRESS)
    return p


def main(argv: list[str]) -> int:
    args = _parser().parse_args(argv)
    if args.worker == "torchnext":
        return torchnext_worker(args)
    if args.worker == "torchft":
        return torchft_worker(args)
    if args.run_lighthouse:
        return run_lighthouse(args)
    if importlib.util.find_spec("torchft") is None:
        print(
            "ft-vs-torchft needs torchft (torchft-nightly, pinned in the 'bench' extra): "
            f"{INSTALL_HINT}",
            file=sys.stderr,
        )
        return 2
    if args.full_tune_check:
        args.tune_s = 300.0
    if args.quick:
        args.reps, args.window_steps, args.tune_s = 3, 8, min(args.tune_s, 10.0)
        args.goodput_s, args.goodput_rounds, args.kill_every_s = 40.0, 1, 20.0
        args.default_kills, args.spare_kills, args.default_span_s = 1, 1, 90.0
        args.default_budget_s = 90.0
    if args.reps < 1 or args.window_steps < 3 or args.goodput_rounds < 1:
        print("ft-vs-torchft: need --reps >= 1, --window-steps >= 3, --goodput-rounds >= 1")
        return 2

    import torch.distributed as dist

    t_start = time.monotonic()
    ctl = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    outcome = Outcome()
    with tempfile.TemporaryDirectory(prefix="ft-vs-torchft-") as tmp:
        root = Path(args.keep_logs).resolve() if args.keep_logs else Path(tmp)
        race = Race(
            args=args,
            root=root,
            script=str(Path(__file__).resolve()),
            ctl=ctl,
            ctl_addr=f"127.0.0.1:{ctl.port}",
            rng=random.Random(args.seed),
        )
        try:
            _race(race, outcome)
        finally:
            for job in list(race.jobs):
                race.close(job)
    if args.tune_only:
        return _tune_report(race, outcome)
    return _report(race, outcome, time.monotonic() - t_start)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
