"""The GPU part of ``torchnext bench gemm``: the Triton template against cuBLAS (CUDA only).

Two claims, each timed interleaved (``torchnext.benchmarking.compare``'s rotation and
warm-up) with CUDA events around ``INNER`` back-to-back calls, so the samples are GPU time
and the Python launch cost of each call overlaps the previous kernel as it does in a model:

- ``gpu_bf16_gemm_ratio_vs_cublas``: bfloat16 ``triton_gemm(a, b)`` against ``torch.mm``
  (cuBLAS) at large square shapes (4096, 8192); the worse shape's cuBLAS time / Triton time.
  Bar >= 0.9.
- ``gpu_fused_epilogue_speedup_vs_cublas``: ``gelu(a @ b + bias) + residual`` in bfloat16 on
  memory-bound shapes (M = N = 8192, K = 256, 512, 1024: the output and the residual weigh
  as much as the GEMM's work), the fused template against ``torch.addmm`` (cuBLAS, bias in
  its epilogue) followed by ``F.gelu`` and the add as separate kernels; the worst shape's
  ratio. Bar >= 1.2.

Every candidate's output is checked against the eager chain before it is timed, so a wrong
kernel never reports a speed. ``measure`` raises ``GemmUnsupportedError`` without a CUDA
device or without Triton; ``benchmarks/gemm.py`` calls it only where CUDA exists.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

from torchnext.benchmarking import Timing, compare
from torchnext.errors import GemmUnsupportedError
from torchnext.gemm.epilogue import Epilogue, add, gelu

SQUARE = (4096, 8192)
MEMORY_BOUND = ((8192, 256, 8192), (8192, 512, 8192), (8192, 1024, 8192))  # (M, K, N)
INNER = 10
"""Back-to-back calls per timed sample (GPU time is their total / INNER)."""
WARMUP = 2


def _require_gpu() -> Callable[..., torch.Tensor]:
    if not torch.cuda.is_available():
        raise GemmUnsupportedError(
            "benchmarks/_gemm_gpu.py: torch.cuda.is_available() is False; this part times the "
            "Triton template against cuBLAS and needs a CUDA device. Run it on a GPU machine "
            "(`torchnext bench gemm` runs it only where CUDA exists)"
        )
    from torchnext.gemm.triton_gemm import triton_available, triton_gemm

    if not triton_available():
        raise GemmUnsupportedError(
            "benchmarks/_gemm_gpu.py: Triton is not importable; pip install 'torchnext[gpu]'"
        )
    return triton_gemm


def _cuda_compare(candidates: dict[str, Callable[[], object]], *, reps: int) -> dict[str, Timing]:
    """``compare``'s interleaving, timed by CUDA events (synchronized in each candidate)."""
    samples: dict[str, list[float]] = {name: [] for name in candidates}

    def timed(name: str, fn: Callable[[], object]) -> Callable[[], None]:
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)

        def run() -> None:
            torch.cuda.synchronize()  # nothing of another candidate is still queued
            start.record()
            for _ in range(INNER):
                fn()
            end.record()
            end.synchronize()
            samples[name].append(start.elapsed_time(end) / 1e3 / INNER)

        return run

    compare({name: timed(name, fn) for name, fn in candidates.items()}, reps=reps, warmup=WARMUP)
    return {name: Timing(name, tuple(s[WARMUP:])) for name, s in samples.items()}


def _check(name: str, got: torch.Tensor, want: torch.Tensor, k: int) -> None:
    # bfloat16 output rounding plus float32 accumulation over K (both sides accumulate in
    # float32, in different orders).
    scale = float(want.float().abs().amax()) + 1.0
    err = float((got.float() - want.float()).abs().amax())
    tol = (4 * torch.finfo(torch.bfloat16).eps + 4 * k * torch.finfo(torch.float32).eps) * scale
    if not err <= tol:
        raise AssertionError(
            f"benchmarks/_gemm_gpu.py {name}: max error {err:.3g} exceeds {tol:.3g}; the "
            "Triton template disagrees with cuBLAS, so its time is not reported"
        )


def _cublas_then_eager(
    a_MK: torch.Tensor, b_KN: torch.Tensor, bias_N: torch.Tensor, res_MN: torch.Tensor
) -> torch.Tensor:
    """What a user writes today: cuBLAS with the bias in its epilogue, then two kernels."""
    return F.gelu(torch.addmm(bias_N, a_MK, b_KN)) + res_MN


def _row(
    case: str, m: int, k: int, n: int, ours: Timing, base: Timing, baseline: str
) -> dict[str, object]:
    return {
        "case": case,
        "M": m,
        "K": k,
        "N": n,
        "dtype": "bfloat16",
        "baseline": baseline,
        "ours_ms": ours.median_s * 1e3,
        "ours_spread": ours.spread,
        "base_ms": base.median_s * 1e3,
        "base_spread": base.spread,
        "speedup": base.median_s / ours.median_s,
    }


def measure(*, reps: int) -> tuple[dict[str, object], list[dict[str, object]]]:
    """Time both GPU claims; ``(keys, rows)`` for ``benchmarks/gemm.py``."""
    triton_gemm = _require_gpu()
    dev = torch.device("cuda")
    gen = torch.Generator(device=dev).manual_seed(0)
    rows: list[dict[str, object]] = []
    gemm_ratios: list[float] = []
    with torch.no_grad():
        for size in SQUARE:
            a = torch.randn(size, size, device=dev, generator=gen).bfloat16()
            b = torch.randn(size, size, device=dev, generator=gen).bfloat16()
            _check(f"gemm {size}", triton_gemm(a, b), torch.mm(a, b), size)  # also tunes
            t = _cuda_compare(
                {
                    "triton": functools.partial(triton_gemm, a, b),
                    "cublas": functools.partial(torch.mm, a, b),
                },
                reps=reps,
            )
            rows.append(_row("bf16 gemm", size, size, size, t["triton"], t["cublas"], "cublas"))
            gemm_ratios.append(t["cublas"].median_s / t["triton"].median_s)
            del a, b, t

        fused_ratios: list[float] = []
        for m, k, n in MEMORY_BOUND:
            a = torch.randn(m, k, device=dev, generator=gen).bfloat16()
            b = (torch.randn(k, n, device=dev, generator=gen) / k**0.5).bfloat16()
            bias = torch.randn(n, device=dev, generator=gen).bfloat16()
            res = torch.randn(m, n, device=dev, generator=gen).bfloat16()
            fused = functools.partial(triton_gemm, a, b, bias, Epilogue(gelu(), add(res)))
            unfused = functools.partial(_cublas_then_eager, a, b, bias, res)
            _check(f"fused {m}x{k}x{n}", fused(), unfused(), k)
            t = _cuda_compare(
                {
                    "fused": fused,
                    "cublas+eager": unfused,
                    "triton gemm only": functools.partial(triton_gemm, a, b, bias),
                },
                reps=reps,
            )
            rows.append(
                _row("bias+gelu+residual", m, k, n, t["fused"], t["cublas+eager"], "cublas+eager")
            )
            rows.append(
                _row("epilogue cost", m, k, n, t["fused"], t["triton gemm only"], "triton gemm")
            )
            fused_ratios.append(t["cublas+eager"].median_s / t["fused"].median_s)
            del a, b, bias, res, fused, unfused, t

    keys: dict[str, Any] = {
        "gpu_bf16_gemm_ratio_vs_cublas": min(gemm_ratios),
        "gpu_fused_epilogue_speedup_vs_cublas": min(fused_ratios),
        "gpu_device": torch.cuda.get_device_name(dev),
    }
    return keys, rows
