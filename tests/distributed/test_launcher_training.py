"""The agent with a real fault-tolerant training script: rank 0 killed, replaced, healed."""

from __future__ import annotations

import json
import signal
import time
from datetime import timedelta
from pathlib import Path

import pytest
import torch

from torchnext.demo.data import load_dataset
from torchnext.demo.trainer import KEY, reference_run
from torchnext.distributed.launcher import Agent, AgentConfig, AgentEvent

STEPS = 120


@pytest.mark.slow
def test_agent_replaces_killed_rank0_and_training_matches_reference(tmp_path: Path) -> None:
    command = [
        "-m",
        "torchnext.demo.trainer",
        f"--steps={STEPS}",
        "--batch=48",
        "--pace-ms=50",
        "--generated-data",
        f"--result-dir={tmp_path}",
    ]
    events: list[AgentEvent] = []
    config = AgentConfig(
        nproc=3,
        max_restarts=2,
        log_dir=str(tmp_path / "logs"),
        term_grace=timedelta(seconds=2),
        events_file=str(tmp_path / "events.jsonl"),
        extra_env={"TORCHNEXT_HEARTBEAT_TIMEOUT": "3"},  # no spurious evictions under load
    )
    with Agent(command, config, on_event=events.append) as agent:
        agent.start()
        killed = False
        deadline = time.monotonic() + 100
        while agent.poll():
            store = agent.store
            latest = int(store.get(f"{KEY}/latest")) if store.check([f"{KEY}/latest"]) else 0
            if not killed and latest >= 10:
                agent.signal_worker(0, signal.SIGKILL)  # n0w0: rank 0 of the first epoch
                killed = True
            assert time.monotonic() < deadline, "training did not finish in time"
            time.sleep(0.05)
        healed = []
        count = int(store.add(f"{KEY}/events/count", 0))
        for i in range(1, count + 1):
            record = json.loads(store.get(f"{KEY}/events/{i}"))
            if record["kind"] == "healed":
                healed.append(record["member"])
        finals = {
            e.member_id: json.loads(store.get(f"{KEY}/final/{e.member_id}"))
            for e in agent.exits
            if e.kind == "finished"
        }
    logs = "\n".join(p.read_text()[-2000:] for p in (tmp_path / "logs").glob("*.log"))
    kinds = {e.member_id: e.kind for e in agent.exits}
    assert kinds.get("n0w0") == "crashed", (kinds, logs)
    assert kinds.get("n0w0.r1") == "finished", (kinds, logs)
    assert healed == ["n0w0.r1"], logs
    assert len({f["checksum"] for f in finals.values()}) == 1 and len(finals) == 3
    assert all(f["replica_mismatches"] == 0 and f["step"] == STEPS for f in finals.values())
    _, ref_state = reference_run(
        steps=STEPS, batch=48, seed=0, lr=2e-3, data=load_dataset(prefer_real=False)
    )
    final = torch.load(tmp_path / "final_state.pt")
    for k, ref in ref_state.items():
        torch.testing.assert_close(final[k], ref, rtol=1e-4, atol=1e-5)
    assert any("killed by SIGKILL" in e.message for e in events)
    # The launcher says what happened to the job, each fault and shrink once.
    job_lines = [e.message for e in events if e.kind == "job"]
    for prefix in ("fault:", "shrink:", "grow:", "heal:", "recovered:"):
        assert any(m.startswith(prefix) for m in job_lines), (prefix, job_lines)
    assert sum(m.startswith("shrink:") for m in job_lines) == 1, job_lines
    assert sum(m.startswith("fault:") for m in job_lines) == 1, job_lines
    assert any("n0w0.r1 received" in m for m in job_lines if m.startswith("heal:")), job_lines
    records = [json.loads(line) for line in (tmp_path / "events.jsonl").read_text().splitlines()]
    sources = {r["source"] for r in records}
    assert sources == {"agent", "worker"}, sources
    worker_kinds = {r["kind"] for r in records if r["source"] == "worker"}
    assert {"failure_detected", "shrink", "grow", "healed", "recovered"} <= worker_kinds
    assert any(r["kind"] == "exited" for r in records if r["source"] == "agent")
