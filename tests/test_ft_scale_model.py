"""The arithmetic of ``benchmarks/ft_scale_model.py`` and of ft-hosts' summary, by hand.

Each formula of ``_ft_scale_costs.py`` is checked against a value worked out here from
its docstring, with a store whose service time is zero where the queue should not
matter. The end-to-end test runs the model's ``main`` on a small ``ft-hosts.json``
written here (no benchmark run, no timing) and checks the prediction it records.
"""

from __future__ import annotations

import importlib
import json
import math
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


@pytest.fixture
def mods(monkeypatch: pytest.MonkeyPatch) -> dict[str, ModuleType]:
    monkeypatch.syspath_prepend(str(BENCHMARKS))  # benchmark scripts import their helpers so
    names = (
        "_ft_scale_costs",
        "_ft_scale_inputs",
        "ft_scale_model",
        "_ft_hosts_summary",
        "_ft_hosts_trials",
    )
    return {n: importlib.import_module(n) for n in names}


def _store(c: ModuleType, **over: float) -> Any:
    values = dict(
        check_s=1e-3,
        get_s=1e-3,
        set_s=1e-3,
        add_s=1e-3,
        cas_s=1e-3,
        mget_base_s=2e-3,
        mget_key_s=0.0,
        service_s=0.0,
        key_service_s=0.0,
        pg_build_s=5e-3,
    )
    values.update(over)
    return c.StoreCosts(**values)


def _timing(c: ModuleType, step_s: float = 0.08) -> Any:
    return c.Timing(
        heartbeat_interval_s=0.1,
        heartbeat_timeout_s=3.0,
        poll_s=0.02,
        step_s=step_s,
        compute_s=0.04,
    )


def test_agreement_requests_and_times_follow_the_protocol(mods: dict[str, ModuleType]) -> None:
    c = mods["_ft_scale_costs"]
    store, t = _store(c), _timing(c)
    # One pass: half a poll, then 8 acks + the decision checked one by one.
    assert c.agreement_iteration_s(8, t, store) == pytest.approx(0.01 + 9e-3)
    # Passes: ceil((poll + compute) / 2 / pass) + 2 = ceil(0.03 / 0.019) + 2 = 4; per
    # survivor 1 ack + 4 * 9 checks + cas + get + 2 eviction marks + address + 5 peers +
    # latest.
    assert c.agreement_ops(8, 2, t, store) == 6 * (1 + 36 + 2 + 2 + 1 + 5 + 1)
    latency, work = c.agreement_s(8, 2, t, store)
    assert latency == pytest.approx(2 * 0.019 + 2e-3) and work == 0.0
    residual = 0.04**2 / (2 * 0.08)
    epoch = 5e-3 + 4 * 2e-3  # the 2-rank build, then a get and a connect per extra peer
    assert c.t3_s(8, 2, t, store) == pytest.approx(0.02 + residual + latency + epoch + 0.08)


def test_load_grows_with_the_square_of_members_and_stretches_the_heartbeat(
    mods: dict[str, ModuleType],
) -> None:
    c = mods["_ft_scale_costs"]
    t = _timing(c)
    keys = _store(c, key_service_s=1e-6)
    # Only the heartbeat reads cost: members * (members - 1) keys per interval.
    assert c.offered_load(10, t, keys) == pytest.approx(10 * 9 / 0.1 * 1e-6)
    assert c.offered_load(1000, t, keys) / c.offered_load(100, t, keys) == pytest.approx(
        1000 * 999 / (100 * 99)
    )
    requests = _store(c, service_s=1e-5)
    per_member = 1 / 0.02 + 3 / 0.1 + c.VOTE_REQUESTS / 0.08
    assert c.steady_ops_per_s(4, t) == pytest.approx(4 * per_member)
    load = c.offered_load(4, t, requests)
    assert c.request_latency(4, t, requests, 1e-3) == pytest.approx(1e-3 + 1e-5 * load / (1 - load))
    # Past saturation: every caller queued once at most, and every loop slowed alike.
    full = _store(c, service_s=1e-3)
    n = 256
    assert c.offered_load(n, t, full) > 1
    assert c.request_latency(n, t, full, 1e-3) == pytest.approx(1e-3 + 2 * n * 1e-3)
    assert c.heartbeat_period_s(n, t, full) == pytest.approx(0.1 * c.offered_load(n, t, full))
    assert c.liveness_holds(8, t, requests) and not c.liveness_holds(n, t, full)


