"""Flight recorder: ring buffer, states, dumps (format, triggers, never blocking), capture paths."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from datetime import timedelta
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from torchnext import _env
from torchnext.cli import main as cli_main
from torchnext.distributed import flight_recorder
from torchnext.distributed.flight_recorder import FlightRecorder, FlightRecorderConfig
from torchnext.distributed.flight_recorder.format import load_dump
from torchnext.distributed.group import hooks as _hooks
from torchnext.errors import FlightRecorderDumpError


def _info(
    seq: int,
    *,
    rank: int = 0,
    size: int = 4,
    dtype: str = "float32",
    op: str = "allreduce",
    epoch: int = 0,
) -> _hooks.OpInfo:
    return _hooks.OpInfo(
        group_name="g",
        epoch=epoch,
        seq=seq,
        op=op,
        rank=rank,
        ranks=(0, 1, 2),
        input_sizes=((size,),),
        input_dtypes=(dtype,),
        output_sizes=((size,),),
        output_dtypes=(dtype,),
        timeout_ms=1000,
    )


def _rec(tmp_path: Path, **kw: object) -> FlightRecorder:
    return FlightRecorder(FlightRecorderConfig(dump_dir=str(tmp_path), **kw))  # type: ignore[arg-type]


def test_ring_wraps_and_keeps_newest(tmp_path: Path) -> None:
    rec = _rec(tmp_path, buffer_size=5)
    for i in range(1, 13):
        rec.on_finish(rec.on_start(_info(i)), "completed")
    doc = rec.to_dict()
    assert [e["record_id"] for e in doc["entries"]] == [7, 8, 9, 10, 11]
    assert [e["collective_seq_id"] for e in doc["entries"]] == [8, 9, 10, 11, 12]
    assert doc["torchnext"]["dropped_entries"] == 7 and doc["torchnext"]["recorded"] == 12
    # A finish for an overwritten record is ignored rather than corrupting a newer slot.
    rec.on_finish(0, "failed")
    assert all(e["state"] == "completed" for e in rec.to_dict()["entries"])


def test_states_format_and_pytorch_keys(tmp_path: Path) -> None:
    rec = _rec(tmp_path)
    rec.set_group_info("g", backend="nccl", desc="data_parallel")
    a = rec.on_start(_info(1))
    rec.on_start(_info(2, op="send 0->1"))
    rec.on_finish(a, "completed")
    path = rec.dump()
    doc = load_dump(path)
    assert doc["version"] == "2.10"
    assert doc["pg_config"] == {"g": {"name": "g", "desc": "data_parallel", "ranks": "[0, 1, 2]"}}
    first, second = doc["entries"]
    for key in (
        "record_id", "pg_id", "process_group", "collective_seq_id", "p2p_seq_id", "op_id",
        "profiling_name", "time_created_ns", "time_discovered_started_ns",
        "time_discovered_completed_ns", "input_sizes", "input_dtypes", "output_sizes",
        "output_dtypes", "state", "retired", "timeout_ms", "is_p2p", "thread_id", "thread_name",
    ):  # fmt: skip
        assert key in first, key
    assert first["profiling_name"] == "nccl:all_reduce" and first["input_dtypes"] == ["Float"]
    assert first["state"] == "completed" and first["retired"] and first["duration_ms"] >= 0
    assert second["profiling_name"] == "nccl:send 0->1" and second["state"] == "started"
    assert doc["torchnext"]["rank"] == 0 and doc["torchnext"]["reason"] == "on_demand"
    # Later epochs are distinct groups (their membership may differ).
    rec.on_start(_info(1, epoch=2))
    assert "g@e2" in rec.to_dict()["pg_config"]


def test_failure_dumps_once_per_epoch_and_bounded(tmp_path: Path) -> None:
    rec = _rec(tmp_path, max_auto_dumps=2)
    rec.on_finish(rec.on_start(_info(1)), "timed_out")
    rec.on_finish(rec.on_start(_info(2)), "timed_out")  # same reason and epoch: no new dump
    assert len(list(tmp_path.glob("*.json"))) == 1
    rec.on_finish(rec.on_start(_info(1, epoch=1)), "revoked")
    rec.on_finish(rec.on_start(_info(1, epoch=2)), "failed")  # over max_auto_dumps
    names = sorted(p.name for p in tmp_path.glob("*.json"))
    assert (
        len(names) == 2
        and any("timed_out" in n for n in names)
        and any("revoked" in n for n in names)
    )
    assert len(set(names)) == 2  # names never collide


def test_watchdog_dumps_a_stuck_op(tmp_path: Path) -> None:
    rec = _rec(tmp_path, stuck_dump_after=timedelta(milliseconds=200))
    try:
        rec.on_start(_info(1))  # never finishes
        deadline = time.monotonic() + 10
        while not list(tmp_path.glob("*stuck*.json")) and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        rec.close()
    (path,) = tmp_path.glob("*stuck*.json")
    doc = load_dump(path)
    assert doc["torchnext"]["stuck"]["seq"] == 1 and doc["entries"][0]["state"] == "started"


def test_dump_does_not_block_on_a_held_lock(tmp_path: Path) -> None:
    rec = _rec(tmp_path, lock_timeout=timedelta(milliseconds=20))
    for i in range(1, 2001):
        rec.on_finish(rec.on_start(_info(i)), "completed")
    held, release = threading.Event(), threading.Event()

    def hold() -> None:  # a thread stuck while holding the recorder's lock
        with rec._lock:
            held.set()
            release.wait(10)

    t = threading.Thread(target=hold)
    t.start()
    try:
        if not held.wait(10):
            pytest.fail("the holding thread never took the recorder's lock")
        start = time.perf_counter()
        doc = json.loads(rec.dump().read_text())
        elapsed = time.perf_counter() - start
    finally:
        release.set()
        t.join()
    assert elapsed < 2.0
    assert doc["torchnext"]["consistent"] is False and len(doc["entries"]) == 2000


def test_stacks_recorded_when_enabled(tmp_path: Path) -> None:
    rec = _rec(tmp_path, stacks=True, stack_depth=4)
    _hooks.register_observer(rec)
    try:
        _hooks.op_finished(_hooks.op_started(_info(1)), "completed")
    finally:
        _hooks.unregister_observer(rec)
    frames = rec.to_dict()["entries"][0]["frames"]
    assert 1 <= len(frames) <= 4
    assert frames[0]["name"] == "test_stacks_recorded_when_enabled"


def test_plain_torch_distributed_capture(tmp_path: Path) -> None:
    store = dist.HashStore()
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    rec = flight_recorder.enable(FlightRecorderConfig(dump_dir=str(tmp_path)))
    try:
        t = torch.ones(4)
        dist.all_reduce(t)
        dist.broadcast(t, 0)
        dist.all_gather([torch.zeros(4)], t)
        dist.barrier()
        work = dist.all_reduce(t, async_op=True)
        work.wait()
        deadline = time.monotonic() + 5
        while rec.to_dict()["entries"][-1]["state"] != "completed" and time.monotonic() < deadline:
            time.sleep(0.01)
    finally:
        flight_recorder.disable()
        dist.destroy_process_group()
    entries = rec.to_dict()["entries"]
    assert [e["profiling_name"] for e in entries] == [
        "gloo:all_reduce", "gloo:broadcast", "gloo:all_gather", "gloo:barrier", "gloo:all_reduce",
    ]  # fmt: skip
    assert [e["collective_seq_id"] for e in entries] == [1, 2, 3, 4, 5]
    assert entries[2]["output_sizes"] == [[1, 4]]  # a list of outputs is one stacked size
    assert all(e["state"] == "completed" for e in entries)
    assert not hasattr(dist.all_reduce, "__torchnext_fr_wrapped__")  # unpatched


def test_signal_and_env_enable_in_a_fresh_process(tmp_path: Path) -> None:
    program = """
