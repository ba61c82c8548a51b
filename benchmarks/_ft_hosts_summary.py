"""The figures of ``torchnext bench ft-hosts``: the issue's keys, the table, the bars.

:func:`summarize` turns the fault-free windows and the trials into the keys the issue
names (``heartbeat_timeout_s``, ``false_suspicions``, ``silent_detection_p99_s``,
``host_loss_t3_p99_s``, ``host_loss_t3_k_ratio``, ``steps_lost``,
``etcd_store_host_loss_survived``, ``etcd_step_overhead_pct``) plus what the scale model
reads (medians, the agreement and healing times); :func:`table_rows` gives one row per
fault kind, store and workers per host.

What not to assume: a "p99" over fewer than 100 trials is the maximum (:func:`p99`);
the etcd overhead pairs each etcd window with the TCP window run next to it, so a
missing window drops its pair, not the whole figure.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from typing import Any

from _ft_hosts_trials import Trial, Window

from torchnext.benchmarking import paired_difference, percentile

__all__ = ["BARS", "p99", "summarize", "table_rows"]

SILENT_KINDS = ("power_off", "freeze", "partition", "store_power_off")

BARS: dict[str, tuple[str, float | bool]] = {
    "false_suspicions": ("==", 0),
    "silent_detection_p99_s": ("<=", 2.0),
    "host_loss_t3_p99_s": ("<=", 2.0),
    "host_loss_t3_k_ratio": ("<=", 1.5),
    "steps_lost": ("==", 0),
    "etcd_store_host_loss_survived": ("==", True),
    "etcd_step_overhead_pct": ("<=", 5.0),
}
"""The issue's bar for each key: (comparison, value)."""


def p99(values: Sequence[float]) -> float | None:
    """The 99th percentile; the maximum when there are fewer than 100 values."""
    if not values:
        return None
    return max(values) if len(values) < 100 else percentile(values, 99)


def _median(values: Sequence[float]) -> float | None:
    return statistics.median(values) if values else None


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b is not None and b > 0 else None


def _minus(a: float | None, b: float | None) -> float | None:
    return a - b if a is not None and b is not None else None


def _survivable(t: Trial) -> bool:
    """Every case but the TCP store's host: there the job is lost by design."""
    return not (t.kind == "store_power_off" and t.store == "tcp")


def _overhead(windows: Sequence[Window]) -> dict[str, Any]:
    """etcd against TCP step time from adjacent windows (etcd job i, then TCP job i)."""
    tcp = [w for w in windows if w.store == "tcp" and w.nproc == 2]
    etcd = [w for w in windows if w.store == "etcd" and w.nproc == 2]
    pairs = [
        (t.step_s, e.step_s)
        for t, e in zip(tcp, etcd, strict=False)
        if t.job.split("-")[-1] == e.job.split("-")[-1]
    ]
    if not pairs:
        return {"etcd_step_overhead_pct": None}
    base = [p[0] for p in pairs]
    diff = paired_difference(base, [p[1] for p in pairs]).relative_to(statistics.median(base))
    return {
        "etcd_step_overhead_pct": round(100 * diff.median, 2),
        "etcd_step_overhead_ci95_pct": [round(100 * diff.lo, 2), round(100 * diff.hi, 2)],
        "etcd_step_overhead_pairs": diff.pairs,
        "step_s_tcp": statistics.median(base),
        "step_s_etcd": statistics.median(p[1] for p in pairs),
    }


