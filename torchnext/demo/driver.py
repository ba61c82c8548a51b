"""Drives ``torchnext demo``: reference run, supervised faulty run, live view, summary, plot.

The driver hosts the store through the agent (:class:`~torchnext.distributed.launcher.Agent`),
injects the configured faults when their step has committed, polls what the workers
report under ``torchnext/demo/`` in the store, and turns it into the summary dict that
``--json`` prints (keys: ``failures``, ``recovery_s``, ``detection_s``, ``heal_s``,
``final_loss``, ``reference_final_loss``, ``replicas_identical``, ``plot``, ...).

Definitions used in the summary (all wall-clock, one machine):
detection = fault injected -> first survivor's ``failure_detected`` (or aborted step);
recovery = fault injected -> first step committed by the shrunk membership;
healing = replacement process started -> ``healed`` (state received, training).
"""

from __future__ import annotations

import json
import re
import signal
import sys
import tempfile
import time
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch

from torchnext.demo.plot import Marker, write_plot
from torchnext.demo.trainer import KEY, reference_run
from torchnext.demo.view import LiveState, LiveView, extras_hint, missing_extras
from torchnext.distributed.launch.agent import FINISHED_KEY, Agent, AgentConfig, AgentEvent

__all__ = ["DemoConfig", "run_demo"]


@dataclass(frozen=True, kw_only=True)
class DemoConfig:
    """What ``torchnext demo`` runs."""

    workers: int = 4
    steps: int = 300
    faults: tuple[tuple[str, int, int], ...] = (("kill", 1, 80), ("stop", 2, 170))
    """``(kind, slot, step)``: ``kill``/``stop`` the worker in ``slot`` after ``step`` committed."""
    seed: int = 0
    batch: int = 64
    lr: float = 2e-3
    pace_ms: float = 40.0
    max_restarts: int = 4
    plot: str = "torchnext-demo.png"
    timeout_s: float = 240.0
    generated_data: bool = False

    def __post_init__(self) -> None:
        if self.workers < 2:
            raise ValueError(
                f"DemoConfig.workers={self.workers}: the demo needs at least 2 workers."
            )
        if self.steps < 1:
            raise ValueError(f"DemoConfig.steps={self.steps} must be positive.")
        for kind, slot, step in self.faults:
            if not 0 <= slot < self.workers:
                raise ValueError(
                    f"fault {kind}:{slot}@{step}: slot must be in [0, {self.workers})."
                )
            if not 0 < step < self.steps:
                raise ValueError(f"fault {kind}:{slot}@{step}: step must be in (0, {self.steps}).")
        if len({slot for _, slot, _ in self.faults}) >= self.workers:
            raise ValueError("faults hit every worker slot; leave at least one worker untouched.")


class _Poller:
    """Reads what workers reported to the store, incrementally."""

    def __init__(self, store: Any) -> None:
        self.store = store
        self.events: list[dict[str, Any]] = []
        self.steps: dict[int, dict[str, Any]] = {}

    def poll(self) -> None:
        s = self.store
        if s.check([f"{KEY}/events/count"]):
            count = int(s.add(f"{KEY}/events/count", 0))
            while len(self.events) < count:
                key = f"{KEY}/events/{len(self.events) + 1}"
                if not s.check([key]):
                    break  # counted but not yet written
                self.events.append(json.loads(s.get(key)))
        if s.check([f"{KEY}/latest"]):
            latest = int(s.get(f"{KEY}/latest"))
            for step in range(max(self.steps, default=0) + 1, latest + 1):
                key = f"{KEY}/step/{step}"
                if s.check([key]):
                    self.steps[step] = json.loads(s.get(key))

    @property
    def latest(self) -> int:
        return max(self.steps, default=0)


_BRACKETED = re.compile(r"\[[^\]]*\]\s*")


def _short_reason(reason: str, limit: int = 90) -> str:
    """A revoke reason without backend source paths, cut to ``limit`` characters."""
    text = _BRACKETED.sub("", reason).strip()
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _describe_event(e: dict[str, Any], seen: set[tuple[Any, ...]]) -> str | None:
    """One line for the live view; every member reports the same transition, show it once."""
    kind, member, d = e["kind"], e["member"], e["detail"]
    if kind == "failure_detected":
        key: tuple[Any, ...] = (kind, d.get("revoked_epoch"))
        text = f"failure detected, epoch {d.get('revoked_epoch')} revoked: {_short_reason(str(d.get('reason', '')))}"
    elif kind in ("shrink", "grow"):
        members = tuple(d.get("members", []))
        key = (kind, members)
        if kind == "shrink":
            text = f"shrink: removed {d.get('removed')} -> world {len(members)} {list(members)}"
        else:
            text = f"grow: admitted {d.get('added')} -> world {len(members)} {list(members)}"
    elif kind == "healed":
        key = (kind, member)
        text = (
            f"{member} healed from {d.get('source')} over the network "
            f"({d.get('bytes', 0) / 1e6:.2f} MB in {d.get('seconds', 0):.2f} s), at step {d.get('step')}"
        )
    elif kind == "joined":
        key = (kind, member)
        text = f"{member} admitted by grow, healing from a live peer"
    elif kind == "replica_mismatch":
        key = (kind, member, d.get("step"))
        text = f"{member}: REPLICAS DIFFER {d.get('checksums')}"
    else:
        return None
    if key in seen:
        return None
    seen.add(key)
    return text


