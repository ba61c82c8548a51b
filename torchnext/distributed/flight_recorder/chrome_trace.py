"""Write an :class:`~torchnext.distributed.flight_recorder.analyzer.Analysis` as Chrome trace-event JSON.

Use it when the HTML timeline is not enough: the file opens in Perfetto
(ui.perfetto.dev) and ``chrome://tracing``, which zoom, search and measure. The layout
follows the trace-event format:

* one *process* per rank (``pid`` = the rank, named ``rank R``), one *thread* per
  group (``tid`` = the group's position in the analysis, named ``group NAME (desc)``);
* one complete event (``ph: "X"``) per recorded op, from the time it started (or was
  enqueued, when the start was not seen) to the time it completed; ``ts`` and ``dur``
  are microseconds from the earliest op in the file. An op that had not completed at
  the dump runs to the dump's time and carries ``"unfinished": true``;
* the op, its collective or point-to-point sequence number, sizes, dtypes, state and
  error in ``args``;
* each finding of the analyzer as a global instant event (``ph: "i"``) at the start of
  the collective it names, so the first divergence is visible on the time axis.

What not to assume: the clocks are the hosts' wall clocks, which are not synchronised
across hosts; compare ranks of one host, or the sequence numbers in ``args``. Entries
without any timestamp (PyTorch dumps that recorded none) are left out and counted in
``otherData.untimed_entries``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from torchnext.distributed.flight_recorder.analyzer import Analysis, GroupReport

__all__ = ["render_chrome_trace", "write_chrome_trace"]


def _span_ns(entry: dict[str, Any], dump_time_ns: int) -> tuple[int, int, bool] | None:
    """(start, end, unfinished) of one entry on the host clock, or None when untimed."""
    start = int(entry.get("time_discovered_started_ns") or entry.get("time_created_ns") or 0)
    if not start:
        return None
    done = int(entry.get("time_discovered_completed_ns") or 0)
    if done:
        return start, max(done, start), False
    return start, max(dump_time_ns, start), True


def _group_entries(analysis: Analysis, group: GroupReport) -> list[tuple[int, dict[str, Any], int]]:
    """(member rank, entry, dump time) for every entry of ``group`` in the member's dump."""
    out = []
    for rank in group.dumped:
        dump = analysis.dumps[group.dump_of.get(rank, rank)]
        for entry in dump.doc["entries"]:
            if str(entry["process_group"][0]) == group.name:
                out.append((rank, entry, dump.time_ns))
    return out


def _args(group: GroupReport, entry: dict[str, Any], unfinished: bool) -> dict[str, Any]:
    args: dict[str, Any] = {
        "op": entry.get("profiling_name", ""),
        "group": group.name,
        "group_desc": group.desc,
        "state": entry.get("state", ""),
        "input_sizes": entry.get("input_sizes", []),
        "input_dtypes": entry.get("input_dtypes", []),
        "output_sizes": entry.get("output_sizes", []),
        "output_dtypes": entry.get("output_dtypes", []),
    }
    if entry.get("is_p2p"):
        args["p2p_seq_id"] = entry.get("p2p_seq_id")
    else:
        args["collective_seq_id"] = entry.get("collective_seq_id")
    if isinstance(entry.get("duration_ms"), (int, float)):
        args["duration_ms"] = entry["duration_ms"]
    if entry.get("error"):
        args["error"] = entry["error"]
    if unfinished:
        args["unfinished"] = True
    return args


def render_chrome_trace(analysis: Analysis) -> dict[str, Any]:
    """The trace as a JSON-ready dict: ``{"traceEvents": [...], "displayTimeUnit": "ms", ...}``."""
    spans: list[tuple[int, int, int, int, bool, dict[str, Any], GroupReport]] = []
    untimed = 0
    for tid, group in enumerate(analysis.groups, start=1):
        for rank, entry, dump_time_ns in _group_entries(analysis, group):
            span = _span_ns(entry, dump_time_ns)
            if span is None:
                untimed += 1
                continue
            spans.append((rank, tid, span[0], span[1], span[2], entry, group))
    origin_ns = min((s[2] for s in spans), default=0)

    events: list[dict[str, Any]] = []
    for rank in sorted({s[0] for s in spans} | set(analysis.dumps)):
        events.append(
            {
                "ph": "M",
                "name": "process_name",
                "pid": rank,
                "tid": 0,
                "args": {"name": f"rank {rank}"},
            }
        )
        events.append(
            {
                "ph": "M",
                "name": "process_sort_index",
                "pid": rank,
                "tid": 0,
                "args": {"sort_index": rank},
            }
        )
    for tid, group in enumerate(analysis.groups, start=1):
        for rank in group.dumped:
            events.append(
                {
                    "ph": "M",
                    "name": "thread_name",
                    "pid": rank,
                    "tid": tid,
                    "args": {"name": f"group {group.name} ({group.desc})"},
                }
            )

    first_start: dict[tuple[str, int], int] = {}
    for rank, tid, start, end, unfinished, entry, group in spans:
        events.append(
            {
                "ph": "X",
                "name": str(entry.get("profiling_name", "op")),
                "cat": "p2p" if entry.get("is_p2p") else "collective",
                "pid": rank,
                "tid": tid,
                "ts": (start - origin_ns) / 1e3,
                "dur": (end - start) / 1e3,
                "args": _args(group, entry, unfinished),
            }
        )
        if not entry.get("is_p2p"):
            key = (group.name, int(entry["collective_seq_id"]))
            first_start[key] = min(first_start.get(key, start), start)

    for f in analysis.findings:
        at = first_start.get((f.group, f.seq)) if f.seq is not None else None
        if at is None:
            continue
        events.append(
            {
                "ph": "i",
                "s": "g",
                "name": f"{f.kind}: group {f.group} collective {f.seq}",
                "cat": "finding",
                "pid": min(analysis.dumps, default=0),
                "tid": 0,
                "ts": (at - origin_ns) / 1e3,
                "args": {"message": f.message, "culprits": list(f.culprits)},
            }
        )
    return {
        "traceEvents": events,
        "displayTimeUnit": "ms",
        "otherData": {
            "source": "torchnext fr analyze",
            "directory": str(analysis.directory),
            "origin_unix_ns": origin_ns,
            "untimed_entries": untimed,
        },
    }


def write_chrome_trace(analysis: Analysis, path: str | Path) -> Path:
    """Write :func:`render_chrome_trace` to ``path`` (parents created) and return the path."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(json.dumps(render_chrome_trace(analysis)), encoding="utf-8")
    return target
