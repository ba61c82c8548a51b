"""The analyzer names the culprit and the kind of every injected fault, from real processes.

Workers are plain ``torch.distributed`` gloo processes with the flight recorder
enabled (one call), run through the multi-process harness; one rank misbehaves
(skips a collective, changes a size or a dtype, is SIGSTOPped, is SIGKILLed). The
others hit gloo's timeout or lose the connection, dump automatically, and the test
runs ``torchnext fr analyze`` on the folder.
"""

from __future__ import annotations

import json
import re
from datetime import timedelta
from pathlib import Path
from xml.etree import ElementTree

import pytest

from torchnext.cli import main as cli_main
from torchnext.distributed.fr_analyze import analyze
from torchnext.testing import Fault, MultiProcessHarness, WorkerContext

WORLD = 3
CULPRIT = 2
STEPS = 5
BAD_STEP = 3


def _fr_worker(ctx: WorkerContext, scenario: str, dump_dir: str) -> str:
    import torch
    import torch.distributed as dist

    from torchnext.distributed import flight_recorder as fr

    fr.enable(fr.FlightRecorderConfig(dump_dir=dump_dir))
    store = dist.PrefixStore("fr-test", ctx.store)
    dist.init_process_group(
        "gloo", store=store, rank=ctx.rank, world_size=ctx.world_size, timeout=timedelta(seconds=3)
    )
    outcome = "completed"
    try:
        for i in range(STEPS):
            ctx.checkpoint(f"step:{i}")
            # Broadcasts from rank 0 whose size differs per step, so a skip can be
            # located. The culprit's buffers are never smaller than what it receives:
            # gloo aborts a process (no dump) that receives more bytes than it expects.
            x = torch.ones(16 + i)
            if ctx.rank == CULPRIT and i == BAD_STEP:
                if scenario == "skip":
                    continue
                if scenario == "size":
                    x = torch.ones(64)
                if scenario == "dtype":
                    x = torch.ones(16 + i, dtype=torch.float64)
                if scenario == "op":
                    dist.all_reduce(x)
                    continue
            dist.broadcast(x, 0)
    except Exception as exc:  # noqa: BLE001 - the failure is what the test looks at
        outcome = f"{type(exc).__name__}: {exc}"[:200]
    fr.dump(reason="end")
    return outcome


def _run(tmp_path: Path, scenario: str, faults: list[Fault]) -> Path:
    dump_dir = tmp_path / "dumps"
    with MultiProcessHarness(WORLD, faults=faults) as harness:
        result = harness.run(_fr_worker, scenario, str(dump_dir), timeout=timedelta(seconds=60))
    assert not result.unfired_faults, result.describe()
    for r in result:
        if r.rank != CULPRIT or not faults:
            assert r.outcome == "returned", result.describe()
    return dump_dir


def _cli(*argv: str, capsys: pytest.CaptureFixture[str]) -> tuple[int, dict]:
    code = cli_main(["fr", "analyze", *argv, "--json"])
    return code, json.loads(capsys.readouterr().out)


def _culprit_kinds(report: dict) -> set[tuple[str, tuple[int, ...]]]:
    return {(f["kind"], tuple(f["culprits"])) for f in report["findings"] if f["culprits"]}


@pytest.mark.parametrize(
    ("scenario", "kind"),
    [
        ("skip", "missing"),
        ("size", "size_mismatch"),
        ("dtype", "dtype_mismatch"),
        ("op", "op_mismatch"),
    ],
)
def test_mismatch_and_skip_named(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], scenario: str, kind: str
) -> None:
    dump_dir = _run(tmp_path, scenario, [])
    code, report = _cli(str(dump_dir), capsys=capsys)
    assert code == 1
    assert (kind, (CULPRIT,)) in _culprit_kinds(report), report["findings"]
    group = report["groups"][0]
    assert group["first_divergence"] == BAD_STEP + 1  # sequence numbers count from 1
    found = next(f for f in report["findings"] if f["kind"] == kind)
    if kind.endswith("mismatch"):
        assert found["expected"] and found["found"] and found["expected"] != found["found"]


