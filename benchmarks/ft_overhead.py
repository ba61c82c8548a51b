"""Overhead of FaultTolerantGroup.all_reduce against plain gloo, nothing failing.

Two worker processes (default; ``--world-size``) run all-reduces of the same tensor on:

* ``gloo``: the raw gloo backend group, ``pg.allreduce([t]).wait()`` (the strictest
  baseline: no torch.distributed Python layer at all);
* ``torchnext``: ``FaultTolerantGroup.all_reduce(t)`` (heartbeats and revoke watch on).

Sizes 1 KB, 1 MB and 16 MB. The two calls are timed one by one in adjacent pairs
(gloo then torchnext, then the other way round, the same order on every rank so both
sides stay in lockstep): loopback latency drifts over seconds and jitters from call
to call, and a difference of neighbours cancels the drift. Each size gets a time
budget; the members agree on the pair count from a warm-up estimate, so every rank
issues the same calls. Overhead = the median paired difference, for the rank where it
is largest, relative to the median gloo time, with a 95 % bootstrap interval of that
median. The same measurement in one process (no network: a one-member gloo group
still runs its collective machinery) isolates the per-call cost torchnext adds.

    torchnext bench ft-overhead [--quick] [--world-size N] [--budget-s S]

What not to assume: on a loaded machine the interval widens; read it before the point.
The default budget (about 6 minutes in all) is sized so that on a quiet 2-core machine
the 1 MB and 16 MB intervals are narrower than +-3 % of the gloo time.
"""

from __future__ import annotations

import argparse
import importlib
from datetime import timedelta
from pathlib import Path
from typing import Any

SIZES = {"1kb": 1 << 10, "1mb": 1 << 20, "16mb": 16 << 20}


