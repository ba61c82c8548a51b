"""Sharded replicas and semi-synchronous training (issue 16): HSDP and DiLoCo, side by side.

One run, two halves:

* **DiLoCo** (``_ft_sharded_diloco.py``): the character transformer of
  ``examples/fault_tolerant_transformer.py`` (small: d_model 64, 2 layers, sequence 32),
  pinned seed and data, on 2 members over gloo on CPU. DDP-style (the training
  Manager, an all-reduce of the gradients every step) against DiLoCo with H = 50
  (``--sync-every``) for 20 outer rounds (``--rounds``) on the same samples; DiLoCo again
  with 3 kill -9s during the run (``--kills``), each victim replaced by a fresh process
  that heals but the last; streaming DiLoCo (``--fragments``); and torchft's DiLoCo
  (``torchft.local_sgd.DiLoCo``, its Manager, a Lighthouse, ``ProcessGroupGloo``) on the
  same configuration when torchft is installed (``_ft_sharded_torchft.py``).
* **HSDP** (``_ft_sharded_hsdp.py``, written separately): its ``measure(quick=...)``
  gives ``hsdp_recovery_s``, ``hsdp_heal_mb_per_s`` and table rows; if it is missing or
  raises, the error is recorded in the JSON and the table, and the DiLoCo half stands.

Keys (at the top level of ``benchmarks/results/ft-sharded.json``):

* ``diloco_bytes_ratio_vs_ddp``: bytes on the wire per (inner) step, all members
  summed, from the group's own counters (``FaultTolerantGroup.wire_bytes``), sync and
  heal traffic included, DiLoCo against DDP-style (bar <= 0.05);
  ``diloco_fault_bytes_ratio_vs_ddp``: the same for the run with kills (heals included);
* ``diloco_loss_ratio_vs_ddp``: final held-out loss after the same samples (bar <= 1.05);
* ``diloco_fault_loss_ratio``: held-out loss with the kills against none (bar <= 1.02);
* step times: ``ddp_step_s`` (median committed step), ``diloco_inner_step_s`` (median
  round time less its sync, per inner step), ``diloco_sync_s`` (median sync).

Usage::

    torchnext bench ft-sharded [--quick] [--rounds 20] [--sync-every 50] [--kills 3]

``--quick`` is a smoke run (H = 10, 6 rounds, 2 kills; under 4 minutes on 2 cores):
its figures are not the benchmark's. The full run is sized to finish within 20 minutes
on 2 cores: from the quick run's step times, about 8 to 10 minutes on a loaded 2-core
machine, HSDP half included (each case is also bounded by ``--case-timeout-s``).
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import importlib.util
import io
import sys
import tempfile
import time
import traceback
from datetime import timedelta
from pathlib import Path
from typing import Any

from _ft_sharded_diloco import NPROC, CaseResult, Plan, run_case


def _say(message: str) -> None:
    print(f"ft-sharded: {message}", file=sys.stderr, flush=True)


def _ratio(num: float | None, den: float | None) -> float | None:
    return num / den if num is not None and den else None


def _hsdp(quick: bool) -> tuple[dict[str, Any], str]:
    """The HSDP half's keys and rows, or the error that kept it from running."""
    try:
        if importlib.util.find_spec("_ft_sharded_hsdp") is None:
            return {}, "benchmarks/_ft_sharded_hsdp.py is missing"
        module = importlib.import_module("_ft_sharded_hsdp")
        figures = dict(module.measure(quick=quick))
    except Exception as exc:  # noqa: BLE001 - recorded; the DiLoCo half still reports
        tail = traceback.format_exc().strip().splitlines()[-1]
        return {}, f"{type(exc).__name__}: {exc} ({tail})"
    return figures, ""