import os, pathlib, signal, time, torch, torch.distributed as dist
from torchnext.distributed import flight_recorder as fr
assert fr.is_enabled(), "TORCHNEXT_FR_ENABLE=1 should enable the recorder on import"
fr.install_signal_handler(signal.SIGUSR2)
dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
dist.all_reduce(torch.ones(2))
os.kill(os.getpid(), signal.SIGUSR2)
# The dump is written on the recorder's signal thread: wait for the file, bounded.
deadline = time.monotonic() + 20
while not list(pathlib.Path(os.environ["TORCHNEXT_FR_DUMP_DIR"]).glob("*signal*.json")):
    if time.monotonic() > deadline:
        raise SystemExit("no dump 20 s after the signal")
    time.sleep(0.01)
dist.destroy_process_group()
"""
    env = dict(os.environ, TORCHNEXT_FR_ENABLE="1", TORCHNEXT_FR_DUMP_DIR=str(tmp_path))
    subprocess.run([sys.executable, "-c", program], env=env, check=True, timeout=60)
    (dump,) = tmp_path.glob("*signal*.json")
    assert load_dump(dump)["entries"][0]["profiling_name"] == "gloo:all_reduce"


# A gloo rank: rank 1 joins one all_reduce and then waits forever in the group; rank 0
# joins that one, then enters a second all_reduce that rank 1 never joins. The
# collective timeout (120 s) is far beyond the test's 1 s bound, so only a dump served
# while the main thread is blocked can pass.
_BLOCKED_RANK = r"""
import signal, sys, threading, time
from datetime import timedelta
from pathlib import Path
import torch, torch.distributed as dist
from torchnext.distributed import flight_recorder as fr

