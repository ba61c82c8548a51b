"""The scaled-GEMM part of ``torchnext bench gemm``: ``torchnext.gemm.scaled_mm`` on the CPU
(and, with ``device="cuda"``, on a GPU), every cell timed interleaved by
``torchnext.benchmarking.compare`` (median and p10-p90 spread of ``reps`` repeats).

- ``scaled_rowwise_ratio_vs_torch``: RowWise FP8 (float8_e4m3fn, bfloat16 out) through
  torchnext against torch's own ``F.scaled_mm`` (which torchnext routes to on the CPU, so this
  measures the cost of torchnext's validation); torch time / torchnext time, the median over
  the cells at 1 and 2 threads. The issue's "match or beat torch": about 1.0.
- Block-wise emulation (report only): MXFP8, MXFP4 and NVFP4 ``scaled_mm`` against
  ``F.linear`` of the same shape in bfloat16 and in float32, at 1 thread.
- ``gpu_fp8_rowwise_ratio_vs_torch`` (``device="cuda"``): RowWise FP8 through torchnext
  against ``torch._scaled_mm`` at large square shapes, the worse shape's ratio (bar 0.9);
  ``gpu_fp8_rowwise_triton_ratio_vs_torch`` times the Triton kernel itself the same way.

Every candidate's output is checked before it is timed (RowWise bit for bit against torch,
the emulation against a float32 product of the dequantized operands), so a wrong route never
reports a speed.
"""

from __future__ import annotations

import functools
import statistics
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

from torchnext.benchmarking import Timing, compare
from torchnext.gemm import formats as fm
from torchnext.gemm.scaled import ScalingType, scaled_mm

S = ScalingType
FP4 = torch.float4_e2m1fn_x2
ROWWISE_CELLS = ((1, 4096, 4096), (8, 1024, 1024), (128, 1024, 1024), (512, 1024, 2048))
BLOCK_CELLS = ((1, 4096, 4096), (128, 2048, 2048))  # (M, K, N)
GPU_SQUARE = (4096, 8192)


def _threads(n: int) -> Callable[[], None]:
    return lambda: torch.set_num_threads(n)


def _row(cell: str, m: int, k: int, n: int, threads: int, t: dict[str, Timing]) -> dict[str, Any]:
    row: dict[str, Any] = {"cell": cell, "M": m, "K": k, "N": n, "threads": threads}
    for name, timing in t.items():
        row[f"{name}_ms"] = timing.median_s * 1e3
        row[f"{name}_spread"] = timing.spread
    return row


def _rowwise_inputs(m: int, k: int, n: int, device: str) -> tuple[Any, ...]:
    gen = torch.Generator().manual_seed(m * 7 + k)
    a = (torch.randn(m, k, generator=gen) * 4).to(torch.float8_e4m3fn)
    b = torch.randn(n, k, generator=gen).to(torch.float8_e4m3fn).t()  # column-major [K, N]
    sa, sb = torch.rand(m, 1, generator=gen) + 0.5, torch.rand(1, n, generator=gen) + 0.5
    return tuple(t.to(device) for t in (a, b, sa, sb))


def _measure_rowwise_cpu(reps: int) -> tuple[list[float], list[dict[str, Any]]]:
    ratios, rows = [], []
    for m, k, n in ROWWISE_CELLS:
        a, b, sa, sb = _rowwise_inputs(m, k, n, "cpu")
        args = (a, b, sa, S.RowWise, sb, S.RowWise)
        ours = functools.partial(scaled_mm, *args)
        theirs = functools.partial(F.scaled_mm, *args)
        if not torch.equal(ours(), theirs()):
            raise AssertionError(f"RowWise {m}x{k}x{n}: torchnext differs from F.scaled_mm")
        for threads in (1, 2):
            t = compare(
                {"torchnext": ours, "torch": theirs},
                reps=reps,
                before={"torchnext": _threads(threads), "torch": _threads(threads)},
            )
            ratio = t["torch"].median_s / t["torchnext"].median_s
            ratios.append(ratio)
            rows.append({**_row("rowwise_fp8", m, k, n, threads, t), "ratio_vs_torch": ratio})
    return ratios, rows


def _block_operands(
    x: torch.Tensor, w: torch.Tensor, recipe: str
) -> tuple[tuple[Any, ...], torch.Tensor, torch.Tensor]:
    """``scaled_mm``'s arguments for ``x @ w.T`` in ``recipe``, and the dequantized operands."""
    if recipe == "nvfp4":
        na, nb = fm.quantize_nvfp4(x), fm.quantize_nvfp4(w)
        args = (na.qdata.view(FP4), nb.qdata.view(FP4).t(), na.scales, S.BlockWise1x16,
                nb.scales.t(), S.BlockWise1x16)  # fmt: skip
        return args, fm.dequantize_nvfp4(na), fm.dequantize_nvfp4(nb)
    elem = FP4 if recipe == "mxfp4" else torch.float8_e4m3fn
    pa, pb = fm.quantize_mx(x, elem), fm.quantize_mx(w, elem)
    qa = pa.qdata.view(FP4) if elem == FP4 else pa.qdata
    qb = pb.qdata.view(FP4) if elem == FP4 else pb.qdata
    args = (qa, qb.t(), pa.scales, S.BlockWise1x32, pb.scales.t(), S.BlockWise1x32)
    return args, fm.dequantize_mx(pa), fm.dequantize_mx(pb)


