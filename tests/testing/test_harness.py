"""The multi-process harness: outcomes, fault injection, bounded waits, no leftovers."""

from __future__ import annotations

import os
import time
from datetime import timedelta

import pytest

from torchnext.testing import Fault, MultiProcessHarness, WorkerContext, run_workers


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def _steps(ctx: WorkerContext, n: int) -> int:
    for i in range(n):
        ctx.checkpoint(f"step:{i}")
        time.sleep(0.01)
    return ctx.rank * 10


def _raise(ctx: WorkerContext) -> None:
    if ctx.rank == 1:
        raise KeyError("boom from rank 1")


def _store_roundtrip(ctx: WorkerContext) -> str:
    ctx.store.set(f"k{ctx.rank}", str(ctx.rank))
    ctx.store.wait([f"k{(ctx.rank + 1) % ctx.world_size}"], timedelta(seconds=10))
    ctx.emit("seen", peer=ctx.store.get(f"k{(ctx.rank + 1) % ctx.world_size}").decode())
    return os.environ["TORCHNEXT_MEMBER_ID"]


def _hang(ctx: WorkerContext) -> None:
    if ctx.rank == 0:
        time.sleep(600)


def _spawn_child_then_wait(ctx: WorkerContext) -> None:
    import subprocess
    import sys

    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    ctx.emit("child", pid=child.pid)
    ctx.checkpoint("child-started")
    time.sleep(600)


def test_returned_and_raised_with_remote_traceback() -> None:
    result = run_workers(_raise, world_size=2, timeout=timedelta(seconds=30))
    assert result[0].outcome == "returned"
    assert result[1].outcome == "raised"
    assert result[1].error_type == "builtins.KeyError"
    assert isinstance(result[1].error, KeyError)
    assert "boom from rank 1" in result[1].traceback
    assert "_raise" in result[1].traceback


def test_store_outside_workers_and_env() -> None:
    result = run_workers(_store_roundtrip, world_size=3, timeout=timedelta(seconds=30))
    assert result.values() == ["w0", "w1", "w2"], result.describe()
    assert [r.events[0][1]["peer"] for r in result] == ["1", "2", "0"]


def test_sigkill_reported_within_bound_and_others_finish() -> None:
    faults = [Fault(rank=1, at="step:3", kind="kill")]
    with MultiProcessHarness(3, faults=faults) as harness:
        start = time.monotonic()
        result = harness.run(_steps, 20, timeout=timedelta(seconds=30))
        elapsed = time.monotonic() - start
        pids = harness.pids
    assert result[1].outcome == "killed", result.describe()
    assert result[1].faults_fired[0][:2] == ("step:3", "kill")
    assert [result[0].value, result[2].value] == [0, 20]
    assert not result.unfired_faults
    assert elapsed < 20
    assert not any(_alive(p) for p in pids)


def test_sigstop_reported_and_process_removed_after() -> None:
    faults = [Fault(rank=0, at="step:2", kind="stop")]
    with MultiProcessHarness(2, faults=faults) as harness:
        result = harness.run(_steps, 10, timeout=timedelta(seconds=30))
        pids = harness.pids
        assert _alive(pids[0])  # stopped, not dead, while the harness is open
    assert result[0].outcome == "stopped", result.describe()
    assert result[1].outcome == "returned"
    assert not any(_alive(p) for p in pids)


def test_sigstop_with_resume_continues() -> None:
    faults = [Fault(rank=0, at="step:1", kind="stop", resume_after=timedelta(milliseconds=300))]
    result = run_workers(_steps, 4, world_size=1, faults=faults, timeout=timedelta(seconds=30))
    assert result[0].outcome == "returned", result.describe()
    assert result[0].faults_fired[0][1] == "stop"


def test_timeout_is_bounded_reports_stack_and_kills() -> None:
    with MultiProcessHarness(2) as harness:
        start = time.monotonic()
        result = harness.run(_hang, timeout=timedelta(seconds=3))
        elapsed = time.monotonic() - start
        pids = harness.pids
    assert elapsed < 10
    assert result[0].outcome == "timed_out"
    assert "_hang" in result[0].traceback
    assert result[1].outcome == "returned"
    assert not any(_alive(p) for p in pids)


def test_kill_takes_the_workers_children_too() -> None:
    faults = [Fault(rank=0, at="child-started", kind="kill")]
    result = run_workers(
        _spawn_child_then_wait, world_size=1, faults=faults, timeout=timedelta(seconds=30)
    )
    assert result[0].outcome == "killed"
    child_pid = result[0].events[0][1]["pid"]
    deadline = time.monotonic() + 5
    while _alive(child_pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(child_pid)


def test_leftover_processes_killed_on_exception() -> None:
    with pytest.raises(ZeroDivisionError):
        with MultiProcessHarness(2) as harness:
            harness.start(_hang)
            pids = harness.pids
            raise ZeroDivisionError
    deadline = time.monotonic() + 5
    while any(_alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not any(_alive(p) for p in pids)


def test_unfired_fault_is_reported() -> None:
    result = run_workers(
        _steps, 2, world_size=1, faults=[Fault(rank=0, at="step:99")], timeout=timedelta(seconds=30)
    )
    assert result[0].outcome == "returned"
    assert [f.at for f in result.unfired_faults] == ["step:99"]


def test_fault_validation() -> None:
    with pytest.raises(ValueError, match="kind"):
        Fault(rank=0, at="x", kind="explode")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="resume_after"):
        Fault(rank=0, at="x", kind="kill", resume_after=timedelta(seconds=1))


def _crash(ctx: WorkerContext) -> None:
    import ctypes

    ctypes.string_at(0)  # SIGSEGV


def test_crash_is_reported_with_python_stack() -> None:
    result = run_workers(_crash, world_size=1, timeout=timedelta(seconds=30))
    assert result[0].outcome == "exited"
    assert result[0].exitcode == -11
    assert "_crash" in result[0].traceback
