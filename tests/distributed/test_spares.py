"""Warm spares (``torchnext run --spares``): a killed worker is replaced by a spare in well
under a second, training matches the reference, spares leave cleanly at the end."""

from __future__ import annotations

import json
import signal
import textwrap
import threading
import time
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path

import pytest
import torch

from torchnext import _env
from torchnext.cli import main as torchnext_main
from torchnext.demo.data import load_dataset
from torchnext.demo.trainer import KEY, reference_run
from torchnext.distributed import is_spare
from torchnext.distributed.launch.agent import Agent, AgentConfig, AgentEvent
from torchnext.distributed.launch.keys import SPARE_KEY_PREFIX
from torchnext.distributed.launch.spares import await_assignment
from torchnext.distributed.launch.store import host_store

STEPS = 80


def _wait_for(
    agent: Agent, condition: Callable[[], bool], what: str, bound_s: float = 90.0
) -> None:
    """Poll the agent until ``condition()`` holds (bounded)."""
    deadline = time.monotonic() + bound_s
    while not condition():
        assert agent.poll(), f"the workers exited before {what}"
        assert time.monotonic() < deadline, f"no {what} within {bound_s} s"
        time.sleep(0.02)


@pytest.mark.slow
def test_a_warm_spare_replaces_a_killed_worker_and_heals_fast(tmp_path: Path) -> None:
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
        spares=1,
        max_restarts=2,
        log_dir=str(tmp_path / "logs"),
        term_grace=timedelta(seconds=5),
        extra_env={"TORCHNEXT_HEARTBEAT_TIMEOUT": "3"},  # no spurious evictions under load
    )

    def event_time(prefix: str) -> float:
        return next(e.time_s for e in events if e.message.startswith(prefix))

    with Agent(command, config, on_event=events.append) as agent:
        agent.start()
        store = agent.store

        def latest() -> int:
            return int(store.get(f"{KEY}/latest")) if store.check([f"{KEY}/latest"]) else 0

        _wait_for(agent, lambda: any("n0s0 ready" in e.message for e in events), "ready spare")
        _wait_for(agent, lambda: latest() >= 10, "10 committed steps")
        pool = agent.spare_pool
        assert pool is not None
        spare_pid = pool.spares[0].proc.pid
        killed_at = time.time()
        agent.signal_worker(1, signal.SIGKILL)  # n0w1
        deadline = time.monotonic() + 100
        while agent.poll():
            assert time.monotonic() < deadline, "training did not finish in time"
            time.sleep(0.02)
        rc = agent.exit_code()
        healed = {}
        for i in range(1, int(store.add(f"{KEY}/events/count", 0)) + 1):
            record = json.loads(store.get(f"{KEY}/events/{i}"))
            if record["kind"] == "healed":
                healed[record["member"]] = record["time"]
        finals = {
            e.member_id: json.loads(store.get(f"{KEY}/final/{e.member_id}"))
            for e in agent.exits
            if e.kind == "finished"
        }
    # Read after the agent's shutdown, which releases the spares, waits for them and reaps
    # them: the refilled spare may still be starting when the last worker finishes.
    spare_exits = list(pool.exits)
    logs = {p.name: p.read_text() for p in (tmp_path / "logs").glob("*.log")}
    tail = "\n".join(text[-2000:] for text in logs.values())
    messages = [e.message for e in events]

    # The spare took n0w1's place: no cold process was started for it.
    assert rc == 0, (messages, tail)
    assert "replacing n0w1 with warm spare n0s0 as n0w1.r1 (restart 1/2)" in messages, messages
    assert not [m for m in messages if m.startswith("started replacement")], messages
    promoted = {e.member_id: e.pid for e in agent.exits}
    assert promoted["n0w1.r1"] == spare_pid
    assert {e.member_id: e.kind for e in agent.exits} == {
        "n0w0": "finished",
        "n0w1": "crashed",
        "n0w2": "finished",
        "n0w1.r1": "finished",
    }, tail
    # ... and healed far sooner than a process start: the spare's own start to ready
    # (torch imported, data loaded, model built) is what a cold replacement pays first.
    heal_s = healed["n0w1.r1"] - killed_at
    cold_start_s = event_time("spare n0s0 ready") - event_time("started spare n0s0")
    print(
        f"kill to healed with a warm spare: {heal_s:.3f} s; a process start: {cold_start_s:.2f} s"
    )
    assert list(healed) == ["n0w1.r1"]
    assert 0 < heal_s < cold_start_s / 2, (heal_s, cold_start_s)

    # Training went on as one replica set and ended where the failure-free run ends.
    assert len(finals) == 3 and len({f["checksum"] for f in finals.values()}) == 1, finals
    assert all(f["replica_mismatches"] == 0 and f["step"] == STEPS for f in finals.values())
    _, ref_state = reference_run(
        steps=STEPS, batch=48, seed=0, lr=2e-3, data=load_dataset(prefer_real=False)
    )
    final = torch.load(tmp_path / "final_state.pt")
    for k, ref in ref_state.items():
        torch.testing.assert_close(final[k], ref, rtol=1e-4, atol=1e-5)

    # The pool was refilled, and its spare left cleanly at the end, with no traceback:
    # code 0 once it waited in from_env (a heavily loaded machine may end the job while
    # it still starts; it is then stopped, as the next test's spare never is).
    assert any(m.startswith("started spare n0s1") for m in messages), messages
    assert [e.member_id for e in spare_exits] == ["n0s1"], spare_exits
    ready = any(m.startswith("spare n0s1 ready") for m in messages)
    outcome = (spare_exits[0].kind, spare_exits[0].returncode)
    stopped = not ready and outcome == ("terminated", -signal.SIGTERM)
    assert outcome == ("finished", 0) or stopped, (spare_exits, messages)
    assert "Traceback" not in logs.get("n0s1.log", ""), logs.get("n0s1.log")