def _worker(ctx: Any, budget_s: dict[str, float], max_pairs: int) -> dict[str, Any]:
    import time

    import torch
    import torch.distributed as dist

    from torchnext.distributed import FaultTolerantGroup

    group = FaultTolerantGroup.from_env()
    plain = dist.ProcessGroupGloo(
        dist.PrefixStore("plain", ctx.store), group.rank, group.size, timedelta(seconds=60)
    )
    out: dict[str, Any] = {}
    clock = time.perf_counter
    for label, nbytes in SIZES.items():
        t = torch.ones(nbytes // 4)
        for _ in range(5):  # warm both paths (connections, allocator, caches)
            plain.allreduce([t]).wait()
            group.all_reduce(t)
        t0 = clock()
        for _ in range(5):
            plain.allreduce([t]).wait()
            group.all_reduce(t)
        pair_s = (clock() - t0) / 5
        # Every rank must issue the same number of calls: agree on the largest estimate.
        n_pairs = torch.tensor([min(max_pairs, max(20, int(budget_s[label] / pair_s)))])
        opts = dist.AllreduceOptions()
        opts.reduceOp = dist.ReduceOp.MAX
        plain.allreduce([n_pairs], opts).wait()
        n = int(n_pairs.item())
        gloo_s: list[float] = []
        ft_s: list[float] = []
        for i in range(n):
            for side in (0, 1) if i % 2 == 0 else (1, 0):
                t0 = clock()
                if side == 0:
                    plain.allreduce([t]).wait()
                    gloo_s.append(clock() - t0)
                else:
                    group.all_reduce(t)
                    ft_s.append(clock() - t0)
        out[label] = list(zip(gloo_s, ft_s, strict=True))
    group.barrier()
    group.shutdown()
    return out


def _paired(pairs: list[tuple[float, float]]) -> dict[str, float]:
    """Median gloo time, median paired difference and its 95 % bootstrap interval."""
    import statistics

    from torchnext.benchmarking import paired_difference

    gloo = [p[0] for p in pairs]
    ft = [p[1] for p in pairs]
    d = paired_difference(gloo, ft)
    return {
        "gloo_s": statistics.median(gloo),
        "ft_s": statistics.median(ft),
        "over_s": d.median,
        "lo_s": d.lo,
        "hi_s": d.hi,
        "pairs": d.pairs,
    }


def _run(
    world_size: int, budget_s: dict[str, float], max_pairs: int
) -> dict[str, dict[str, float]]:
    from torchnext.testing import run_workers

    # Pickle the worker by a module name the worker processes can import.
    worker = importlib.import_module(Path(__file__).stem)._worker
    result = run_workers(
        worker, budget_s, max_pairs, world_size=world_size, timeout=timedelta(seconds=900)
    )
    result.raise_if_failed()
    # The rank with the largest overhead (each rank timed the same call sequence).
    return {
        label: max((_paired(v[label]) for v in result.values()), key=lambda d: d["over_s"])
        for label in SIZES
    }


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="torchnext bench ft-overhead")
    parser.add_argument("--quick", action="store_true", help="fewer repetitions")
    parser.add_argument("--world-size", type=int, default=2)
    parser.add_argument(
        "--budget-s",
        type=float,
        default=None,
        help="seconds of paired calls per size with --world-size processes (default 90; "
        "30 with --quick); the 1-process rows get a third of it",
    )
    args = parser.parse_args(argv)
    if args.world_size < 2:
        parser.error(f"--world-size={args.world_size}: pass 2 or more (1 is always measured)")
    if args.budget_s is not None and args.budget_s <= 0:
        parser.error(f"--budget-s={args.budget_s}: pass a positive number of seconds")

    from torchnext.benchmarking import Report

    budget = args.budget_s if args.budget_s is not None else (30.0 if args.quick else 90.0)
    report = Report(
        name="ft-overhead",
        columns=[
            "size",
            "processes",
            "gloo_us",
            "torchnext_us",
            "overhead_us",
            "overhead_pct",
            "ci95_us",
            "ci95_pct",
            "pairs",
        ],
    )
    for world_size in (args.world_size, 1):
        share = budget if world_size > 1 else budget / 3
        measured = _run(world_size, dict.fromkeys(SIZES, share), max_pairs=200_000)
        for label, d in measured.items():
            over_us, pct = d["over_s"] * 1e6, 100 * d["over_s"] / d["gloo_s"]
            lo_pct, hi_pct = (100 * d[k] / d["gloo_s"] for k in ("lo_s", "hi_s"))
            report.add(
                size=label,
                processes=world_size,
                gloo_us=d["gloo_s"] * 1e6,
                torchnext_us=d["ft_s"] * 1e6,
                overhead_us=over_us,
                overhead_pct=pct,
                ci95_us=f"[{d['lo_s'] * 1e6:.1f}, {d['hi_s'] * 1e6:.1f}]",
                ci95_pct=f"[{lo_pct:.2f}, {hi_pct:.2f}]",
                pairs=d["pairs"],
            )
            if world_size == args.world_size:
                report.summary[f"overhead_{label}_pct"] = round(pct, 3)
                report.summary[f"overhead_{label}_ci95_pct"] = [round(lo_pct, 3), round(hi_pct, 3)]
                report.summary[f"ci95_halfwidth_{label}_pct"] = round((hi_pct - lo_pct) / 2, 3)
                if label == "1kb":
                    report.summary["overhead_1kb_us"] = round(over_us, 3)
            else:
                report.summary[f"added_cost_{label}_us"] = round(over_us, 3)
    report.summary["world_size"] = args.world_size
    report.notes.append(
        "baseline is the raw gloo backend (pg.allreduce().wait()); torch.distributed.all_reduce "
        "adds its own Python layer on top of that"
    )
    report.notes.append(
        "overhead = median of (torchnext call - adjacent gloo call) over the pairs, worst "
        "rank, with a 95 % bootstrap interval of that median (ci95_*, also as % of the "
        "median gloo time); the 1-process rows have no network, so they isolate the "
        "per-call cost torchnext adds (added_cost_*_us)"
    )
    report.write()
    return 0


if __name__ == "__main__":
    import sys

    raise SystemExit(main(sys.argv[1:]))
