"""torchnext.gemm.formats: FP4 / MX / NVFP4 quantizers and the SWIZZLE_32_4_4 layout.

Parity tests hold every quantizer to torchao 0.18 bit for bit (codes, scales and the
dequantized values, NaN payloads included) on inputs with zeros, subnormals, huge values,
inf and NaN; they skip where torchao is absent. The rest (round trips, exactness on
representable values, bad input) runs without torchao.
"""

from __future__ import annotations

import itertools
from typing import Any

import pytest
import torch

from torchnext.errors import GemmInputError
from torchnext.gemm import formats as fm

MX_ELEMS = (torch.float8_e4m3fn, torch.float8_e5m2, torch.float4_e2m1fn_x2)
MODES = ("floor", "ceil", "even", "rceil")


@pytest.fixture(scope="module")
def ao() -> Any:
    pytest.importorskip("torchao")
    from torchao.prototype.mx_formats import kernels, mx_tensor, nvfp4_tensor, utils
    from torchao.prototype.mx_formats.config import ScaleCalculationMode

    return type(
        "AO",
        (),
        {
            "MXTensor": mx_tensor.MXTensor,
            "NVFP4Tensor": nvfp4_tensor.NVFP4Tensor,
            "to_mx": staticmethod(mx_tensor.to_mx),
            "modes": {m: getattr(ScaleCalculationMode, m.upper()) for m in MODES},
            "f32_to_f4": staticmethod(kernels.f32_to_f4_unpacked),
            "to_blocked": staticmethod(utils.to_blocked),
            "from_blocked": staticmethod(utils.from_blocked),
        },
    )