def _torchft(args: argparse.Namespace, root: Path) -> tuple[CaseResult | None, str]:
    """torchft's DiLoCo on the same configuration, or why it could not run."""
    if importlib.util.find_spec("torchft") is None:
        return None, (
            "torchft is not installed (pip install 'torch==2.13.0' -e '.[bench]'); "
            "torchft's DiLoCo was not run"
        )
    try:
        from _ft_sharded_torchft import run_torchft

        return run_torchft(
            rounds=args.rounds,
            sync_every=args.sync_every,
            root=root,
            timeout=timedelta(seconds=args.case_timeout_s),
        )
    except Exception as exc:  # noqa: BLE001 - recorded beside the torchnext figures
        return None, f"torchft DiLoCo failed: {type(exc).__name__}: {exc}"


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="torchnext bench ft-sharded",
        description="HSDP recovery and DiLoCo against DDP-style: bytes, loss, faults",
    )
    p.add_argument("--quick", action="store_true", help="a short smoke run (< 4 minutes)")
    p.add_argument("--rounds", type=int, default=20, help="DiLoCo outer rounds (>= 20)")
    p.add_argument("--sync-every", type=int, default=50, help="H: inner steps per round")
    p.add_argument("--fragments", type=int, default=2, help="streaming DiLoCo fragments")
    p.add_argument("--kills", type=int, default=3, help="kill -9s in the fault run (>= 3)")
    p.add_argument("--kill-after", type=int, default=3, help="rounds each victim lives")
    p.add_argument("--case-timeout-s", type=float, default=300.0)
    p.add_argument("--no-torchft", action="store_true", help="skip torchft's DiLoCo")
    p.add_argument("--no-hsdp", action="store_true", help="skip the HSDP half")
    p.add_argument("--keep-logs", default="", help="write the members' logs here and keep them")
    return p


def main(argv: list[str]) -> int:
    args = _parser().parse_args(argv)
    if args.quick:
        args.rounds, args.sync_every, args.kills, args.kill_after = 6, 10, 2, 1
        args.case_timeout_s = min(args.case_timeout_s, 120.0)
    if args.rounds < 1 or args.sync_every < 1 or args.kills < 0 or args.kill_after < 1:
        print("ft-sharded: need --rounds >= 1, --sync-every >= 1, --kills >= 0, --kill-after >= 1")
        return 2
    if args.sync_every % args.fragments:
        print(
            f"ft-sharded: --fragments {args.fragments} must divide --sync-every {args.sync_every}"
        )
        return 2
    t_start = time.monotonic()
    timeout = timedelta(seconds=args.case_timeout_s)
    plans = [
        Plan("ddp", "ddp", args.rounds, args.sync_every),
        Plan("diloco", "diloco", args.rounds, args.sync_every),
        Plan(
            "diloco_faults",
            "diloco",
            args.rounds,
            args.sync_every,
            kills=args.kills,
            kill_after=args.kill_after,
        ),
        Plan("streaming", "diloco", args.rounds, args.sync_every, fragments=args.fragments),
    ]
    results: dict[str, CaseResult] = {}
    with tempfile.TemporaryDirectory(prefix="ft-sharded-") as tmp:
        root = Path(args.keep_logs).resolve() if args.keep_logs else Path(tmp)
        for plan in plans:
            _say(f"{plan.case}: {plan.steps} steps of {NPROC} members")
            res = results[plan.case] = run_case(plan, root, timeout)
            _say(
                f"  {plan.case}: held-out loss {res.heldout_loss}, {res.wire_bytes} bytes, "
                f"{res.kills} kills, {res.wall_s:.0f} s {res.error[:300]}"
            )
        ft_result, ft_note = (None, "skipped (--no-torchft)")
        if not args.no_torchft:
            _say("torchft DiLoCo")
            ft_result, ft_note = _torchft(args, root)
            if ft_note:
                _say(f"  {ft_note}")
    hsdp, hsdp_error = ({}, "skipped (--no-hsdp)") if args.no_hsdp else _hsdp(args.quick)
    if hsdp_error:
        _say(f"HSDP half: {hsdp_error}")
    return _report(args, results, ft_result, ft_note, hsdp, hsdp_error, time.monotonic() - t_start)


