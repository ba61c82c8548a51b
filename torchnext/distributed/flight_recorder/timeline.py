"""Render an :class:`~torchnext.distributed.fr_analyze.Analysis` as one self-contained HTML page.

Two pictures per group, inline SVG, no scripts and no external assets (the file can be
attached to an incident ticket and opened anywhere):

* *by sequence*: one row per rank, one column per collective; a cell's colour is the
  op, a hatched cell never completed, a red-outlined cell is a culprit's, a red cross
  marks a collective a rank never entered, and a dashed red line marks the first
  divergence;
* *by wall time*: each rank's ops as bars between start and end on the host clock
  (ops still running at the dump run to the dump's time, in red). Clocks of different
  hosts are not synchronised; compare ranks on one host, or use the first picture.

Hover any cell or bar for its op, sizes, dtypes, state and duration.
"""

from __future__ import annotations

import html
import zlib
from pathlib import Path
from typing import Any

from torchnext.distributed.flight_recorder.analyzer import Analysis, Finding, GroupReport

__all__ = ["render_html", "write_html"]

_PALETTE = [
    "#4e79a7",
    "#59a14f",
    "#9c755f",
    "#76b7b2",
    "#edc948",
    "#b07aa1",
    "#ff9da7",
    "#bab0ac",
    "#f28e2b",
]
_CELL = 18
_ROW = 22
_LEFT = 70
_MAX_COLS = 160
_MIN_WIDTH = 640
_LEGEND_H = 24


def _color(op: str) -> str:
    return _PALETTE[zlib.crc32(op.encode()) % len(_PALETTE)]


def _esc(text: object) -> str:
    return html.escape(str(text), quote=True)


def _tooltip(rank: int, e: dict[str, Any]) -> str:
    dur = e.get("duration_ms")
    return (
        f"rank {rank} · collective {e['collective_seq_id']} · {e['profiling_name']}\n"
        f"in {e['input_sizes']} {e['input_dtypes']} · out {e['output_sizes']} {e['output_dtypes']}\n"
        f"state {e['state']}"
        + (f" · {dur:.3f} ms" if isinstance(dur, (int, float)) else "")
        + (f"\nerror: {e['error']}" if e.get("error") else "")
    )


def _entries(analysis: Analysis, group: GroupReport) -> dict[int, dict[int, dict[str, Any]]]:
    out: dict[int, dict[int, dict[str, Any]]] = {}
    for r in group.dumped:
        out[r] = {
            int(e["collective_seq_id"]): e
            for e in analysis.dumps[group.dump_of.get(r, r)].doc["entries"]
            if str(e["process_group"][0]) == group.name and not e["is_p2p"]
        }
    return out