def run_demo(config: DemoConfig, *, live: bool = True) -> dict[str, Any]:
    """Run the whole demo; returns the summary (see the module docstring for its keys)."""
    from torchnext.demo.data import load_dataset

    missing = missing_extras()
    if missing:
        # stderr, so that --json's stdout stays one JSON document.
        print(extras_hint(missing), file=sys.stderr, flush=True)
    t_start = time.time()
    data = load_dataset(prefer_real=not config.generated_data, seed=config.seed)
    # One thread: the model is tiny, and intra-op threads only contend with the workers
    # (on a busy 2-core machine two threads made this run eight times slower).
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        ref_losses, ref_state = reference_run(
            steps=config.steps, batch=config.batch, seed=config.seed, lr=config.lr, data=data
        )
    finally:
        torch.set_num_threads(threads)
    state = LiveState(total_steps=config.steps, world_size=config.workers)
    shown_events = 0
    seen_events: set[tuple[Any, ...]] = set()
    fault_log: list[dict[str, Any]] = []
    agent_events: list[AgentEvent] = []

    def on_agent_event(e: AgentEvent) -> None:
        agent_events.append(e)
        if e.kind in ("replacing", "exited", "gave_up", "evicting"):
            state.events.append(f"agent: {e.message.splitlines()[0]}")

    with tempfile.TemporaryDirectory(prefix="torchnext-demo-") as tmp:
        command = [
            "-m",
            "torchnext.demo.trainer",
            f"--steps={config.steps}",
            f"--batch={config.batch}",
            f"--seed={config.seed}",
            f"--lr={config.lr}",
            f"--pace-ms={config.pace_ms}",
            f"--result-dir={tmp}",
        ] + (["--generated-data"] if config.generated_data else [])
        agent_cfg = AgentConfig(
            nproc=config.workers,
            max_restarts=config.max_restarts,
            log_dir=str(Path(tmp) / "logs"),
            term_grace=timedelta(seconds=3),
            finish_grace=timedelta(seconds=15),
        )
        agent = Agent(command, agent_cfg, on_event=on_agent_event)
        t_agent0 = time.time()
        pending = sorted(config.faults, key=lambda f: f[2])
        timed_out = False
        view = LiveView() if live else None
        try:
            agent.start()
            poller = _Poller(agent.store)
            deadline = time.monotonic() + config.timeout_s
            while agent.poll():
                poller.poll()
                latest = poller.latest
                while pending and latest >= pending[0][2]:
                    kind, slot, step = pending.pop(0)
                    sig = signal.SIGKILL if kind == "kill" else signal.SIGSTOP
                    member = agent.workers[slot].member_id if slot in agent.workers else "?"
                    pid = agent.signal_worker(slot, sig)
                    fault_log.append(
                        {
                            "kind": kind,
                            "slot": slot,
                            "member": member,
                            "pid": pid,
                            "step": latest,
                            "time": time.time(),
                        }
                    )
                    state.events.append(
                        f"demo: {sig.name} -> {member} (pid {pid}) after step {latest}"
                    )
                for e in poller.events[shown_events:]:
                    text = _describe_event(e, seen_events)
                    if text:
                        state.events.append(text)
                shown_events = len(poller.events)
                if latest in poller.steps:
                    rec = poller.steps[latest]
                    state.step, state.loss, state.world_size = latest, rec["loss"], rec["world"]
                    state.members = tuple(rec["members"])
                state.phase = "training" if latest < config.steps else "finishing"
                if view is not None:
                    view.render(state)
                if (
                    agent.store is not None
                    and agent.store.check([FINISHED_KEY])
                    and latest >= config.steps
                ):
                    # Training is over: do not wait for a straggling joiner's bounded join.
                    if all(w.replacement for w in agent.workers.values()):
                        agent.shutdown()
                if time.monotonic() > deadline:
                    timed_out = True
                    state.events.append(f"demo: timed out after {config.timeout_s:.0f} s")
                    break
                time.sleep(0.05)
            poller.poll()
            finals = {}
            for key_member in {e["member"] for e in poller.events} | {
                w.member_id for w in agent.exits
            }:
                key = f"{KEY}/final/{key_member}"
                if agent.store is not None and agent.store.check([key]):
                    finals[key_member] = json.loads(agent.store.get(key))
            final_path = Path(tmp) / "final_state.pt"
            final_state = torch.load(final_path) if final_path.exists() else None
            logs = {
                p.stem: p.read_text(errors="replace")[-3000:]
                for p in (Path(tmp) / "logs").glob("*.log")
            }
        finally:
            agent.close()
            if view is not None:
                view.render(state)
                view.close()

    return _summarise(
        config=config,
        data_name=data.name,
        poller=poller,
        fault_log=fault_log,
        agent=agent,
        agent_events=agent_events,
        t_agent0=t_agent0,
        finals=finals,
        final_state=final_state,
        ref_losses=ref_losses,
        ref_state=ref_state,
        wall_s=time.time() - t_start,
        timed_out=timed_out,
        logs=logs,
    )


