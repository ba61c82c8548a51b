"""TensorWise and RowWise ``scaled_mm`` on the CPU: torch's algorithm with a table decode.

The contract is torch's result bit for bit (test_scaled checks the common cases); here, that
the fast path is the one that ran, for every float8 dtype, bias dtype and output dtype torch
accepts, that the decode kernel itself gives the bits of ``.float() * scale`` (NaN codes and
both storage orders included), and that torch's own call still runs where the path does not
apply.
"""

from __future__ import annotations

import re
from collections.abc import Iterator

import pytest
import torch
import torch.nn.functional as F

from torchnext.errors import GemmInputError
from torchnext.gemm import gemv_cpu, scaled
from torchnext.gemm.scaled import ScalingType as S
from torchnext.gemm.scaled import scaled_mm

# Shape legend: M rows of the output, N its columns, K the contraction; R, C a decoded matrix.

_KERNELS = gemv_cpu.kernels()
needs_kernels = pytest.mark.skipif(_KERNELS is None, reason="needs a C compiler")
FP8 = [torch.float8_e4m3fn, torch.float8_e5m2, torch.float8_e4m3fnuz, torch.float8_e5m2fnuz]


@pytest.fixture
def decodes(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[int]]:
    """The element count of every decode8 call."""
    seen: list[int] = []
    real = gemv_cpu.CpuKernels.decode8

    def spy(self: gemv_cpu.CpuKernels, codes: torch.Tensor, *args: object, **kw: object) -> None:
        seen.append(codes.numel())
        real(self, codes, *args, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(gemv_cpu.CpuKernels, "decode8", spy)
    yield seen


def _fp8(shape: tuple[int, ...], dtype: torch.dtype, seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return (torch.randn(*shape, generator=gen) * 4).to(dtype)


@needs_kernels
@pytest.mark.parametrize("dtype_b", FP8, ids=str)
@pytest.mark.parametrize("dtype_a", FP8, ids=str)
def test_every_float8_pair_torch_runs_takes_the_table_path_and_equals_torch(
    dtype_a: torch.dtype, dtype_b: torch.dtype, decodes: list[int]
) -> None:
    m, k, n = 33, 70, 45
    a_MK = _fp8((m, k), dtype_a, 1)
    b_KN = _fp8((n, k), dtype_b, 2).t()  # stored [N, K]: the usual weight layout
    scales = [
        (torch.tensor(0.7), S.TensorWise, torch.tensor(1.3), S.TensorWise),
        (torch.rand(m, 1) + 0.5, S.RowWise, torch.rand(1, n) + 0.5, S.RowWise),
    ]
    ran = 0
    for sa, ra, sb, rb in scales:
        for bias in (None, torch.randn(n), torch.randn(n).bfloat16(), torch.randn(n).half()):
            for out in (torch.float32, torch.bfloat16, torch.float16):
                try:
                    want = F.scaled_mm(a_MK, b_KN, sa, ra, sb, rb, bias=bias, output_dtype=out)
                except (RuntimeError, ValueError):
                    with pytest.raises((RuntimeError, ValueError, GemmInputError)):
                        scaled_mm(a_MK, b_KN, sa, ra, sb, rb, bias=bias, output_dtype=out)
                    continue
                got = scaled_mm(a_MK, b_KN, sa, ra, sb, rb, bias=bias, output_dtype=out)
                assert got.dtype == want.dtype and torch.equal(got, want), (ra, bias, out)
                ran += 1
    assert len(decodes) == 2 * ran  # both operands of every call torch runs went through it


@needs_kernels
def test_a_float8_output_equals_torch(decodes: list[int]) -> None:
    a_MK, b_KN = _fp8((8, 64), torch.float8_e4m3fn, 3), _fp8((16, 64), torch.float8_e4m3fn, 4).t()
    sa, sb = torch.tensor(0.25), torch.tensor(2.0)
    want = F.scaled_mm(a_MK, b_KN, sa, S.TensorWise, sb, S.TensorWise, output_dtype=None)
    got = scaled_mm(a_MK, b_KN, sa, S.TensorWise, sb, S.TensorWise, output_dtype=None)
    assert got.dtype == want.dtype
    assert torch.equal(got.view(torch.uint8), want.view(torch.uint8))
    assert decodes


@pytest.mark.parametrize("empty", ["M", "K", "N"])
def test_empty_operands_take_torchs_call(empty: str, decodes: list[int]) -> None:
    m, k, n = (0 if empty == d else 8 for d in "MKN")
    a_MK, b_KN = _fp8((m, k), torch.float8_e4m3fn, 5), _fp8((n, k), torch.float8_e4m3fn, 6).t()
    sa, sb, bias = torch.tensor(1.0), torch.tensor(1.0), torch.ones(n)
    want = F.scaled_mm(a_MK, b_KN, sa, S.TensorWise, sb, S.TensorWise, bias=bias)
    got = scaled_mm(a_MK, b_KN, sa, S.TensorWise, sb, S.TensorWise, bias=bias)
    assert torch.equal(got, want) and decodes == []  # K = 0: zeros without the bias, as torch


def test_without_the_c_kernels_torchs_call_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(scaled.gemv_cpu, "kernels", lambda: None)
    a_MK, b_KN = _fp8((5, 32), torch.float8_e4m3fn, 7), _fp8((9, 32), torch.float8_e5m2, 8).t()
    sa, sb = torch.rand(5, 1) + 0.5, torch.rand(1, 9) + 0.5
    want = F.scaled_mm(a_MK, b_KN, sa, S.RowWise, sb, S.RowWise)
    assert torch.equal(scaled_mm(a_MK, b_KN, sa, S.RowWise, sb, S.RowWise), want)


@needs_kernels
@pytest.mark.parametrize("order", ["rows", "columns"])
@pytest.mark.parametrize("scale", ["row", "column", "one"])
def test_decode8_gives_the_bits_of_float_times_scale(order: str, scale: str) -> None:
    assert _KERNELS is not None
    r, c = 70, 130  # tiles of 64 with tails in both directions
    codes = torch.arange(r * c, dtype=torch.int64).remainder(256).to(torch.uint8)
    codes_RC = codes.view(r, c) if order == "rows" else codes.view(c, r).t()
    fp8_RC = codes_RC.view(torch.float8_e4m3fn)  # every code, 0x7F and 0xFF (NaN) included
    table = torch.arange(256, dtype=torch.uint8).view(torch.float8_e4m3fn).float()
    out_RC = torch.empty(r, c)
    rs, cs = torch.rand(r) + 0.5, torch.rand(c) + 0.5
    if scale == "row":
        _KERNELS.decode8(fp8_RC, table, out_RC, row_scale=rs)
        want = fp8_RC.float() * rs[:, None]
    elif scale == "column":
        _KERNELS.decode8(fp8_RC, table, out_RC, col_scale=cs)
        want = fp8_RC.float() * cs[None, :]
    else:
        _KERNELS.decode8(fp8_RC, table, out_RC, scale=0.375)
        want = fp8_RC.float() * 0.375
    assert torch.equal(out_RC.view(torch.int32), want.view(torch.int32))


@needs_kernels
@pytest.mark.parametrize(
    ("what", "expected"),
    [
        ("codes float32", "codes_RC torch.float32"),
        ("codes 1-D", "expected 2-D one-byte codes on the CPU"),
        ("table int32", "table torch.int32 [256]"),
        ("out transposed", "expected contiguous float32 [4, 8]"),
        ("both scales", "both row_scale and col_scale"),
        ("short row scale", "row_scale torch.float32 [3]"),
    ],
)
def test_decode8_checks_what_its_c_code_trusts(what: str, expected: str) -> None:
    assert _KERNELS is not None
    codes = torch.zeros(4, 8, dtype=torch.uint8)
    table, out = torch.zeros(256), torch.empty(4, 8)
    kw: dict[str, torch.Tensor] = {}
    if what == "codes float32":
        codes = torch.zeros(4, 8)
    elif what == "codes 1-D":
        codes = torch.zeros(32, dtype=torch.uint8)
    elif what == "table int32":
        table = torch.zeros(256, dtype=torch.int32)
    elif what == "out transposed":
        out = torch.empty(8, 4).t()
    elif what == "both scales":
        kw = {"row_scale": torch.ones(4), "col_scale": torch.ones(8)}
    else:
        kw = {"row_scale": torch.ones(3)}
    with pytest.raises(GemmInputError, match="decode8: .*" + re.escape(expected)):
        _KERNELS.decode8(codes, table, out, **kw)  # type: ignore[arg-type]


@needs_kernels
@pytest.mark.parametrize(("m", "k", "n"), [(1, 70, 1), (7, 64, 1), (1, 1, 5), (3, 1, 4)])
@pytest.mark.parametrize("stored", ["[N, K]", "[K, N]"])
def test_single_rows_and_columns_keep_torchs_layout_and_bits(
    m: int, k: int, n: int, stored: str
) -> None:
    # torch decodes mat.contiguous(), whose strides differ from the canonical ones where a
    # dimension is 1; its GEMM then sums in another order, which the path must follow.
    for seed in range(4):
        a_MK = _fp8((m, k), torch.float8_e4m3fn, seed)
        b_KN = _fp8((n, k), torch.float8_e4m3fn, 10 + seed)
        b_KN = b_KN.t() if stored == "[N, K]" else b_KN.t().contiguous()
        for sa, sb, rec in (
            (torch.tensor(0.7), torch.tensor(1.3), S.TensorWise),
            (torch.rand(m, 1) + 0.5, torch.rand(1, n) + 0.5, S.RowWise),
        ):
            want = F.scaled_mm(a_MK, b_KN, sa, rec, sb, rec, output_dtype=torch.float32)
            got = scaled_mm(a_MK, b_KN, sa, rec, sb, rec, output_dtype=torch.float32)
            assert torch.equal(got, want), (seed, rec)


def test_scales_that_require_grad_keep_torchs_autograd_behaviour(decodes: list[int]) -> None:
    a_MK, b_KN = _fp8((4, 16), torch.float8_e4m3fn, 1), _fp8((8, 16), torch.float8_e4m3fn, 2).t()
    sa = torch.tensor(0.7, requires_grad=True)
    out = scaled_mm(a_MK, b_KN, sa, S.TensorWise, torch.tensor(1.0), S.TensorWise)
    assert out.requires_grad and decodes == []  # torch's call, whose backward says it has none
    with torch.no_grad():
        scaled_mm(a_MK, b_KN, sa, S.TensorWise, torch.tensor(1.0), S.TensorWise)
    assert len(decodes) == 2 or _KERNELS is None
