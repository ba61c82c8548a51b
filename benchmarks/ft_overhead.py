"""Overhead of FaultTolerantGroup.all_reduce against plain gloo, nothing failing.

Two worker processes (default; ``--world-size``) run, side by side and interleaved
(``torchnext.benchmarking.compare``, same order on every rank so both sides stay in
lockstep), all-reduces of the same tensor on:

* ``gloo``: the raw gloo backend group, ``pg.allreduce([t]).wait()`` (the strictest
  baseline: no torch.distributed Python layer at all);
* ``torchnext``: ``FaultTolerantGroup.all_reduce(t)`` (heartbeats and revoke watch on).

Sizes 1 KB, 1 MB and 16 MB. Overhead = median(torchnext) - median(gloo), per call.

    torchnext bench ft-overhead [--quick] [--world-size N]
"""

from __future__ import annotations

import argparse
import importlib
from datetime import timedelta
from pathlib import Path
from typing import Any

SIZES = {"1kb": 1 << 10, "1mb": 1 << 20, "16mb": 16 << 20}


def _worker(ctx: Any, reps: int, inner: dict[str, int]) -> dict[str, Any]:
    import torch
    import torch.distributed as dist

    from torchnext.benchmarking import compare
    from torchnext.distributed import FaultTolerantGroup

    group = FaultTolerantGroup.from_env()
    plain = dist.ProcessGroupGloo(
        dist.PrefixStore("plain", ctx.store), group.rank, group.size, timedelta(seconds=60)
    )
    out: dict[str, Any] = {}
    for label, nbytes in SIZES.items():
        t = torch.ones(nbytes // 4)
        timings = compare(
            {
                "gloo": lambda t=t: plain.allreduce([t]).wait(),
                "torchnext": lambda t=t: group.all_reduce(t),
            },
            reps=reps,
            warmup=2,
            inner=inner[label],
        )
        out[label] = {n: (tm.median_s, tm.spread) for n, tm in timings.items()}
    group.barrier()
    group.shutdown()
    return out


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="torchnext bench ft-overhead")
    parser.add_argument("--quick", action="store_true", help="fewer repetitions")
    parser.add_argument("--world-size", type=int, default=2)
    args = parser.parse_args(argv)

    from torchnext.benchmarking import Report
    from torchnext.testing import run_workers

    reps = 7 if args.quick else 21
    inner = {"1kb": 200, "1mb": 20, "16mb": 2} if args.quick else {"1kb": 500, "1mb": 50, "16mb": 4}
    # Pickle the worker by a module name the worker processes can import.
    worker = importlib.import_module(Path(__file__).stem)._worker
    result = run_workers(
        worker, reps, inner, world_size=args.world_size, timeout=timedelta(seconds=900)
    )
    result.raise_if_failed()
    per_rank = result.values()
    report = Report(
        name="ft-overhead",
        columns=["size", "gloo_us", "torchnext_us", "overhead_us", "overhead_pct", "spread"],
    )
    for label in SIZES:
        # Worst rank (each rank measured the same interleaved sequence).
        gloo = max(v[label]["gloo"][0] for v in per_rank)
        ft = max(v[label]["torchnext"][0] for v in per_rank)
        spread = max(max(v[label]["gloo"][1], v[label]["torchnext"][1]) for v in per_rank)
        over = ft - gloo
        report.add(
            size=label,
            gloo_us=gloo * 1e6,
            torchnext_us=ft * 1e6,
            overhead_us=over * 1e6,
            overhead_pct=100 * over / gloo,
            spread=spread,
        )
        report.summary[f"overhead_{label}_pct"] = round(100 * over / gloo, 3)
        if label == "1kb":
            report.summary["overhead_1kb_us"] = round(over * 1e6, 3)
    report.summary["world_size"] = args.world_size
    report.notes.append(
        "baseline is the raw gloo backend (pg.allreduce().wait()); torch.distributed.all_reduce "
        "adds its own Python layer on top of that"
    )
    report.write()
    return 0
