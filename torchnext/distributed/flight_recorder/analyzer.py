"""Merge per-rank flight-recorder dumps and say what went wrong, per group.

Use it after a hang or a failure: ``torchnext fr analyze DIR`` (or :func:`analyze`)
reads every dump in ``DIR`` (ours, or PyTorch JSON dumps with a rank in the file name),
lines up each group's collectives by sequence number across ranks and reports:

* ``missing``: a rank that never entered collective N that others entered (it skipped
  it, or is still computing); a rank whose ops are the others' shifted by one is
  reported as having skipped N, not as a mismatch;
* ``op_mismatch`` / ``size_mismatch`` / ``dtype_mismatch``: the culprit rank (the
  minority; the majority is taken as right) with the expected and the found values;
* ``hang`` / ``crash``: a member left no dump while the others are stuck in, or failed
  on, the collective it never joined (``crash`` when the others saw the connection drop);
* ``stuck``: ranks whose op never completed (started, timed out) — who waits where;
* ``p2p_mismatch``: sends and receives between a pair of ranks that do not pair up;
* ``deadlock``: ranks that entered collectives of two groups in different orders, so
  each waits in one group for ranks waiting in the other (one finding for all the
  groups involved, in :attr:`Analysis.cross_group`; see
  :mod:`torchnext.distributed.flight_recorder.crossgroup`), replacing those groups' ``missing``;
* the first divergence of each group (the earliest collective with a problem).

What not to assume: the majority rule can blame the wrong rank when half the ranks
agree on each side (findings then say ``ambiguous``); ring buffers that wrapped are
aligned on the latest first sequence number, so older history is not compared.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from torchnext.distributed.flight_recorder.crossgroup import find_deadlocks
from torchnext.distributed.flight_recorder.exits import (
    ExitRecord,
    is_exit_record,
    load_exit_records,
)
from torchnext.distributed.flight_recorder.format import fr_op_name, load_dump
from torchnext.distributed.flight_recorder.report import (
    Finding,
    GroupReport,
    RankDump,
    finding_json,
    ranges,
)
from torchnext.errors import FlightRecorderDumpError

__all__ = ["Finding", "GroupReport", "RankDump", "Analysis", "analyze", "load_dumps"]

_STUCK_STATES = frozenset({"started", "scheduled", "timed_out"})
_CRASH_WORDS = ("connection", "closed", "reset", "broken pipe", "eof", "dead", "exited", "killed")


@dataclass
class Analysis:
    directory: Path
    dumps: dict[int, RankDump]
    bad_files: list[tuple[Path, str]]
    groups: list[GroupReport]
    superseded: list[Path] = field(default_factory=list)
    cross_group: list[Finding] = field(default_factory=list)
    """Findings that span groups (``deadlock``)."""

    @property
    def findings(self) -> list[Finding]:
        return [f for g in self.groups for f in g.findings] + self.cross_group

    @property
    def ok(self) -> bool:
        return not self.bad_files and not self.findings

    def to_json(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "directory": str(self.directory),
            "dumps": {str(r): str(d.path) for r, d in sorted(self.dumps.items())},
            "unreadable": [{"file": str(p), "error": e} for p, e in self.bad_files],
            "superseded": [str(p) for p in self.superseded],
            "groups": [
                {
                    "name": g.name,
                    "desc": g.desc,
                    "ranks": list(g.ranks),
                    "dumped_ranks": list(g.dumped),
                    "last_seq": {str(r): s for r, s in g.last_seq.items()},
                    "first_divergence": g.first_divergence,
                    "findings": [finding_json(f) for f in g.findings],
                }
                for g in self.groups
            ],
            "cross_group_findings": [finding_json(f) for f in self.cross_group],
            "findings": [finding_json(f) for f in self.findings],
        }

    def format_text(self) -> str:
        lines = [
            f"flight-recorder analysis of {self.directory}: {len(self.dumps)} dump(s) "
            f"(ranks {ranges(sorted(self.dumps))}), {len(self.bad_files)} unreadable"
        ]
        for _path, err in self.bad_files:
            lines.append(f"  [unreadable] {err}")
        for g in self.groups:
            status = "OK" if not g.findings else "PROBLEM"
            lines.append(f"group {g.name} ({g.desc}), ranks [{ranges(list(g.ranks))}]: {status}")
            if g.first_divergence is not None:
                lines.append(f"  first divergence: collective {g.first_divergence}")
            for f in g.findings:
                lines.append(f"  [{f.kind}] {f.message}")
        for f in self.cross_group:
            lines.append(f"groups {f.group}: PROBLEM\n  [{f.kind}] {f.message}")
        lines.append(
            "result: "
            + ("no problem found" if self.ok else f"{len(self.findings)} problem(s) found")
        )
        return "\n".join(lines)


_RANK_IN_NAME = re.compile(r"rank(\d+)|(\d+)$")


def _rank_of(path: Path, doc: dict[str, Any]) -> int:
    meta = doc.get("torchnext")
    if isinstance(meta, dict) and isinstance(meta.get("rank"), int):
        return int(meta["rank"])
    m = _RANK_IN_NAME.search(path.stem) or _RANK_IN_NAME.search(path.name)
    if m is None:
        raise FlightRecorderDumpError(
            f"flight-recorder dump {path}: no rank in the file (torchnext.rank) nor in its name "
            "(<prefix><rank>); rename it to end with the rank"
        )
    return int(m.group(1) or m.group(2))


def load_dumps(
    directory: str | Path,
) -> tuple[dict[int, RankDump], list[tuple[Path, str]], list[Path]]:
    """(rank -> latest dump, unreadable files with their error, superseded older dumps)."""
    folder = Path(directory)
    if not folder.is_dir():
        raise FileNotFoundError(
            f"flight-recorder dump folder {folder} does not exist or is not a folder"
        )
    dumps: dict[int, RankDump] = {}
    bad: list[tuple[Path, str]] = []
    superseded: list[Path] = []
    revokes: dict[int, Any] = {}
    for path in sorted(p for p in folder.rglob("*") if p.is_file() and not p.name.startswith(".")):
        if is_exit_record(path):
            continue  # the launcher's word on a dead process, read by analyze()
        if path.suffix not in (".json", "") and not _RANK_IN_NAME.search(path.name):
            continue
        try:
            doc = load_dump(path)
            rank = _rank_of(path, doc)
        except FlightRecorderDumpError as exc:
            bad.append((path, str(exc)))
            continue
        dump = RankDump(rank=rank, path=path, doc=doc)
        revoke = (doc.get("torchnext") or {}).get("revoke")
        if revoke and rank not in revokes:
            revokes[rank] = revoke
        old = dumps.get(rank)
        if old is None or dump.time_ns >= old.time_ns:
            if old is not None:
                superseded.append(old.path)
            dumps[rank] = dump
        else:
            superseded.append(path)
    # A later dump (on demand, at exit) supersedes the one taken at the revoke, but the
    # revoke's suspects and reason are evidence the analysis should keep.
    for rank, revoke in revokes.items():
        meta = dumps[rank].doc.setdefault("torchnext", {})
        if isinstance(meta, dict) and not meta.get("revoke"):
            meta["revoke"] = revoke
    return dumps, bad, superseded


def _op(entry: dict[str, Any]) -> str:
    name = str(entry["profiling_name"]).split(":", 1)[-1]
    return fr_op_name(name.split(" ", 1)[0])


def _signature(entry: dict[str, Any]) -> tuple[str, str, str]:
    """(op, dtypes, sizes) in the form compared across ranks; rooted ops compare one side."""
    op = _op(entry)
    ins = entry["input_sizes"]
    outs = entry["output_sizes"]
    if op == "gather":
        sizes: Any = ins
    elif op == "scatter":
        sizes = outs
    elif op in ("all_to_all", "barrier"):
        sizes = []  # irregular splits are legal
    elif op in ("broadcast", "reduce", "all_reduce"):
        sizes = ins
    else:
        sizes = [ins, outs]
    dtypes = sorted(set(entry["input_dtypes"]) | set(entry["output_dtypes"]))
    if op == "gather" or op == "scatter":
        dtypes = sorted(set(entry["input_dtypes"] if op == "gather" else entry["output_dtypes"]))
    return op, ",".join(dtypes), json.dumps(sizes)


def _describe(sig: tuple[str, str, str], kind: str) -> str:
    op, dtypes, sizes = sig
    if kind == "dtype_mismatch":
        return f"{op} dtype {dtypes or '-'}"
    if kind == "size_mismatch":
        return f"{op} sizes {sizes}"
    return op


def _group_of(entry: dict[str, Any]) -> str:
    return str(entry["process_group"][0])


def analyze(directory: str | Path) -> Analysis:
    """Analyse every dump in ``directory``; unreadable files are reported, the rest analysed."""
    dumps, bad, superseded = load_dumps(directory)
    deaths = load_exit_records(Path(directory))
    groups: dict[str, dict[str, Any]] = {}
    for _rank, dump in sorted(dumps.items()):
        for name, cfg in dump.doc["pg_config"].items():
            try:
                ranks = tuple(int(r) for r in json.loads(str(cfg.get("ranks", "[]"))))
            except (ValueError, TypeError):
                bad.append(
                    (
                        dump.path,
                        f"flight-recorder dump {dump.path}: pg_config[{name!r}].ranks is not a list",
                    )
                )
                continue
            g = groups.setdefault(
                str(cfg.get("name", name)), {"desc": str(cfg.get("desc", "")), "ranks": ranks}
            )
            if not g["ranks"] and ranks:
                g["ranks"] = ranks
        for entry in dump.doc["entries"]:
            groups.setdefault(
                _group_of(entry), {"desc": str(entry["process_group"][1]), "ranks": ()}
            )
    reports = [
        _analyze_group(name, info["desc"], info["ranks"], dumps, deaths)
        for name, info in sorted(groups.items())
    ]
    cross = _deadlocks(reports, dumps)
    return Analysis(Path(directory), dumps, bad, reports, superseded, cross)


def _deadlocks(reports: list[GroupReport], dumps: dict[int, RankDump]) -> list[Finding]:
    """Merge the groups; each cross-group deadlock replaces the ``missing`` it explains."""
    entries = {r: list(d.doc["entries"]) for r, d in dumps.items()}
    found = find_deadlocks(entries, {g.name: set(g.dump_of.values()) for g in reports})
    names = {
        (_group_of(e), int(e["collective_seq_id"])): _op(e)
        for es in entries.values()
        for e in es
        if not e["is_p2p"]
    }
    out = []
    for d in found:
        for g in reports:
            g.findings = [
                f
                for f in g.findings
                if not (
                    f.kind == "missing" and g.name in d.groups and set(f.culprits) <= set(d.ranks)
                )
            ]
        exp = d.expected
        out.append(
            Finding(
                "deadlock", "+".join(d.groups), exp[1], names.get(exp, ""), d.culprits,
                d.message(names), expected=f"{exp[0]}:{exp[1]} first", ambiguous=d.ambiguous,
                ops=d.ops,
            )
        )  # fmt: skip
    return out


def _analyze_group(
    name: str,
    desc: str,
    ranks: tuple[int, ...],
    dumps: dict[int, RankDump],
    deaths: dict[int, ExitRecord],
) -> GroupReport:
    members = ranks or tuple(sorted(dumps))
    member_dump = _members_dumps(name, members, dumps)
    colls: dict[int, dict[int, dict[str, Any]]] = {}
    p2p: dict[int, list[dict[str, Any]]] = {}
    dropped: dict[int, bool] = {}
    for r in members:
        if r not in member_dump:
            continue
        doc = member_dump[r].doc
        dropped[r] = int((doc.get("torchnext") or {}).get("dropped_entries", 0)) > 0
        per_seq: dict[int, dict[str, Any]] = {}
        for entry in doc["entries"]:
            if _group_of(entry) != name:
                continue
            if entry["is_p2p"]:
                p2p.setdefault(r, []).append(entry)
            else:
                per_seq[int(entry["collective_seq_id"])] = entry
        colls[r] = per_seq
    dumped = tuple(r for r in members if r in member_dump)
    last_seq = {r: max(colls[r], default=0) for r in colls}
    report = GroupReport(name, desc, tuple(members), dumped, last_seq)
    report.dump_of = {r: d.rank for r, d in member_dump.items()}
    if not colls:
        return report
    low = max((min(s) for r, s in colls.items() if s and dropped.get(r)), default=1)
    high = max(last_seq.values(), default=0)
    findings = report.findings
    for seq in range(low, high + 1):
        present = {r: e[seq] for r, e in colls.items() if seq in e}
        absent = [r for r in colls if seq not in colls[r]]
        # A rank whose last op never completed is blocked earlier, not absent by choice:
        # the stuck/hang findings cover it.
        absent = [r for r in absent if _last_completed(colls[r], last_seq[r])]
        if absent and present:
            op = _op(next(iter(present.values())))
            for r in absent:
                last = colls[r].get(last_seq[r])
                tail = (
                    f"its last collective is {last_seq[r]} ({_op(last)}, {last['state']})"
                    if last
                    else "it recorded no collective in this group"
                )
                findings.append(
                    Finding(
                        "missing",
                        name,
                        seq,
                        op,
                        (r,),
                        f"rank {r} never entered collective {seq} ({op}) that ranks {ranges(sorted(present))} entered; {tail}",
                    )
                )
            report.first_divergence = seq
            break
        sigs = {r: _signature(e) for r, e in present.items()}
        if len(set(sigs.values())) <= 1:
            continue
        report.first_divergence = seq
        findings.extend(_mismatch(name, seq, sigs, colls))
        break
    _stuck(report, colls)
    _no_dump(report, colls, dumps, member_dump, deaths)
    _p2p(report, p2p)
    seqs = [f.seq for f in report.findings if f.seq is not None and f.kind != "p2p_mismatch"]
    report.first_divergence = min(seqs) if seqs else None
    return report


def _last_completed(per_seq: dict[int, dict[str, Any]], last: int) -> bool:
    entry = per_seq.get(last)
    return entry is None or entry["state"] == "completed"


def _mismatch(
    name: str,
    seq: int,
    sigs: dict[int, tuple[str, str, str]],
    colls: dict[int, dict[int, dict[str, Any]]],
) -> list[Finding]:
    counts = Counter(sigs.values())
    best = max(counts.values())
    leaders = [s for s, c in counts.items() if c == best]
    # Ties: the lowest rank's view wins, and the finding says it is ambiguous.
    expected = leaders[0] if len(leaders) == 1 else sigs[min(sigs)]
    ambiguous = len(leaders) > 1
    majority = sorted(r for r, s in sigs.items() if s == expected)
    out = []
    for r in sorted(r for r, s in sigs.items() if s != expected):
        found = sigs[r]
        nxt = {_signature(colls[m][seq + 1]) for m in majority if seq + 1 in colls[m]}
        if nxt == {found}:
            out.append(
                Finding(
                    "missing",
                    name,
                    seq,
                    expected[0],
                    (r,),
                    f"rank {r} skipped collective {seq} ({expected[0]}): its collective {seq} is the others' collective {seq + 1} ({found[0]})",
                    expected=expected[0],
                    found=found[0],
                    ambiguous=ambiguous,
                )
            )
            continue
        kind = (
            "op_mismatch"
            if found[0] != expected[0]
            else ("dtype_mismatch" if found[1] != expected[1] else "size_mismatch")
        )
        exp_s, found_s = _describe(expected, kind), _describe(found, kind)
        out.append(
            Finding(
                kind,
                name,
                seq,
                expected[0],
                (r,),
                f"collective {seq}: rank {r} called {found_s}, ranks {ranges(majority)} called {exp_s}"
                + (" (ambiguous: as many ranks on each side)" if ambiguous else ""),
                expected=exp_s,
                found=found_s,
                ambiguous=ambiguous,
            )
        )
    return out


def _stuck(report: GroupReport, colls: dict[int, dict[int, dict[str, Any]]]) -> None:
    by_op: dict[tuple[int, str, str], list[int]] = {}
    for r, per_seq in colls.items():
        for seq, e in per_seq.items():
            if e["state"] in _STUCK_STATES:
                by_op.setdefault((seq, _op(e), e["state"]), []).append(r)
    for (seq, op, state), ranks in sorted(by_op.items()):
        report.findings.append(
            Finding(
                "stuck",
                report.name,
                seq,
                op,
                (),
                f"ranks {ranges(sorted(ranks))} stuck in collective {seq} ({op}), state {state}",
            )
        )


def _members_dumps(
    name: str, members: tuple[int, ...], dumps: dict[int, RankDump]
) -> dict[int, RankDump]:
    """Which dump speaks for which member of group ``name``.

    An entry's ``group_rank`` decides when present (a fault-tolerant group renumbers
    its members from one epoch to the next, so the rank a process had when it started
    is not its rank in every group); else the dump's own rank does.
    """
    out: dict[int, RankDump] = {}
    for d in dumps.values():
        for entry in d.doc["entries"]:
            g = entry.get("group_rank")
            if _group_of(entry) == name and isinstance(g, int) and 0 <= g < len(members):
                out.setdefault(members[g], d)
                break
    claimed = {id(d) for d in out.values()}
    for r in members:
        if r not in out and r in dumps and id(dumps[r]) not in claimed:
            out[r] = dumps[r]
    return out


def _no_dump(
    report: GroupReport,
    colls: dict[int, dict[int, dict[str, Any]]],
    dumps: dict[int, RankDump],
    member_dump: dict[int, RankDump],
    deaths: dict[int, ExitRecord],
) -> None:
    # A member whose process died after its last dump is as good as absent: its
    # dump shows an op in flight, but nobody is left to finish it.
    def in_flight_when_it_died(r: int) -> bool:
        return (
            r in deaths
            and deaths[r].time_ns > member_dump[r].time_ns
            and any(e["state"] in ("started", "scheduled") for e in colls.get(r, {}).values())
        )

    absent = [r for r in report.ranks if r not in member_dump or in_flight_when_it_died(r)]
    if not absent:
        return
    last_entries = [colls[r][s] for r, s in report.last_seq.items() if s in colls[r]]
    waiting = sorted(
        (e for e in last_entries if e["state"] != "completed"),
        key=lambda e: int(e["collective_seq_id"]),
    )
    # The earliest op a survivor is blocked in is the one the silent rank never joined.
    high = (
        int(waiting[0]["collective_seq_id"])
        if waiting
        else max(report.last_seq.values(), default=0)
    )
    op = _op(waiting[0]) if waiting else ""
    suspects = sorted(
        {
            int(s)
            for d in dumps.values()
            for s in ((d.doc.get("torchnext") or {}).get("revoke") or {}).get("suspects", [])
        }
    )
    hint = f"; the group's revoke named suspects {suspects}" if suspects else ""
    if waiting:
        revoke_reasons = " ".join(
            str(((d.doc.get("torchnext") or {}).get("revoke") or {}).get("reason", ""))
            for d in dumps.values()
        )
        # Judge by the first blocked collective only: later failures are the cascade
        # (a survivor that timed out and exited drops *its* connections too).
        first = [e for e in waiting if int(e["collective_seq_id"]) == high]
        texts = [str(e.get("error", "")).lower() for e in first]
        reasons = revoke_reasons.lower()
        crashed = all(
            e["state"] in ("failed", "revoked") and any(w in (t or reasons) for w in _CRASH_WORDS)
            for e, t in zip(first, texts, strict=True)
        )
        died = [f"rank {r} {deaths[r].how}" for r in absent if r in deaths]
        kind = "crash" if crashed or died else "hang"
        what = "lost the connection to it" if crashed else "wait for it"
        if died:
            what += f", but it will not come: the launcher recorded {'; '.join(died)}"
        report.findings.append(
            Finding(
                kind,
                report.name,
                high,
                op,
                tuple(absent),
                f"rank(s) {ranges(absent)} left no dump and never completed collective {high} ({op}); ranks {ranges(sorted(report.dumped))} {what}{hint}",
            )
        )
    else:
        report.findings.append(
            Finding(
                "missing_dump",
                report.name,
                None,
                "",
                tuple(absent),
                f"no dump from rank(s) {ranges(absent)}; their part of the group cannot be checked{hint}",
            )
        )


def _p2p(report: GroupReport, p2p: dict[int, list[dict[str, Any]]]) -> None:
    pairs: dict[tuple[int, int], dict[str, list[dict[str, Any]]]] = {}
    pat = re.compile(r"(send|recv) (-?\d+)(->|<-)(-?\d+)")
    members = report.ranks
    for _r, entries in p2p.items():
        for e in entries:
            m = pat.search(str(e["profiling_name"]))
            if m is None:
                continue
            a, b = int(m.group(2)), int(m.group(4))
            src, dst = (a, b) if m.group(1) == "send" else (b, a)
            if not (0 <= src < len(members) and 0 <= dst < len(members)):
                continue
            key = (members[src], members[dst])
            pairs.setdefault(key, {"send": [], "recv": []})[m.group(1)].append(e)
    for (src, dst), sides in sorted(pairs.items()):
        sends, recvs = sides["send"], sides["recv"]
        if src not in report.dumped or dst not in report.dumped:
            continue
        # Pairs up to the shorter side; a count mismatch is its own finding below.
        for i, (s, rv) in enumerate(zip(sends, recvs, strict=False)):
            if s["input_sizes"] != rv["output_sizes"] or s["input_dtypes"] != rv["output_dtypes"]:
                report.findings.append(
                    Finding(
                        "p2p_mismatch",
                        report.name,
                        int(s["p2p_seq_id"]),
                        "send/recv",
                        (src, dst),
                        f"send #{i + 1} from rank {src} to rank {dst} carries {s['input_sizes']} {s['input_dtypes']}, the matching recv expects {rv['output_sizes']} {rv['output_dtypes']}",
                        expected=str(rv["output_sizes"]),
                        found=str(s["input_sizes"]),
                    )
                )
                break
        if len(sends) != len(recvs):
            more, fewer = ("send", "recv") if len(sends) > len(recvs) else ("recv", "send")
            culprit = dst if more == "send" else src
            report.findings.append(
                Finding(
                    "p2p_mismatch",
                    report.name,
                    None,
                    "send/recv",
                    (culprit,),
                    f"rank {src} posted {len(sends)} send(s) to rank {dst}, which posted {len(recvs)} recv(s) from it; rank {culprit} posted too few {fewer}s",
                )
            )