def _measure_blockwise_cpu(reps: int) -> list[dict[str, Any]]:
    rows = []
    torch.set_num_threads(1)
    for m, k, n in BLOCK_CELLS:
        gen = torch.Generator().manual_seed(m + n)
        x, w = torch.randn(m, k, generator=gen), torch.randn(n, k, generator=gen)
        xb, wb = x.bfloat16(), w.bfloat16()
        candidates: dict[str, Callable[[], object]] = {
            "linear_bf16": functools.partial(F.linear, xb, wb),
            "linear_f32": functools.partial(F.linear, x, w),
        }
        for recipe in ("mxfp8", "mxfp4", "nvfp4"):
            args, a_deq, b_deq = _block_operands(x, w, recipe)
            mat_a, mat_b, sa, ra, sb, rb = args
            out = scaled_mm(mat_a, mat_b, sa, ra, sb, rb, output_dtype=torch.float32)
            ref = a_deq @ b_deq.T
            err = float((out - ref).abs().max() / ref.abs().max().clamp_min(1e-30))
            if err > 1e-5:
                raise AssertionError(f"{recipe} {m}x{k}x{n}: relative error {err:.3g}")
            candidates[recipe] = functools.partial(scaled_mm, *args)
        t = compare(candidates, reps=reps)
        row = _row("blockwise_emulation", m, k, n, 1, t)
        for recipe in ("mxfp8", "mxfp4", "nvfp4"):
            for base in ("linear_bf16", "linear_f32"):
                row[f"{recipe}_vs_{base}"] = t[base].median_s / t[recipe].median_s
        rows.append(row)
    return rows


def _cuda_timed(fn: Callable[[], object], inner: int = 10) -> Callable[[], object]:
    """``inner`` back-to-back calls, then a synchronize: a sample is GPU time, not launches."""

    def run() -> object:
        for _ in range(inner):
            fn()
        torch.cuda.synchronize()
        return None

    return run


def _measure_gpu(reps: int) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    from torchnext.compat.gemm_internals import native_scaled_mm
    from torchnext.gemm.formats import ScaledOperand
    from torchnext.gemm.triton_scaled import scaled_mm_triton

    native = native_scaled_mm()
    if native is None:
        raise RuntimeError("torch._scaled_mm is missing from this torch build")
    keys: dict[str, Any] = {}
    rows: list[dict[str, Any]] = []
    ratios: dict[str, list[float]] = {"route": [], "triton": []}
    for size in GPU_SQUARE:
        a, b, sa, sb = _rowwise_inputs(size, size, size, "cuda")
        ops = (ScaledOperand(a, "e4m3", size, sa, 1, size),
               ScaledOperand(b.t(), "e4m3", size, sb.t(), 1, size))  # fmt: skip
        args = (a, b, sa, S.RowWise, sb, S.RowWise)
        calls: dict[str, Callable[[], Any]] = {
            "torch": functools.partial(native, a, b, sa, sb, out_dtype=torch.bfloat16),
            "torchnext": functools.partial(scaled_mm, *args),
            "triton": functools.partial(
                scaled_mm_triton, *ops, alpha=None, bias=None, out_dtype=torch.bfloat16
            ),
        }
        ref = calls["torch"]().float()
        for name in ("torchnext", "triton"):
            got = calls[name]().float()
            if float((got - ref).abs().max()) > 1e-2 * float(ref.abs().max()):
                raise AssertionError(f"GPU RowWise {size}: {name} differs from torch._scaled_mm")
        t = compare({name: _cuda_timed(fn) for name, fn in calls.items()}, reps=reps)
        ratios["route"].append(t["torch"].median_s / t["torchnext"].median_s)
        ratios["triton"].append(t["torch"].median_s / t["triton"].median_s)
        rows.append(_row("gpu_rowwise_fp8", size, size, size, 0, t))
    keys["gpu_fp8_rowwise_ratio_vs_torch"] = min(ratios["route"])
    keys["gpu_fp8_rowwise_triton_ratio_vs_torch"] = min(ratios["triton"])
    return keys, rows


def measure(*, reps: int, device: str = "cpu") -> tuple[dict[str, object], list[dict[str, object]]]:
    """Time the scaled-GEMM cells; returns (the issue's top-level keys, the table rows)."""
    threads = torch.get_num_threads()
    try:
        if device == "cuda":
            return _measure_gpu(reps)  # type: ignore[return-value]
        ratios, rows = _measure_rowwise_cpu(reps)
        rows += _measure_blockwise_cpu(reps)
    finally:
        torch.set_num_threads(threads)
    keys: dict[str, object] = {
        "scaled_rowwise_ratio_vs_torch": statistics.median(ratios),
        "scaled_rowwise_worst_ratio_vs_torch": min(ratios),
    }
    return keys, rows  # type: ignore[return-value]


if __name__ == "__main__":
    import json
    import sys

    found_keys, found_rows = measure(reps=int(sys.argv[1]) if len(sys.argv) > 1 else 7)
    print(json.dumps({"keys": found_keys, "rows": found_rows}, indent=1))