def test_detection_is_the_timeout_plus_phase_poll_and_the_checks(
    mods: dict[str, ModuleType],
) -> None:
    c = mods["_ft_scale_costs"]
    store, t = _store(c), _timing(c)
    phase = 0.1 * (math.sqrt(2 / 6) - 0.5)
    assert c.detection_s(6, t, store, 8) == pytest.approx(3.0 + phase + 0.01 + 2e-3 + 1e-3)


def test_goodput_restart_and_torchft_closed_forms(mods: dict[str, ModuleType]) -> None:
    c = mods["_ft_scale_costs"]
    interval = c.young_daly_interval_s(60, 3600)
    assert interval == pytest.approx(math.sqrt(2 * 60 * 3600))
    expected = (1 - 60 / interval) * (1 - (600 + interval / 2) / 3600)
    assert c.restart_goodput(3600, 600, 60, interval) == pytest.approx(expected)
    d = c.Design("x", lost_s=10.0, degraded_s=100.0, overhead=0.02)
    assert c.goodput(d, 50, 3600) == pytest.approx(0.98 * (1 - (10 + 100 / 50) / 3600))
    assert c.goodput(c.Design("saturated", math.inf), 50, 3600) == 0.0
    ft = c.TorchftCosts("d", 0.1, 5.0, 0.1, 60.0, rpc_s=5e-5, rtt_s=1e-4)
    msgs, quorum, load = c.torchft_quorum(8000, 1000, ft)
    assert msgs == 2 * (8000 + 1000)
    assert quorum == pytest.approx(0.05 + 4e-4 + 1000 * (5e-5 + 1000 * 50e-9))
    assert load == pytest.approx(1000 / 0.1 * 5e-5)
    assert c.torchft_lost_s(8000, 1000, ft, 0.01, 0.08) == pytest.approx(60 + quorum + 0.09)


def _hosts_json(path: Path) -> None:
    latency = {
        "set_s": 1e-5,
        "get_s": 4e-5,
        "check_s": 4e-5,
        "add_s": 4e-5,
        "compare_set_s": 4e-5,
        "multi_get_8_s": 9e-5,
        "multi_get_64_s": 2e-4,
        "multi_get_per_key_s": 2e-6,
    }
    trial = {
        "store": "tcp",
        "nproc": 2,
        "kind": "power_off",
        "survived": True,
        "detection_s": 3.02,
        "t3_s": 0.14,
    }
    payload = {
        "heartbeat_interval_s": 0.1,
        "heartbeat_timeout_s": 3.0,
        "poll_interval_s": 0.02,
        "compute_s": 0.04,
        "replace_p50_s": 15.0,
        "etcd_step_overhead_pct": 50.0,
        "store_latency_tcp": latency,
        "store_latency_etcd": {**latency, "check_s": 1e-3},
        "store_throughput_tcp_ops_s": 30000.0,
        "store_throughput_tcp_mget64_ops_s": 8000.0,
        "store_throughput_etcd_ops_s": 1500.0,
        "store_throughput_etcd_mget64_ops_s": 200.0,
        "pg_build_tcp_s": 0.002,
        "pg_build_etcd_s": 0.01,
        "trials_raw": [trial, {**trial, "t3_s": 0.16, "detection_s": 3.0}],
        "windows_raw": [{"store": "tcp", "nproc": 2, "step_s": 0.078}],
    }
    path.write_text(json.dumps(payload))