def hard_values(n: int, seed: int) -> torch.Tensor:
    """Gaussian values over 60 binades, with zeros, subnormals, huge, inf and NaN mixed in."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(n, generator=gen) * torch.exp2(
        torch.randint(-30, 30, (n,), generator=gen).float()
    )
    special = torch.tensor(
        [0.0, -0.0, float("inf"), -float("inf"), float("nan"), 1e-45, -1e-40, 3e38, 0.25, 2.5]
    )
    idx = torch.randint(0, n, (n // 20,), generator=gen)
    x[idx] = special[torch.randint(0, len(special), (len(idx),), generator=gen)]
    return x


def bits(t: torch.Tensor) -> torch.Tensor:
    return t.view({1: torch.uint8, 2: torch.int16, 4: torch.int32}[t.element_size()])


def test_e2m1_table_and_round_trip() -> None:
    codes = torch.arange(16, dtype=torch.uint8)
    values = torch.tensor(fm.E2M1_VALUES)
    assert torch.equal(bits(fm.decode_e2m1(codes)), bits(values))
    assert torch.equal(fm.encode_e2m1(values), codes)  # -0.0 keeps code 8
    packed = fm.pack_fp4(codes.reshape(2, 8))
    assert packed[0, 0].item() == 0x10 and packed[0, 1].item() == 0x32  # 2i low, 2i+1 high
    assert torch.equal(fm.unpack_fp4(packed), codes.reshape(2, 8))
    assert torch.equal(bits(fm.decode_packed_e2m1(packed)), bits(values.reshape(2, 8)))


def test_encode_e2m1_rounds_to_nearest_even_and_saturates() -> None:
    x = torch.tensor([0.24, 0.25, 0.26, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 5.01, 7.0, 1e30, -0.1])
    expect = [0.0, 0.0, 0.5, 1.0, 1.0, 2.0, 2.0, 4.0, 4.0, 6.0, 6.0, 6.0, -0.0]
    got = fm.decode_e2m1(fm.encode_e2m1(x))
    assert torch.equal(bits(got), bits(torch.tensor(expect)))


def test_encode_e2m1_matches_torchao_bit_for_bit(ao: Any) -> None:
    payloads = torch.randint(0x7F800001, 0x7FFFFFFF, (2000,), dtype=torch.int64)
    nan_bits = payloads.to(torch.int32)
    nans = torch.cat([nan_bits, nan_bits | torch.tensor(-(2**31), dtype=torch.int32)])
    x = torch.cat([hard_values(50000, 1), nans.view(torch.float32), torch.linspace(-7, 7, 20001)])
    assert torch.equal(fm.encode_e2m1(x), ao.f32_to_f4(x))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("shape", [(8, 64), (3, 5, 96)])
def test_quantize_mx_matches_torchao_bit_for_bit(
    ao: Any, dtype: torch.dtype, shape: tuple[int, ...]
) -> None:
    x = hard_values(int(torch.tensor(shape).prod()), 2).reshape(shape).to(dtype)
    x[0] = 0  # whole zero blocks
    x[1, ..., :32] = 1e-42  # a block of subnormals
    for elem, mode in itertools.product(MX_ELEMS, MODES):
        scale_ref, data_ref = ao.to_mx(x.contiguous(), elem, 32, ao.modes[mode])
        parts = fm.quantize_mx(x, elem, scaling_mode=mode)
        assert torch.equal(bits(parts.scales), bits(scale_ref)), (elem, mode)
        assert torch.equal(bits(parts.qdata), bits(data_ref)), (elem, mode)
        if mode == "floor" and len(shape) == 2:
            tensor = ao.MXTensor.to_mx(x, elem, 32)
            for out in (torch.float32, torch.bfloat16):
                assert torch.equal(
                    bits(fm.dequantize_mx(parts, out)), bits(tensor.dequantize(out))
                ), (elem, out)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_quantize_nvfp4_matches_torchao_bit_for_bit(ao: Any, dtype: torch.dtype) -> None:
    x = hard_values(16 * 160, 3).reshape(16, 160).to(dtype)
    x[2] = 0
    for pts in (None, torch.tensor(0.37), fm.nvfp4_per_tensor_scale(torch.tensor(100.0))):
        ref = ao.NVFP4Tensor.to_nvfp4(x, per_tensor_scale=pts)
        parts = fm.quantize_nvfp4(x, per_tensor_scale=pts)
        assert torch.equal(parts.qdata, ref.qdata)
        assert torch.equal(bits(parts.scales), bits(ref.scale))
        for out in (torch.float32, torch.bfloat16):
            assert torch.equal(bits(fm.dequantize_nvfp4(parts, out)), bits(ref.dequantize(out))), (
                pts,
                out,
            )


def test_quantize_nvfp4_3d_with_per_expert_scale_matches_torchao(ao: Any) -> None:
    x = torch.randn(3, 8, 64)
    pts = fm.nvfp4_per_tensor_scale(x.abs().amax(dim=(1, 2), keepdim=True))
    ref = ao.NVFP4Tensor.to_nvfp4(x, per_tensor_scale=pts)
    parts = fm.quantize_nvfp4(x, per_tensor_scale=pts)
    assert torch.equal(parts.qdata, ref.qdata)
    assert torch.equal(bits(parts.scales), bits(ref.scale))
    assert torch.equal(bits(fm.dequantize_nvfp4(parts)), bits(ref.dequantize(torch.float32)))


def test_swizzle_matches_torchao_to_blocked(ao: Any) -> None:
    for rows, groups in ((128, 4), (300, 37), (1, 1), (129, 8)):
        s = torch.randint(0, 255, (rows, groups), dtype=torch.uint8)
        blocked = fm.swizzle_32_4_4(s)
        assert torch.equal(blocked, ao.to_blocked(s))
        assert torch.equal(fm.unswizzle_32_4_4(blocked, rows, groups), s)
        assert torch.equal(ao.from_blocked(blocked, rows, groups), s)


def test_swizzle_layout_formula() -> None:
    s = torch.arange(256 * 8, dtype=torch.int32).reshape(256, 8)
    out = fm.swizzle_32_4_4(s).view(2, 2, 32, 16)
    for i, j, r, g in ((0, 0, 0, 0), (1, 1, 37, 3), (0, 1, 127, 2), (1, 0, 96, 1)):
        assert out[i, j, r % 32, 4 * (r // 32) + g] == s[128 * i + r, 4 * j + g]


@pytest.mark.parametrize("kind", ["nvfp4", "mxfp4", "mxfp8"])
def test_from_torchao_and_to_torchao_round_trip(ao: Any, kind: str) -> None:
    x, w = torch.randn(130, 64), torch.randn(40, 64)
    if kind == "nvfp4":
        t = ao.NVFP4Tensor.to_nvfp4(x, is_swizzled_scales=True)
        plain = fm.quantize_nvfp4(x)
    else:
        elem = torch.float4_e2m1fn_x2 if kind == "mxfp4" else torch.float8_e4m3fn
        t = ao.MXTensor.to_mx(x, elem, 32, is_swizzled_scales=True)
        plain = fm.quantize_mx(x, elem)
    parts = fm.from_torchao(t)
    assert torch.equal(bits(parts.qdata), bits(plain.qdata))
    assert torch.equal(bits(parts.scales), bits(plain.scales))
    back = fm.to_torchao(parts, torch.float32)
    assert torch.equal(back.dequantize(torch.float32), t.dequantize(torch.float32))
    wt = ao.NVFP4Tensor.to_nvfp4(w).t()  # torchao's transposed weight reads as [N, K]
    assert fm.from_torchao(wt).shape == (40, 64)


@pytest.mark.parametrize("elem", MX_ELEMS)
def test_mx_round_trip_is_exact_on_representable_values(elem: torch.dtype) -> None:
    gen = torch.Generator().manual_seed(4)
    codes = torch.randint(0, 16, (6, 64), dtype=torch.uint8, generator=gen)
    codes[:, ::32] = 7  # each block reaches 6.0, so the floor rule picks scale 2**e exactly
    pow2 = torch.exp2(torch.randint(-20, 20, (6, 2, 1), generator=gen).float())
    x = (fm.decode_e2m1(codes).view(6, 2, 32) * pow2).view(6, 64)
    parts = fm.quantize_mx(x, elem)
    assert torch.equal(fm.dequantize_mx(parts), x)


def test_nvfp4_quantization_error_is_within_half_a_step() -> None:
    x = torch.randn(32, 128)
    parts = fm.quantize_nvfp4(x)
    err = (fm.dequantize_nvfp4(parts) - x).abs().view(32, 8, 16)
    scale = parts.scales.float().unsqueeze(-1)
    # e2m1 steps are at most 2 (between 4 and 6); the e4m3 scale rounds by at most 1/16.
    assert bool((err <= scale * 1.0 + x.abs().view(32, 8, 16) / 16 + 1e-6).all())


@pytest.mark.parametrize(
    ("call", "match"),
    [
        (lambda: fm.quantize_mx(torch.randn(4, 40), torch.float8_e4m3fn), r"x\.shape=\(4, 40\)"),
        (
            lambda: fm.quantize_mx(torch.ones(4, 32).int(), torch.float8_e4m3fn),
            r"x\.dtype=torch\.int32",
        ),  # fmt: skip
        (lambda: fm.quantize_mx(torch.randn(4, 32), torch.int8), r"elem_dtype=torch\.int8"),
        (
            lambda: fm.quantize_mx(torch.randn(4, 32), torch.float8_e4m3fn, scaling_mode="up"),
            r"scaling_mode='up'",
        ),  # fmt: skip
        (lambda: fm.quantize_nvfp4(torch.randn(2, 24)), r"x\.shape=\(2, 24\).*16"),
        (
            lambda: fm.quantize_nvfp4(
                torch.randn(2, 32), per_tensor_scale=torch.tensor(1.0).double()
            ),
            r"per_tensor_scale has dtype torch\.float64",
        ),  # fmt: skip
        (
            lambda: fm.quantize_nvfp4(
                torch.randn(2, 32), per_tensor_scale=torch.tensor(float("nan"))
            ),
            r"per_tensor_scale holds NaN",
        ),  # fmt: skip
        (lambda: fm.pack_fp4(torch.zeros(3, 5, dtype=torch.uint8)), r"codes_XK\.shape=\(3, 5\)"),
        (lambda: fm.unpack_fp4(torch.zeros(3, 4)), r"packed_XP\.dtype=torch\.float32"),
        (lambda: fm.encode_e2m1(torch.zeros(3).double()), r"x\.dtype=torch\.float64"),
        (
            lambda: fm.unswizzle_32_4_4(torch.zeros(100), 128, 4),
            r"blocked has 100 elements; expected 512",
        ),  # fmt: skip
        (lambda: fm.swizzle_32_4_4(torch.zeros(2, 3, 4)), r"scales_RG\.shape=\(2, 3, 4\)"),
        (lambda: fm.from_torchao(torch.zeros(2)), r"t is a Tensor"),
    ],
)
def test_bad_input_names_argument_and_value(call: Any, match: str) -> None:
    with pytest.raises(GemmInputError, match=match):
        call()
