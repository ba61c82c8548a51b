"""The AVX-512 kernel under torchnext.gemm.grouped_mm: small float32 groups of 2-D x 3-D.

Which groups it takes (1 to 64 rows, float32, ``b[g]`` stored ``[K, N]``), its results
against a float64 reference at float32-accumulation tolerance (test_grouped's bound), the
groups it leaves to torch, its operand checks, and gradients through it. Tests that need the
kernel skip on CPUs without AVX-512F; test_gemv checks that the library's report of
AVX-512 agrees with the CPU's own flags.
"""

from __future__ import annotations

import re
from collections.abc import Iterator

import pytest
import torch

from torchnext.errors import GemmInputError, GemmUnsupportedError
from torchnext.gemm import gemv_cpu, grouped_cpu
from torchnext.gemm.grouped import available_routes, grouped_mm

# Shape legend: G groups, M rows, K contraction, N columns.

_KERNELS = gemv_cpu.kernels()
needs_avx512 = pytest.mark.skipif(
    _KERNELS is None or torch.float32 not in _KERNELS.avx512_dtypes,
    reason="needs AVX-512F and a C compiler for the grouped kernel",
)


def loop_mm(
    a_MK: torch.Tensor, b_GKN: torch.Tensor, offs: torch.Tensor, bias_GN: torch.Tensor | None
) -> torch.Tensor:
    """The docstring's equivalent Python in a_MK's dtype (zeros past the last offset)."""
    out = a_MK.new_zeros(a_MK.shape[0], b_GKN.shape[2])
    start = 0
    for g, end in enumerate(offs.tolist()):
        out[start:end] = a_MK[start:end] @ b_GKN[g] + (0 if bias_GN is None else bias_GN[g])
        start = end
    return out


def assert_close_to_reference(
    out: torch.Tensor,
    a_MK: torch.Tensor,
    b_GKN: torch.Tensor,
    offs: torch.Tensor,
    bias_GN: torch.Tensor | None = None,
) -> None:
    """``|out - ref| <= 2 K eps32 (|A| @ |B| + |bias|) + eps_out |ref|`` per element."""
    x = None if bias_GN is None else bias_GN.double()
    ref = loop_mm(a_MK.double(), b_GKN.double(), offs, x)
    mag = loop_mm(a_MK.double().abs(), b_GKN.double().abs(), offs, None if x is None else x.abs())
    k = max(1, a_MK.shape[1])
    bound = 2 * k * torch.finfo(torch.float32).eps * mag
    bound += torch.finfo(out.dtype).eps * ref.abs() + 1e-300
    worst = ((out.double() - ref).abs() / bound).max().item()
    assert worst <= 1.0, f"error {worst:.2f}x the bound ({out.dtype}, {tuple(out.shape)})"


