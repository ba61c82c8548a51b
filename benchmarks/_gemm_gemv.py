"""The decode-GEMV part of ``torchnext bench gemm``: weight-only 4-bit GEMV against bfloat16.

One decode step of a 4096 x 4096 projection (M = 1, K = N = 4096, ``x`` bfloat16 ``[1, 1,
K]``), at 1 and 2 threads, every candidate timed interleaved by
:func:`torchnext.benchmarking.compare` (median of at least 15 repeats, p10-p90 spread):

- ``bf16_linear``: ``F.linear(x, w_bf16)``, the baseline;
- ``nvfp4`` / ``mxfp4`` / ``int4``: ``torchnext.gemm.gemv.linear(x, w_q)`` with an
  ``NVFP4Weight`` / ``MXFP4Weight`` / ``Int4Weight`` (group 32, asymmetric, bf16 scales);
- ``int4_native``: torch's own int4 weight-only CPU kernel on the same int4 weight;
- ``dense_gemv``: ``linear(x, w_bf16)`` (torchnext's bfloat16 route) against ``F.linear``, at
  M = 1 and M = 8 (report only).

Keys: ``nvfp4_gemv_speedup_vs_bf16`` and ``mxfp4_gemv_speedup_vs_bf16`` (bf16_linear /
format, the worse of the thread counts; bar >= 2 for NVFP4), ``int4_gemv_ratio_vs_native``
(int4_native / int4, the worse thread count; above 1 means torchnext is faster),
``nvfp4_gemv_peak_bytes_ratio`` (peak of bytes allocated minus freed during one NVFP4 call,
from the profiler's timestamped allocation events, over the packed weight's bytes; bar < 2),
``gemv_route`` (the route the NVFP4 call took). With ``device="cuda"`` the cells run on the
GPU (the Triton route; no thread counts, no native int4, no peak measure).
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch.profiler import ProfilerActivity, profile

from torchnext.benchmarking import Timing, compare
from torchnext.compat.gemm_internals import int4pack_mm_for_cpu
from torchnext.gemm.gemv import linear, route
from torchnext.gemm.quantized_weight import Int4Weight, MXFP4Weight, NVFP4Weight, QuantizedWeight

K = N = 4096
THREADS = (1, 2)
Row = dict[str, object]


def peak_extra_bytes(fn: Callable[[], object]) -> int:
    """Peak of (allocated - freed) bytes during ``fn``: every allocation and free through
    torch's CPU allocator is a timestamped ``[memory]`` event of the profiler."""
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    events = [e for e in prof.profiler.kineto_results.events() if e.name() == "[memory]"]
    live = peak = 0
    for e in sorted(events, key=lambda e: e.start_ns()):
        live += e.nbytes()
        peak = max(peak, live)
    return peak


def _row(case: str, threads: int, m: int, t: Timing, base: Timing, route_name: str) -> Row:
    return {
        "case": case,
        "threads": threads,
        "M": m,
        "K": K,
        "N": N,
        "route": route_name,
        "ms": round(t.median_s * 1e3, 4),
        "spread": round(t.spread, 3),
        "baseline_ms": round(base.median_s * 1e3, 4),
        "speedup": round(base.median_s / t.median_s, 3),
    }


