"""Reading ``ft-hosts.json`` for ``torchnext bench ft-scale-model``: costs, settings, medians.

:func:`store_costs` builds a store's :class:`~_ft_scale_costs.StoreCosts` from the
latency, throughput, server-CPU and gloo-build figures ft-hosts measured; :func:`timing`
the group's settings with a step time; :func:`measured` the medians of detection, t3
and step time per configuration (4x2 TCP, 4x2 etcd, 4x1 and 4x4 TCP) from the raw
trials and windows; :func:`torchft_costs` and :func:`tuned_torchft` torchft's settings
(its defaults, and the tuned one ``ft-vs-torchft`` found, when its result is there).

What not to assume: a figure the model needs and the file lacks raises ``ValueError``
naming it and the fix (run ft-hosts); optional ones fall back as each function says.
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path
from typing import Any

from _ft_scale_costs import StoreCosts, Timing, TorchftCosts

__all__ = [
    "SILENT",
    "TORCHFT_DEFAULT",
    "measured",
    "need",
    "store_costs",
    "timing",
    "torchft_costs",
    "tuned_torchft",
]

SILENT = ("power_off", "freeze", "partition")
"""The worker-host faults whose detection and t3 the model is checked against."""

TORCHFT_DEFAULT = {
    "heartbeat_timeout_ms": 5000,
    "quorum_tick_ms": 100,
    "pg_timeout_ms": 60000,
    "heartbeat_interval_ms": 100,
}
"""torchft's defaults: ``torchft_lighthouse --help`` and ``ProcessGroupGloo()``'s timeout."""


def need(d: dict[str, Any], key: str, path: Path) -> Any:
    if d.get(key) is None:
        raise ValueError(
            f"{path} has no {key!r}; run `torchnext bench ft-hosts` (or --quick) first, "
            "or pass --input with a complete ft-hosts.json"
        )
    return d[key]


def store_costs(d: dict[str, Any], kind: str, path: Path, rtt_extra_s: float) -> StoreCosts:
    """One store's costs from ft-hosts' latency, throughput and gloo-build figures."""
    lat = need(d, f"store_latency_{kind}", path)
    # The server's own CPU per call when ft-hosts could read it; else the inverse of
    # what 4 callers got together (an upper bound: the callers' own cost bounds it too).
    service = d.get(f"store_cpu_{kind}_s_per_op") or 1.0 / float(
        need(d, f"store_throughput_{kind}_ops_s", path)
    )
    mget64 = d.get(f"store_cpu_{kind}_mget64_s_per_op") or 1.0 / float(
        need(d, f"store_throughput_{kind}_mget64_ops_s", path)
    )
    return StoreCosts(
        check_s=lat["check_s"],
        get_s=lat["get_s"],
        set_s=lat["set_s"],
        add_s=lat["add_s"],
        cas_s=lat["compare_set_s"],
        mget_base_s=lat["multi_get_8_s"],
        mget_key_s=lat["multi_get_per_key_s"],
        service_s=service,
        key_service_s=max(0.0, mget64 - service) / 63,
        pg_build_s=float(need(d, f"pg_build_{kind}_s", path)),
        rtt_extra_s=rtt_extra_s,
    )


def _median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def measured(d: dict[str, Any]) -> dict[str, Any]:
    """Medians of the trials and windows, per configuration."""
    trials = [t for t in d.get("trials_raw", []) if t.get("survived")]
    windows = d.get("windows_raw", [])

    def pick(field: str, store: str, nproc: int, kinds: tuple[str, ...]) -> float | None:
        return _median(
            [
                t[field]
                for t in trials
                if t["store"] == store
                and t["nproc"] == nproc
                and t["kind"] in kinds
                and t.get(field) is not None
            ]
        )

    def step(store: str, nproc: int) -> float | None:
        return _median(
            [w["step_s"] for w in windows if w["store"] == store and w["nproc"] == nproc]
        )

    return {
        "tcp": {
            "detection_s": pick("detection_s", "tcp", 2, SILENT),
            "t3_s": pick("t3_s", "tcp", 2, SILENT),
            "step_s": step("tcp", 2),
            "ranks": 8,
            "failed": 2,
        },
        "etcd": {
            "detection_s": pick("detection_s", "etcd", 2, ("power_off",)),
            "t3_s": pick("t3_s", "etcd", 2, ("power_off",)),
            "step_s": step("etcd", 2),
            "ranks": 8,
            "failed": 2,
        },
        "k1": {
            "detection_s": pick("detection_s", "tcp", 1, SILENT),
            "t3_s": pick("t3_s", "tcp", 1, SILENT),
            "step_s": step("tcp", 1),
            "ranks": 4,
            "failed": 1,
        },
        "k4": {
            "detection_s": pick("detection_s", "tcp", 4, SILENT),
            "t3_s": pick("t3_s", "tcp", 4, SILENT),
            "step_s": step("tcp", 4),
            "ranks": 16,
            "failed": 4,
        },
    }


def timing(d: dict[str, Any], step_s: float, path: Path, store: str = "tcp") -> Timing:
    """The group's timing on ``store`` ("tcp" or "etcd": its own heartbeat interval, when
    the results give one)."""
    interval = d.get(f"heartbeat_interval_s_{store}") or need(d, "heartbeat_interval_s", path)
    return Timing(
        heartbeat_interval_s=float(interval),
        heartbeat_timeout_s=float(need(d, "heartbeat_timeout_s", path)),
        poll_s=float(need(d, "poll_interval_s", path)),
        step_s=step_s,
        compute_s=float(d.get("compute_s", 0.04)),
    )


def torchft_costs(setting: dict[str, Any], name: str, rpc_s: float, rtt_s: float) -> TorchftCosts:
    return TorchftCosts(
        name=name,
        heartbeat_interval_s=setting["heartbeat_interval_ms"] / 1000,
        heartbeat_timeout_s=setting["heartbeat_timeout_ms"] / 1000,
        quorum_tick_s=setting["quorum_tick_ms"] / 1000,
        pg_timeout_s=setting["pg_timeout_ms"] / 1000,
        rpc_s=rpc_s,
        rtt_s=rtt_s,
    )


def tuned_torchft(folders: tuple[Path, ...]) -> dict[str, Any] | None:
    """The fastest torchft setting ft-vs-torchft found without false failures, if it ran."""
    for folder in dict.fromkeys(folders):
        f = folder / "ft-vs-torchft.json"
        if f.is_file():
            setting = json.loads(f.read_text()).get("torchft_tuned_setting")
            if isinstance(setting, dict):
                return setting
    return None
