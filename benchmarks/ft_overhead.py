"""Overhead of FaultTolerantGroup.all_reduce against plain gloo, nothing failing.

Two worker processes (default; ``--world-size``) run all-reduces of the same tensor,
in alternating batches (the same order on every rank, so both sides stay in lockstep),
on:

* ``gloo``: the raw gloo backend group, ``pg.allreduce([t]).wait()`` (the strictest
  baseline: no torch.distributed Python layer at all);
* ``torchnext``: ``FaultTolerantGroup.all_reduce(t)`` (heartbeats and revoke watch on).

Sizes 1 KB, 1 MB and 16 MB. Overhead = the median over repetitions of the paired
difference (a torchnext batch's mean call time minus the adjacent gloo batch's), for
the rank where it is largest, with a 95 % bootstrap interval: loopback latency drifts
and jitters, so read the interval, not only the point. The same measurement in one
process (no network: a one-member gloo group still runs its collective machinery)
isolates the per-call cost torchnext adds.

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
        n = inner[label]
        pairs: list[tuple[float, float]] = []
        # Batches alternate, and each gloo batch is paired with the torchnext batch next
        # to it: loopback latency drifts over seconds, and a paired difference cancels it.
        for r in range(reps):
            gloo_s = ft_s = 0.0
            for side in (0, 1) if r % 2 == 0 else (1, 0):
                t0 = clock()
                if side == 0:
                    for _ in range(n):
                        plain.allreduce([t]).wait()
                    gloo_s = (clock() - t0) / n
                else:
                    for _ in range(n):
                        group.all_reduce(t)
                    ft_s = (clock() - t0) / n
            pairs.append((gloo_s, ft_s))
        out[label] = pairs
    group.barrier()
    group.shutdown()
    return out


def _paired(pairs: list[tuple[float, float]], seed: int = 0) -> dict[str, float]:
    """Median gloo time, median paired difference and its 95 % bootstrap interval."""
    import numpy as np

    a = np.asarray(pairs)
    diff = a[:, 1] - a[:, 0]
    rng = np.random.default_rng(seed)
    boot = [np.median(rng.choice(diff, diff.size)) for _ in range(1000)]
    lo, hi = np.percentile(boot, [2.5, 97.5])
    return {
        "gloo_s": float(np.median(a[:, 0])),
        "ft_s": float(np.median(a[:, 1])),
        "over_s": float(np.median(diff)),
        "lo_s": float(lo),
        "hi_s": float(hi),
    }


def _run(world_size: int, reps: int, inner: dict[str, int]) -> dict[str, dict[str, float]]:
    from torchnext.testing import run_workers

    # Pickle the worker by a module name the worker processes can import.
    worker = importlib.import_module(Path(__file__).stem)._worker
    result = run_workers(worker, reps, inner, world_size=world_size, timeout=timedelta(seconds=900))
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
    args = parser.parse_args(argv)
    if args.world_size < 2:
        parser.error(f"--world-size={args.world_size}: pass 2 or more (1 is always measured)")

    from torchnext.benchmarking import Report

    reps = 7 if args.quick else 25
    inner = {"1kb": 50, "1mb": 10, "16mb": 1} if args.quick else {"1kb": 200, "1mb": 40, "16mb": 4}
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
        ],
    )
    for world_size in (args.world_size, 1):
        for label, d in _run(world_size, reps, inner).items():
            over_us, pct = d["over_s"] * 1e6, 100 * d["over_s"] / d["gloo_s"]
            report.add(
                size=label,
                processes=world_size,
                gloo_us=d["gloo_s"] * 1e6,
                torchnext_us=d["ft_s"] * 1e6,
                overhead_us=over_us,
                overhead_pct=pct,
                ci95_us=f"[{d['lo_s'] * 1e6:.1f}, {d['hi_s'] * 1e6:.1f}]",
            )
            if world_size == args.world_size:
                report.summary[f"overhead_{label}_pct"] = round(pct, 3)
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
        "overhead = median over repetitions of (torchnext batch mean - adjacent gloo batch "
        "mean), worst rank, with a 95 % bootstrap interval; the 1-process rows have no "
        "network, so they isolate the per-call cost torchnext adds (added_cost_*_us)"
    )
    report.write()
    return 0


if __name__ == "__main__":
    import sys

    raise SystemExit(main(sys.argv[1:]))
