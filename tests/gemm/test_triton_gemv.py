"""The Triton 4-bit GEMV kernel, run on the CPU through Triton's interpreter.

``TRITON_INTERPRET`` must be set before Triton is first imported, so the kernel runs in a
child process; this module never imports Triton itself. The child checks every format
against a float64 reference, and decodes every finite e4m3 scale byte and the e8m0 bytes
that stay finite exactly (one-hot rows of ``x`` read single weights back).
"""

from __future__ import annotations

import textwrap

import pytest
import torch
from triton_interpreter import needs_triton, run_child

from torchnext.gemm import gemv
from torchnext.gemm.quantized_weight import NVFP4Weight

pytestmark = needs_triton

_CHILD = textwrap.dedent(
    """
    import json, torch
    from torchnext.gemm import formats, triton_gemv
    from torchnext.gemm.quantized_weight import (
        Int4Weight, MXFP4Weight, NVFP4Weight)
    torch.manual_seed(0)
    rows = []
    w = torch.randn(40, 256)
    weights = {
        "nvfp4": NVFP4Weight.from_float(w),
        "mxfp4": MXFP4Weight.from_float(w),
        "int4-g64-bf16": Int4Weight.from_float(w, group_size=64),
        "int4-g32-sym-f32": Int4Weight.from_float(
            w, group_size=32, symmetric=True, scale_dtype=torch.float32),
        "int4-g128-f16": Int4Weight.from_float(w, group_size=128, scale_dtype=torch.float16),
    }
    for name, q in weights.items():
        w64 = q.dequantize(torch.float64)
        for m in (1, 4):
            x = torch.randn(m, 256)
            y = triton_gemv.q4_gemv(x, q)
            ref = x.double() @ w64.T
            mag = x.double().abs() @ w64.abs().T
            rows.append(dict(case=name, m=m, err=float(((y.double() - ref).abs() / mag).max())))
    # Every scale byte: NVFP4 e4m3 (all but the two NaNs) and e8m0 (those that stay finite).
    # One scale per row (K = one block), one-hot rows of x read single weights back exactly.
    e4m3 = torch.tensor([b for b in range(256) if b & 0x7F != 0x7F], dtype=torch.uint8)
    nv = NVFP4Weight(formats.NVFP4Parts(
        torch.randint(0, 256, (254, 8), dtype=torch.uint8), e4m3.view(254, 1).view(torch.float8_e4m3fn)))
    e8m0 = torch.arange(0, 128, dtype=torch.uint8).view(128, 1)
    mx = MXFP4Weight(formats.MXParts(torch.randint(0, 256, (128, 16), dtype=torch.uint8),
                                     e8m0.view(torch.float8_e8m0fnu), torch.float4_e2m1fn_x2))
    for name, q in (("e4m3-bytes", nv), ("e8m0-bytes", mx)):
        pick = [0, 5, q.in_features - 1]
        y = triton_gemv.q4_gemv(torch.eye(q.in_features)[pick], q)
        rows.append(dict(case=name, exact=bool(torch.equal(y.T, q.dequantize()[:, pick]))))
    print(json.dumps(rows))
    """
)


@pytest.fixture(scope="module")
def interpreted_rows() -> list[dict[str, object]]:
    rows: list[dict[str, object]] = run_child(_CHILD)
    return rows


def test_kernel_matches_the_float64_reference(interpreted_rows: list[dict[str, object]]) -> None:
    checked = [r for r in interpreted_rows if "err" in r]
    assert len(checked) == 10
    tol = 4 * 16 * torch.finfo(torch.float32).eps  # 4 sqrt(K) eps32 of sum |x| |w|, K = 256
    for row in checked:
        assert float(row["err"]) <= tol, row  # type: ignore[arg-type]


def test_kernel_decodes_every_scale_byte_exactly(
    interpreted_rows: list[dict[str, object]],
) -> None:
    exact = {r["case"]: r["exact"] for r in interpreted_rows if "exact" in r}
    assert exact == {"e4m3-bytes": True, "e8m0-bytes": True}


def test_cuda_weights_route_to_the_kernel_for_decode_rows() -> None:
    w = NVFP4Weight.from_float(torch.randn(16, 64)).to("meta")
    assert w.layout == "rows"
    x = torch.empty(1, 64, device="meta")
    assert gemv.route(x, w) == "torch-q4-chunked"  # neither CPU nor CUDA: the torch route


@pytest.mark.gpu
def test_kernel_on_the_gpu_matches_the_cpu_route() -> None:
    w = NVFP4Weight.from_float(torch.randn(300, 512))
    x = torch.randn(4, 512)
    wc = w.to("cuda")
    assert gemv.route(x.cuda(), wc) == "triton-q4-gemv"
    y = gemv.linear(x.cuda(), wc).cpu()
    assert torch.allclose(y, gemv.linear(x, w), rtol=1e-4, atol=1e-4)
