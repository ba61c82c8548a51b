"""Multi-host fault tolerance on test hosts: a whole host loses power mid-training.

Three test hosts (network namespaces, real TCP between them), one ``torchnext run``
agent per host with two workers each, the job's TCP store on host 0. Host 1 loses
power at a known step: its link goes down first, then all its processes die, so the
survivors get silence, never a reset. They must see it from heartbeats, shrink once
for both of its ranks, and end where the failure-free reference ends.
"""

from __future__ import annotations

import json
import subprocess
import sys
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import torch

from torchnext import _env
from torchnext.demo.data import load_dataset
from torchnext.demo.trainer import KEY, reference_run
from torchnext.distributed.launch.keys import EVENT_COUNT_KEY, EVENT_KEY_PREFIX
from torchnext.distributed.launch.store import connect_store
from torchnext.testing import TestHosts, requires_test_hosts

STEPS = 40
FAULT_STEP = 10
NPROC = 2
STORE_PORT = 29600
WAIT = timedelta(seconds=90)  # bound on every wait: starts import torch on 2 busy cores


def _agent_argv(node: int, nnodes: int, tmp_path: Path) -> list[str]:
    """The command line a multi-node job runs on every node (only --node-rank differs)."""
    return [
        sys.executable,
        "-m",
        "torchnext",
        "run",
        f"--nproc={NPROC}",
        f"--nnodes={nnodes}",
        f"--node-rank={node}",
        f"--store-addr=h0:{STORE_PORT}",  # a host name, as a cluster's DNS would give it
        "--store-host=0.0.0.0",
        "--max-restarts=0",  # a dead host's agent is gone: nobody replaces its workers
        f"--log-dir={tmp_path / f'logs-h{node}'}",
        "-m",
        "torchnext.demo.trainer",
        f"--steps={STEPS}",
        "--batch=48",
        "--pace-ms=40",
        "--generated-data",
        f"--result-dir={tmp_path}",
    ]


def _events(store: Any) -> list[dict[str, Any]]:
    count = int(store.add(EVENT_COUNT_KEY, 0))
    keys = [f"{EVENT_KEY_PREFIX}{i}" for i in range(1, count + 1)]
    return [json.loads(store.get(k)) for k in keys if store.check([k])]


def _logs(tmp_path: Path) -> str:
    parts = [
        f"--- {p.name}\n{p.read_text(errors='replace')[-3000:]}" for p in tmp_path.glob("**/*.log")
    ]
    parts += [
        f"--- {p.name}\n{p.read_text(errors='replace')[-3000:]}"
        for p in tmp_path.glob("agent-*.txt")
    ]
    return "\n".join(parts)


@pytest.mark.slow
@pytest.mark.timeout(300)  # nine processes import torch at once on 2 busy cores
@requires_test_hosts()
def test_power_off_of_a_worker_host_is_detected_by_heartbeats_and_shrinks_once(
    tmp_path: Path,
) -> None:
    with TestHosts(3) as hosts:
        agents: list[subprocess.Popen[bytes]] = []
        for host in hosts:
            with open(tmp_path / f"agent-h{host.index}.txt", "wb") as out:
                agents.append(
                    host.run(
                        _agent_argv(host.index, len(hosts), tmp_path),
                        role="agent",
                        stdout=out,
                        stderr=subprocess.STDOUT,
                    )
                )
        # The test process stays outside the hosts and reaches host 0 through the bridge.
        store = connect_store(f"{hosts[0].address}:{STORE_PORT}", WAIT)
        store.wait([f"{KEY}/step/{FAULT_STEP}"], WAIT)
        fault = hosts.power_off(hosts[1])
        survivors = ["n0w0", "n0w1", "n2w0", "n2w1"]
        try:
            store.wait([f"{KEY}/final/{m}" for m in survivors], WAIT)
        except Exception as exc:  # noqa: BLE001 - show what the job did
            raise AssertionError(f"survivors did not finish: {exc}\n{_logs(tmp_path)}") from None
        assert agents[2].wait(WAIT.total_seconds()) == 0, _logs(tmp_path)
        events = _events(store)
        finals = [json.loads(store.get(f"{KEY}/final/{m}")) for m in survivors]
        last = json.loads(store.get(f"{KEY}/step/{STEPS}"))

    detected = [e for e in events if e["kind"] == "failure_detected"]
    assert detected, (events, _logs(tmp_path))
    first = min(detected, key=lambda e: e["time"])
    detection_s = first["time"] - fault.time_s
    reason = str(first["detail"].get("reason", ""))
    print(f"\npower_off of h1 detected after {detection_s:.2f} s by {first['member_id']}: {reason}")
    # Silence: seen from heartbeats (the default timeout is 1.5 s), never a socket error.
    assert all("no heartbeat" in str(e["detail"].get("reason")) for e in detected), detected
    assert "n1w" in reason, detected
    timeout_s = _env.TORCHNEXT_HEARTBEAT_TIMEOUT.get().total_seconds()
    assert 0 < detection_s < timeout_s + 1.0, detection_s
    # Both ranks of the host go in one agreement: one shrink, one new epoch.
    shrinks = [e for e in events if e["kind"] == "shrink"]
    assert len({e["epoch"] for e in shrinks}) == 1, shrinks
    assert all(set(e["detail"]["removed"]) == {"n1w0", "n1w1"} for e in shrinks), shrinks
    assert all(e["world_size"] == 4 for e in shrinks), shrinks
    # The survivors agree and end where the failure-free run ends.
    assert len({f["checksum"] for f in finals}) == 1, finals
    assert all(f["step"] == STEPS and f["replica_mismatches"] == 0 for f in finals), finals
    losses, ref_state = reference_run(
        steps=STEPS, batch=48, seed=0, lr=2e-3, data=load_dataset(prefer_real=False)
    )
    assert last["world"] == 4 and last["loss"] == pytest.approx(losses[-1], rel=1e-4, abs=1e-5)
    final = torch.load(tmp_path / "final_state.pt")
    for k, ref in ref_state.items():
        torch.testing.assert_close(final[k], ref, rtol=1e-4, atol=1e-5)
