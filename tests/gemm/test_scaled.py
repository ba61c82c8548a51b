"""torchnext.gemm.scaled_mm / mm_quantized on the CPU.

TensorWise and RowWise must equal torch's own ``F.scaled_mm`` bit for bit (torch's algorithm,
with the float8 decode in C: test_scaled_light_cpu).
The block-wise recipes run the emulation and must sit within float32-accumulation tolerance of
a float64 product of the dequantized operands: ``|out - ref| <= 4 K eps32 (|A| @ |B|)``.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
import torch.nn.functional as F

from torchnext.errors import GemmInputError, GemmUnsupportedError
from torchnext.gemm import formats as fm
from torchnext.gemm import scaled as sc
from torchnext.gemm.scaled import ScalingType as S
from torchnext.gemm.scaled import SwizzleType as Z
from torchnext.gemm.scaled import mm_quantized, scaled_mm
from torchnext.gemm.scaled_plan import plan_scaled_mm

FP4 = torch.float4_e2m1fn_x2
EPS = torch.finfo(torch.float32).eps


def assert_close_to_reference(out: torch.Tensor, a_MK: torch.Tensor, b_NK: torch.Tensor) -> None:
    ref = a_MK.double() @ b_NK.double().T
    bound = 4 * a_MK.shape[1] * EPS * (a_MK.double().abs() @ b_NK.double().abs().T) + 1e-30
    err = (out.double() - ref).abs()
    assert bool((err <= bound).all()), f"max err/bound {(err / bound).max().item():.3g}"


def operands(m: int, n: int, k: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(m, k, generator=gen) * 3, torch.randn(n, k, generator=gen)


def fp4(parts: Any) -> torch.Tensor:
    return parts.qdata.view(FP4)


# --------------------------------------------------------------------------- torch's recipes


@pytest.mark.parametrize("out_dtype", [torch.bfloat16, torch.float32, torch.float16, None])
@pytest.mark.parametrize(("m", "n", "k"), [(33, 70, 256), (1, 64, 512), (5, 9, 48)])
def test_tensorwise_and_rowwise_equal_torch(
    out_dtype: torch.dtype | None, m: int, n: int, k: int
) -> None:
    x, w = operands(m, n, k)
    a, b = x.to(torch.float8_e4m3fn), w.to(torch.float8_e5m2).t()
    bias = torch.randn(n, dtype=torch.bfloat16)
    cases = [
        (torch.tensor(0.5), S.TensorWise, torch.tensor(1.5), S.TensorWise),
        (torch.rand(m, 1) + 0.5, S.RowWise, torch.rand(1, n) + 0.5, S.RowWise),
    ]
    for sa, ra, sb, rb in cases:
        for bb in (None, bias):
            ours = scaled_mm(a, b, sa, ra, sb, rb, bias=bb, output_dtype=out_dtype)
            theirs = F.scaled_mm(a, b, sa, ra, sb, rb, bias=bb, output_dtype=out_dtype)
            assert ours.dtype == theirs.dtype and torch.equal(ours, theirs), (ra, bb is None)


def test_rowwise_emulation_matches_reference() -> None:
    x, w = operands(17, 40, 96)
    a, b = x.to(torch.float8_e4m3fn), w.to(torch.float8_e4m3fn)
    sa, sb = torch.rand(17, 1) + 0.5, torch.rand(1, 40) + 0.5
    plan = plan_scaled_mm(a, b.t(), sa, S.RowWise, sb, S.RowWise, None, None)
    out = sc._emulate(plan, None, torch.float32)
    assert_close_to_reference(out, a.float() * sa, b.float() * sb.t())


@pytest.mark.parametrize(
    ("ra", "rb"),
    [
        (S.BlockWise1x128, S.BlockWise128x128),
        (S.BlockWise1x128, S.BlockWise1x128),
        (S.BlockWise128x128, S.BlockWise1x128),
    ],
)
def test_deepseek_blockwise(ra: Any, rb: Any) -> None:
    m, n, k = 130, 200, 320  # partial blocks on every axis
    x, w = operands(m, n, k)
    a, b = x.to(torch.float8_e4m3fn), w.to(torch.float8_e4m3fn)
    shape_a = (m, 3) if ra == S.BlockWise1x128 else (2, 3)
    shape_b = (3, n) if rb == S.BlockWise1x128 else (3, 2)
    sa, sb = torch.rand(shape_a) + 0.5, torch.rand(shape_b) + 0.5
    out = scaled_mm(a, b.t(), sa, ra, sb, rb, output_dtype=torch.float32)

    def expand(s: torch.Tensor, rows: int, rb_: int) -> torch.Tensor:
        return s.repeat_interleave(rb_, 0)[:rows].repeat_interleave(128, 1)[:, :k]

    a_MK = a.float() * expand(sa, m, 1 if ra == S.BlockWise1x128 else 128)
    b_NK = b.float() * expand(sb.t(), n, 1 if rb == S.BlockWise1x128 else 128)
    assert_close_to_reference(out, a_MK, b_NK)


# --------------------------------------------------------------------------- MX and NVFP4


@pytest.mark.parametrize("elem", [torch.float8_e4m3fn, torch.float8_e5m2, FP4])
@pytest.mark.parametrize("swizzled", [False, True])
def test_mx_matches_reference(elem: torch.dtype, swizzled: bool) -> None:
    x, w = operands(37, 150, 256)
    pa, pb = fm.quantize_mx(x, elem), fm.quantize_mx(w, elem)
    mat_a = fp4(pa) if elem == FP4 else pa.qdata
    mat_b = (fp4(pb) if elem == FP4 else pb.qdata).t()
    if swizzled:
        sa, sb, z = fm.swizzle_32_4_4(pa.scales), fm.swizzle_32_4_4(pb.scales), Z.SWIZZLE_32_4_4
    else:
        sa, sb, z = pa.scales, pb.scales.t(), Z.NO_SWIZZLE
    out = scaled_mm(mat_a, mat_b, sa, S.BlockWise1x32, sb, S.BlockWise1x32, z, z,
                    output_dtype=torch.float32)  # fmt: skip
    assert_close_to_reference(out, fm.dequantize_mx(pa), fm.dequantize_mx(pb))
    bf16 = scaled_mm(mat_a, mat_b, sa, S.BlockWise1x32, sb, S.BlockWise1x32, z, z)
    assert torch.equal(bf16, out.bfloat16())  # one rounding, at the end


@pytest.mark.parametrize("levels", [(1, 1), (2, 1), (2, 2)])
def test_nvfp4_one_and_two_levels(levels: tuple[int, int]) -> None:
    x, w = operands(65, 96, 192)
    gs = (torch.tensor(0.02), torch.tensor(0.005))
    pa = fm.quantize_nvfp4(x, per_tensor_scale=gs[0] if levels[0] == 2 else None)
    pb = fm.quantize_nvfp4(w, per_tensor_scale=gs[1] if levels[1] == 2 else None)
    sa: Any = pa.scales if levels[0] == 1 else [pa.scales, gs[0]]
    ra: Any = S.BlockWise1x16 if levels[0] == 1 else [S.BlockWise1x16, S.TensorWise]
    sb: Any = pb.scales.t() if levels[1] == 1 else [pb.scales.t(), gs[1]]
    rb: Any = S.BlockWise1x16 if levels[1] == 1 else [S.BlockWise1x16, S.TensorWise]
    bias = torch.randn(96)
    out = scaled_mm(fp4(pa), fp4(pb).t(), sa, ra, sb, rb, bias=bias, output_dtype=torch.float32)
    assert_close_to_reference(out - bias, fm.dequantize_nvfp4(pa), fm.dequantize_nvfp4(pb))


def test_partial_last_block_and_empty_dims() -> None:
    x, w = operands(9, 11, 48)  # K = 48: the second 1x32 block is half full
    a, b = x.to(torch.float8_e4m3fn), w.to(torch.float8_e4m3fn)
    e8 = torch.tensor([[126, 129]], dtype=torch.uint8).view(torch.float8_e8m0fnu)
    sa, sb = e8.expand(9, 2).contiguous(), e8.t().expand(2, 11).contiguous()
    out = scaled_mm(a, b.t(), sa, S.BlockWise1x32, sb, S.BlockWise1x32, output_dtype=torch.float32)
    scale_K = torch.tensor([0.5] * 32 + [4.0] * 16)
    assert_close_to_reference(out, a.float() * scale_K, b.float() * scale_K)
    empty = scaled_mm(a[:0], b.t(), sa[:0], S.BlockWise1x32, sb, S.BlockWise1x32)
    assert empty.shape == (0, 11)


def test_large_operand_is_decoded_in_chunks(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[tuple[int, int]] = []
    original = fm.ScaledOperand.dequantize_rows

    def spy(self: fm.ScaledOperand, start: int, stop: int) -> torch.Tensor:
        seen.append((self.rows, stop - start))
        return original(self, start, stop)

    monkeypatch.setattr(sc, "_CHUNK_BYTES", 64 * 1024)  # 64 KiB of float32 per mat_b chunk
    monkeypatch.setattr(sc, "_WHOLE_A_BYTES", 32 * 1024)
    monkeypatch.setattr(fm.ScaledOperand, "dequantize_rows", spy)
    x, w = operands(40, 300, 256)
    pa, pb = fm.quantize_nvfp4(x), fm.quantize_nvfp4(w)
    out = scaled_mm(fp4(pa), fp4(pb).t(), pa.scales, S.BlockWise1x16, pb.scales.t(),
                    S.BlockWise1x16, output_dtype=torch.float32)  # fmt: skip
    assert_close_to_reference(out, fm.dequantize_nvfp4(pa), fm.dequantize_nvfp4(pb))
    assert max(rows for total, rows in seen if total == 300) == 64  # 64 KiB / (4 * 256)
    assert max(rows for total, rows in seen if total == 40) == 32


# --------------------------------------------------------------------------- mm_quantized


def test_mm_quantized_with_parts_and_plain_activation() -> None:
    x, w = operands(12, 40, 128)
    pw = fm.quantize_mx(w, FP4)
    out = mm_quantized(x, pw, output_dtype=torch.float32)  # x quantized to MXFP4 on the fly
    assert_close_to_reference(out, fm.dequantize_mx(fm.quantize_mx(x, FP4)), fm.dequantize_mx(pw))
    pw4 = fm.quantize_nvfp4(w)
    out = mm_quantized(fm.quantize_nvfp4(x), pw4, bias=torch.ones(40), output_dtype=torch.float32)
    ref_a = fm.dequantize_nvfp4(fm.quantize_nvfp4(x))
    assert_close_to_reference(out - 1, ref_a, fm.dequantize_nvfp4(pw4))


@pytest.mark.parametrize("kind", ["nvfp4", "nvfp4_2lvl", "mxfp8", "mxfp4"])
def test_mm_quantized_takes_torchao_tensors(kind: str) -> None:
    pytest.importorskip("torchao")
    from torchao.prototype.mx_formats.mx_tensor import MXTensor
    from torchao.prototype.mx_formats.nvfp4_tensor import NVFP4Tensor

    x, w = operands(20, 136, 128)
    if kind.startswith("nvfp4"):
        pts = torch.tensor(0.01) if kind == "nvfp4_2lvl" else None
        ta = NVFP4Tensor.to_nvfp4(x, per_tensor_scale=pts)
        tw = NVFP4Tensor.to_nvfp4(w, per_tensor_scale=pts, is_swizzled_scales=True)
    else:
        elem = FP4 if kind == "mxfp4" else torch.float8_e4m3fn
        ta, tw = MXTensor.to_mx(x, elem, 32), MXTensor.to_mx(w, elem, 32)
    out = mm_quantized(ta, tw.t(), output_dtype=torch.float32)
    assert_close_to_reference(out, ta.dequantize(torch.float32), tw.dequantize(torch.float32))
    with pytest.raises(GemmInputError, match="quantized along its columns"):
        mm_quantized(ta, tw)


# --------------------------------------------------------------------------- bad input


def _mx_args() -> dict[str, Any]:
    x, w = operands(8, 16, 64)
    pa, pb = fm.quantize_mx(x, torch.float8_e4m3fn), fm.quantize_mx(w, torch.float8_e4m3fn)
    return dict(mat_a=pa.qdata, mat_b=pb.qdata.t(), scale_a=pa.scales,
                scale_recipe_a=S.BlockWise1x32, scale_b=pb.scales.t(),
                scale_recipe_b=S.BlockWise1x32)  # fmt: skip


def _nan_e8m0(s: torch.Tensor) -> torch.Tensor:
    u = s.view(torch.uint8).clone()
    u[1, 1] = 255
    return u.view(torch.float8_e8m0fnu)


a8 = torch.ones(8, 64).to(torch.float8_e4m3fn)
b8 = torch.ones(16, 64).to(torch.float8_e4m3fn).t()
one = torch.tensor(1.0)


@pytest.mark.parametrize(
    ("change", "error", "match"),
    [
        (
            dict(mat_b=b8[:32]),
            GemmInputError,
            r"mat_a\.shape=\(8, 64\) and mat_b\.shape=\(32, 16\)",
        ),  # fmt: skip
        (
            dict(scale_a=torch.ones(8, 3).to(torch.float8_e8m0fnu)),
            GemmInputError,
            r"scale_a\.shape=\(8, 3\); expected \(8, 2\)",
        ),  # fmt: skip
        (
            dict(scale_b=torch.ones(2, 16)),
            GemmInputError,
            r"scale_b\.dtype=torch\.float32; expected torch\.float8_e8m0fnu",
        ),  # fmt: skip
        (
            dict(scale_a=_nan_e8m0(_mx_args()["scale_a"])),
            GemmInputError,
            r"scale_a holds NaN \(first at index \(1, 1\)",
        ),  # fmt: skip
        (
            dict(swizzle_a=Z.SWIZZLE_32_4_4),
            GemmInputError,
            r"scale_a has 16 elements.*expected 512",
        ),  # fmt: skip
        (dict(mat_a=torch.ones(8, 64)), GemmInputError, r"mat_a\.dtype=torch\.float32"),
        (
            dict(mat_a=torch.zeros(8, 32, dtype=torch.uint8).view(FP4)),
            GemmUnsupportedError,
            r"mat_a\.dtype=torch\.float4_e2m1fn_x2 with mat_b\.dtype=torch\.float8_e4m3fn",
        ),  # fmt: skip
        (
            dict(scale_recipe_b=S.BlockWise1x16),
            GemmUnsupportedError,
            r"scale_recipe_b=\['BlockWise1x16'\]",
        ),  # fmt: skip
        (
            dict(output_dtype=torch.float8_e4m3fn),
            GemmUnsupportedError,
            r"output_dtype=torch\.float8_e4m3fn for mx",
        ),  # fmt: skip
        (dict(bias=torch.ones(15)), GemmInputError, r"bias has shape \(15,\).*expected 16"),
        (dict(contraction_dim=(1, 1)), GemmUnsupportedError, r"contraction_dim=\(1, 1\)"),
        (
            dict(scale_recipe_a=[S.BlockWise1x32, S.TensorWise]),
            GemmInputError,
            r"scale_recipe_a=.* for 1 scale tensor",
        ),  # fmt: skip
        (
            dict(
                mat_a=a8,
                mat_b=b8,
                scale_a=torch.tensor(float("nan")),
                scale_recipe_a=S.TensorWise,
                scale_b=one,
                scale_recipe_b=S.TensorWise,
            ),
            GemmInputError,
            r"scale_a holds NaN",
        ),  # fmt: skip
        (
            dict(
                mat_a=a8,
                mat_b=b8,
                scale_a=torch.ones(8, 1),
                scale_recipe_a=S.RowWise,
                scale_b=torch.ones(16, 1),
                scale_recipe_b=S.RowWise,
            ),
            GemmInputError,
            r"scale_b\.shape=\(16, 1\); expected \(1, 16\)",
        ),  # fmt: skip
        (
            dict(
                mat_a=a8,
                mat_b=b8,
                scale_a=torch.ones(8, 1),
                scale_recipe_a=S.RowWise,
                scale_b=one,
                scale_recipe_b=S.TensorWise,
            ),
            GemmUnsupportedError,
            r"scale_recipe_a=\['RowWise'\] with scale_recipe_b=\['TensorWise'\]",
        ),  # fmt: skip
        (
            dict(
                mat_a=a8,
                mat_b=b8,
                scale_a=one,
                scale_recipe_a=S.TensorWise,
                scale_b=one,
                scale_recipe_b=S.TensorWise,
                swizzle_a=Z.SWIZZLE_32_4_4,
            ),
            GemmInputError,
            r"swizzle_a=.*SWIZZLE_32_4_4 applies only",
        ),  # fmt: skip
        (
            dict(
                mat_a=a8,
                mat_b=b8,
                scale_a=one.double(),
                scale_recipe_a=S.TensorWise,
                scale_b=one,
                scale_recipe_b=S.TensorWise,
            ),
            GemmInputError,
            r"scale_a\.dtype=torch\.float64; expected torch\.float32",
        ),  # fmt: skip
    ],
)
def test_bad_input_names_argument_value_and_expectation(
    change: dict[str, Any], error: type[Exception], match: str
) -> None:
    args = {**_mx_args(), **change}
    with pytest.raises(error, match=match):
        scaled_mm(**args)


def test_nvfp4_nan_scales_raise() -> None:
    x, w = operands(8, 16, 64)
    pa, pb = fm.quantize_nvfp4(x), fm.quantize_nvfp4(w)
    bad = pa.scales.view(torch.uint8).clone()
    bad[0, 2] = 0x7F  # float8_e4m3fn NaN
    with pytest.raises(GemmInputError, match=r"scale_a holds NaN \(first at index \(0, 2\)"):
        scaled_mm(fp4(pa), fp4(pb).t(), bad.view(torch.float8_e4m3fn), S.BlockWise1x16,
                  pb.scales.t(), S.BlockWise1x16)  # fmt: skip
    with pytest.raises(GemmInputError, match=r"scale_a/b holds NaN"):
        scaled_mm(fp4(pa), fp4(pb).t(), [pa.scales, torch.tensor(float("nan"))],
                  [S.BlockWise1x16, S.TensorWise], pb.scales.t(), S.BlockWise1x16)  # fmt: skip


def test_mm_quantized_rejects_two_plain_tensors() -> None:
    with pytest.raises(GemmInputError, match="both plain tensors"):
        mm_quantized(torch.ones(2, 32), torch.ones(32, 2))


def test_native_scaled_mm_accessor_runs_rowwise_on_this_torch() -> None:
    from torchnext.compat.gemm_internals import native_scaled_mm

    op = native_scaled_mm()
    assert op is not None
    x, w = operands(8, 24, 64)
    a, b = x.to(torch.float8_e4m3fn), w.to(torch.float8_e4m3fn).t()
    sa, sb = torch.rand(8, 1) + 0.5, torch.rand(1, 24) + 0.5
    theirs = op(a, b, sa, sb, out_dtype=torch.bfloat16)
    assert torch.equal(scaled_mm(a, b, sa, S.RowWise, sb, S.RowWise), theirs)


def test_importing_the_scaled_path_loads_neither_triton_nor_torchao() -> None:
    import subprocess
    import sys

    probe = (
        "import sys, torch\n"
        "import torchnext.gemm.scaled, torchnext.gemm.formats\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('triton', 'torchao')))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True, timeout=120
    ).stdout
    assert out.strip() == "[]"


def test_fnuz_float8_runs_tensorwise_and_refuses_block_recipes() -> None:
    x, w = operands(6, 10, 64)
    a, b = x.to(torch.float8_e4m3fnuz), w.to(torch.float8_e5m2fnuz).t()
    sa, sb = torch.tensor(0.5), torch.tensor(2.0)
    ours = scaled_mm(a, b, sa, S.TensorWise, sb, S.TensorWise, output_dtype=torch.float32)
    assert torch.equal(ours, F.scaled_mm(a, b, sa, S.TensorWise, sb, S.TensorWise,
                                         output_dtype=torch.float32))  # fmt: skip
    plan = plan_scaled_mm(a, b, sa, S.TensorWise, sb, S.TensorWise, None, None)
    assert_close_to_reference(sc._emulate(plan, None, torch.float32), a.float() * 0.5,
                              b.t().float() * 2.0)  # fmt: skip
    e8 = torch.ones(6, 2).to(torch.float8_e8m0fnu)
    with pytest.raises(GemmUnsupportedError, match=r"fnuz float8 types run TensorWise"):
        scaled_mm(a, b, e8, S.BlockWise1x32, e8.new_ones(2, 10), S.BlockWise1x32)


@pytest.mark.parametrize("kind", ["mx", "nvfp4", "nvfp4_2lvl", "rowwise"])
def test_native_cuda_arguments_pass_torchs_meta_checks(kind: str) -> None:
    # torch 2.13's meta kernel for scaled_mm applies the CUDA rules (layouts, swizzled scale
    # sizes), so the arguments the CUDA route hands torch are checked here without a GPU.
    x, w = operands(130, 80, 256)
    if kind == "mx":
        pa, pb = fm.quantize_mx(x, torch.float8_e4m3fn), fm.quantize_mx(w, torch.float8_e4m3fn)
        given: tuple[Any, ...] = (pa.qdata, pb.qdata.t(), pa.scales, S.BlockWise1x32,
                                  pb.scales.t(), S.BlockWise1x32)  # fmt: skip
    elif kind == "rowwise":
        a, b = x.to(torch.float8_e4m3fn), w.to(torch.float8_e4m3fn)
        given = (a, b.t(), torch.ones(130, 1), S.RowWise, torch.ones(1, 80), S.RowWise)
    else:
        pts = torch.tensor(0.5) if kind == "nvfp4_2lvl" else None
        pa, pb = fm.quantize_nvfp4(x, per_tensor_scale=pts), fm.quantize_nvfp4(w)
        sa: Any = pa.scales if pts is None else [pa.scales, pts]
        ra: Any = S.BlockWise1x16 if pts is None else [S.BlockWise1x16, S.TensorWise]
        given = (fp4(pa), fp4(pb).t(), sa, ra, pb.scales.t(), S.BlockWise1x16)
    plan = plan_scaled_mm(*given, None, None)
    keys = ("scale_a", "scale_recipe_a", "scale_b", "scale_recipe_b")
    args = sc._native_args(plan, given[0], given[1], dict(zip(keys, given[2:], strict=True)))

    def meta(v: Any) -> Any:
        if isinstance(v, list):
            return [meta(t) for t in v]
        return v.to("meta") if isinstance(v, torch.Tensor) else v

    out = F.scaled_mm(**{k: meta(v) for k, v in args.items()}, output_dtype=torch.bfloat16)
    assert out.shape == (130, 80)


def test_any_operand_layout_gives_the_same_result() -> None:
    x, w = operands(24, 48, 128)
    for elem in (torch.float8_e4m3fn, FP4):
        pa, pb = fm.quantize_mx(x, elem), fm.quantize_mx(w, elem)
        qa = fp4(pa) if elem == FP4 else pa.qdata
        qb = fp4(pb) if elem == FP4 else pb.qdata
        rest = (S.BlockWise1x32, pb.scales.t(), S.BlockWise1x32)
        col_major = scaled_mm(qa, qb.t(), pa.scales, *rest, output_dtype=torch.float32)
        row_major = scaled_mm(qa.t().contiguous().t(), qb.t().contiguous(), pa.scales, *rest,
                              output_dtype=torch.float32)  # fmt: skip
        assert torch.equal(col_major, row_major), elem


def test_tuples_are_accepted_where_torch_takes_lists() -> None:
    x, w = operands(4, 8, 32)
    a, b = x.to(torch.float8_e4m3fn), w.to(torch.float8_e4m3fn).t()
    one = torch.tensor(1.0)
    ours = scaled_mm(a, b, (one,), (S.TensorWise,), [one], [S.TensorWise])
    assert torch.equal(ours, F.scaled_mm(a, b, one, S.TensorWise, one, S.TensorWise))
