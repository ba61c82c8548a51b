"""``torchnext bench gemm-gpu``: the GEMM package's GPU bars, on a CUDA machine, in one run.

It runs the GPU halves of the GEMM benchmark parts (``benchmarks/_gemm_*.py``) with
``device="cuda"``: the Triton template's bf16 GEMM against cuBLAS and its fused epilogue
against cuBLAS plus a separate kernel (``_gemm_gpu``), FP8 row-wise against
``torch._scaled_mm`` (``_gemm_scaled``) and grouped GEMM against ``torch._grouped_mm``
(``_gemm_grouped``), and writes ``benchmarks/results/gemm-gpu.json`` with every part's keys
at the top level. ``benchmarks/gpu_check.sh`` runs it after the GPU tests. Without CUDA it
exits with status 2 and says so; the CPU bars are ``torchnext bench gemm``'s.
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
from pathlib import Path
from typing import Any

import torch

from torchnext.benchmarking import Report

# (part script, whether its measure() takes device=)
PARTS = (("_gemm_gpu", False), ("_gemm_scaled", True), ("_gemm_grouped", True))


def _load(name: str) -> Any:
    path = Path(__file__).with_name(f"{name}.py")
    spec = importlib.util.spec_from_file_location(f"torchnext_bench_{name}", path)
    if spec is None or spec.loader is None:
        raise FileNotFoundError(f"benchmark part {path} is missing")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="torchnext bench gemm-gpu", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--reps", type=int, default=10, help="interleaved repeats per cell")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print(
            "gemm-gpu needs a CUDA device; none is present (the CPU bars: torchnext bench gemm)",
            file=sys.stderr,
        )
        return 2
    report = Report("gemm-gpu", ["part", "row"])
    summary: dict[str, Any] = {"device": torch.cuda.get_device_name()}
    for name, takes_device in PARTS:
        module = _load(name)
        print(f"-- {name} --", file=sys.stderr, flush=True)
        kwargs: dict[str, Any] = {"device": "cuda"} if takes_device else {}
        try:
            keys, rows = module.measure(reps=args.reps, **kwargs)
        except Exception as exc:  # noqa: BLE001 - one failing part must not hide the others
            summary[f"{name.removeprefix('_gemm_')}_error"] = f"{type(exc).__name__}: {exc}"
            continue
        summary.update(keys)
        for row in rows:
            report.add(part=name.removeprefix("_gemm_"), row=row)
    report.summary = summary
    report.write()
    return 0