class _Cells:
    """The weights, built once, and the timed cells of one thread count."""

    def __init__(self, device: torch.device, reps: int) -> None:
        self.device, self.reps = device, reps
        self.gen = torch.Generator().manual_seed(0)
        w = torch.randn(N, K, generator=self.gen) * 0.02
        self.w_bf16 = w.bfloat16().to(device)
        i4 = Int4Weight.from_float(w, group_size=32)
        self.native = int4pack_mm_for_cpu() if device.type == "cpu" else None
        self.int4pack = i4.to_int4pack(torch.bfloat16) if self.native is not None else None
        self.weights: dict[str, QuantizedWeight] = {
            "nvfp4": NVFP4Weight.from_float(w).to(device),
            "mxfp4": MXFP4Weight.from_float(w).to(device),
            "int4": i4.to(device),
        }

    def x(self, m: int) -> torch.Tensor:
        return torch.randn(m, 1, K, generator=self.gen).bfloat16().to(self.device)

    def timed(self, fn: Callable[[], object]) -> Callable[[], None]:
        cuda = self.device.type == "cuda"

        def call() -> None:
            fn()
            if cuda:
                torch.cuda.synchronize()

        return call

    def decode(self, threads: int) -> tuple[dict[str, Timing], list[Row]]:
        x = self.x(1)
        cands = {"bf16_linear": self.timed(lambda: F.linear(x, self.w_bf16))}
        for name, q in self.weights.items():
            cands[name] = self.timed(functools.partial(linear, x, q))
        if self.native is not None and self.int4pack is not None:
            native, (packed, table), x2 = self.native, self.int4pack, x.reshape(1, K)
            cands["int4_native"] = self.timed(lambda: native(x2, packed, 32, table))
        res = compare(cands, reps=self.reps, warmup=3)
        rows = []
        for name, t in res.items():
            found = self.weights.get(name)
            r = route(x, found) if found else ("native" if name == "int4_native" else "aten")
            rows.append(_row(name, threads, 1, t, res["bf16_linear"], r))
        return res, rows

    def dense(self, threads: int) -> list[Row]:
        rows = []
        for m in (1, 8):
            xm = self.x(m)
            res = compare(
                {
                    "F.linear": self.timed(functools.partial(F.linear, xm, self.w_bf16)),
                    "dense_gemv": self.timed(functools.partial(linear, xm, self.w_bf16)),
                },
                reps=self.reps,
                warmup=2,
            )
            r = route(xm, self.w_bf16)
            rows.append(_row("dense_gemv", threads, m, res["dense_gemv"], res["F.linear"], r))
        return rows


def measure(*, reps: int, device: str = "cpu") -> tuple[dict[str, object], list[Row]]:
    """Time the GEMV cells; returns (the issue's keys, one row per candidate and thread count)."""
    dev = torch.device(device)
    cells = _Cells(dev, max(reps, 15))  # calls take milliseconds: extra repeats are cheap
    rows: list[Row] = []
    worst: dict[str, float] = {}
    saved = torch.get_num_threads()
    try:
        for threads in THREADS if dev.type == "cpu" else (0,):
            if threads:
                torch.set_num_threads(threads)
            res, decode_rows = cells.decode(threads)
            rows += decode_rows + cells.dense(threads)
            ratios = {n: res["bf16_linear"].median_s / res[n].median_s for n in cells.weights}
            if "int4_native" in res:
                ratios["int4_native"] = res["int4_native"].median_s / res["int4"].median_s
            for name, ratio in ratios.items():
                worst[name] = min(worst.get(name, ratio), ratio)
    finally:
        torch.set_num_threads(saved)
    nv, x1 = cells.weights["nvfp4"], cells.x(1)
    linear(x1, nv)  # the kernels are built and loaded before the measured call
    peak = peak_extra_bytes(lambda: linear(x1, nv)) if dev.type == "cpu" else None
    keys: dict[str, object] = {
        "nvfp4_gemv_speedup_vs_bf16": round(worst["nvfp4"], 3),
        "mxfp4_gemv_speedup_vs_bf16": round(worst["mxfp4"], 3),
        "int4_gemv_ratio_vs_native": round(worst["int4_native"], 3)
        if "int4_native" in worst
        else None,
        "nvfp4_gemv_peak_bytes_ratio": None if peak is None else round(peak / nv.nbytes, 4),
        "gemv_route": route(x1, nv),
    }
    return keys, rows


if __name__ == "__main__":
    import json
    import sys

    found, table = measure(reps=int(sys.argv[1]) if len(sys.argv) > 1 else 7)
    print(json.dumps(found, indent=1))
    for line in table:
        print(line)