def _by_seq(analysis: Analysis, group: GroupReport) -> str:
    per_rank = _entries(analysis, group)
    seqs = sorted({s for m in per_rank.values() for s in m})
    if not seqs:
        return "<p>no collectives recorded in this group</p>"
    lo, hi = seqs[0], seqs[-1]
    focus = group.first_divergence if group.first_divergence is not None else hi
    if hi - lo + 1 > _MAX_COLS:  # keep the divergence in view, with the lead-up to it
        lo = max(lo, min(focus + 20, hi) - _MAX_COLS + 1)
        hi = min(hi, lo + _MAX_COLS - 1)
    culprit_cells = {(r, f.seq) for f in group.findings for r in f.culprits if f.seq is not None}
    width = max(_LEFT + (hi - lo + 1) * _CELL + 20, _MIN_WIDTH)
    height = 30 + len(group.ranks) * _ROW + 10 + _LEGEND_H
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" font-family="monospace" font-size="11">',
        '<defs><pattern id="hatch" width="4" height="4" patternUnits="userSpaceOnUse" patternTransform="rotate(45)">'
        '<rect width="2" height="4" fill="#d62728" opacity="0.6"/></pattern></defs>',
    ]
    for s in range(lo, hi + 1):
        if (s - lo) % 5 == 0 or s == focus:
            parts.append(f'<text x="{_LEFT + (s - lo) * _CELL}" y="14">{s}</text>')
    for i, rank in enumerate(group.ranks):
        y = 24 + i * _ROW
        parts.append(f'<text x="4" y="{y + 13}">rank {rank}</text>')
        if rank not in per_rank:
            blamed = [s for (r, s) in culprit_cells if r == rank and lo <= s <= hi]
            x_text = _LEFT
            if blamed:
                x = _LEFT + (min(blamed) - lo) * _CELL
                title = f"rank {rank} never completed collective {min(blamed)}"
                parts.append(_cross(x, y, "#d62728", title))
                x_text = x + _CELL + 4
            parts.append(
                f'<text x="{x_text}" y="{y + 13}" fill="#d62728">no dump from rank {rank} (hung or dead?)</text>'
            )
            continue
        last = max(per_rank[rank], default=lo - 1)
        for s in range(lo, hi + 1):
            x = _LEFT + (s - lo) * _CELL
            e = per_rank[rank].get(s)
            if e is None:
                if s <= hi and (
                    s > last or s in {f.seq for f in group.findings if rank in f.culprits}
                ):
                    color = (
                        "#d62728"
                        if (rank, s) in culprit_cells or s == group.first_divergence
                        else "#999"
                    )
                    parts.append(_cross(x, y, color, f"rank {rank} never entered collective {s}"))
                continue
            op = str(e["profiling_name"]).split(":", 1)[-1].split(" ")[0]
            fill = _color(op) if e["state"] == "completed" else "url(#hatch)"
            stroke = ' stroke="#d62728" stroke-width="3"' if (rank, s) in culprit_cells else ""
            parts.append(
                f'<g><title>{_esc(_tooltip(rank, e))}</title><rect x="{x}" y="{y}" width="{_CELL - 2}" '
                f'height="{_ROW - 4}" fill="{fill}"{stroke}/></g>'
            )
    if group.first_divergence is not None and lo <= group.first_divergence <= hi:
        x = _LEFT + (group.first_divergence - lo) * _CELL - 1
        parts.append(
            f'<line x1="{x}" y1="18" x2="{x}" y2="{height - _LEGEND_H - 4}" stroke="#d62728" stroke-dasharray="4,3" stroke-width="2"/>'
        )
    parts.append(_legend(height - _LEGEND_H + 4))
    parts.append("</svg>")
    return "".join(parts)


def _cross(x: float, y: float, color: str, title: str) -> str:
    return (
        f"<g><title>{_esc(title)}</title>"
        f'<path d="M{x + 3},{y + 3} L{x + _CELL - 5},{y + _ROW - 7} M{x + _CELL - 5},{y + 3} '
        f'L{x + 3},{y + _ROW - 7}" stroke="{color}" stroke-width="2"/></g>'
    )


def _legend(y: int) -> str:
    return "".join(
        [
            f'<rect x="4" y="{y}" width="12" height="12" fill="{_PALETTE[0]}"/>'
            f'<text x="20" y="{y + 10}">completed (colour: op)</text>',
            f'<rect x="170" y="{y}" width="12" height="12" fill="url(#hatch)"/>'
            f'<text x="186" y="{y + 10}">never completed</text>',
            f'<rect x="300" y="{y}" width="12" height="12" fill="none" stroke="#d62728" stroke-width="2"/>'
            f'<text x="316" y="{y + 10}">culprit</text>',
            f'<path d="M372,{y} L384,{y + 12} M384,{y} L372,{y + 12}" stroke="#d62728" stroke-width="2"/>'
            f'<text x="390" y="{y + 10}">never entered</text>',
            f'<line x1="494" y1="{y}" x2="494" y2="{y + 12}" stroke="#d62728" stroke-dasharray="4,3" stroke-width="2"/>'
            f'<text x="500" y="{y + 10}">first divergence</text>',
        ]
    )


