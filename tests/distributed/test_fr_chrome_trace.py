"""The Chrome trace export on a hand-built analysis: spans, unfinished ops, untimed entries."""

from __future__ import annotations

import json
from pathlib import Path

from torchnext.distributed.flight_recorder import write_chrome_trace
from torchnext.distributed.flight_recorder.analyzer import Analysis
from torchnext.distributed.flight_recorder.chrome_trace import render_chrome_trace
from torchnext.distributed.flight_recorder.report import Finding, GroupReport, RankDump

T0 = 1_700_000_000_000_000_000


def _entry(seq: int, start: int, done: int, state: str, **extra: object) -> dict:
    return {
        "process_group": ["7", "tp"],
        "profiling_name": "gloo:all_reduce",
        "collective_seq_id": seq,
        "p2p_seq_id": 0,
        "is_p2p": False,
        "input_sizes": [[4]],
        "input_dtypes": ["Float"],
        "output_sizes": [[4]],
        "output_dtypes": ["Float"],
        "state": state,
        "time_created_ns": start,
        "time_discovered_started_ns": start,
        "time_discovered_completed_ns": done,
        **extra,
    }


def _analysis(tmp_path: Path) -> Analysis:
    dump_ns = T0 + 9_000_000
    entries = [
        _entry(1, T0, T0 + 1_000_000, "completed", duration_ms=1.0),
        _entry(2, T0 + 2_000_000, 0, "started"),
        _entry(3, 0, 0, "scheduled", time_created_ns=0),
    ]
    doc = {"entries": entries, "torchnext": {"time_ns": dump_ns}}
    group = GroupReport(name="7", desc="tp", ranks=(0, 1), dumped=(0,), last_seq={0: 3})
    group.findings.append(
        Finding(
            kind="hang",
            group="7",
            seq=2,
            op="all_reduce",
            culprits=(1,),
            message="rank 1 never joined",
        )
    )
    return Analysis(
        directory=tmp_path,
        dumps={0: RankDump(rank=0, path=tmp_path / "d.json", doc=doc)},
        bad_files=[],
        groups=[group],
    )


def test_spans_in_microseconds_from_the_first_op(tmp_path: Path) -> None:
    trace = render_chrome_trace(_analysis(tmp_path))
    ops = [e for e in trace["traceEvents"] if e["ph"] == "X"]
    assert [(e["ts"], e["dur"]) for e in ops] == [(0.0, 1000.0), (2000.0, 7000.0)]
    done, open_op = ops
    assert "unfinished" not in done["args"] and done["args"]["duration_ms"] == 1.0
    assert open_op["args"]["unfinished"] is True  # ran to the dump's time
    assert all(e["pid"] == 0 and e["tid"] == 1 and e["cat"] == "collective" for e in ops)
    assert trace["otherData"]["untimed_entries"] == 1
    assert trace["otherData"]["origin_unix_ns"] == T0


def test_names_and_findings(tmp_path: Path) -> None:
    events = render_chrome_trace(_analysis(tmp_path))["traceEvents"]
    meta = {(e["name"], e["pid"], e["tid"]): e["args"] for e in events if e["ph"] == "M"}
    assert meta[("process_name", 0, 0)] == {"name": "rank 0"}
    assert meta[("thread_name", 0, 1)] == {"name": "group 7 (tp)"}
    (finding,) = [e for e in events if e["ph"] == "i"]
    assert finding["ts"] == 2000.0 and finding["s"] == "g"
    assert finding["name"] == "hang: group 7 collective 2"
    assert finding["args"]["culprits"] == [1]


def test_write_creates_parents_and_is_json(tmp_path: Path) -> None:
    path = write_chrome_trace(_analysis(tmp_path), tmp_path / "out" / "trace.json")
    assert json.loads(path.read_text())["displayTimeUnit"] == "ms"