@pytest.mark.parametrize(("fault_kind", "kind"), [("stop", "hang"), ("kill", "crash")])
def test_stopped_or_killed_rank_named(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], fault_kind: str, kind: str
) -> None:
    fault = Fault(rank=CULPRIT, at=f"step:{BAD_STEP}", kind=fault_kind)  # type: ignore[arg-type]
    dump_dir = _run(tmp_path, "fault", [fault])
    timeline = tmp_path / "timeline.html"
    trace = tmp_path / "trace.json"
    code, report = _cli(
        str(dump_dir), "--timeline", str(timeline), "--trace", str(trace), capsys=capsys
    )
    assert code == 1
    assert (kind, (CULPRIT,)) in _culprit_kinds(report), report["findings"]
    named = next(f for f in report["findings"] if f["kind"] == kind)
    assert named["seq"] == BAD_STEP + 1
    if kind == "hang":  # the survivors timed out waiting inside that collective
        stuck = [f for f in report["findings"] if f["kind"] == "stuck"]
        assert stuck and stuck[0]["seq"] == BAD_STEP + 1
    page = timeline.read_text()
    assert page.startswith("<!DOCTYPE html>") and "<svg" in page
    for svg in re.findall(r"<svg.*?</svg>", page, flags=re.S):
        ElementTree.fromstring(svg)  # every picture is well-formed SVG
    assert "http://" not in page.replace('xmlns="http://www.w3.org/2000/svg"', "")
    assert "stroke-dasharray" in page  # the divergence line
    events = _check_trace_format(trace)
    ops = [e for e in events if e["ph"] == "X"]
    # The stopped or killed culprit left no dump: only the others' ops are drawn.
    assert sorted({e["pid"] for e in ops}) == sorted(set(range(WORLD)) - {CULPRIT})
    # A survivor's op on the collective the culprit never joined timed out or failed,
    # and its span ends where it did (or at the dump, when it never ended).
    stuck_ops = [e for e in ops if e["args"].get("collective_seq_id") == BAD_STEP + 1]
    failed = [e for e in stuck_ops if e["args"]["state"] != "completed"]
    assert failed and all("error" in e["args"] or e["args"].get("unfinished") for e in failed)
    assert any(e["ph"] == "i" and e["name"].startswith(kind) for e in events)


def _check_trace_format(path: Path) -> list[dict]:
    """The Chrome trace-event format as Perfetto and chrome://tracing read it."""
    doc = json.loads(path.read_text())
    assert doc["displayTimeUnit"] == "ms" and isinstance(doc["traceEvents"], list)
    events = doc["traceEvents"]
    named_processes = {e["pid"] for e in events if e["ph"] == "M" and e["name"] == "process_name"}
    named_threads = {
        (e["pid"], e["tid"]) for e in events if e["ph"] == "M" and e["name"] == "thread_name"
    }
    for e in events:
        assert e["ph"] in {"M", "X", "i"}, e
        assert isinstance(e["pid"], int) and isinstance(e["tid"], int), e
        if e["ph"] == "X":
            assert isinstance(e["ts"], float) and e["ts"] >= 0, e
            assert isinstance(e["dur"], float) and e["dur"] >= 0, e
            assert e["pid"] in named_processes and (e["pid"], e["tid"]) in named_threads, e
            for key in ("op", "state", "input_sizes", "output_sizes", "input_dtypes"):
                assert key in e["args"], (key, e)
    return events


