"""torchnext.gemm.gemv and quantized_weight: decode GEMV on dense and 4-bit weights (CPU).

Every route is held to a float64 reference at a dtype-scaled tolerance: float32 results within
``4 * sqrt(K) * eps32`` of ``sum_k |x| |W|`` (float32 accumulation), bfloat16 / float16 within
one rounding of the output dtype. The weight containers round-trip their layout exactly and
match torchao's tensors bit for bit (skipped without torchao); peak memory during a call is
measured from the profiler's allocation events; bad input names the argument and its value.
"""

from __future__ import annotations

import math
import subprocess
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch.profiler import ProfilerActivity, profile

from torchnext.compat import gemm_internals
from torchnext.errors import GemmInputError, GemmUnsupportedError
from torchnext.gemm import formats, gemv, gemv_cpu
from torchnext.gemm.gemv import linear, route
from torchnext.gemm.grouped_cpu import cpu_upcasts
from torchnext.gemm.quantized_weight import (
    Int4Weight,
    MXFP4Weight,
    NVFP4Weight,
    QuantizedWeight,
    weight_from_torchao,
)

needs_kernels = pytest.mark.skipif(
    gemv_cpu.kernels() is None, reason="no working C compiler for the CPU GEMV kernels"
)

MAKERS: dict[str, Callable[[torch.Tensor], QuantizedWeight]] = {
    "nvfp4": NVFP4Weight.from_float,
    "nvfp4-no-global": lambda w: NVFP4Weight.from_float(w, per_tensor_scale=None),
    "mxfp4": MXFP4Weight.from_float,
    "int4-g32-bf16": lambda w: Int4Weight.from_float(w, group_size=32),
    "int4-g64-sym-f32": lambda w: Int4Weight.from_float(
        w, group_size=64, symmetric=True, scale_dtype=torch.float32
    ),
    "int4-g128-f16": lambda w: Int4Weight.from_float(w, group_size=128, scale_dtype=torch.float16),
}


def assert_close_to_reference(
    y: torch.Tensor, x: torch.Tensor, w64_NK: torch.Tensor, bias: torch.Tensor | None = None
) -> None:
    k = x.shape[-1]
    x64 = x.double().reshape(-1, k)
    ref = x64 @ w64_NK.T + (0 if bias is None else bias.double())
    mag = x64.abs() @ w64_NK.abs().T + (0 if bias is None else bias.double().abs())
    if y.dtype == torch.float32:
        tol = 4 * math.sqrt(k) * torch.finfo(torch.float32).eps * mag
    else:
        tol = torch.finfo(y.dtype).eps * (ref.abs() + mag / math.sqrt(k))
    err = (y.double().reshape(ref.shape) - ref).abs()
    assert y.dtype == x.dtype and y.shape == (*x.shape[:-1], w64_NK.shape[0])
    assert bool((err <= tol + 1e-30).all()), f"max excess {float((err - tol).max())}"


@needs_kernels
@pytest.mark.parametrize("kind", sorted(MAKERS))
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_quantized_linear_matches_float64_reference(kind: str, dtype: torch.dtype) -> None:
    n, k = 43, 256  # N not a multiple of 8: the padded rows must not leak
    w = MAKERS[kind](torch.randn(n, k))
    w64 = w.dequantize(torch.float64)
    bias = torch.randn(n).to(dtype)
    for rows in (1, 2, 3, 5, 8, 9, 40):
        x = torch.randn(rows, 1, k).to(dtype)
        expected = "cpu-q4-gemv" if rows <= gemv.GEMV_MAX_ROWS else "cpu-q4-chunked"
        assert route(x, w) == expected
        assert_close_to_reference(linear(x, w, bias), x, w64, bias)
        y = linear(x[:, 0], w)
        assert_close_to_reference(y, x[:, 0], w64)
        assert y.is_contiguous()


@needs_kernels
def test_chunked_route_crosses_chunk_boundaries() -> None:
    w = NVFP4Weight.from_float(torch.randn(203, 64))  # chunks of 64 rows, the last partial
    x = torch.randn(12, 64)
    assert_close_to_reference(linear(x, w), x, w.dequantize(torch.float64))