@pytest.fixture
def kernel_calls(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[int]]:
    """The number of groups of each call that reached the kernel."""
    calls: list[int] = []
    real = gemv_cpu.CpuKernels.grouped512

    def counting(self: gemv_cpu.CpuKernels, *args: object, **kwargs: object) -> None:
        calls.append(len(args[2]))  # type: ignore[arg-type]
        real(self, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(gemv_cpu.CpuKernels, "grouped512", counting)
    yield calls


def _problem(
    sizes: list[int], k: int, n: int, *, seed: int = 0, pad: int = 3
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Rows past the last offset, and padded row strides on a and b (views, not copies)."""
    gen = torch.Generator().manual_seed(seed)
    m = sum(sizes) + pad
    a_MK = torch.randn(m, k + pad, generator=gen)[:, :k]
    b_GKN = torch.randn(len(sizes), k, n + pad, generator=gen)[:, :, :n]
    offs = torch.cumsum(torch.tensor(sizes), 0).to(torch.int32)
    return a_MK, b_GKN, offs


@needs_avx512
@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize(
    ("k", "n"), [(96, 80), (37, 7), (130, 100), (1, 16)], ids=["96x80", "37x7", "130x100", "1x16"]
)
@pytest.mark.parametrize("with_bias", [False, True], ids=["nobias", "bias"])
def test_small_groups_take_the_kernel_and_match_the_reference(
    threads: int, k: int, n: int, with_bias: bool, kernel_calls: list[int]
) -> None:
    # 0 and 65+ rows are not the kernel's; 1 to 64 are, in tiles of 4 rows, odd tails included.
    sizes = [3, 0, 1, 70, 5, 64, 2, 9, 40]
    a_MK, b_GKN, offs = _problem(sizes, k, n, seed=k + n)
    bias = torch.randn(len(sizes), n) if with_bias else None
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        out = grouped_mm(a_MK, b_GKN, offs=offs, bias=bias)
    finally:
        torch.set_num_threads(before)
    assert kernel_calls == [7]  # all but the empty group and the 70 rows
    assert_close_to_reference(out, a_MK, b_GKN, offs, bias)
    assert torch.equal(out[sum(sizes) :], torch.zeros(3, n))


@needs_avx512
def test_an_empty_contraction_gives_the_bias(kernel_calls: list[int]) -> None:
    a_MK, b_GKN, offs = _problem([2, 5], 0, 20)
    bias = torch.randn(2, 20)
    out = grouped_mm(a_MK, b_GKN, offs=offs, bias=bias)
    assert kernel_calls == [2]
    assert torch.equal(out[:2], bias[0].expand(2, 20))
    assert torch.equal(out[2:7], bias[1].expand(5, 20))


@needs_avx512
def test_few_groups_split_their_columns_between_threads(kernel_calls: list[int]) -> None:
    a_MK, b_GKN, offs = _problem([7], 64, 300, seed=5)
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        out = grouped_mm(a_MK, b_GKN, offs=offs)
    finally:
        torch.set_num_threads(before)
    assert kernel_calls == [1]
    assert_close_to_reference(out, a_MK, b_GKN, offs)


@pytest.mark.parametrize(
    "case",
    [
        "bfloat16 stored [K, N]",
        "weights with no unit stride",
        "a with a column stride",
        "only large groups",
        "mostly large groups",
        "a float32 bias for bfloat16",
    ],
)
def test_groups_the_kernel_does_not_take_still_run(case: str, kernel_calls: list[int]) -> None:
    a_MK, b_GKN, offs = _problem([3, 5, 2], 32, 48, seed=7)
    bias = None
    if case == "bfloat16 stored [K, N]":
        a_MK, b_GKN = a_MK.bfloat16(), b_GKN.bfloat16()
    elif case == "weights with no unit stride":
        b_GKN = torch.randn(3, 64, 96)[:, ::2, ::2]
    elif case == "a float32 bias for bfloat16":
        a_MK, b_GKN = a_MK.bfloat16(), b_GKN.transpose(-2, -1).contiguous().bfloat16()
        b_GKN, bias = b_GKN.transpose(-2, -1), torch.randn(3, 48)
    elif case == "a with a column stride":
        a_MK = a_MK.t().contiguous().t()
    elif case == "mostly large groups":  # a prefill: torch's loop takes all of it
        a_MK, b_GKN, offs = _problem([3, 100], 32, 48, seed=7)
    else:
        a_MK, b_GKN, offs = _problem([80, 100], 32, 48, seed=7)
    out_dtype = torch.float32 if bias is not None else None
    out = grouped_mm(a_MK, b_GKN, offs=offs, bias=bias, out_dtype=out_dtype)
    assert kernel_calls == []
    assert_close_to_reference(out, a_MK, b_GKN, offs, bias)


_KINDS = set() if _KERNELS is None else _KERNELS.avx512_dtypes


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize(
    ("dtype", "out_dtype", "limit"),
    [(torch.float32, None, 32), (torch.bfloat16, None, 8), (torch.bfloat16, torch.float32, 8)],
    ids=["float32", "bfloat16", "bfloat16-to-float32"],
)
def test_experts_stored_n_by_k_take_the_gemv_tiles(
    threads: int,
    dtype: torch.dtype,
    out_dtype: torch.dtype | None,
    limit: int,
    kernel_calls: list[int],
) -> None:
    if dtype not in _KINDS:
        pytest.skip(f"this CPU has no AVX-512 instructions for {dtype}")
    # nn.Linear-style experts [G, N, K] go in transposed; float32 up to 32 rows, bfloat16 to 8.
    sizes = [3, 0, 1, 40, 5, 32, 2, 9, 8, 6, 7] + [4] * 13
    gen = torch.Generator().manual_seed(23)
    a_MK = torch.randn(sum(sizes) + 2, 100, generator=gen).to(dtype)
    w_GNK = torch.randn(len(sizes), 37, 100, generator=gen).to(dtype)
    bias = torch.randn(len(sizes), 37, generator=gen).to(dtype)
    offs = torch.cumsum(torch.tensor(sizes), 0).to(torch.int32)
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        out = grouped_mm(a_MK, w_GNK.transpose(-2, -1), offs=offs, bias=bias, out_dtype=out_dtype)
    finally:
        torch.set_num_threads(before)
    assert kernel_calls == [len([n for n in sizes if 0 < n <= limit])]
    assert out.dtype == (out_dtype or dtype)
    assert_close_to_reference(out, a_MK, w_GNK.transpose(-2, -1), offs, bias)


def test_without_the_kernel_library_the_loop_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(grouped_cpu.gemv_cpu, "kernels", lambda: None)
    a_MK, b_GKN, offs = _problem([3, 0, 6], 40, 24, seed=9)
    assert_close_to_reference(grouped_mm(a_MK, b_GKN, offs=offs), a_MK, b_GKN, offs)


@needs_avx512
def test_float32_gradients_through_the_kernel_match_the_loop(kernel_calls: list[int]) -> None:
    # The backward's dA is a grouped GEMM against b transposed: the [N, K] tiles run it.
    a_MK, b_GKN, offs = _problem([4, 1, 0, 9], 24, 40, seed=11, pad=0)
    a1, b1 = a_MK.clone().requires_grad_(), b_GKN.clone().requires_grad_()
    (grouped_mm(a1, b1, offs=offs) ** 2).sum().backward()
    a2, b2 = a_MK.double().requires_grad_(), b_GKN.double().requires_grad_()
    (loop_mm(a2, b2, offs, None) ** 2).sum().backward()
    assert len(kernel_calls) == 2  # the forward and dA (dB is a 2-D x 2-D grouped GEMM)
    assert a1.grad is not None and b1.grad is not None
    assert a2.grad is not None and b2.grad is not None
    for got, want in ((a1.grad, a2.grad), (b1.grad, b2.grad)):
        # Two float32 contractions of at most 40 terms each, in any order.
        bound = 4 * 40 * torch.finfo(torch.float32).eps * want.abs().max().item()
        assert (got.double() - want).abs().max().item() <= bound


@needs_avx512
@pytest.mark.parametrize(
    ("what", "expected"),
    [
        ("b_GKN bfloat16", "b_GKN torch.bfloat16 [2, 4, 8]"),
        ("group out of range", "groups hold a group outside [0, 2)"),
        ("rows past a", "rows outside [0, 10]"),
        ("groups int32", "groups torch.int32"),
        ("chunk 0", "chunk=0"),
        ("bias shape", "bias_GN [3, 8]"),
        ("b contraction", "expected [M, K], [G, K, N], [M, N]"),
        ("b no unit stride", "stored [K, N] or [N, K]"),
        ("out strided for [N, K]", "out_MN is not contiguous"),
        # What its threads would race on (running sums live in out between blocks of K):
        ("overlapping groups", "groups whose row ranges overlap"),
        ("out aliases a", "out_MN shares memory with a_MK or b_GKN"),
        ("out rows overlap", "out_MN row stride 0 (expected >= N = 8)"),
    ],
)
def test_grouped512_checks_what_its_c_code_trusts(what: str, expected: str) -> None:
    assert _KERNELS is not None
    a_MK, b_GKN, out_MN = torch.randn(10, 4), torch.randn(2, 4, 8), torch.empty(10, 8)
    groups = torch.tensor([[0, 0, 3], [1, 3, 10]])
    bias, chunk = None, 8
    if what == "b_GKN bfloat16":
        b_GKN = b_GKN.bfloat16()
    elif what == "group out of range":
        groups = torch.tensor([[2, 0, 3]])
    elif what == "rows past a":
        groups = torch.tensor([[0, 5, 11]])
    elif what == "groups int32":
        groups = groups.int()
    elif what == "chunk 0":
        chunk = 0
    elif what == "bias shape":
        bias = torch.randn(3, 8)
    elif what == "b no unit stride":
        b_GKN = torch.randn(2, 8, 16)[:, ::2, ::2]
    elif what == "out strided for [N, K]":
        b_GKN = torch.randn(2, 8, 4).transpose(-2, -1)
        out_MN = torch.empty(10, 16)[:, ::2]
    elif what == "overlapping groups":
        groups = torch.tensor([[0, 0, 5], [1, 3, 10]])
    elif what == "out aliases a":
        a_MK, b_GKN = torch.randn(10, 8), torch.randn(2, 8, 8)
        out_MN = a_MK
    elif what == "out rows overlap":
        out_MN = torch.empty(1, 8).expand(10, 8)
    else:
        b_GKN = torch.randn(2, 5, 8)
    with pytest.raises(GemmInputError, match="grouped512: .*" + re.escape(expected)):
        _KERNELS.grouped512(a_MK, b_GKN, groups, bias, out_MN, chunk=chunk)


@needs_avx512
def test_grouped512_refuses_a_dtype_this_cpu_does_not_run() -> None:
    assert _KERNELS is not None
    a_MK, b_GKN = torch.randn(4, 8, dtype=torch.float64), torch.randn(1, 8, 8, dtype=torch.float64)
    groups = torch.tensor([[0, 0, 4]])
    with pytest.raises(GemmUnsupportedError, match=r"a_MK.dtype=torch.float64.*grouped_mm"):
        _KERNELS.grouped512(a_MK, b_GKN, groups, None, torch.empty(4, 8), chunk=8)


def test_the_doctor_lists_the_kernel() -> None:
    expected = _KERNELS is not None and torch.float32 in _KERNELS.avx512_dtypes
    assert available_routes("cpu")["cpu-avx512"] is expected
    assert available_routes("cuda")["cpu-avx512"] is False