def test_clean_run_exit_zero_and_corrupt_file_named(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    dump_dir = _run(tmp_path, "clean", [])
    trace = tmp_path / "trace.json"
    code, report = _cli(str(dump_dir), "--trace", str(trace), capsys=capsys)
    assert code == 0 and report["ok"], report
    ops = [e for e in _check_trace_format(trace) if e["ph"] == "X"]
    for rank in range(WORLD):  # every rank's broadcasts, in order, all completed
        mine = sorted((e for e in ops if e["pid"] == rank), key=lambda e: e["ts"])
        assert [e["args"]["collective_seq_id"] for e in mine] == list(range(1, STEPS + 1))
        assert all(
            e["args"]["state"] == "completed" and "unfinished" not in e["args"] for e in mine
        )
        assert [e["args"]["input_sizes"] for e in mine] == [[[16 + i]] for i in range(STEPS)]
    # Truncate one rank's dump: it is named, the others are still analysed.
    victim = sorted(dump_dir.glob("*rank00001*.json"))[-1]
    victim.write_text(victim.read_text()[:100])
    code, report = _cli(str(dump_dir), capsys=capsys)
    assert code == 1
    assert report["unreadable"] and victim.name in report["unreadable"][0]["error"]
    assert "truncated or corrupt" in report["unreadable"][0]["error"]
    assert sorted(report["dumps"]) == ["0", "2"]


def test_analyze_usage_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli_main(["fr", "analyze", str(tmp_path / "nope")]) == 2
    assert "does not exist" in capsys.readouterr().err
    (tmp_path / "junk.json").write_text("{not json")
    assert cli_main(["fr", "analyze", str(tmp_path)]) == 2
    assert "junk.json" in capsys.readouterr().err


def test_analyze_text_report(tmp_path: Path) -> None:
    dump_dir = _run(tmp_path, "size", [])
    text = analyze(dump_dir).format_text()
    assert "size_mismatch" in text and f"rank {CULPRIT} called" in text


def _p2p_worker(ctx: WorkerContext, dump_dir: str) -> str:
    import torch
    import torch.distributed as dist

    from torchnext.distributed import flight_recorder as fr

    fr.enable(fr.FlightRecorderConfig(dump_dir=dump_dir))
    store = dist.PrefixStore("fr-p2p", ctx.store)
    dist.init_process_group(
        "gloo", store=store, rank=ctx.rank, world_size=2, timeout=timedelta(seconds=3)
    )
    try:
        if ctx.rank == 0:
            dist.send(torch.ones(4), 1)
            dist.send(torch.ones(4), 1)
        else:
            dist.recv(torch.zeros(4), 0)
            dist.recv(torch.zeros(8), 0)  # expects more than is sent
    except RuntimeError as exc:
        return f"{type(exc).__name__}: {exc}"[:200]
    finally:
        fr.dump(reason="end")
    return "completed"


def test_point_to_point_mismatch_named(tmp_path: Path) -> None:
    dump_dir = tmp_path / "dumps"
    with MultiProcessHarness(2) as harness:
        result = harness.run(_p2p_worker, str(dump_dir), timeout=timedelta(seconds=60))
    result.raise_if_failed([0, 1])
    found = [f for f in analyze(dump_dir).findings if f.kind == "p2p_mismatch"]
    assert found and found[0].culprits == (0, 1), found
    assert found[0].found == "[[4]]" and found[0].expected == "[[8]]"


def test_members_renumbered_by_a_new_epoch_are_matched_by_group_rank(tmp_path: Path) -> None:
    from torchnext.distributed.flight_recorder import FlightRecorder, FlightRecorderConfig
    from torchnext.distributed.group.hooks import OpInfo

    def op(epoch: int, seq: int, rank: int, size: int, n: int = 4) -> OpInfo:
        return OpInfo(
            group_name="g", epoch=epoch, seq=seq, op="allreduce", rank=rank,
            ranks=tuple(range(size)), input_sizes=((n,),), input_dtypes=("float32",),
            output_sizes=((n,),), output_dtypes=("float32",),
        )  # fmt: skip

    # Epoch 0: three members. Epoch 1 (member 1 died): the process that was rank 2 is
    # rank 1, and it calls collective 2 of epoch 1 with another size.
    for first_rank, epoch1_rank in ((0, 0), (2, 1)):
        rec = FlightRecorder(FlightRecorderConfig(dump_dir=str(tmp_path)))
        for seq in (1, 2):
            rec.on_finish(rec.on_start(op(0, seq, first_rank, 3)), "completed")
        for seq in (1, 2, 3):
            n = 8 if (epoch1_rank == 1 and seq == 2) else 4
            rec.on_finish(rec.on_start(op(1, seq, epoch1_rank, 2, n)), "completed")
        rec.dump()
    analysis = analyze(tmp_path)
    by_group = {g.name: g for g in analysis.groups}
    e1 = by_group["g@e1"]
    assert e1.dumped == (0, 1)
    # Two members, one on each side: the lowest rank's view wins, flagged ambiguous.
    assert [(f.kind, f.culprits, f.seq, f.ambiguous) for f in e1.findings] == [
        ("size_mismatch", (1,), 2, True)
    ]
    e0 = by_group["g"]
    assert [f.kind for f in e0.findings] == ["missing_dump"]  # member 1 died in epoch 0


def _two_group_worker(ctx: WorkerContext, dump_dir: str, swapped: tuple[int, ...]) -> str:
    import torch
    import torch.distributed as dist

    from torchnext.distributed import flight_recorder as fr

    fr.enable(fr.FlightRecorderConfig(dump_dir=dump_dir))
    store = dist.PrefixStore("fr-cross", ctx.store)
    dist.init_process_group(
        "gloo", store=store, rank=ctx.rank, world_size=ctx.world_size, timeout=timedelta(seconds=3)
    )
    other = dist.new_group(list(range(ctx.world_size)))
    x = torch.ones(8)
    dist.all_reduce(x)
    dist.all_reduce(x, group=other)  # both groups work once, in the same order
    first, second = (other, None) if ctx.rank in swapped else (None, other)
    outcome = "completed"
    try:
        dist.all_reduce(x, group=first)
        dist.all_reduce(x, group=second)
    except Exception as exc:  # noqa: BLE001 - the timeout is the expected outcome
        outcome = type(exc).__name__
    fr.dump(reason="end")
    return outcome


@pytest.mark.parametrize(("swapped", "ambiguous"), [((2,), False), ((2, 3), True)])
def test_cross_group_order_is_one_deadlock_naming_the_minority(
    tmp_path: Path, swapped: tuple[int, ...], ambiguous: bool
) -> None:
    world = 4 if ambiguous else 3
    dump_dir = tmp_path / "dumps"
    with MultiProcessHarness(world) as harness:
        result = harness.run(
            _two_group_worker, str(dump_dir), swapped, timeout=timedelta(seconds=60)
        )
    assert all(r.outcome == "returned" for r in result), result.describe()
    report = analyze(dump_dir)
    deadlocks = [f for f in report.findings if f.kind == "deadlock"]
    assert len(deadlocks) == 1, report.format_text()
    (dl,) = deadlocks
    names = sorted(g.name for g in report.groups)
    assert sorted(dl.group.split("+")) == names and len(names) == 2
    # Collective 2 of the world group and collective 2 of the other group.
    assert sorted(seq for _, seq in dl.ops) == [2, 2]
    assert dl.ambiguous is ambiguous
    # No majority: the lowest rank's order (world group first) is taken as expected.
    assert dl.culprits == swapped
    # The deadlock replaces the per-group "missing" findings that blamed every rank.
    assert not [f for f in report.findings if f.kind == "missing"], report.format_text()
    assert "deadlock across groups" in report.format_text()
    assert report.to_json()["cross_group_findings"][0]["culprits"] == list(swapped)


_ABORTING_SCRIPT = """
import os, sys
from datetime import timedelta
import torch
import torch.distributed as dist
from torchnext.distributed import flight_recorder as fr

rank = int(os.environ["TORCHNEXT_MEMBER_ID"].rsplit("w", 1)[1])
dump_dir, init_file = sys.argv[1], sys.argv[2]
fr.enable(fr.FlightRecorderConfig(dump_dir=dump_dir))
dist.init_process_group(
    "gloo", init_method="file://" + init_file, rank=rank, world_size=3,
    timeout=timedelta(seconds=4),
)
try:
    for i in range(5):
        # Rank 2 receives more bytes than its buffer holds at step 3: gloo aborts it.
        n = 4 if (rank == 2 and i == 3) else 16 + i
        dist.broadcast(torch.ones(n), 0)
except Exception:
    pass
fr.dump(reason="end")
"""


def test_a_rank_whose_process_died_is_a_crash_not_a_hang(tmp_path: Path) -> None:
    import subprocess
    import sys

    script = tmp_path / "train.py"
    script.write_text(_ABORTING_SCRIPT)
    dump_dir = tmp_path / "dumps"
    proc = subprocess.run(
        [sys.executable, "-m", "torchnext", "run", "--nproc", "3", "--max-restarts", "0",
         str(script), str(dump_dir), str(tmp_path / "init")],
        capture_output=True, text=True, timeout=90, check=False,
    )  # fmt: skip
    records = [p.name.split("_pid")[0] for p in dump_dir.glob("torchnext_fr_exit_*")]
    assert "torchnext_fr_exit_rank00002" in records, proc.stdout + proc.stderr
    report = analyze(dump_dir)
    assert not report.bad_files  # the exit record is not taken for a broken dump
    crashes = [f for f in report.findings if f.kind == "crash"]
    assert [f.culprits for f in crashes] == [(2,)], report.format_text()
    assert "rank 2 killed by SIGABRT" in crashes[0].message
    assert not [f for f in report.findings if f.kind == "hang"]


def test_exit_record_turns_a_silent_hang_into_a_crash(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from torchnext.distributed.flight_recorder import FlightRecorder, FlightRecorderConfig
    from torchnext.distributed.fr_exits import write_exit_record
    from torchnext.distributed.group.hooks import OpInfo

    def op(seq: int, rank: int) -> OpInfo:
        return OpInfo(
            group_name="g", epoch=0, seq=seq, op="allreduce", rank=rank, ranks=(0, 1, 2),
            input_sizes=((4,),), input_dtypes=("float32",),
            output_sizes=((4,),), output_dtypes=("float32",),
        )  # fmt: skip

    # Rank 2 recorded collective 1 and died; ranks 0 and 1 timed out in collective 2
    # with nothing in their errors that says a peer went away.
    error_file = tmp_path / "n0w2.error"
    monkeypatch.setenv("TORCHNEXT_ERROR_FILE", str(error_file))
    dead = FlightRecorder(FlightRecorderConfig(dump_dir=str(tmp_path / "dumps")))
    dead.on_finish(dead.on_start(op(1, 2)), "completed")
    monkeypatch.delenv("TORCHNEXT_ERROR_FILE")
    for rank in (0, 1):
        rec = FlightRecorder(FlightRecorderConfig(dump_dir=str(tmp_path / "dumps")))
        rec.on_finish(rec.on_start(op(1, rank)), "completed")
        rec.on_finish(rec.on_start(op(2, rank)), "timed_out", "wait timed out after 4000 ms")
        rec.dump()
    before = [(f.kind, f.culprits) for f in analyze(tmp_path / "dumps").findings]
    assert ("hang", (2,)) in before
    # The launcher's record of the death (the note's pid is this process's).
    import os

    path = write_exit_record(error_file, pid=os.getpid(), returncode=-6)
    assert path is not None and path.parent == (tmp_path / "dumps").resolve()
    after = analyze(tmp_path / "dumps")
    kinds = [(f.kind, f.culprits) for f in after.findings]
    assert ("crash", (2,)) in kinds and ("hang", (2,)) not in kinds, after.format_text()
    assert "rank 2 killed by SIGABRT" in after.format_text()
    assert not after.bad_files
    # A note left by another process in the same slot is not this worker's.
    assert write_exit_record(error_file, pid=os.getpid() + 1, returncode=-9) is None