def test_torch_fallback_route_without_a_compiler(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(gemv_cpu, "kernels", lambda **_: None)
    for kind in ("nvfp4", "int4-g32-bf16"):
        w = MAKERS[kind](torch.randn(30, 128))
        for rows in (1, 11):
            x = torch.randn(rows, 128)
            assert route(x, w) == "torch-q4-chunked"
            assert_close_to_reference(linear(x, w), x, w.dequantize(torch.float64))
    wb = torch.randn(1024, 1024, dtype=torch.bfloat16)
    assert route(torch.randn(1, 1024, dtype=torch.bfloat16), wb) == "aten"


@needs_kernels
def test_portable_c_build_agrees_with_the_simd_build() -> None:
    portable = gemv_cpu.kernels(portable=True)
    fast = gemv_cpu.kernels()
    assert portable is not None and fast is not None and not portable.simd
    w = MAKERS["int4-g32-bf16"](torch.randn(20, 64))
    x = torch.randn(3, 64)
    reference = x.double() @ w.dequantize(torch.float64).T
    outs = []
    for lib in (portable, fast):
        # x as it is in each activation dtype; the output's 20 rows are not a multiple of 8.
        for x_dtype in (torch.float32, torch.bfloat16, torch.float16):
            x_in = x.to(x_dtype)
            out = torch.full((3, 20), float("nan"))
            lib.q4_gemv(w, x_in, out)
            expect = x_in.double() @ w.dequantize(torch.float64).T
            assert torch.allclose(out.double(), expect, rtol=1e-4, atol=1e-4), (lib, x_dtype)
        out = torch.empty(3, 20)
        lib.q4_gemv(w, x, out)
        w_KR = torch.empty(64, 24)
        lib.q4_dequant(w, 0, 3, w_KR)
        outs.append((out, w_KR[:, :20]))
    assert torch.allclose(outs[0][0], outs[1][0], rtol=1e-5, atol=1e-5)
    assert torch.allclose(outs[1][0].double(), reference, rtol=1e-4, atol=1e-4)
    assert torch.equal(outs[0][1], outs[1][1])
    assert torch.equal(outs[0][1].T, w.dequantize())


def scale_byte_weights() -> list[QuantizedWeight]:
    """Weights whose scales are every finite e4m3 byte, and the e8m0 bytes that stay finite."""
    codes = torch.randint(0, 256, (16, 128), dtype=torch.uint8)
    e4m3 = [b for b in range(256) if b & 0x7F != 0x7F] + [0x38, 0x38]
    nv_scales = torch.tensor(e4m3, dtype=torch.uint8).view(16, 16)
    mx_scales = torch.arange(0, 128, dtype=torch.uint8).view(16, 8)
    return [
        NVFP4Weight(formats.NVFP4Parts(codes, nv_scales.view(torch.float8_e4m3fn))),
        MXFP4Weight(
            formats.MXParts(codes, mx_scales.view(torch.float8_e8m0fnu), torch.float4_e2m1fn_x2)
        ),
    ]


@needs_kernels
@pytest.mark.parametrize("portable", [False, True])
def test_every_scale_byte_decodes_exactly(portable: bool) -> None:
    lib = gemv_cpu.kernels(portable=portable)
    assert lib is not None
    for q in scale_byte_weights():
        w_KR = torch.empty(256, 16)
        lib.q4_dequant(q, 0, 2, w_KR)
        assert torch.equal(w_KR.T, q.dequantize())


def _cpu_avx512() -> frozenset[torch.dtype]:
    """What the CPU itself reports (Linux), independent of the library's detection."""
    try:
        flags = set(Path("/proc/cpuinfo").read_text().split())
    except OSError:
        return frozenset()
    if not {"avx512f", "avx512bw"} <= flags:
        return frozenset()
    return frozenset({torch.float32} | ({torch.bfloat16} if "avx512_bf16" in flags else set()))


def _avx512_dtypes() -> frozenset[torch.dtype]:
    cpu = gemv_cpu.kernels()
    return frozenset() if cpu is None else cpu.avx512_dtypes


@needs_kernels
def test_the_avx512_tiles_are_built_where_the_cpu_has_them() -> None:
    # Decided from /proc/cpuinfo, so a build that lost the AVX-512 part fails here instead of
    # skipping the tests below.
    if not Path("/proc/cpuinfo").exists():
        pytest.skip("no /proc/cpuinfo to read the CPU's flags from")
    assert _avx512_dtypes() == _cpu_avx512(), "AVX-512 tiles missing (compiler older than 11?)"


@needs_kernels
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_dense_half_gemv_matches_reference(dtype: torch.dtype) -> None:
    avx512 = dtype in _avx512_dtypes()
    dense = "cpu-dense512" if avx512 else "cpu-dense-gemv"
    big = torch.randn(1030, 520).to(dtype)
    w = big[:, :515]  # K with a tail past 32 and 8, and a row stride that is not K
    assert w.numel() >= gemv.DENSE_MIN_ELEMENTS
    x = torch.randn(1, 1, 515).to(dtype)
    assert route(x, w) == dense
    b = torch.randn(1030).to(dtype)
    assert_close_to_reference(linear(x, w, b), x, w.double(), b)
    # From two rows on the C tiles are taken where the AVX-512 tiles run the dtype, or where
    # torch emulates it (no instructions for it); elsewhere torch's GEMM is as fast or faster.
    several = dense if avx512 or cpu_upcasts(dtype) else "aten"
    for rows in (2, 8):
        x = torch.randn(rows, 515).to(dtype)
        assert route(x, w) == several
        assert_close_to_reference(linear(x, w), x, w.double())
    x = torch.randn(9, 515).to(dtype)
    assert route(x, w) == "aten"
    assert torch.equal(linear(x, w), F.linear(x, w))
    assert route(torch.randn(1, 1030, dtype=dtype), big.T) == "aten"  # column stride
    small = torch.randn(512, 512).to(dtype)  # torch's own call is faster at M = 1 here
    one_row = dense if avx512 else "aten"  # but not than the AVX-512 tiles
    assert route(torch.randn(1, 512, dtype=dtype), small) == one_row
    assert route(torch.randn(2, 512, dtype=dtype), small) == several


@needs_kernels
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("rows", [1, 2, 3, 4, 5, 8])
def test_avx512_tiles_match_reference(dtype: torch.dtype, rows: int) -> None:
    """Every tile of the AVX-512 kernel (4 weight rows and the single rows left over, against
    1 to 4 rows of x, twice for 5 to 8), the K tail past 32 and 16, a weight row stride that is
    not K, with and without bias, in the operands' own dtype and in float32."""
    if dtype not in _cpu_avx512():
        pytest.skip(f"this CPU has no AVX-512 instructions for {dtype}")
    cpu = gemv_cpu.kernels()
    assert cpu is not None
    w = torch.randn(1031, 523).to(dtype)[:, :515]
    x = torch.randn(rows, 515).to(dtype)
    b = torch.randn(1031).to(dtype)
    for bias in (None, b):
        out = torch.full((rows, 1031), float("nan"), dtype=dtype)
        cpu.dense512(w, x, bias, out)
        assert_close_to_reference(out, x, w.double(), bias)
    wide = torch.full((rows, 1031), float("nan"))  # float32 out: the sums before rounding
    cpu.dense512(w, x, b, wide)
    ref = x.double() @ w.double().T + b.double()
    tol = (
        4
        * math.sqrt(515)
        * torch.finfo(torch.float32).eps
        * (x.double().abs() @ w.double().abs().T + b.double().abs())
    )
    assert bool(((wide.double() - ref).abs() <= tol).all())
    x[0, 7] = float("nan")  # a NaN reaches its row of the output, and only that row
    cpu.dense512(w, x, None, out)
    assert out[0].isnan().all() and not out[1:].isnan().any()
    big = torch.randn(1024, 1024).to(dtype)  # big enough for either dtype's threshold
    assert route(torch.randn(rows, 1024).to(dtype), big) == "cpu-dense512"


@needs_kernels
def test_avx512_bfloat16_rounds_once_to_nearest_even() -> None:
    """Small integers: every product and sum is exact in float32, so the result must equal
    torch's float32 result rounded to bfloat16, bias included before the one rounding."""
    if torch.bfloat16 not in _cpu_avx512():
        pytest.skip("this CPU has no AVX-512 BF16")
    cpu = gemv_cpu.kernels()
    assert cpu is not None
    gen = torch.Generator().manual_seed(3)
    w = torch.randint(-16, 17, (260, 96), generator=gen).bfloat16()
    x = torch.randint(-16, 17, (5, 96), generator=gen).bfloat16()
    b = torch.randint(-200, 201, (260,), generator=gen).bfloat16()
    out = torch.empty(5, 260, dtype=torch.bfloat16)
    cpu.dense512(w, x, b, out)
    exact = x.float() @ w.float().T + b.float()
    assert (exact.abs() > 256).any()  # sums that bfloat16 cannot hold: the rounding is tested
    assert torch.equal(out, exact.bfloat16())


@needs_kernels
def test_avx512_tiles_refuse_what_they_cannot_read() -> None:
    cpu = gemv_cpu.kernels()
    assert cpu is not None
    w, x = torch.randn(8, 32).half(), torch.randn(2, 32).half()
    with pytest.raises(GemmUnsupportedError, match=r"x_MK.dtype=torch.float16"):
        cpu.dense512(w, x, None, torch.empty(2, 8, dtype=torch.float16))
    if torch.float32 not in cpu.avx512_dtypes:
        return
    w, x = torch.randn(8, 32), torch.randn(2, 32)
    bad = [
        (w.bfloat16(), x, None, torch.empty(2, 8), "w_NK torch.bfloat16"),
        (w, x, torch.randn(7), torch.empty(2, 8), r"bias_N torch.float32 \[7\]"),
        (w, x, torch.randn(16)[::2], torch.empty(2, 8), "bias_N"),
        (w, x, None, torch.empty(2, 7), r"out_MN torch.float32 \[2, 7\]"),
        (w, x, None, torch.empty(2, 8, dtype=torch.float16), "out_MN torch.float16"),
        (w, torch.randn(2, 64)[:, ::2], None, torch.empty(2, 8), "x_MK is not contiguous"),
    ]
    for w_NK, x_MK, bias_N, out_MN, match in bad:
        with pytest.raises(GemmInputError, match=match):
            cpu.dense512(w_NK, x_MK, bias_N, out_MN)


@needs_kernels
def test_a_bias_that_requires_grad_keeps_autograd() -> None:
    w = torch.randn(1024, 1024, dtype=torch.bfloat16)
    x = torch.randn(2, 1024, dtype=torch.bfloat16)
    b = torch.zeros(1024, dtype=torch.bfloat16, requires_grad=True)
    assert route(x, w, b) == "aten"
    y = linear(x, w, b)
    assert y.requires_grad
    y.float().sum().backward()
    assert b.grad is not None and torch.equal(b.grad, torch.full_like(b, 2.0))


@needs_kernels
def test_out_dtype_float32_keeps_the_float32_sums() -> None:
    w = torch.randn(1024, 1024, dtype=torch.bfloat16)
    b = torch.randn(1024, dtype=torch.bfloat16)
    for rows in (1, 8, 16):
        x = torch.randn(rows, 1024, dtype=torch.bfloat16)
        y = linear(x, w, b, out_dtype=torch.float32)
        assert y.dtype == torch.float32
        assert not torch.equal(y, y.bfloat16().float())  # not rounded to bfloat16 on the way
        ref = x.double() @ w.double().T + b.double()
        mag = x.double().abs() @ w.double().abs().T + b.double().abs()
        assert bool(
            ((y.double() - ref).abs() <= 4 * 32 * torch.finfo(torch.float32).eps * mag).all()
        )
    with pytest.raises(GemmInputError, match="out_dtype=torch.float8_e4m3fn"):
        linear(torch.randn(1, 1024, dtype=torch.bfloat16), w, out_dtype=torch.float8_e4m3fn)


@needs_kernels
def test_a_dtype_mismatch_names_x_before_the_bias() -> None:
    w = torch.randn(64, 512, dtype=torch.bfloat16)
    b = torch.randn(64, dtype=torch.bfloat16)
    with pytest.raises(GemmInputError, match=r"x.dtype=torch.float32, weight.dtype=torch.bfloat16"):
        linear(torch.randn(4, 1, 512), w, b)


def test_compiled_decode_calls_trace_without_a_graph_break() -> None:
    w = torch.randn(1024, 1024, dtype=torch.bfloat16)
    x = torch.randn(2, 1024, dtype=torch.bfloat16)
    compiled = torch.compile(lambda x: linear(x, w), fullgraph=True, backend="eager")
    assert_close_to_reference(compiled(x), x, w.double())


@needs_kernels
@pytest.mark.parametrize("rows", [1, 2, 3, 5, 8])
def test_dense_kernel_tiles_match_reference(rows: int) -> None:
    """Every tile shape of the kernel (4 or 2 weight rows against up to 4 rows of x, the odd
    weight row left over, the K tail past 8) against float64."""
    cpu = gemv_cpu.kernels()
    assert cpu is not None
    w = torch.randn(1031, 523).bfloat16()[:, :515]
    x = torch.randn(rows, 515)
    out = torch.full((rows, 1031), float("nan"))
    cpu.dense_gemv(w, x, out)
    assert_close_to_reference(out, x, w.double())
    assert route(torch.randn(1, 16), torch.randn(5, 16)) == "aten"


def test_containers_round_trip_their_layout() -> None:
    w = torch.randn(21, 128)
    parts = formats.quantize_nvfp4(
        w, per_tensor_scale=formats.nvfp4_per_tensor_scale(w.abs().amax())
    )
    nv = NVFP4Weight(parts)
    assert nv.layout == "blocked8" and nv.codes.shape == (3, 32, 16)
    assert torch.equal(nv.codes_rows(), parts.qdata)
    assert torch.equal(nv.scales_rows().view(torch.uint8), parts.scales.view(torch.uint8))
    assert torch.equal(nv.dequantize(), formats.dequantize_nvfp4(parts))
    assert torch.equal(nv.dequantize_rows(5, 19), nv.dequantize()[5:19])
    assert nv.nbytes == 24 * 64 + 24 * 8 + 4  # padded rows, e4m3 scales, the global scale
    mx = MXFP4Weight.from_float(w)
    mparts = formats.quantize_mx(w, torch.float4_e2m1fn_x2)
    assert torch.equal(mx.codes_rows(), mparts.qdata)
    assert torch.equal(mx.dequantize(), formats.dequantize_mx(mparts))
    i4 = Int4Weight.from_float(w, group_size=64)
    zeros = i4.zeros_rows()
    assert zeros is not None and zeros.shape == (21, 2)
    meta = i4.to("meta")
    assert meta.layout == "rows" and meta.codes.shape == (21, 64)
    assert "Int4Weight(out_features=21" in repr(i4)


def test_int4_quantization_error_is_within_half_a_step() -> None:
    w = torch.randn(16, 256)
    for symmetric in (False, True):
        q = Int4Weight.from_float(w, group_size=32, symmetric=symmetric, scale_dtype=torch.float32)
        step = q.scales_rows().repeat_interleave(32, dim=1)
        assert bool(((q.dequantize() - w).abs() <= 0.5 * step * (1 + 1e-5)).all())


@needs_kernels
def test_int4_matches_torchs_native_int4_kernel() -> None:
    native = gemm_internals.int4pack_mm_for_cpu()
    if native is None:
        pytest.skip("this torch has no int4 CPU kernel")
    w = Int4Weight.from_float(torch.randn(64, 256), group_size=64)
    packed, scales_and_zeros = w.to_int4pack(torch.bfloat16)
    x = torch.randn(2, 256, dtype=torch.bfloat16)
    y_native = native(x, packed, 64, scales_and_zeros)
    y = linear(x, w)
    assert torch.allclose(y.float(), y_native.float(), rtol=2e-2, atol=2e-2 * y.abs().max().item())


def peak_extra_bytes(fn: Callable[[], object]) -> int:
    """Peak of (bytes allocated - bytes freed) on the CPU during ``fn``, from the profiler's
    allocation events (every allocation and free through torch's allocators, timestamped)."""
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    events = [e for e in prof.profiler.kineto_results.events() if e.name() == "[memory]"]
    live = peak = 0
    for e in sorted(events, key=lambda e: e.start_ns()):
        live += e.nbytes()
        peak = max(peak, live)
    return peak


@needs_kernels
def test_no_dequantized_weight_is_held_during_the_call() -> None:
    w = NVFP4Weight.from_float(torch.randn(512, 1024))
    x = torch.randn(1, 1, 1024, dtype=torch.bfloat16)
    linear(x, w)  # build and load the kernels first
    assert peak_extra_bytes(lambda: linear(x, w)) < 0.1 * w.nbytes
    # The measure sees a full dequantization (4 bytes per element, 7x the packed form).
    assert peak_extra_bytes(lambda: w.dequantize()) >= 512 * 1024 * 4
    # The GEMM route holds one chunk at a time.
    xs = torch.randn(64, 1024)
    assert peak_extra_bytes(lambda: linear(xs, w)) < 2 * w.nbytes


@pytest.mark.parametrize("kind", ["nvfp4", "mxfp4"])
def test_torchao_tensors_are_taken_as_they_are(kind: str) -> None:
    pytest.importorskip("torchao")
    from torchao.prototype.mx_formats.mx_tensor import MXTensor
    from torchao.prototype.mx_formats.nvfp4_tensor import NVFP4Tensor

    w = torch.randn(40, 128)
    if kind == "nvfp4":
        pts = formats.nvfp4_per_tensor_scale(w.abs().amax())
        t = NVFP4Tensor.to_nvfp4(w, per_tensor_scale=pts, is_swizzled_scales=True)
        ours: QuantizedWeight = NVFP4Weight.from_float(w)
    else:
        t = MXTensor.to_mx(w, torch.float4_e2m1fn_x2, 32)
        ours = MXFP4Weight.from_float(w)
    theirs = weight_from_torchao(t)
    same = (NVFP4Weight if kind == "nvfp4" else MXFP4Weight).from_torchao(t)
    assert torch.equal(same.codes, theirs.codes) and torch.equal(same.codes, ours.codes)
    assert torch.equal(theirs.dequantize(), t.dequantize(torch.float32))
    assert torch.equal(ours.dequantize(), t.dequantize(torch.float32))
    x = torch.randn(2, 128)
    assert torch.equal(linear(x, t), linear(x, theirs))


@pytest.mark.parametrize(
    ("call", "match"),
    [
        (lambda w: linear(torch.randn(1, 100), w), r"x.shape=\(1, 100\).*in_features=128"),
        (lambda w: linear(torch.randn(1, 128).long(), w), r"x.dtype=torch.int64"),
        (lambda w: linear(torch.randn(1, 128), w, torch.randn(7)), r"bias is .*\(7,\).*\(16,\)"),
        (lambda w: linear(torch.randn(1, 128), w, torch.randn(16).half()), r"torch.float16"),
        (lambda w: linear(torch.empty(1, 128, device="meta"), w), r"x.device=meta"),
        (lambda w: linear(torch.randn(1, 128), "w"), r"weight is str"),  # type: ignore[arg-type]
        (lambda w: linear(torch.randn(1, 8), torch.randn(4, 8).half()), r"x.dtype=torch.float32"),
        (lambda w: Int4Weight.from_float(torch.randn(4, 96), group_size=64), r"group_size=64"),
        (lambda w: Int4Weight.from_float(torch.randn(4, 64), group_size=48), r"group_size=48"),
        (
            lambda w: Int4Weight.from_float(
                torch.randn(4, 64), group_size=32, scale_dtype=torch.int8
            ),
            r"scale_dtype=torch.int8",
        ),
        (lambda w: NVFP4Weight.from_float(torch.randn(64)), r"w_NK is Tensor of shape \(64,\)"),
        (lambda w: MXFP4Weight.from_float(torch.randn(4, 48)), r"x.shape=\(4, 48\)"),
    ],
)
def test_bad_input_names_the_argument_and_value(call: Callable[..., object], match: str) -> None:
    w = NVFP4Weight.from_float(torch.randn(16, 128))
    with pytest.raises(GemmInputError, match=match):
        call(w)


def test_nan_scales_are_refused() -> None:
    parts = formats.quantize_nvfp4(torch.randn(8, 32))
    bad = parts.scales.view(torch.uint8).clone()
    bad[0, 0] = 0x7F
    with pytest.raises(GemmInputError, match="NaN"):
        NVFP4Weight(formats.NVFP4Parts(parts.qdata, bad.view(torch.float8_e4m3fn)))
    mx = formats.quantize_mx(torch.randn(8, 32), torch.float4_e2m1fn_x2)
    e = mx.scales.view(torch.uint8).clone()
    e[3, 0] = 255
    with pytest.raises(GemmInputError, match="NaN"):
        MXFP4Weight(formats.MXParts(mx.qdata, e.view(torch.float8_e8m0fnu), mx.elem_dtype))
    s = torch.ones(2, 1)
    s[1, 0] = float("nan")
    with pytest.raises(GemmInputError, match="NaN"):
        Int4Weight(torch.zeros(2, 16, dtype=torch.uint8), s, None, 32)


_BUILD = textwrap.dedent(
    """
    import sys
    from pathlib import Path
    from torchnext.gemm import gemv_cpu
    path = gemv_cpu.build(portable=True, folder=Path(sys.argv[1]))
    print(path)
    """
)


@needs_kernels
def test_concurrent_builds_share_one_library(tmp_path: Path) -> None:
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", _BUILD, str(tmp_path)], stdout=subprocess.PIPE, text=True
        )
        for _ in range(2)
    ]
    paths = {p.communicate(timeout=100)[0].strip() for p in procs}
    assert all(p.returncode == 0 for p in procs)
    assert len(paths) == 1 and Path(paths.pop()).exists()
    assert [f.name for f in tmp_path.iterdir() if f.is_dir()] == []  # no temporary folder left


