"""Grouped GEMM cells of ``torchnext bench gemm``: torchnext's ``grouped_mm`` against a Python
loop of ``mm`` and against torch 2.13's own ``torch._grouped_mm``.

Two MoE shapes, float32, 64 experts, top-2 routing with uneven (Zipf-like) expert loads:

* decode-like: 256 tokens -> 512 routed rows, K = N = 1024 (256 MB of expert weights,
  about 8 rows per expert: bound by streaming the weights);
* prefill-like: 4096 tokens -> 8192 routed rows, K = N = 512 (compute bound).

Every candidate, at 1 and 2 threads, is timed interleaved in one
:func:`torchnext.benchmarking.compare` run per shape (the thread count is set, untimed,
before each call). The expert weights are ``(G, K, N)`` row-major, the layout 2.14's
documentation gives ``mat_b``. Keys (the worse thread count of each):
``grouped_mm_speedup_vs_loop`` (decode-like, bar >= 2) and ``grouped_mm_speedup_vs_native``
(prefill-like, bar >= 1.0). On CUDA, :func:`measure` times bfloat16 against
``torch._grouped_mm`` instead (key ``gpu_grouped_ratio_vs_native``, GPU bar 0.9).

Not a script of its own: ``benchmarks/gemm.py`` calls :func:`measure`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from torchnext.benchmarking import Timing, compare
from torchnext.compat import gemm_internals
from torchnext.gemm.grouped import grouped_mm

EXPERTS = 64
SHAPES = {"decode": (256, 1024, 1024), "prefill": (4096, 512, 512)}  # tokens, K, N
THREADS = (1, 2)


def routing(tokens: int, experts: int, *, top_k: int = 2, seed: int = 0) -> torch.Tensor:
    """Rows per expert (int64, ``experts`` long) of a top-k router with uneven expert loads.

    Each token picks ``top_k`` distinct experts with probability proportional to
    ``1 / rank**0.9`` over a shuffled ranking: a few hot experts, a long tail, some idle.
    """
    gen = torch.Generator().manual_seed(seed)
    weights = 1.0 / torch.arange(1, experts + 1, dtype=torch.float64) ** 0.9
    weights = weights[torch.randperm(experts, generator=gen)]
    picks = torch.multinomial(weights.expand(tokens, experts), top_k, generator=gen)
    return torch.bincount(picks.flatten(), minlength=experts)


def _operands(shape: str, device: str, dtype: torch.dtype) -> tuple[torch.Tensor, ...]:
    tokens, k, n = SHAPES[shape]
    counts = routing(tokens, EXPERTS)
    offs = torch.cumsum(counts, 0).to(torch.int32)
    gen = torch.Generator().manual_seed(1)
    a_MK = torch.randn(int(offs[-1]), k, generator=gen).to(device, dtype)
    w_GKN = (torch.randn(EXPERTS, k, n, generator=gen) / k**0.5).to(device, dtype)
    return a_MK, w_GKN, offs.to(device), counts


def _loop(a_MK: torch.Tensor, w_GKN: torch.Tensor, counts: list[int]) -> torch.Tensor:
    """The baseline people write: one ``mm`` per expert, then a ``cat``."""
    outs, start = [], 0
    for g, c in enumerate(counts):
        outs.append(a_MK[start : start + c] @ w_GKN[g])
        start += c
    return torch.cat(outs)


def _row(shape: str, t: int, timing: dict[str, Timing]) -> dict[str, object]:
    ours, loop, native = (timing[f"{n}@{t}"] for n in ("torchnext", "loop", "native"))
    return {
        "cell": f"grouped {shape}",
        "threads": t,
        "torchnext_ms": round(ours.median_s * 1e3, 3),
        "loop_ms": round(loop.median_s * 1e3, 3),
        "native_ms": round(native.median_s * 1e3, 3),
        "speedup_vs_loop": round(loop.median_s / ours.median_s, 3),
        "speedup_vs_native": round(native.median_s / ours.median_s, 3),
        "spread_torchnext": round(ours.spread, 3),
        "spread_loop": round(loop.spread, 3),
        "spread_native": round(native.spread, 3),
    }


def measure(*, reps: int, device: str = "cpu") -> tuple[dict[str, object], list[dict[str, object]]]:
    """Time the grouped cells; return (the issue's keys, one row per shape and thread count)."""
    if device != "cpu":
        return _measure_cuda(reps=reps)
    before = torch.get_num_threads()
    rows: list[dict[str, object]] = []
    try:
        for shape in SHAPES:
            rows += _measure_cpu_shape(shape, reps)
    finally:
        torch.set_num_threads(before)
    decode = [r for r in rows if r["cell"] == "grouped decode"]
    prefill = [r for r in rows if r["cell"] == "grouped prefill"]
    keys: dict[str, object] = {
        "grouped_mm_speedup_vs_loop": min(_num(r["speedup_vs_loop"]) for r in decode),
        "grouped_mm_speedup_vs_native": min(_num(r["speedup_vs_native"]) for r in prefill),
    }
    return keys, rows


def _threads_setter(t: int) -> Callable[[], None]:
    return lambda: torch.set_num_threads(t)


def _num(value: object) -> float:
    if not isinstance(value, (int, float)):
        raise TypeError(f"expected a number, got {value!r}")
    return float(value)


def _measure_cpu_shape(shape: str, reps: int) -> list[dict[str, object]]:
    native = gemm_internals.native_grouped_mm()
    if native is None:
        raise RuntimeError("torch._grouped_mm is missing: this torch cannot be the baseline")
    a_MK, w_GKN, offs, counts_t = _operands(shape, "cpu", torch.float32)
    counts = counts_t.tolist()
    ref = _loop(a_MK, w_GKN, counts)
    err = (grouped_mm(a_MK, w_GKN, offs=offs) - ref).abs().max().item() / ref.abs().max().item()
    fns: dict[str, Callable[[], object]] = {
        "torchnext": lambda: grouped_mm(a_MK, w_GKN, offs=offs),
        "loop": lambda: _loop(a_MK, w_GKN, counts),
        "native": lambda: native(a_MK, w_GKN, offs=offs),
    }
    candidates = {f"{n}@{t}": fn for t in THREADS for n, fn in fns.items()}
    set_threads = {f"{n}@{t}": _threads_setter(t) for t in THREADS for n in fns}
    timing = compare(candidates, reps=reps, warmup=1, before=set_threads)
    rows = []
    for t in THREADS:
        row = _row(shape, t, timing)
        row["max_rel_err_vs_loop"] = err
        row["rows_per_expert_max"] = max(counts)
        row["idle_experts"] = counts.count(0)
        rows.append(row)
    return rows


def _measure_cuda(*, reps: int) -> tuple[dict[str, object], list[dict[str, object]]]:
    """bfloat16 on the GPU: torchnext's route and its Triton kernel against torch's op."""
    rows = [_measure_cuda_shape(shape, reps) for shape in SHAPES]
    ratios = [_num(r["ratio_vs_native"]) for r in rows if "ratio_vs_native" in r]
    keys: dict[str, object] = {"gpu_grouped_ratio_vs_native": min(ratios) if ratios else None}
    return keys, rows


def _measure_cuda_shape(shape: str, reps: int) -> dict[str, object]:
    from torchnext.gemm.triton_grouped import grouped_mm_triton, triton_available

    native = gemm_internals.native_grouped_mm()
    a_MK, w_GKN, offs, _ = _operands(shape, "cuda", torch.bfloat16)

    def synced(fn: Callable[[], Any]) -> Callable[[], None]:
        def run() -> None:
            fn()
            torch.cuda.synchronize()

        return run

    fns: dict[str, Callable[[], None]] = {
        "torchnext": synced(lambda: grouped_mm(a_MK, w_GKN, offs=offs)),
    }
    if native is not None:
        fns["native"] = synced(lambda: native(a_MK, w_GKN, offs=offs))
    if triton_available():
        fns["triton"] = synced(lambda: grouped_mm_triton(a_MK, w_GKN, offs))
    timing = compare(fns, reps=reps, warmup=3)
    row: dict[str, object] = {"cell": f"grouped {shape} cuda bf16"}
    for name, t in timing.items():
        row[f"{name}_ms"] = round(t.median_s * 1e3, 4)
        row[f"spread_{name}"] = round(t.spread, 3)
    if "native" in timing:
        # The bar is about the kernel torchnext brings; on sm90/sm100 torchnext's own route
        # is torch's kernel, so that ratio is reported but is not the key.
        mine = timing.get("triton", timing["torchnext"]).median_s
        row["ratio_vs_native"] = round(timing["native"].median_s / mine, 3)
        row["route_ratio_vs_native"] = round(
            timing["native"].median_s / timing["torchnext"].median_s, 3
        )
    return row