def _report(
    args: argparse.Namespace,
    results: dict[str, CaseResult],
    ft: CaseResult | None,
    ft_note: str,
    hsdp: dict[str, Any],
    hsdp_error: str,
    wall_s: float,
) -> int:
    from torchnext.benchmarking import Report, results_dir

    columns = ["case", "heldout_loss", "bytes_per_step", "step_s", "sync_s", "kills", "heals"]
    columns += ["wall_s", "note"]
    report = Report(name="ft-sharded", columns=columns)
    rows = [*results.values(), *([ft] if ft is not None else [])]
    for r in rows:
        report.add(
            case=r.case,
            heldout_loss=_opt(r.heldout_loss),
            bytes_per_step=_opt(r.bytes_per_step),
            step_s=_opt(r.step_s),
            sync_s=_opt(r.sync_s),
            kills=r.kills,
            heals=r.heals,
            wall_s=round(r.wall_s, 1),
            note=r.error.splitlines()[0][:80] if r.error else "",
        )
    if ft is None:
        report.add(**_blank(columns, case="torchft diloco", note=ft_note))
    for label, value in hsdp.get("rows", []):
        report.add(**_blank(columns, case=f"hsdp: {label}", note=str(value)))
    if hsdp_error:
        report.add(**_blank(columns, case="hsdp", note=hsdp_error[:200]))
    ddp, dl = results["ddp"], results["diloco"]
    faults, streaming = results["diloco_faults"], results["streaming"]
    summary: dict[str, Any] = {
        "diloco_bytes_ratio_vs_ddp": _ratio(dl.bytes_per_step, ddp.bytes_per_step),
        "diloco_loss_ratio_vs_ddp": _ratio(dl.heldout_loss, ddp.heldout_loss),
        "diloco_fault_loss_ratio": _ratio(faults.heldout_loss, dl.heldout_loss),
        "diloco_fault_bytes_ratio_vs_ddp": _ratio(faults.bytes_per_step, ddp.bytes_per_step),
        "diloco_fault_kills": faults.kills,
        "streaming_bytes_ratio_vs_ddp": _ratio(streaming.bytes_per_step, ddp.bytes_per_step),
        "streaming_loss_ratio_vs_ddp": _ratio(streaming.heldout_loss, ddp.heldout_loss),
        "ddp_step_s": ddp.step_s,
        "diloco_inner_step_s": dl.step_s,
        "diloco_sync_s": dl.sync_s,
        "streaming_sync_s": streaming.sync_s,
        "heldout_loss": {r.case: r.heldout_loss for r in rows},
        "wire_bytes_by_kind": {r.case: r.wire_by_kind for r in rows},
        "torchft_diloco_loss_ratio_vs_torchnext": _ratio(
            ft.heldout_loss if ft else None, dl.heldout_loss
        ),
        "torchft_diloco_inner_step_s": ft.step_s if ft else None,
        "torchft_diloco_sync_s": ft.sync_s if ft else None,
        "torchft_note": ft_note,
        "hsdp_recovery_s": hsdp.get("hsdp_recovery_s"),
        "hsdp_heal_mb_per_s": hsdp.get("hsdp_heal_mb_per_s"),
        "hsdp_error": hsdp_error,
        "config": {
            "members": NPROC,
            "rounds": args.rounds,
            "sync_every": args.sync_every,
            "fragments": args.fragments,
            "kills": args.kills,
            "steps": ddp.steps,
        },
        "errors": {r.case: r.error for r in rows if r.error},
        "quick": bool(args.quick),
        "wall_s": round(wall_s, 1),
    }
    summary.update({k: v for k, v in hsdp.items() if k != "rows" and k not in summary})
    report.summary = summary
    report.notes += NOTES
    target = results_dir() / ("ft-sharded-quick.json" if args.quick else "ft-sharded.json")
    _write(report, target)
    return 0


NOTES = [
    "bytes_per_step: bytes all members put on the wire (the group's modelled counters: ring "
    "all-reduce 2(n-1)/n x payload per member, ...; see torchnext.distributed.group.wire) "
    "plus heal bytes received, over the run's (inner) steps",
    "step_s: DDP: median committed step; DiLoCo: median (round - sync) / inner steps; "
    "sync_s: median sync of a round (all-reduce, vote, outer step)",
    "diloco_faults: kill -9 of a member after --kill-after rounds of its life, each victim "
    "but the last replaced by a fresh process that heals; the same samples as the others",
]


def _write(report: Any, target: Path) -> None:
    """Print the table (rich when installed) and write the JSON."""
    try:
        from rich.console import Console
        from rich.table import Table
    except ImportError:
        report.write(target)
        return
    table = Table(title="ft-sharded")
    for c in report.columns:
        table.add_column(c, justify="left" if c in ("case", "note") else "right")
    for row in report.rows:
        table.add_row(*[_cell(row.get(c, "")) for c in report.columns])
    Console(width=max(120, Console().width)).print(table)
    for key, value in report.summary.items():
        if key not in ("heldout_loss", "wire_bytes_by_kind"):
            print(f"{key}: {_cell(value)}")
    with contextlib.redirect_stdout(io.StringIO()):  # the plain table was printed above
        report.write(target)


def _blank(columns: list[str], **cells: Any) -> dict[str, Any]:
    return {**{c: "" for c in columns}, **cells}


def _cell(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


def _opt(value: float | None) -> float | str:
    return "" if value is None else value


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