@pytest.mark.parametrize("kind", ["nvfp4", "dense"])
def test_empty_rows_give_an_empty_result(kind: str) -> None:
    w = (
        NVFP4Weight.from_float(torch.randn(16, 64))
        if kind == "nvfp4"
        else torch.randn(16, 64).half()
    )
    x = torch.randn(0, 3, 64).to(torch.float16)
    y = linear(x, w)
    assert y.shape == (0, 3, 16) and y.dtype == torch.float16


def test_traced_calls_take_the_torch_route_in_one_graph() -> None:
    w = Int4Weight.from_float(torch.randn(24, 64), group_size=32)
    x = torch.randn(2, 64)
    compiled = torch.compile(lambda x: linear(x, w), fullgraph=True, backend="eager")
    assert_close_to_reference(compiled(x), x, w.dequantize(torch.float64))


def test_available_routes_lists_every_route_without_building() -> None:
    cpu = gemv.available_routes("cpu")
    assert set(cpu) == {
        "cpu-q4-gemv",
        "cpu-q4-chunked",
        "cpu-dense512",
        "cpu-dense-gemv",
        "torch-q4-chunked",
    }
    assert "triton-q4-gemv" in gemv.available_routes("cuda")


def test_autograd_takes_the_torch_routes_and_backpropagates() -> None:
    # The C/Triton kernels have no backward: a call autograd records must not lose the graph.
    q = NVFP4Weight.from_float(torch.randn(64, 256))
    x = torch.randn(1, 256, requires_grad=True)
    assert route(x, q) == "torch-q4-chunked"
    linear(x, q).sum().backward()
    want = q.dequantize(torch.float32).sum(0)
    torch.testing.assert_close(x.grad[0], want, rtol=1e-5, atol=1e-5)
    w = torch.randn(1024, 1024, dtype=torch.bfloat16, requires_grad=True)
    xb = torch.randn(1, 1024, dtype=torch.bfloat16)
    assert route(xb, w) == "aten"
    linear(xb, w).sum().backward()
    assert w.grad is not None
