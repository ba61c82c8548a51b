"""Flight recorder: ring buffer, states, dumps (format, triggers, never blocking), capture paths."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from datetime import timedelta
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from torchnext.cli import main as cli_main
from torchnext.distributed import _hooks, flight_recorder
from torchnext.distributed._fr_format import load_dump
from torchnext.distributed.flight_recorder import FlightRecorder, FlightRecorderConfig
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
    release = threading.Event()

    def hold() -> None:  # a thread stuck while holding the recorder's lock
        with rec._lock:
            release.wait(10)

    t = threading.Thread(target=hold)
    t.start()
    try:
        time.sleep(0.05)
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
import os, signal, time, torch, torch.distributed as dist
from torchnext.distributed import flight_recorder as fr
assert fr.is_enabled(), "TORCHNEXT_FR_ENABLE=1 should enable the recorder on import"
fr.install_signal_handler(signal.SIGUSR2)
dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
dist.all_reduce(torch.ones(2))
os.kill(os.getpid(), signal.SIGUSR2)
time.sleep(0.2)
dist.destroy_process_group()
"""
    env = dict(os.environ, TORCHNEXT_FR_ENABLE="1", TORCHNEXT_FR_DUMP_DIR=str(tmp_path))
    subprocess.run([sys.executable, "-c", program], env=env, check=True, timeout=60)
    (dump,) = tmp_path.glob("*signal*.json")
    assert load_dump(dump)["entries"][0]["profiling_name"] == "gloo:all_reduce"


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