def _summarise(
    *,
    config: DemoConfig,
    data_name: str,
    poller: _Poller,
    fault_log: list[dict[str, Any]],
    agent: Agent,
    agent_events: list[AgentEvent],
    t_agent0: float,
    finals: dict[str, dict[str, Any]],
    final_state: dict[str, torch.Tensor] | None,
    ref_losses: list[float],
    ref_state: dict[str, torch.Tensor],
    wall_s: float,
    timed_out: bool,
    logs: dict[str, str],
) -> dict[str, Any]:
    events = poller.events
    detection, recovery = [], []
    for fault in fault_log:
        t_f = fault["time"]
        seen = [
            e["time"]
            for e in events
            if e["kind"] in ("failure_detected", "step_aborted") and e["time"] >= t_f
        ]
        if seen:
            detection.append(min(seen) - t_f)
        shrinks = [
            e["time"]
            for e in events
            if e["kind"] == "shrink"
            and e["time"] >= t_f
            and fault["member"] in e["detail"].get("removed", [])
        ]
        if shrinks:
            t_shrink = min(shrinks)
            after = [rec["time"] for rec in poller.steps.values() if rec["time"] >= t_shrink]
            if after:
                recovery.append(min(after) - t_f)
    started = {
        e.member_id: t_agent0 + e.time_s
        for e in agent_events
        if e.kind == "started" and ".r" in e.member_id
    }
    heal = []
    for member, t0 in started.items():
        healed = [e["time"] for e in events if e["kind"] == "healed" and e["member"] == member]
        if healed:
            heal.append(min(healed) - t0)
    steps_sorted = sorted(poller.steps)
    losses = [poller.steps[s]["loss"] for s in steps_sorted]
    worlds = [poller.steps[s]["world"] for s in steps_sorted]
    final_loss = losses[-1] if losses and steps_sorted[-1] == config.steps else float("nan")
    reference_final = ref_losses[-1]
    if final_state is not None:
        diff = max(float((final_state[k] - ref_state[k]).abs().max()) for k in ref_state)
    else:
        diff = float("nan")
    checks = sum(int(f.get("replica_checks", 0)) for f in finals.values())
    mismatches = sum(int(f.get("replica_mismatches", 0)) for f in finals.values())
    checksums = {f["checksum"] for f in finals.values()}
    replicas_identical = bool(finals) and mismatches == 0 and len(checksums) == 1
    markers = [
        Marker(
            step=f["step"],
            kind=f["kind"],
            label=f"{'sigkill' if f['kind'] == 'kill' else 'sigstop'} {f['member']}",
        )
        for f in fault_log
    ]
    for e in events:
        if e["kind"] == "healed":
            markers.append(
                Marker(step=e["detail"].get("step", 0), kind="heal", label=f"healed {e['member']}")
            )
    plot_path = ""
    if steps_sorted and "matplotlib" not in missing_extras():
        plot_path = str(
            write_plot(
                config.plot,
                title=f"torchnext demo: {config.workers} workers, {len(fault_log)} faults, healed in place",
                steps=steps_sorted,
                losses=losses,
                world_sizes=worlds,
                reference_steps=list(range(1, len(ref_losses) + 1)),
                reference_losses=ref_losses,
                markers=markers,
            ).resolve()
        )
    redone = max((int(f.get("steps_redone", 0)) for f in finals.values()), default=0)
    ok = (
        not timed_out
        and bool(steps_sorted)
        and steps_sorted[-1] == config.steps
        and replicas_identical
        and abs(final_loss - reference_final) <= 1e-3 * max(1.0, abs(reference_final))
    )
    summary: dict[str, Any] = {
        "ok": ok,
        "dataset": data_name,
        "model": "MLP 64-128-128-10, Adam",
        "workers": config.workers,
        "steps": config.steps,
        "wall_s": wall_s,
        "failures": len(fault_log),
        "fault_kinds": [f"{f['kind']} {f['member']} @ step {f['step']}" for f in fault_log],
        "detection_s": detection,
        "recovery_s": recovery,
        "heal_s": heal,
        "replacements": agent.restarts,
        "steps_redone": redone,
        "final_loss": final_loss,
        "reference_final_loss": reference_final,
        "max_param_diff_vs_reference": diff,
        "replicas_identical": replicas_identical,
        "replica_checks": checks,
        "plot": plot_path,
        "timed_out": timed_out,
        "worker_exits": [e.describe() for e in agent.exits],
    }
    if not ok:
        summary["worker_log_tails"] = logs
    return summary
