"""Scale on paper: torchnext's host-loss recovery from 8 to 16,384 ranks, and a 1,000-host job.

Reads ``results/ft-hosts.json`` (``torchnext bench ft-hosts``): the store operations'
round trips and service time (TCP store and etcd), the cost of building a gloo group,
the heartbeat settings, the fault-free step time, and the measured detection, t3 and
replacement times. Writes ``results/ft-scale-model.json`` and ``.png``.

The model is the protocol as ``torchnext/distributed/group`` runs it (the arithmetic,
one function per quantity, is in ``_ft_scale_costs.py``):

* *Liveness*: every member bumps a counter in the store every heartbeat interval I and
  reads all members' counters in one ``multi_get``; a counter unchanged for the timeout
  T is a failure. Each member also checks its epoch's revoke key every poll. So the
  store serves N/poll + 3N/I + 7N/step requests a second and reads N(N-1)/I keys: the
  load grows with N squared, and the store saturates where it reaches 1.
* *Detection* of a silent host: T, less the victim's last beat's age, plus the first
  survivor's observation and check phase, half a poll and the check's round trips.
* *Agreement* (``agree_on_next``): each survivor sets its ack, then loops (sleep half a
  poll, ``check`` the decision and each of the N members' acks, one after the other)
  until every member acked or is suspected; the first to see that proposes with a
  ``compare_set``, the others read it. Requests: about S(passes(N+1) + S + F + 6),
  fan-in all at the one store, served one at a time (service time: the server
  processes' CPU per call, which ft-hosts reads from ``/proc`` while 4 callers hammer
  it; else the inverse of their throughput). Latency: two passes after the last arrival,
  or the store's busy time for all of them if longer.
* *t3* (detection to every survivor's commit): a poll (the revoke reaches the last
  survivor), the compute in flight that a revoke cannot cut short, the agreement, the
  new epoch's gloo group (the measured 2-rank build plus a round trip per extra peer),
  and the redone step (the measured fault-free step, held constant with N: each rank's
  compute does not change with data parallelism).
* *torchft* (its published design, from its ``src/lighthouse.rs`` and defaults; torchft
  is not needed to run this): one Lighthouse; each replica group's manager heartbeats it
  every 100 ms and asks it for a quorum, each rank asks its manager; the Lighthouse
  drops a group after its heartbeat timeout (5 s default), serves requests one at a time
  under its state lock, each running a quorum check that scans every group, and checks
  again every quorum tick (100 ms). Survivors blocked in the cross-group all-reduce wait
  for the process group's timeout (60 s default for gloo; ``ft-vs-torchft`` measured
  torchft's recovery at its defaults at about that). The Lighthouse's time per
  request (``--lighthouse-rpc-us``) and per group scanned (50 ns) are assumed, not
  measured. The tuned setting is read from ``results/ft-vs-torchft.json`` when present.
* *Goodput* of a job of ``--hosts`` hosts of ``--ranks-per-host`` ranks, each host
  failing once per ``--host-mtbf-h`` hours (default 6,300 h: 419 unexpected
  interruptions in 54 days on 2,048 hosts of 8 GPUs, the rate Meta reported for Llama 3
  pre-training): (1 - overhead)(1 - lost per failure / job MTBF), where torchnext and
  torchft lose their detection-to-recovery time and the missing host's share until it
  is replaced; a full restart loses the restart (``--restart-min``) and half a
  checkpoint interval (Young/Daly optimum for ``--ckpt-write-s``) per failure and a
  checkpoint write per interval.

Its prediction for the measured configuration (4 hosts x 2 ranks, TCP store, a worker
host lost) is printed beside the measurement; the bar is 25 %. Usage::

    torchnext bench ft-scale-model [--hosts 1000] [--host-mtbf-h 6300] [--input PATH]
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path
from typing import Any

from _ft_scale_costs import (
    Design,
    StoreCosts,
    TorchftCosts,
    agreement_ops,
    agreement_s,
    detection_s,
    goodput,
    heartbeat_period_s,
    liveness_holds,
    offered_load,
    restart_goodput,
    step_at,
    t3_s,
    torchft_lost_s,
    torchft_quorum,
    young_daly_interval_s,
)
from _ft_scale_inputs import (
    TORCHFT_DEFAULT,
    measured,
    need,
    store_costs,
    timing,
    torchft_costs,
    tuned_torchft,
)

RANKS = (8, 16, 64, 256, 1024, 4096, 16384)
BAR = 0.25
"""The largest error of a prediction for a measured configuration that passes."""


def validate(d: dict[str, Any], stores: dict[str, StoreCosts], path: Path) -> list[dict[str, Any]]:
    """Prediction against measurement for every configuration ft-hosts measured."""
    rows = []
    for name, m in measured(d).items():
        if m["step_s"] is None or m["t3_s"] is None:
            continue
        kind = "etcd" if name == "etcd" else "tcp"
        store = stores[kind]
        t = timing(d, m["step_s"], path, kind)
        survivors = m["ranks"] - m["failed"]
        pred = {
            "detection_s": detection_s(survivors, t, store, m["ranks"]),
            "t3_s": t3_s(m["ranks"], m["failed"], t, store),
        }
        for what in ("detection_s", "t3_s"):
            if m[what] is None:
                continue
            error = pred[what] / m[what] - 1
            rows.append(
                {
                    "config": name,
                    "quantity": what,
                    "measured": m[what],
                    "predicted": pred[what],
                    "error_pct": 100 * error,
                    "within_25pct": abs(error) <= BAR,
                }
            )
    return rows


def scale_rows(
    d: dict[str, Any],
    stores: dict[str, StoreCosts],
    args: argparse.Namespace,
    ft: TorchftCosts,
    path: Path,
) -> list[dict[str, Any]]:
    """One row per rank count: one host of ``--ranks-per-host`` ranks lost, TCP store."""
    base = measured(d)["tcp"]
    base_step = base["step_s"] or float(need(d, "step_s_tcp", path))
    rows = []
    for n in RANKS:
        f = min(args.ranks_per_host, n // 2)
        store = stores["tcp"]
        t0 = timing(d, base_step, path)
        t = timing(d, step_at(n, base["ranks"], base_step, t0, store), path)
        live = liveness_holds(n, t, store)
        lat, work = agreement_s(n, f, t, store)
        groups = max(1, n // args.ranks_per_host)
        msgs, quorum, lh = torchft_quorum(n, groups, ft)
        rows.append(
            {
                "ranks": n,
                "hosts": groups,
                "agree_requests": agreement_ops(n, f, t, store),
                "agree_latency_s": lat,
                "agree_work_s": work,
                "load_tcp": offered_load(n, t, store),
                "load_etcd": offered_load(n, t, stores["etcd"]),
                "beat_period_s": heartbeat_period_s(n, t, store),
                "step_s": t.step_s,
                "detect_s": detection_s(n - f, t, store, n) if live else "unstable",
                "t3_tcp_s": t3_s(n, f, t, store) if live else "unstable",
                "lost_s": detection_s(n - f, t, store, n) + t3_s(n, f, t, store)
                if live
                else "unstable",
                "torchft_lost_s": torchft_lost_s(n, groups, ft, store.pg_build_s, base_step),
                "torchft_msgs": msgs,
                "torchft_quorum_s": quorum,
                "lighthouse_load": lh,
            }
        )
    return rows


def goodput_rows(
    d: dict[str, Any],
    stores: dict[str, StoreCosts],
    args: argparse.Namespace,
    fts: list[TorchftCosts],
    path: Path,
) -> tuple[list[dict[str, Any]], float]:
    """The 1,000-host job run each way: lost seconds per failure, overhead, goodput."""
    hosts, k = args.hosts, args.ranks_per_host
    n = hosts * k
    job_mtbf_s = args.host_mtbf_h * 3600 / hosts
    m = measured(d)
    replace_s = float(d.get("replace_p50_s") or 60.0)
    fast = m["tcp"]["step_s"] or float(need(d, "step_s_tcp", path))
    designs: list[Design] = []
    for kind, members, failed, label in (
        ("tcp", n, k, "torchnext, TCP store, a member per rank"),
        ("etcd", n, k, "torchnext, etcd store, a member per rank"),
        ("tcp", hosts, 1, "what-if: torchnext, a member per host"),
    ):
        store = stores[kind]
        base = m[kind]["step_s"] or fast
        t0 = timing(d, base, path, kind)
        t = timing(d, step_at(members, m[kind]["ranks"], base, t0, store), path, kind)
        if not liveness_holds(members, t, store):
            designs.append(Design(label, math.inf))
            continue
        lost = detection_s(members - failed, t, store, members) + t3_s(members, failed, t, store)
        designs.append(Design(label, lost, replace_s, max(0.0, 1 - fast / t.step_s)))
    for ft in fts:
        lost = torchft_lost_s(n, hosts, ft, stores["tcp"].pg_build_s, fast)
        designs.append(Design(f"torchft ({ft.name})", lost, replace_s))
    rows: list[dict[str, Any]] = [
        {
            "design": x.name,
            "lost_s_per_failure": x.lost_s if math.isfinite(x.lost_s) else "saturated",
            "overhead_pct": 100 * x.overhead,
            "goodput": goodput(x, hosts, job_mtbf_s),
        }
        for x in designs
    ]
    interval = young_daly_interval_s(args.ckpt_write_s, job_mtbf_s)
    restart_s = args.restart_min * 60
    rows.append(
        {
            "design": f"full restart ({args.restart_min:g} min, checkpoint every "
            f"{interval / 60:.0f} min)",
            "lost_s_per_failure": restart_s + interval / 2,
            "overhead_pct": 100 * args.ckpt_write_s / interval,
            "goodput": restart_goodput(job_mtbf_s, restart_s, args.ckpt_write_s, interval),
        }
    )
    return rows, job_mtbf_s


def main(argv: list[str]) -> int:
    from torchnext.benchmarking import results_dir

    p = argparse.ArgumentParser(prog="torchnext bench ft-scale-model")
    p.add_argument("--input", default="", help="ft-hosts.json (default results/ft-hosts.json)")
    p.add_argument("--out-dir", default="", help="where to write (default benchmarks/results)")
    p.add_argument("--hosts", type=int, default=1000)
    p.add_argument("--ranks-per-host", type=int, default=8)
    p.add_argument("--host-mtbf-h", type=float, default=6300.0)
    p.add_argument("--restart-min", type=float, default=10.0)
    p.add_argument("--ckpt-write-s", type=float, default=60.0)
    p.add_argument("--lighthouse-rpc-us", type=float, default=50.0)
    p.add_argument("--rtt-extra-us", type=float, default=0.0, help="network RTT to add per request")
    p.add_argument("--no-png", action="store_true")
    args = p.parse_args(argv)
    if args.hosts < 1 or args.ranks_per_host < 1 or args.host_mtbf_h <= 0:
        p.error("--hosts, --ranks-per-host and --host-mtbf-h must be positive")
    out_dir = Path(args.out_dir) if args.out_dir else results_dir()
    path = Path(args.input) if args.input else results_dir() / "ft-hosts.json"
    if not path.is_file():
        print(
            f"torchnext bench ft-scale-model: {path} not found; run `torchnext bench "
            "ft-hosts` first (or pass --input)",
            file=sys.stderr,
        )
        return 2
    d = json.loads(path.read_text())
    try:
        stores = {k: store_costs(d, k, path, args.rtt_extra_us * 1e-6) for k in ("tcp", "etcd")}
        rtt = stores["tcp"].rtt(stores["tcp"].check_s)
        fts = [torchft_costs(TORCHFT_DEFAULT, "defaults", args.lighthouse_rpc_us * 1e-6, rtt)]
        tuned = tuned_torchft((out_dir, path.parent, results_dir()))
        if tuned is not None:
            fts.append(
                torchft_costs(
                    tuned,
                    f"tuned {tuned.get('name', '')}".strip(),
                    args.lighthouse_rpc_us * 1e-6,
                    rtt,
                )
            )
        checks = validate(d, stores, path)
        scale = scale_rows(d, stores, args, fts[0], path)
        gp, job_mtbf_s = goodput_rows(d, stores, args, fts, path)
    except ValueError as exc:
        print(f"torchnext bench ft-scale-model: {exc}", file=sys.stderr)
        return 2
    return _write(args, out_dir, path, d, checks, scale, gp, job_mtbf_s)


def _write(
    args: argparse.Namespace,
    out_dir: Path,
    source: Path,
    d: dict[str, Any],
    checks: list[dict[str, Any]],
    scale: list[dict[str, Any]],
    gp: list[dict[str, Any]],
    job_mtbf_s: float,
) -> int:
    from torchnext.benchmarking import Report

    scale_table = Report("ft-scale-model", columns=list(scale[0]), rows=scale)
    gp_table = Report("goodput", columns=list(gp[0]), rows=gp)
    check_table = Report(
        "validation", columns=list(checks[0]) if checks else ["config"], rows=checks
    )
    print("== ft-scale-model: one host of --ranks-per-host ranks lost, TCP store unless named ==")
    print(scale_table.table())
    print(
        f"\n== goodput: {args.hosts} hosts x {args.ranks_per_host} ranks, a host fails every "
        f"{args.host_mtbf_h:g} h (the job every {job_mtbf_s / 60:.1f} min) =="
    )
    print(gp_table.table())
    print("\n== prediction against measurement (ft-hosts) ==")
    print(check_table.table())
    head = [c for c in checks if c["config"] == "tcp"]
    ok = bool(head) and all(c["within_25pct"] for c in head)
    saturation = next((r["ranks"] for r in scale if r["t3_tcp_s"] == "unstable"), None)
    summary = {
        "prediction_within_25pct": ok,
        "predicted_t3_s": next((c["predicted"] for c in head if c["quantity"] == "t3_s"), None),
        "measured_t3_s": next((c["measured"] for c in head if c["quantity"] == "t3_s"), None),
        "predicted_detection_s": next(
            (c["predicted"] for c in head if c["quantity"] == "detection_s"), None
        ),
        "measured_detection_s": next(
            (c["measured"] for c in head if c["quantity"] == "detection_s"), None
        ),
        "tcp_store_liveness_fails_at_ranks": saturation,
        "goodput": {r["design"]: r["goodput"] for r in gp},
    }
    print(f"\nprediction for the measured configuration within 25 %: {ok}")
    if d.get("quick"):
        print("note: the input is a --quick run of ft-hosts (2 rounds): medians of few trials")
    out_dir.mkdir(parents=True, exist_ok=True)
    payload = {
        "name": "ft-scale-model",
        "source": source.name,
        "source_quick": bool(d.get("quick")),
        "args": vars(args),
        **summary,
        "validation": checks,
        "scale": scale,
        "goodput_rows": gp,
        "model": (__doc__ or "").split("\n\n", 2)[2],
        "assumptions": {
            "lighthouse_rpc_us": args.lighthouse_rpc_us,
            "torchft_default": TORCHFT_DEFAULT,
            "step_s_held_constant": measured(d)["tcp"]["step_s"],
            "rtt_extra_us": args.rtt_extra_us,
        },
    }
    target = out_dir / "ft-scale-model.json"
    target.write_text(json.dumps(payload, indent=2, default=str) + "\n")
    print(f"wrote {target}", file=sys.stderr)
    if not args.no_png:
        from _ft_scale_plot import plot

        png = plot(scale, gp, out_dir / "ft-scale-model.png")
        print(
            f"wrote {png}"
            if png
            else "matplotlib is not installed (pip install 'torchnext[demo]'): no PNG written",
            file=sys.stderr,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