def test_the_model_runs_on_an_ft_hosts_file_and_records_its_prediction(
    mods: dict[str, ModuleType], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    model = mods["ft_scale_model"]
    src = tmp_path / "ft-hosts.json"
    _hosts_json(src)
    code = model.main(["--input", str(src), "--out-dir", str(tmp_path), "--no-png"])
    assert code == 0, capsys.readouterr().err
    out = json.loads((tmp_path / "ft-scale-model.json").read_text())
    assert out["measured_t3_s"] == pytest.approx(0.15)  # the median of the two trials
    error = out["predicted_t3_s"] / out["measured_t3_s"] - 1
    assert out["prediction_within_25pct"] == (abs(error) <= 0.25)
    assert [r["ranks"] for r in out["scale"]] == list(model.RANKS)
    assert {r["design"].split(" (")[0] for r in out["goodput_rows"]} >= {"full restart"}
    # The server's measured CPU per call, when there, is the service time.
    inputs = mods["_ft_scale_inputs"]
    payload = json.loads(src.read_text())
    assert inputs.store_costs(payload, "tcp", src, 0.0).service_s == pytest.approx(1 / 30000)
    payload["store_cpu_tcp_s_per_op"] = 2e-5
    payload["store_cpu_tcp_mget64_s_per_op"] = 2e-5 + 63e-6
    costs = inputs.store_costs(payload, "tcp", src, 0.0)
    assert costs.service_s == 2e-5 and costs.key_service_s == pytest.approx(1e-6)
    # A file without a figure the model needs: exit 2, naming the key and the fix.
    payload = json.loads(src.read_text())
    del payload["pg_build_tcp_s"]
    src.write_text(json.dumps(payload))
    assert model.main(["--input", str(src), "--out-dir", str(tmp_path), "--no-png"]) == 2
    assert "pg_build_tcp_s" in capsys.readouterr().err


def test_ft_hosts_summary_keys(mods: dict[str, ModuleType]) -> None:
    summary, trials = mods["_ft_hosts_summary"], mods["_ft_hosts_trials"]
    assert summary.p99([1.0, 3.0, 2.0]) == 3.0  # under 100 trials: the maximum
    assert summary.p99([float(i) for i in range(200)]) == pytest.approx(197.01)

    def trial(kind: str, store: str, nproc: int, t3: float, **kw: Any) -> Any:
        return trials.Trial(
            f"{store}-0", store, kind, "h1", nproc, 8, survived=True, detection_s=3.0, t3_s=t3, **kw
        )

    runs = [
        trial("power_off", "etcd", 2, 0.8),
        trial("store_power_off", "etcd", 2, 1.2, steps_lost=1),
        trial("freeze", "tcp", 2, 0.15),
        trials.Trial("tcp-0", "tcp", "store_power_off", "h0", 2, 6, steps_lost=40),
        trial("power_off", "tcp", 1, 0.1),
        trial("power_off", "tcp", 4, 0.2),
    ]
    windows = [
        trials.Window("tcp-0", "tcp", 2, 50, 4.0, 0.08, 0),
        trials.Window("etcd-0", "etcd", 2, 12, 4.0, 0.3, 1),
    ]
    out = summary.summarize(windows, runs, heartbeat_timeout_s=3.0)
    assert out["steps_lost"] == 1  # the TCP store's loss is not counted
    assert out["host_loss_t3_p99_s"] == 1.2 and out["host_loss_t3_k_ratio"] == 2.0
    assert out["etcd_store_host_loss_survived"] is True
    assert out["tcp_store_host_loss_survived"] is False
    assert out["false_suspicions"] == 1
    assert out["etcd_step_overhead_pct"] == pytest.approx(275.0)
    assert out["bars"]["steps_lost"] is False and out["bars"]["host_loss_t3_p99_s"] is True