def summarize(
    windows: Sequence[Window],
    trials: Sequence[Trial],
    *,
    heartbeat_timeout_s: float,
) -> dict[str, Any]:
    """The issue's keys first, then the figures behind them."""
    main = [t for t in trials if t.nproc == 2]
    ok = [t for t in trials if t.survived]
    detections = [t.detection_s for t in ok if t.detection_s is not None and t.kind in SILENT_KINDS]
    t3s = [t.t3_s for t in ok if t.t3_s is not None]
    k1 = [t.t3_s for t in ok if t.nproc == 1 and t.t3_s is not None]
    k4 = [t.t3_s for t in ok if t.nproc == 4 and t.t3_s is not None]
    etcd_loss = [t for t in trials if t.kind == "store_power_off" and t.store == "etcd"]
    tcp_loss = [t for t in trials if t.kind == "store_power_off" and t.store == "tcp"]
    survivable = [t for t in trials if _survivable(t)]
    fenced = [t.fenced_s for t in trials if t.fenced_s is not None]
    out: dict[str, Any] = {
        "heartbeat_timeout_s": heartbeat_timeout_s,
        "false_suspicions": sum(w.false_suspicions for w in windows),
        "silent_detection_p99_s": p99(detections),
        "host_loss_t3_p99_s": p99(t3s),
        "host_loss_t3_k_ratio": _ratio(_median(k4), _median(k1)),
        # Measured on every survivable trial that recovered; one that did not is counted
        # in survivable_trials_failed (its loss cannot be measured).
        "steps_lost": sum(t.steps_lost for t in survivable if t.survived),
        "etcd_store_host_loss_survived": bool(etcd_loss) and all(t.survived for t in etcd_loss),
    }
    out.update(_overhead(windows))
    step = {
        k: _median([w.step_s for w in windows if w.nproc == k and w.store == "tcp"]) for k in (1, 4)
    }
    out["host_loss_t3_k_ratio_less_one_step"] = _ratio(
        _minus(_median(k4), step[4]), _minus(_median(k1), step[1])
    )
    out["step_s_k1"], out["step_s_k4"] = step[1], step[4]
    out.update(
        {
            "tcp_store_host_loss_survived": any(t.survived for t in tcp_loss) if tcp_loss else None,
            "tcp_store_host_loss_trials": len(tcp_loss),
            "survivable_trials_failed": sum(1 for t in survivable if not t.survived),
            "silent_detection_p50_s": _median(detections),
            "host_loss_t3_p50_s": _median(t3s),
            "host_loss_t3_p50_s_k1": _median(k1),
            "host_loss_t3_p50_s_k4": _median(k4),
            "host_loss_t3_p50_s_k2_tcp": _median(
                [t.t3_s for t in main if t.survived and t.store == "tcp" and t.t3_s is not None]
            ),
            "host_loss_t3_p50_s_k2_etcd": _median(
                [t.t3_s for t in main if t.survived and t.store == "etcd" and t.t3_s is not None]
            ),
            "agreement_p50_s": _median([t.agreement_s for t in ok if t.agreement_s is not None]),
            "shrinks_per_host_loss_max": max((t.shrinks for t in ok), default=None),
            "fenced_p99_s": p99(fenced),
            "fenced_exits": f"{len(fenced)}/{sum(1 for t in trials if t.kind in ('freeze', 'partition'))}",
            "split_brain_commits": sum(t.split_brain_commits for t in trials),
            "in_flight_commits_on_cut_off_host": sum(t.in_flight_commits for t in trials),
            "wrong_suspicions_in_fault_runs": sum(t.wrong_suspicions for t in trials),
            "replace_p50_s": _median([t.replace_s for t in trials if t.replace_s is not None]),
            "heal_p50_s": _median([t.heal_s for t in trials if t.heal_s is not None]),
        }
    )
    out["bars"] = {key: _meets(out.get(key), *bar) for key, bar in BARS.items()}
    return out


def _meets(value: Any, op: str, bar: float | bool) -> bool | None:
    if value is None:
        return None
    if op == "==":
        return bool(value == bar)
    return bool(value <= bar)


def table_rows(trials: Sequence[Trial]) -> list[dict[str, Any]]:
    """One row per (fault kind, store, workers per host), in the order first seen."""
    keys: list[tuple[str, str, int]] = []
    for t in trials:
        if (t.kind, t.store, t.nproc) not in keys:
            keys.append((t.kind, t.store, t.nproc))
    rows = []
    for kind, store, nproc in keys:
        group = [t for t in trials if (t.kind, t.store, t.nproc) == (kind, store, nproc)]
        ok = [t for t in group if t.survived]
        det = [t.detection_s for t in ok if t.detection_s is not None]
        t3 = [t.t3_s for t in ok if t.t3_s is not None]
        fen = [t.fenced_s for t in group if t.fenced_s is not None]
        rows.append(
            {
                "fault": kind,
                "store": store,
                "k": nproc,
                "trials": len(group),
                "survived": len(ok),
                "detect_p50_s": _median(det) if det else "",
                "detect_p99_s": p99(det) if det else "",
                "t3_p50_s": _median(t3) if t3 else "",
                "t3_p99_s": p99(t3) if t3 else "",
                "steps_lost": sum(t.steps_lost for t in group) if _survivable(group[0]) else "n/a",
                "shrinks_max": max((t.shrinks for t in ok), default=""),
                "fenced_p99_s": p99(fen) if fen else "",
            }
        )
    return rows