rank, out = int(sys.argv[1]), Path(sys.argv[2])
fr.enable(fr.FlightRecorderConfig(dump_dir=str(out / "dumps")))
fr.install_signal_handler(signal.SIGUSR1)
dist.init_process_group(
    "gloo", init_method="file://" + str(out / "store"), rank=rank, world_size=2,
    timeout=timedelta(seconds=120),
)
dist.all_reduce(torch.ones(2))
if rank == 1:
    (out / "rank1-in-group").touch()
    threading.Event().wait()
main = threading.main_thread().ident

def announce_when_blocked():
    # The main thread is blocked in C code once its innermost Python frame sits in
    # torch's all_reduce at one instruction for 0.3 s; from then on no Python-level
    # handler can run on it until the collective ends.
    seen, since = None, time.monotonic()
    while True:
        frame = sys._current_frames().get(main)
        here = None
        if frame is not None and frame.f_code.co_name == "all_reduce":
            here = (id(frame), frame.f_lasti)
        if here is None or here != seen:
            seen, since = here, time.monotonic()
        elif time.monotonic() - since > 0.3:
            (out / "rank0-blocked").touch()
            return
        time.sleep(0.01)

threading.Thread(target=announce_when_blocked, daemon=True).start()
dist.all_reduce(torch.ones(3))
(out / "rank0-returned").touch()
"""


def _wait_for(path: Path, procs: list[subprocess.Popen[bytes]], seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while not path.exists():
        for p in procs:
            if p.poll() is not None:
                pytest.fail(f"a rank exited with {p.returncode} before {path.name} appeared")
        if time.monotonic() > deadline:
            pytest.fail(f"{path.name} did not appear within {seconds} s")
        time.sleep(0.02)


def test_sigusr1_dumps_a_rank_blocked_in_a_gloo_collective(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TORCHNEXT_FR_")}
    logs = [(tmp_path / f"rank{r}.log").open("wb") for r in range(2)]
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", _BLOCKED_RANK, str(r), str(tmp_path)],
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        for r, log in enumerate(logs)
    ]
    try:
        _wait_for(tmp_path / "rank1-in-group", procs, 90)
        _wait_for(tmp_path / "rank0-blocked", procs, 60)
        os.kill(procs[0].pid, signal.SIGUSR1)
        sent = time.monotonic()
        pattern = f"torchnext_fr_rank00000_*_{procs[0].pid}_*_signal{int(signal.SIGUSR1)}.json"
        found: list[Path] = []
        while not found and time.monotonic() - sent < 1.0:
            found = list((tmp_path / "dumps").glob(pattern))
            time.sleep(0.01)
        elapsed = time.monotonic() - sent
        still_blocked = procs[0].poll() is None and not (tmp_path / "rank0-returned").exists()
    finally:
        for p in procs:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.pid, signal.SIGKILL)
            p.wait(timeout=30)
        for log in logs:
            log.close()
    rank0_log = (tmp_path / "rank0.log").read_text(errors="replace")[-2000:]
    assert found, f"no dump {elapsed:.2f} s after SIGUSR1 to the blocked rank; log:\n{rank0_log}"
    assert still_blocked, "the dump must come while the collective is still blocked"
    (path,) = found
    doc = load_dump(path)
    assert doc["torchnext"]["reason"] == f"signal{int(signal.SIGUSR1)}"
    states = [(e["profiling_name"], e["collective_seq_id"], e["state"]) for e in doc["entries"]]
    assert states == [("gloo:all_reduce", 1, "completed"), ("gloo:all_reduce", 2, "started")]
    assert doc["entries"][1]["input_sizes"] == [[3]]


def test_stuck_dump_variable_parses_seconds_and_rejects_bad_values(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    var = _env.TORCHNEXT_FR_STUCK_DUMP_S
    monkeypatch.setenv(var.name, "2.5")
    assert var.get() == timedelta(seconds=2.5)
    monkeypatch.setenv(var.name, "0")
    assert var.get() is None  # off
    for bad in ("-1", "soon", "", "nan", "inf", "1e300"):
        monkeypatch.setenv(var.name, bad)
        with pytest.raises(ValueError, match=rf"TORCHNEXT_FR_STUCK_DUMP_S='{bad}' is invalid"):
            var.get()


_PRINT_STUCK = """
from torchnext.distributed import flight_recorder as fr
if not fr.is_enabled():
    fr.enable()