SPARE_SCRIPT = """
import os, sys, time
from datetime import timedelta
from torchnext.distributed import is_spare
from torchnext.distributed.launch.store import connect_store

if is_spare():
    from torchnext.distributed.launch.spares import await_assignment
    await_assignment()  # nobody dies here: it leaves (code 0) when the agent says so
    sys.exit(3)
store = connect_store(os.environ["TORCHNEXT_STORE_ADDR"], timedelta(seconds=30))
store.wait(["test/go"], timedelta(seconds=60))  # the test's go, once the spares were seen
"""


@pytest.mark.slow
def test_a_dead_spare_is_restarted_and_spares_leave_at_the_end(tmp_path: Path) -> None:
    script = tmp_path / "worker.py"
    script.write_text(textwrap.dedent(SPARE_SCRIPT))
    events: list[AgentEvent] = []
    config = AgentConfig(nproc=1, spares=1, max_restarts=1, term_grace=timedelta(seconds=10))
    with Agent([str(script)], config, on_event=events.append) as agent:
        agent.start()
        pool = agent.spare_pool
        assert pool is not None

        def ready(name: str) -> bool:
            return any(e.message.startswith(f"spare {name} ready") for e in events)

        _wait_for(agent, lambda: ready("n0s0"), "ready spare n0s0")
        pool.spares[0].proc.send_signal(signal.SIGKILL)
        _wait_for(agent, lambda: ready("n0s1"), "ready spare n0s1")
        agent.store.set("test/go", "1")
        while agent.poll():
            time.sleep(0.02)
        agent.shutdown()
    assert agent.exit_code() == 0
    assert agent.restarts == 0 and [e.kind for e in agent.exits] == ["finished"]
    kinds = [(e.member_id, e.kind, e.returncode) for e in pool.exits]
    assert kinds == [("n0s0", "crashed", -9), ("n0s1", "finished", 0)], kinds
    deaths = [e.message for e in events if e.message.startswith("spare n0s0 (pid")]
    assert len(deaths) == 1 and "killed by SIGKILL" in deaths[0], deaths
    assert "a new spare takes its place" in deaths[0]


def test_a_spare_waits_for_its_member_id(monkeypatch: pytest.MonkeyPatch) -> None:
    store = host_store("127.0.0.1", 0, timedelta(seconds=10))
    monkeypatch.setenv(_env.TORCHNEXT_STORE_ADDR.name, f"127.0.0.1:{store.port}")
    monkeypatch.setenv(_env.TORCHNEXT_SPARE.name, "n0s0")
    monkeypatch.setenv(_env.TORCHNEXT_MEMBER_ID.name, "")
    assert is_spare()

    def assign() -> None:
        store.wait([f"{SPARE_KEY_PREFIX}n0s0/ready"], timedelta(seconds=10))
        store.set(f"{SPARE_KEY_PREFIX}n0s0/assign", "n0w1.r1")

    thread = threading.Thread(target=assign)
    thread.start()
    got = await_assignment(store_timeout=timedelta(seconds=10))
    thread.join()
    assert got is not None and got[1] == "n0w1.r1"
    assert not is_spare() and _env.TORCHNEXT_MEMBER_ID.get() == "n0w1.r1"

    monkeypatch.setenv(_env.TORCHNEXT_SPARE.name, "n0s1")
    store.set(f"{SPARE_KEY_PREFIX}n0s1/assign", "")  # released: the job is over
    with pytest.raises(SystemExit) as exit_info:
        await_assignment(store_timeout=timedelta(seconds=10))
    assert exit_info.value.code == 0


def test_a_script_that_never_reaches_from_env_stops_the_pool(tmp_path: Path) -> None:
    # The worker waits (bounded) until the spare has exited, so the spare is seen to finish on
    # its own rather than being stopped with the pool when the worker happens to finish first.
    script = tmp_path / "worker.py"
    script.write_text(
        textwrap.dedent(
            f"""
            import os, pathlib, time
            marker = pathlib.Path({str(tmp_path / "spare.pid")!r})
            if os.environ.get("TORCHNEXT_SPARE"):
                marker.with_suffix(".tmp").write_text(str(os.getpid()))
                marker.with_suffix(".tmp").rename(marker)  # atomic: the worker never reads half
            else:
                deadline = time.monotonic() + 60
                while time.monotonic() < deadline:
                    if marker.exists():
                        stat = pathlib.Path("/proc", marker.read_text(), "stat")
                        try:
                            if stat.read_text().split(")")[-1].split()[0] in ("Z", "X"):
                                break
                        except FileNotFoundError:
                            break
                    time.sleep(0.01)
                else:
                    raise SystemExit("the spare never finished")
            print("done")
            """
        )
    )
    events: list[AgentEvent] = []
    with Agent([str(script)], AgentConfig(nproc=1, spares=1), on_event=events.append) as agent:
        rc = agent.run(poll_interval=timedelta(milliseconds=20))
    assert rc == 0
    assert sum(e.message.startswith("started spare") for e in events) == 1, events
    assert any("could never be used" in e.message for e in events), events


def test_cli_refuses_negative_spares(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    script = tmp_path / "train.py"
    script.write_text("")
    rc = torchnext_main(["run", "--nproc", "2", "--spares", "-1", str(script)])
    err = capsys.readouterr().err
    assert rc == 2, err
    assert "--spares" in err and "must be >= 0" in err and "give 0" in err, err
