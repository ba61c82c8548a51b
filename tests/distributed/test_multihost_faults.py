"""Machines fail, not processes: fencing after a partition, losing the store's host, bad input.

Test hosts (network namespaces on a bridge, real TCP between them), one ``torchnext run``
agent per host, the demo's pinned model (``multihost_worker.py`` records every committed
step with its state checksum, in files the test reads). What each test proves:

* a host cut off mid-training comes back: its workers learn they were left out within a
  heartbeat timeout of reconnecting, exit with ``EXIT_EVICTED`` by themselves and are
  replaced; none of them committed a step the survivors did not commit (the same epoch,
  step and state checksum), and the survivors end where the failure-free run ends;
* the host of the TCP store loses power: every surviving worker and agent says, within
  the store timeout, that the store at ``h0:port`` is lost and how to avoid it
  (``--store etcd://``), and exits; a store call on the half-open connection fails
  within its own timeout;
* with the store on a 3-member etcd cluster over the 3 hosts, powering off one of them
  (its etcd member, agent and worker) leaves the job running to the end;
* two agents claiming one node rank, or agents started with different world sizes, fail
  at once with an error naming the other agent and the fix.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from torchnext import _env
from torchnext.demo.data import load_dataset
from torchnext.demo.trainer import reference_run
from torchnext.distributed.launch import cli
from torchnext.distributed.launch.bounded_store import BoundedTCPStore
from torchnext.distributed.launch.exits import EXIT_STORE_LOST
from torchnext.distributed.launch.keys import AGENT_CLAIM_KEY_PREFIX, JOB_SHAPE_KEY
from torchnext.distributed.launch.store import host_store
from torchnext.errors import StoreUnreachableError
from torchnext.testing import TestHosts, requires_test_hosts
from torchnext.testing.etcd import EtcdCluster, etcd_binary

HERE = Path(__file__).resolve().parent
WORKER = HERE / "multihost_worker.py"
PORT = 29600
WAIT = timedelta(seconds=120)  # bound on every wait: interpreters start on 2 busy cores


def _agent(
    host: Any, tmp: Path, nnodes: int, store: str, flags: list[str], script: list[str], **env: str
) -> Any:
    """Start ``torchnext run`` on ``host`` (the same command line on every host)."""
    argv = [sys.executable, "-m", "torchnext", "run", f"--nnodes={nnodes}", *flags]
    argv += [f"--node-rank={host.index}", f"--log-dir={tmp / f'logs-h{host.index}'}"]
    argv += [f"--events={tmp / f'events-h{host.index}.jsonl'}"]
    if store.startswith("etcd://"):
        argv += [f"--store={store}"]
    else:
        argv += [f"--store-addr={store}", "--store-host=0.0.0.0"]
    with open(tmp / f"agent-h{host.index}.txt", "wb") as out:
        return host.run(
            [*argv, str(WORKER), f"--records={tmp}", *script],
            env=env,
            role="agent",
            stdout=out,
            stderr=subprocess.STDOUT,
        )


def _lines(path: Path) -> list[dict[str, Any]]:
    """The JSON lines of ``path`` (none if it does not exist; a line being written is skipped)."""
    try:
        text = path.read_text()
    except FileNotFoundError:
        return []
    return [json.loads(line) for line in text.splitlines() if line.endswith("}")]


def _records(tmp: Path) -> list[dict[str, Any]]:
    return [r for f in sorted(tmp.glob("n*.jsonl")) for r in _lines(f)]


def _steps(tmp: Path, member: str) -> list[dict[str, Any]]:
    return [r for r in _lines(tmp / f"{member}.jsonl") if r["kind"] == "step"]


def _until(
    what: str,
    done: Callable[[], bool],
    tmp: Path,
    agents: Sequence[Any] = (),
    bound: timedelta = WAIT,
) -> None:
    deadline = time.monotonic() + bound.total_seconds()
    while not done():
        failed = [a.returncode for a in agents if a.poll() is not None]
        if time.monotonic() > deadline or failed:
            raise AssertionError(
                f"{what}: not within {bound} (agents' exits {failed})\n{_logs(tmp)}"
            )
        time.sleep(0.02)


def _logs(tmp: Path) -> str:
    files = [*tmp.glob("agent-*.txt"), *tmp.glob("logs-*/*.log")]
    return "\n".join(f"--- {p.name}\n{p.read_text(errors='replace')[-2500:]}" for p in files)


def _reference_loss(steps: int) -> float:
    losses, _ = reference_run(
        steps=steps, batch=48, seed=0, lr=2e-3, data=load_dataset(prefer_real=False)
    )
    return losses[-1]


def _go(tmp: Path, members: list[str], agents: Sequence[Any]) -> None:
    """Let the workers make the group once all of them have built their model."""
    files = [tmp / f"{m}.jsonl" for m in members]
    _until("workers ready", lambda: all(p.exists() for p in files), tmp, agents)
    (tmp / "go").touch()


@pytest.mark.slow
@pytest.mark.timeout(300)
@requires_test_hosts()
def test_a_partitioned_host_is_fenced_on_return_and_its_workers_replaced(tmp_path: Path) -> None:
    steps, hb = 16, _env.TORCHNEXT_HEARTBEAT_TIMEOUT.get().total_seconds()
    flags, script = ["--nproc=1", "--max-restarts=1"], [f"--steps={steps}", "--full-world=3"]
    with TestHosts(3) as hosts:
        agents = [_agent(h, tmp_path, 3, f"h0:{PORT}", flags, script) for h in hosts]
        _until("step 6", lambda: len(_steps(tmp_path, "n0w0")) >= 6, tmp_path, agents)
        cut = hosts.partition(hosts[1])
        # The survivors notice, shrink and commit steps without h1...
        _until(
            "survivors' steps without h1",
            lambda: sum(r["world"] == 2 for r in _steps(tmp_path, "n0w0")) >= 4,
            tmp_path,
            agents,
        )
        back = hosts.reconnect(hosts[1])
        for agent in agents:
            assert agent.wait(WAIT.total_seconds()) == 0, _logs(tmp_path)
    records = _records(tmp_path)
    logs = _logs(tmp_path)

    # h1's worker learned of its eviction once back, and left by itself.
    fenced = {r["member"]: r for r in records if r["kind"] == "exit"}
    assert set(fenced) == {"n1w0"} and all(r["evicted"] for r in fenced.values()), logs
    learned_s = max(r["t"] for r in fenced.values()) - back.time_s
    print(f"\nh1's worker fenced itself {learned_s:.2f} s after reconnecting")
    assert learned_s < hb + 1.5, (learned_s, logs)
    agent_events = _lines(tmp_path / "events-h1.jsonl")
    exits = [e["message"] for e in agent_events if e.get("kind") == "exited"]
    assert sum("was evicted by the group" in m for m in exits) == 1, exits
    assert not any("killed by" in m for m in exits), exits
    # ... was replaced, and the replacement trained with the survivors to the end.
    joined = {r["member"] for r in records if r["kind"] == "joined" and ".r" in r["member"]}
    assert joined == {"n1w0.r1"}, (joined, logs)

    # Split brain: every step a partitioned worker committed, the survivors committed too
    # (same epoch, step and state); none of them committed one after it was cut off.
    survivors = {
        (r["epoch"], r["step"], r["checksum"])
        for r in records
        if r["kind"] == "step" and r["member"] in ("n0w0", "n2w0")
    }
    cut_off = [r for r in records if r["kind"] == "step" and r["member"] in fenced]
    assert cut_off and all((r["epoch"], r["step"], r["checksum"]) in survivors for r in cut_off)
    at_cut = max(r["step"] for r in _steps(tmp_path, "n0w0") if r["t"] <= cut.time_s)
    assert max(r["step"] for r in cut_off) <= at_cut + 1, (cut_off, at_cut)
    # The survivors' state is one state at every step (replacements included), and the
    # run ends where the failure-free run ends.
    by_step: dict[int, set[int]] = {}
    for r in records:
        if r["kind"] == "step":
            by_step.setdefault(r["step"], set()).add(r["checksum"])
    split = {
        step: sorted((r["member"], r["epoch"], r["checksum"]) for r in records
                     if r["kind"] == "step" and r["step"] == step)
        for step, sums in by_step.items() if len(sums) > 1
    }  # fmt: skip
    assert not split, (split, logs)
    done = [r for r in records if r["kind"] == "done"]
    assert len(done) == 3 and {r["world"] for r in done} == {3}, done
    last = max(done, key=lambda r: r["step"])["step"]
    final_loss = [r["loss"] for r in _steps(tmp_path, "n0w0") if r["step"] == last][0]
    assert final_loss == pytest.approx(_reference_loss(last), rel=1e-4, abs=1e-5)


@pytest.mark.slow
@pytest.mark.timeout(240)
@requires_test_hosts()
def test_losing_the_tcp_store_host_is_a_prompt_clear_error_everywhere(tmp_path: Path) -> None:
    store_timeout = 5.0
    env = {"TORCHNEXT_STORE_TIMEOUT": str(store_timeout)}
    flags = ["--nproc=1", "--max-restarts=1"]
    script = ["--steps=1000", f"--go={tmp_path / 'go'}"]
    with TestHosts(2) as hosts:
        agents = [_agent(h, tmp_path, 2, f"h0:{PORT}", flags, script, **env) for h in hosts]
        _go(tmp_path, ["n0w0", "n1w0"], agents)
        _until("step 4", lambda: len(_steps(tmp_path, "n1w0")) >= 4, tmp_path, agents)
        # A client of this process too, to time one call on the half-open connection.
        probe = BoundedTCPStore(hosts[0].address, PORT, timeout=timedelta(seconds=2))
        probe.add("probe", 1)
        fault = hosts.power_off(hosts[0])
        start = time.monotonic()
        with pytest.raises(StoreUnreachableError, match=f"{hosts[0].address}:{PORT}"):
            probe.add("probe", 1)
        call_s = time.monotonic() - start
        assert agents[1].wait(WAIT.total_seconds()) == 1, _logs(tmp_path)
        agent_s = time.time() - fault.time_s
        probe.close()
    logs = _logs(tmp_path)
    print(
        f"\na call on the half-open connection failed after {call_s:.2f} s; h1's agent "
        f"stopped {agent_s:.1f} s after the store's host lost power"
    )
    assert call_s < 2.0 + 1.0, call_s
    # The worker: a StoreLostError naming the store and the fix, within the store timeout.
    (error,) = [r for r in _records(tmp_path) if r["kind"] == "exit" and r["member"] == "n1w0"]
    assert "StoreLostError" in error["error"] and f"h0:{PORT}" in error["error"], error
    assert error["t"] - fault.time_s < store_timeout + 3.0, (error, logs)
    worker_log = (tmp_path / "logs-h1" / "n1w0.log").read_text()
    assert "the job's store is lost" in worker_log and "--store etcd://" in worker_log
    # The agent: the same, once, then it stops (no worker can come back without a store).
    agent = (tmp_path / "agent-h1.txt").read_text()
    assert f"the store at h0:{PORT} has not answered for over" in agent, agent
    assert "--store etcd://" in agent and "lost the job's store" in agent, agent
    assert agent_s < 2 * store_timeout + 10.0, (agent_s, agent)  # it waits for the store a while
    assert f"exited with code {EXIT_STORE_LOST}" not in agent  # classified, not a bare code


@pytest.mark.slow
@pytest.mark.timeout(240)
@requires_test_hosts()
@pytest.mark.skipif(etcd_binary() is None, reason="no etcd server: pip install 'torchnext[etcd]'")
def test_with_etcd_the_job_survives_losing_a_host_of_the_store(tmp_path: Path) -> None:
    steps = 16
    with TestHosts(3) as hosts:
        cluster = EtcdCluster(
            3, hosts=[h.address for h in hosts], wrap=lambda i, argv: hosts[i].command(argv)
        )
        with cluster:
            url = cluster.url("multihost")
            flags, script = ["--nproc=1", "--max-restarts=0"], [f"--steps={steps}"]
            agents = [_agent(h, tmp_path, 3, url, flags, script) for h in hosts]
            _until("step 4", lambda: len(_steps(tmp_path, "n1w0")) >= 4, tmp_path, agents)
            fault = hosts.power_off(hosts[0])  # an etcd member, an agent and a worker
            for agent in agents[1:]:
                assert agent.wait(WAIT.total_seconds()) == 0, _logs(tmp_path)
    records = _records(tmp_path)
    detected = [r for r in records if r["kind"] == "event" and r["event"] == "failure_detected"]
    first = min(r["et"] for r in detected) - fault.time_s
    print(f"\nh0 (etcd member, agent, worker) lost power; detected after {first:.2f} s")
    shrinks = {r["epoch"] for r in records if r["kind"] == "event" and r["event"] == "shrink"}
    assert len(shrinks) == 1, records
    done = [r for r in records if r["kind"] == "done"]
    assert {r["member"] for r in done} == {"n1w0", "n2w0"}, _logs(tmp_path)
    assert all(r["step"] == steps and r["world"] == 2 for r in done), done
    (final,) = [r for r in _steps(tmp_path, "n1w0") if r["step"] == steps]
    assert final["loss"] == pytest.approx(_reference_loss(steps), rel=1e-4, abs=1e-5)


def _run_cli(*argv: str) -> int:
    parser = argparse.ArgumentParser()
    cli.add_arguments(parser)
    return cli.main(parser.parse_args(list(argv)))


def test_two_agents_on_one_node_rank_or_different_world_sizes_fail_at_once(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    script = tmp_path / "never.py"
    script.write_text("raise SystemExit('a worker must not start')\n")
    store = host_store("127.0.0.1", 0, timedelta(seconds=10))
    addr = f"127.0.0.1:{store.port}"
    # Another agent (on host h7) holds node rank 1 and started a job of 3 x 1 workers.
    other = {"host": "h7", "pid": 4242, "shape": {"nnodes": 3, "nproc": 1, "world_size": 3}}
    store.set(f"{AGENT_CLAIM_KEY_PREFIX}1", json.dumps(other, sort_keys=True))
    store.set(JOB_SHAPE_KEY, json.dumps({**other, "node": 1}))
    for node, nproc, expected, fix in (
        (1, 1, "node rank 1 is already taken by the agent on host h7 (pid 4242)", "--node-rank"),
        (
            2,
            2,
            "world size 6 (--nnodes 3 x --nproc 2), but the agent of node 1 on host h7 "
            "(pid 4242) started it with world size 3",
            "the same --nnodes and --nproc",
        ),
    ):
        start = time.monotonic()
        rc = _run_cli(
            "--nproc",
            str(nproc),
            "--nnodes",
            "3",
            "--node-rank",
            str(node),
            "--store-addr",
            addr,
            str(script),
        )
        err = capsys.readouterr().err
        assert rc == 2 and expected in err and fix in err, err
        assert time.monotonic() - start < 10, err  # at once, not after a store timeout
    # The agent that fits (node 2 of the 3 x 1 job) passes the check and starts its worker.
    fits = ["--nproc", "1", "--nnodes", "3", "--node-rank", "2", "--max-restarts", "0"]
    assert _run_cli(*fits, "--store-addr", addr, str(script)) == 1  # the worker refused
    err = capsys.readouterr().err
    assert "started worker n2w0" in err and "exited with code 1" in err, err
