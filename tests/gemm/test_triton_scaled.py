"""The block-scaled Triton GEMM, run on the CPU through Triton's interpreter.

``TRITON_INTERPRET`` must be set before Triton is first imported, so the kernel runs in a
child process; it is compared there with the CPU emulation of ``scaled_mm`` on the same plan
(every recipe, ragged M/N/K, bias, both MX paths). A ``gpu`` test compares the CUDA routes
(native or Triton) with the CPU on the same inputs.
"""

from __future__ import annotations

import textwrap
from typing import Any

import pytest
import torch
from triton_interpreter import needs_triton, run_child

pytestmark = needs_triton

# Builds (name, plan args) cases; shared by the interpreter child and the GPU test.
_CASES = """
import torch
from torchnext.gemm import formats as fm
from torchnext.gemm.scaled import ScalingType as S, SwizzleType as Z
FP4 = torch.float4_e2m1fn_x2
def cases():
    gen = torch.Generator().manual_seed(0)
    out = []
    for (m, n, k) in ((20, 40, 160), (1, 33, 96)):
        x, w = torch.randn(m, k, generator=gen) * 4, torch.randn(n, k, generator=gen)
        for elem in (torch.float8_e4m3fn, torch.float8_e5m2, FP4):
            pa, pb = fm.quantize_mx(x, elem), fm.quantize_mx(w, elem)
            qa = pa.qdata.view(FP4) if elem == FP4 else pa.qdata
            qb = pb.qdata.view(FP4) if elem == FP4 else pb.qdata
            out.append((f"mx-{elem}-{m}", (qa, qb.t(), pa.scales, S.BlockWise1x32,
                        fm.swizzle_32_4_4(pb.scales), S.BlockWise1x32, None, Z.SWIZZLE_32_4_4)))
        pa, pb = fm.quantize_nvfp4(x, per_tensor_scale=torch.tensor(0.03)), fm.quantize_nvfp4(w)
        out.append((f"nvfp4-{m}", (pa.qdata.view(FP4), pb.qdata.view(FP4).t(),
                    [pa.scales, torch.tensor(0.03)], [S.BlockWise1x16, S.TensorWise],
                    pb.scales.t(), S.BlockWise1x16, None, None)))
        a8, b8 = x.to(torch.float8_e4m3fn), w.to(torch.float8_e4m3fn)
        out.append((f"rowwise-{m}", (a8, b8.t(), torch.rand(m, 1, generator=gen) + .5,
                    S.RowWise, torch.rand(1, n, generator=gen) + .5, S.RowWise, None, None)))
        out.append((f"tensorwise-{m}", (a8, w.to(torch.float8_e5m2).t(), torch.tensor(2.0),
                    S.TensorWise, torch.tensor(0.25), S.TensorWise, None, None)))
        kb = -(-k // 128)
        out.append((f"1x128-128x128-{m}", (a8, b8.t(), torch.rand(m, kb, generator=gen) + .5,
                    S.BlockWise1x128, torch.rand(kb, -(-n // 128), generator=gen) + .5,
                    S.BlockWise128x128, None, None)))
        out.append((f"128x128-1x128-{m}", (a8, b8.t(), torch.rand(-(-m // 128), kb,
                    generator=gen) + .5, S.BlockWise128x128, torch.rand(kb, n, generator=gen)
                    + .5, S.BlockWise1x128, None, None)))
    return out
"""

_CHILD = textwrap.dedent(
    """
    import json, torch
    from torchnext.gemm import scaled as sc
    from torchnext.gemm.scaled_plan import plan_scaled_mm
    from torchnext.gemm.triton_scaled import scaled_mm_triton
    rows = []
    for name, args in cases():
        plan = plan_scaled_mm(*args)
        n = plan.b.rows
        bias = torch.linspace(-1, 1, n)
        for dot_scaled in ((None, False) if name.startswith("mx") else (None,)):
            for out_dtype in (torch.float32, torch.bfloat16)[: 2 if plan.a.rows > 1 else 1]:
                got = scaled_mm_triton(plan.a, plan.b, alpha=plan.alpha, bias=bias,
                                       out_dtype=out_dtype, use_dot_scaled=dot_scaled)
                ref = sc._emulate(plan, bias, torch.float32)
                a = plan.a.dequantize_rows(0, plan.a.rows).double().abs()
                b = plan.b.dequantize_rows(0, n).double().abs()
                alpha = 1.0 if plan.alpha is None else float(plan.alpha)
                k = plan.a.k
                bound = 8 * k * 2**-23 * (a @ b.T) * alpha + 1e-30
                if out_dtype == torch.bfloat16:
                    bound = bound + ref.double().abs() * 2**-7  # one bf16 ulp
                rows.append(dict(name=name, dot_scaled=dot_scaled, out=str(out_dtype),
                                 dtype_ok=got.dtype == out_dtype,
                                 ratio=float(((got.double() - ref.double()).abs() / bound).max())))
    print(json.dumps(rows))
    """
)


@pytest.fixture(scope="module")
def interpreted_rows() -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = run_child(_CASES + _CHILD)
    return rows


def test_kernel_matches_the_cpu_emulation(interpreted_rows: list[dict[str, Any]]) -> None:
    assert len(interpreted_rows) == (3 * 2 + 5) * 3  # bfloat16 output on the first shape only
    for row in interpreted_rows:
        assert row["dtype_ok"], row
        assert row["ratio"] <= 1.0, row


def test_tile_config_aligns_k_tiles_with_scale_blocks() -> None:
    from torchnext.gemm.triton_scaled import tile_config

    for k_block in (16, 32, 128, 256, 4096, 96):
        bm, bn, bk, _, _ = tile_config(512, 512, k_block)
        assert bk % 32 == 0 and (k_block % bk == 0 or bk % k_block == 0 or k_block % 128), k_block
    assert tile_config(1, 4096, 32)[0] == 16  # decode takes a narrow M tile


@pytest.mark.gpu
def test_cuda_routes_match_the_cpu() -> None:
    from torchnext.gemm.scaled import scaled_mm

    namespace: dict[str, Any] = {}
    exec(_CASES, namespace)  # noqa: S102 - the same case builder the interpreter test runs
    for name, args in namespace["cases"]():
        cpu = scaled_mm(*args, output_dtype=torch.float32)

        def to_cuda(v: Any) -> Any:
            if isinstance(v, list):
                return [to_cuda(x) for x in v]
            return v.cuda() if isinstance(v, torch.Tensor) else v

        gpu = scaled_mm(*[to_cuda(v) for v in args], output_dtype=torch.float32)
        scale = cpu.abs().max().clamp_min(1e-30)
        assert float((gpu.cpu() - cpu).abs().max() / scale) < 1e-5, name
