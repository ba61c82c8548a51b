"""``torchnext bench gemm``: fused epilogues, routes, the compile pass, the tuner's cost, and
the scaled, grouped and GEMV parts, side by side in one run.

Fused GEMM cells: transformer MLP and attention projections, M in 1, 8, 128, 2048, K and N
from 256 to 4096, float32 and bfloat16, at 1 and 2 threads. Each cell times, interleaved
(median of ``--reps`` >= 7 repeats, with p10-p90 spread; each repeat the mean of as many
calls as fill ``SAMPLE_S``):

- ``fused``: ``torchnext.gemm.linear(x, w, b, epilogue=...)`` (the tuned route);
- ``own+eager``: torchnext's own tuned GEMM for the same call without the epilogue, then the
  epilogue in eager code (what fusion is measured against: the same GEMM route, unfused);
- ``aten+eager``: ``F.linear`` then the eager epilogue (what a user writes today);
- ``gemm`` and ``epilogue``: the two halves of ``own+eager`` alone, for the epilogue's share.

Keys: ``fused_epilogue_speedup_memory_bound`` (median of own+eager / fused over the cells
whose epilogue takes >= 20 % of the GEMM's time), ``fused_epilogue_worst_ratio`` (the worst
aten+eager / fused; a cell whose loss is within its spread counts as parity, the raw worst
is reported beside it), ``route_speedup_vs_aten`` (median aten+eager / fused over the
bfloat16 cells; report only), ``compile_mlp_speedup`` (a transformer MLP block, float32, 1
thread, inference: ``backend="torchnext_gemm"`` against plain ``torch.compile``) and
``autotune_cache_hit_us`` (the cost of answering from the tuner's memory, per call). The
scaled, grouped and GEMV parts add their own keys (see ``benchmarks/_gemm_*.py``); the GPU
bars are ``torchnext bench gemm-gpu``'s (``benchmarks/gpu_check.sh``).
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.nn as nn
import torch.nn.functional as F

from torchnext.benchmarking import Report, Timing, compare, time_once
from torchnext.gemm import autotune, gemv
from torchnext.gemm.epilogue import Epilogue, add, gelu, mul, scale, silu
from torchnext.gemm.fused import gemm, linear
from torchnext.gemm.routes import Problem

SAMPLE_S = 0.01
"""Each fused-cell sample is the mean of as many calls as fill about this many seconds."""

# (name, M, K, N, epilogue kind): MLP up (gelu/silu), down (+residual), attention projections.
CELLS = [
    ("attn.out decode", 1, 4096, 4096, "residual"),
    ("mlp.up decode", 1, 1024, 4096, "gelu"),
    ("mlp.down decode", 8, 4096, 1024, "residual"),
    ("attn.q decode", 8, 1024, 1024, "scale"),
    ("mlp.up", 128, 1024, 4096, "gelu"),
    ("mlp.down", 128, 4096, 1024, "residual"),
    ("swiglu.gate", 128, 256, 1024, "silu_mul"),
    ("attn.q", 128, 1024, 1024, "scale"),
    ("mlp.up prefill", 2048, 256, 1024, "gelu"),
    ("mlp.down prefill", 2048, 1024, 256, "residual"),
    ("mlp.up prefill", 2048, 512, 2048, "silu"),
    ("mlp.small prefill", 2048, 256, 256, "gelu_residual"),
]


def _epilogue(
    kind: str, m: int, n: int, dtype: torch.dtype
) -> tuple[Epilogue, Callable[[Any], Any]]:
    """The epilogue for torchnext and the same steps as eager code."""
    full = torch.randn(m, n, dtype=dtype)
    if kind == "gelu":
        return Epilogue(gelu()), F.gelu
    if kind == "silu":
        return Epilogue(silu()), F.silu
    if kind == "residual":
        return Epilogue(add(full)), lambda y: y + full
    if kind == "scale":
        return Epilogue(scale(0.125)), lambda y: y * 0.125
    if kind == "silu_mul":
        return Epilogue(silu(), mul(full)), lambda y: F.silu(y) * full
    if kind == "gelu_residual":
        return Epilogue(gelu(), add(full)), lambda y: F.gelu(y) + full
    raise ValueError(f"unknown epilogue kind {kind!r}")


def _time_cell(
    m: int, k: int, n: int, kind: str, dtype: torch.dtype, reps: int
) -> tuple[dict[str, Timing], str]:
    x = torch.randn(m, k, dtype=dtype)
    w = torch.randn(n, k, dtype=dtype) / k**0.5
    b = torch.randn(n, dtype=dtype)
    epilogue, eager = _epilogue(kind, m, n, dtype)
    y = linear(x, w, b)  # tunes the GEMM-only problem
    linear(x, w, b, epilogue=epilogue)  # tunes the fused one
    # The route torchnext's call takes: the GEMV path for decode shapes it serves, else the
    # tuner's (remembered) choice.
    small = gemv.route(x, w)
    if m <= gemv.GEMV_MAX_ROWS and small != "aten":
        chosen = f"gemv:{small}"
    else:
        chosen = autotune.choose(Problem(x, w.t(), b, epilogue, dtype)).name
    timings = compare(
        {
            "fused": lambda: linear(x, w, b, epilogue=epilogue),
            "own+eager": lambda: eager(linear(x, w, b)),
            "aten+eager": lambda: eager(F.linear(x, w, b)),
            "gemm": lambda: linear(x, w, b),
            "epilogue": lambda: eager(y),
        },
        reps=reps,
        warmup=1,
        inner=_inner(lambda: eager(F.linear(x, w, b))),
    )
    return timings, chosen


def _inner(call: Callable[[], object]) -> int:
    """Calls per sample, so that a sample lasts about SAMPLE_S: one call of 0.1 ms timed
    alone is mostly the timer's and the scheduler's noise on a shared 2-core machine."""
    once = time_once(call, 3)
    return max(1, min(200, round(SAMPLE_S / max(once, 1e-9))))


def _spread_loss(fused: Timing, base: Timing) -> bool:
    """True when fused is slower than base beyond both spreads (p10-p90 do not overlap)."""
    return fused.p10_s > base.p90_s


def _fused_cells(reps: int, threads: list[int], report: Report) -> dict[str, Any]:
    own_ratios, worst, worst_raw, route_ratios = [], [], [], []
    for dtype in (torch.float32, torch.bfloat16):
        for t in threads:
            torch.set_num_threads(t)
            for name, m, k, n, kind in CELLS:
                timings, chosen = _time_cell(m, k, n, kind, dtype, reps)
                fused = timings["fused"]
                own = timings["own+eager"].median_s / fused.median_s
                vs_aten = timings["aten+eager"].median_s / fused.median_s
                share = timings["epilogue"].median_s / timings["gemm"].median_s
                counted = (
                    1.0
                    if vs_aten < 1 and not _spread_loss(fused, timings["aten+eager"])
                    else vs_aten
                )
                report.add(
                    cell=name,
                    M=m,
                    K=k,
                    N=n,
                    dtype=str(dtype).removeprefix("torch."),
                    threads=t,
                    epilogue=kind,
                    route=chosen,
                    fused_ms=fused.median_s * 1e3,
                    spread=fused.spread,
                    epilogue_share=share,
                    vs_own_unfused=own,
                    vs_aten=vs_aten,
                )
                if share >= 0.2:
                    own_ratios.append(own)
                worst.append(counted)
                worst_raw.append(vs_aten)
                if dtype == torch.bfloat16:
                    route_ratios.append(vs_aten)
    return {
        "fused_epilogue_speedup_memory_bound": statistics.median(own_ratios)
        if own_ratios
        else None,
        "fused_epilogue_memory_bound_cells": len(own_ratios),
        "fused_epilogue_worst_ratio": min(worst),
        "fused_epilogue_worst_ratio_raw": min(worst_raw),
        "route_speedup_vs_aten": statistics.median(route_ratios),
    }


class MLP(nn.Module):
    def __init__(self, d: int, hidden: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(d)
        self.up = nn.Linear(d, hidden)
        self.down = nn.Linear(hidden, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(F.gelu(self.up(self.norm(x))))


def _compile_mlp(reps: int, report: Report) -> dict[str, Any]:
    torch.set_num_threads(1)
    model = MLP(512, 2048).eval()
    x = torch.randn(4, 256, 512)
    import torchnext.gemm.compile_pass  # noqa: F401  registers the backend

    with torch.no_grad():
        plain = torch.compile(model)
        ours = torch.compile(model, backend="torchnext_gemm")
        want = model(x)
        for fn in (plain, ours):
            torch.testing.assert_close(fn(x), want, rtol=1e-4, atol=1e-4)
        timings = compare(
            {"inductor": lambda: plain(x), "torchnext_gemm": lambda: ours(x)}, reps=reps
        )
    speedup = timings["inductor"].median_s / timings["torchnext_gemm"].median_s
    for name, timing in timings.items():
        report.add(
            cell=f"compiled MLP ({name})",
            M=1024,
            K=512,
            N=2048,
            dtype="float32",
            threads=1,
            epilogue="gelu; residual",
            route=name,
            fused_ms=timing.median_s * 1e3,
            spread=timing.spread,
            epilogue_share="",
            vs_own_unfused="",
            vs_aten="",
        )
    return {"compile_mlp_speedup": speedup}


def _cache_hit(reps: int) -> dict[str, Any]:
    torch.set_num_threads(1)
    x, w = torch.randn(1, 64), torch.randn(64, 64)
    problem = Problem(x, w, None, Epilogue(gelu()), torch.float32)
    autotune.choose(problem)  # tuned and remembered
    inner = 2000
    samples = []
    for _ in range(max(reps, 7)):
        start = time.perf_counter()
        for _ in range(inner):
            autotune.choose(problem)
        samples.append((time.perf_counter() - start) / inner)
    route = autotune.choose(problem)
    direct, wrapped = [], []
    epilogue = Epilogue(gelu())
    for _ in range(max(reps, 7)):
        start = time.perf_counter()
        for _ in range(inner // 4):
            route.run(problem)
        direct.append((time.perf_counter() - start) / (inner // 4))
        start = time.perf_counter()
        for _ in range(inner // 4):
            gemm(x, w, epilogue=epilogue)
        wrapped.append((time.perf_counter() - start) / (inner // 4))
    return {
        "autotune_cache_hit_us": statistics.median(samples) * 1e6,
        "gemm_call_overhead_us": (statistics.median(wrapped) - statistics.median(direct)) * 1e6,
    }


def _parts(reps: int) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The scaled, grouped and GEMV parts on the CPU, each its own script (the GPU bars are
    ``torchnext bench gemm-gpu``'s)."""
    keys: dict[str, Any] = {}
    rows: list[dict[str, Any]] = []
    names = ["_gemm_scaled", "_gemm_grouped", "_gemm_gemv"]
    for name in names:
        path = Path(__file__).with_name(f"{name}.py")
        spec = importlib.util.spec_from_file_location(f"torchnext_bench_{name}", path)
        if spec is None or spec.loader is None:
            raise FileNotFoundError(f"benchmark part {path} is missing")
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module
        spec.loader.exec_module(module)
        print(f"-- {name.removeprefix('_gemm_')} --", file=sys.stderr)
        part_keys, part_rows = module.measure(reps=reps)
        keys.update(part_keys)
        rows += [{"part": name.removeprefix("_gemm_"), **r} for r in part_rows]
    return keys, rows


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="torchnext bench gemm", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--reps", type=int, default=7, help="interleaved repeats per cell (>= 7)")
    parser.add_argument("--threads", default="1,2", help="thread counts, comma separated")
    parser.add_argument("--skip-parts", action="store_true", help="only the fused-GEMM cells")
    args = parser.parse_args(argv)
    if args.reps < 1:
        parser.error(f"--reps {args.reps}: need at least 1 (the issue's bar needs 7)")
    threads = [int(t) for t in args.threads.split(",") if t]
    # A private tuning folder: the run measures tuning from nothing, not an old choice.
    os.environ["TORCHNEXT_GEMM_CACHE_DIR"] = tempfile.mkdtemp(prefix="torchnext-gemm-bench-")
    started = time.perf_counter()
    report = Report(
        "gemm",
        [
            "cell",
            "M",
            "K",
            "N",
            "dtype",
            "threads",
            "epilogue",
            "route",
            "fused_ms",
            "spread",
            "epilogue_share",
            "vs_own_unfused",
            "vs_aten",
        ],
    )
    summary = _fused_cells(args.reps, threads, report)
    summary.update(_compile_mlp(args.reps, report))
    summary.update(_cache_hit(args.reps))
    part_rows: list[dict[str, Any]] = []
    if not args.skip_parts:
        part_keys, part_rows = _parts(args.reps)
        summary.update(part_keys)
    summary["reps"] = args.reps
    summary["threads"] = threads
    summary["wall_s"] = time.perf_counter() - started
    summary["gpu_bars"] = "see torchnext bench gemm-gpu (benchmarks/gpu_check.sh)"
    report.summary = summary
    report.notes.append(f"{len(part_rows)} rows of the scaled/grouped/GEMV parts are under 'parts'")
    path = report.write()
    if part_rows:
        import json

        payload = json.loads(path.read_text())
        payload["parts"] = part_rows
        path.write_text(json.dumps(payload, indent=2, default=str) + "\n")
        for row in part_rows:
            print(
                "  ".join(
                    f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in row.items()
                )
            )
    return 0