after = fr.get_recorder().config.stuck_dump_after
print("stuck:", None if after is None else after.total_seconds())
"""


@pytest.mark.parametrize(
    ("enable", "value", "expected"),
    [
        ("1", None, "60.0"),  # enabled from the environment: the 60 s default
        ("1", "2.5", "2.5"),
        ("1", "0", "None"),  # 0 turns the default off
        ("0", None, "None"),  # enabled in code: no watchdog unless asked for
        ("0", "7", "7.0"),
    ],
)
def test_stuck_dump_from_the_environment(enable: str, value: str | None, expected: str) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TORCHNEXT_FR_")}
    env["TORCHNEXT_FR_ENABLE"] = enable
    if value is not None:
        env["TORCHNEXT_FR_STUCK_DUMP_S"] = value
    proc = subprocess.run(
        [sys.executable, "-c", _PRINT_STUCK], env=env, capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip().splitlines()[-1] == f"stuck: {expected}"


def test_bad_stuck_dump_variable_fails_enabling_from_the_environment() -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TORCHNEXT_FR_")}
    env.update(TORCHNEXT_FR_ENABLE="1", TORCHNEXT_FR_STUCK_DUMP_S="5min")
    proc = subprocess.run(
        [sys.executable, "-c", _PRINT_STUCK], env=env, capture_output=True, text=True, timeout=60
    )
    assert proc.returncode != 0
    assert "TORCHNEXT_FR_STUCK_DUMP_S='5min' is invalid" in proc.stderr, proc.stderr
    assert "Fix the value or unset it" in proc.stderr, proc.stderr


def test_corrupt_dumps_are_rejected_with_the_file_name(tmp_path: Path) -> None:
    bad = tmp_path / "rank3.json"
    for text, needle in [
        ("", "empty"),
        ('{"version": "2.10", "entr', "truncated or corrupt"),
        ("[1, 2]", "expected an object"),
        ('{"version": "2.10"}', "missing top-level keys"),
        ('{"version": "2.10", "pg_config": {}, "entries": [{"record_id": 1}]}', "lacks keys"),
    ]:
        bad.write_text(text)
        with pytest.raises(FlightRecorderDumpError, match=needle) as info:
            load_dump(bad)
        assert str(bad) in str(info.value)


def _synthetic_dumps(folder: Path, bad_rank: int | None) -> None:
    for rank in range(3):
        rec = FlightRecorder(FlightRecorderConfig(dump_dir=str(folder)))
        rec.set_rank(rank)
        for seq in range(1, 6):
            size = 8 if (rank == bad_rank and seq == 3) else 4
            rec.on_finish(rec.on_start(_info(seq, rank=rank, size=size)), "completed")
        rec.dump()


@pytest.mark.parametrize("bad_rank", [None, 2])
def test_pytorch_torchfrtrace_reads_our_dumps(tmp_path: Path, bad_rank: int | None) -> None:
    dumps, exported = tmp_path / "dumps", tmp_path / "exported"
    _synthetic_dumps(dumps, bad_rank)
    assert cli_main(["fr", "export", str(dumps), str(exported)]) == 0
    tool = Path(sys.executable).with_name("torchfrtrace")
    cmd = (
        [str(tool)]
        if tool.exists()
        else [sys.executable, "-m", "torch.distributed.flight_recorder.fr_trace"]
    )
    proc = subprocess.run(
        [*cmd, str(exported), "-p", "torchnext_fr_rank"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    if bad_rank is None:
        assert "has errors" not in out and "Not all ranks" not in out, out
    else:
        assert "Collective sequence number: 3 has errors" in out, out
        assert f"Culprit rank {bad_rank}" in out and "SIZE_OR_SYNTAX_MISMATCH" in out, out