def _by_time(analysis: Analysis, group: GroupReport) -> str:
    per_rank = _entries(analysis, group)
    spans = []
    for r, m in per_rank.items():
        meta = analysis.dumps[group.dump_of.get(r, r)].doc.get("torchnext") or {}
        dump_t = int(meta.get("time_ns", 0))
        for e in m.values():
            t0 = int(e.get("time_discovered_started_ns") or e.get("time_created_ns") or 0)
            t1 = int(e.get("time_discovered_completed_ns") or 0) or max(dump_t, t0)
            if t0:
                spans.append((r, t0, t1, e))
    if not spans:
        return ""
    start = min(s[1] for s in spans)
    end = max(s[2] for s in spans)
    total = max(end - start, 1)
    plot = 900
    rows = {r: i for i, r in enumerate(group.ranks)}
    height = 30 + len(group.ranks) * _ROW + 10
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{_LEFT + plot + 20}" height="{height}" font-family="monospace" font-size="11">',
        f'<text x="{_LEFT}" y="14">0 s</text><text x="{_LEFT + plot - 60}" y="14">{total / 1e9:.3f} s</text>',
    ]
    for r, i in rows.items():
        parts.append(f'<text x="4" y="{24 + i * _ROW + 13}">rank {r}</text>')
        if r not in per_rank:
            parts.append(
                f'<text x="{_LEFT}" y="{24 + i * _ROW + 13}" fill="#d62728">no dump</text>'
            )
    for r, t0, t1, e in spans:
        if r not in rows:
            continue
        x = _LEFT + (t0 - start) * plot / total
        w = max((t1 - t0) * plot / total, 1.5)
        fill = (
            _color(str(e["profiling_name"]).split(":", 1)[-1].split(" ")[0])
            if e["state"] == "completed"
            else "#d62728"
        )
        parts.append(
            f'<g><title>{_esc(_tooltip(r, e))}</title><rect x="{x:.1f}" y="{24 + rows[r] * _ROW}" '
            f'width="{w:.1f}" height="{_ROW - 4}" fill="{fill}" opacity="0.85"/></g>'
        )
    parts.append("</svg>")
    return "".join(parts)


def _finding_html(f: Finding) -> str:
    return f"<li><b>{_esc(f.kind)}</b> {_esc(f.message)}</li>"


def render_html(analysis: Analysis) -> str:
    """The whole page as a string."""
    body = [
        f"<h1>Flight recorder: {_esc(analysis.directory)}</h1>",
        f"<p>{len(analysis.dumps)} dump(s); result: <b>{'no problem found' if analysis.ok else 'problems found'}</b></p>",
    ]
    if analysis.bad_files:
        body.append(
            "<h3>Unreadable dumps</h3><ul>"
            + "".join(f"<li>{_esc(e)}</li>" for _, e in analysis.bad_files)
            + "</ul>"
        )
    for g in analysis.groups:
        body.append(f"<h2>group {_esc(g.name)} ({_esc(g.desc)}) — ranks {_esc(list(g.ranks))}</h2>")
        if g.findings:
            body.append(
                '<ul class="bad">' + "".join(_finding_html(f) for f in g.findings) + "</ul>"
            )
        else:
            body.append("<p>no problem found</p>")
        body.append("<h3>By sequence number</h3>" + _by_seq(analysis, g))
        timed = _by_time(analysis, g)
        if timed:
            body.append("<h3>By wall time</h3>" + timed)
    style = (
        "body{font-family:sans-serif;margin:24px;color:#222}ul.bad li{color:#a11}"
        "svg{border:1px solid #ddd;margin:6px 0;background:#fff}h2{margin-top:28px}"
    )
    return (
        '<!DOCTYPE html><html><head><meta charset="utf-8"><title>flight recorder timeline</title>'
        f"<style>{style}</style></head><body>" + "".join(body) + "</body></html>\n"
    )


def write_html(analysis: Analysis, path: str | Path) -> Path:
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(render_html(analysis), encoding="utf-8")
    return target
