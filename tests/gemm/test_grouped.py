"""torchnext.gemm.grouped_mm on the CPU: 2.14's semantics, accuracy, autograd, bad input.

The reference is the docstring's equivalent Python evaluated in float64. Tolerances scale
with the dtype: per element, ``|out - ref| <= 2 K eps_acc (|A| @ |B|) + eps_out |ref|``,
where eps_acc is float32's epsilon (float64's for float64 inputs) and eps_out the output
dtype's (one rounding of the result).
"""

from __future__ import annotations

import re
import subprocess
import sys
from typing import Any

import pytest
import torch

from torchnext.compat import gemm_internals
from torchnext.errors import GemmInputError, GemmUnsupportedError
from torchnext.gemm import grouped_cpu
from torchnext.gemm.grouped import GROUPED_DTYPES, available_routes, grouped_mm

# Shape legend: G groups, M rows, K contraction, N columns.


def reference(
    a: torch.Tensor, b: torch.Tensor, offs: torch.Tensor | None, bias: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """(the float64 result, the float64 |A| @ |B| + |bias| of the error bound)."""
    x = None if bias is None else bias.double()
    ref = _loops(a.double(), b.double(), offs, x)
    mag = _loops(a.double().abs(), b.double().abs(), offs, None if x is None else x.abs())
    return ref, mag


def _loops(
    a: torch.Tensor, b: torch.Tensor, offs: torch.Tensor | None, bias: torch.Tensor | None
) -> torch.Tensor:
    if a.dim() == 3 and b.dim() == 3:
        out = a @ b
        return out if bias is None else out + bias[:, None, :]
    assert offs is not None
    ends = offs.tolist()
    starts = [0, *ends[:-1]]
    if a.dim() == 2 and b.dim() == 2:
        if not ends:
            return torch.zeros(0, a.shape[0], b.shape[1], dtype=a.dtype)
        return torch.stack(
            [
                a[:, s:e] @ b[s:e] + (0 if bias is None else bias[g])
                for g, (s, e) in enumerate(zip(starts, ends, strict=True))
            ]
        )
    if a.dim() == 2:
        out = torch.zeros(a.shape[0], b.shape[2], dtype=a.dtype)
        for g, (s, e) in enumerate(zip(starts, ends, strict=True)):
            out[s:e] = a[s:e] @ b[g] + (0 if bias is None else bias[g])
        return out
    out = torch.zeros(a.shape[1], b.shape[1], dtype=a.dtype)
    for g, (s, e) in enumerate(zip(starts, ends, strict=True)):
        out[:, s:e] = a[g] @ b[:, s:e] + (0 if bias is None else bias[s:e])
    return out


def assert_close_to_reference(
    out: torch.Tensor,
    a: torch.Tensor,
    b: torch.Tensor,
    offs: torch.Tensor | None,
    bias: torch.Tensor | None = None,
) -> None:
    ref, mag = reference(a, b, offs, bias)
    assert out.shape == ref.shape
    k = a.shape[-1] if not (a.dim() == 2 and b.dim() == 2) else max(1, a.shape[1])
    eps_acc = torch.finfo(torch.float64 if a.dtype == torch.float64 else torch.float32).eps
    eps_out = torch.finfo(out.dtype).eps
    bound = 2 * k * eps_acc * mag + eps_out * ref.abs() + 1e-300
    err = (out.double() - ref).abs()
    worst = (err / bound).max().item() if err.numel() else 0.0
    assert worst <= 1.0, f"error {worst:.2f}x the bound ({out.dtype}, {tuple(out.shape)})"


def _offs(*ends: int) -> torch.Tensor:
    return torch.tensor(ends, dtype=torch.int32)


def _case(mode: str, dtype: torch.dtype, gen: torch.Generator) -> tuple[torch.Tensor, ...]:
    """Uneven groups with an empty one, and rows/columns past the last offset."""

    def r(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=gen).to(dtype)

    if mode == "2d3d":
        return r(13, 7), r(4, 7, 5), _offs(3, 3, 9, 11), r(4, 5)
    if mode == "3d3d":
        return r(4, 6, 7), r(4, 7, 5), None, r(4, 5)  # type: ignore[return-value]
    if mode == "2d2d":
        return r(6, 12), r(12, 5), _offs(4, 4, 9, 11), r(4, 5)
    return r(4, 6, 7), r(7, 14), _offs(2, 2, 8, 12), r(14)


MODES = ("2d3d", "3d3d", "2d2d", "3d2d")


@pytest.mark.parametrize("dtype", GROUPED_DTYPES, ids=str)
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("with_bias", [False, True], ids=["nobias", "bias"])
def test_every_form_matches_the_float64_reference(
    mode: str, dtype: torch.dtype, with_bias: bool
) -> None:
    gen = torch.Generator().manual_seed(hash((mode, str(dtype))) % 1000)
    a, b, offs, bias = _case(mode, dtype, gen)
    x = bias if with_bias else None
    out = grouped_mm(a, b, offs=offs, bias=x)
    assert out.dtype == dtype
    assert_close_to_reference(out, a, b, offs, x)


@pytest.mark.parametrize("mode", MODES)
def test_16_bit_inputs_give_float32_when_asked(mode: str) -> None:
    gen = torch.Generator().manual_seed(3)
    a, b, offs, bias = _case(mode, torch.bfloat16, gen)
    out = grouped_mm(a, b, offs=offs, bias=bias, out_dtype=torch.float32)
    assert out.dtype == torch.float32
    assert_close_to_reference(out, a, b, offs, bias)
    # float32 accumulation of exact bfloat16 products: equal to float32 inputs' result.
    wide = grouped_mm(a.float(), b.float(), offs=offs, bias=bias.float())
    torch.testing.assert_close(out, wide, rtol=1e-6, atol=1e-5)


def test_rows_and_columns_past_the_last_offset_are_zero() -> None:
    a, b = torch.full((10, 4), float("nan")), torch.ones(3, 4, 8)
    a[:6] = 1.0
    out = grouped_mm(a, b, offs=_offs(2, 2, 6))
    assert torch.equal(out[6:], torch.zeros(4, 8))
    assert torch.equal(out[:6], torch.full((6, 8), 4.0))
    out = grouped_mm(torch.ones(3, 5, 4), torch.ones(4, 9), offs=_offs(1, 1, 4))
    assert torch.equal(out[:, 4:], torch.zeros(5, 5))
    assert torch.equal(out[:, :4], torch.full((5, 4), 4.0))


def test_empty_groups_everywhere() -> None:
    a, b = torch.randn(5, 4), torch.randn(3, 4, 8)
    assert torch.equal(grouped_mm(a, b, offs=_offs(0, 0, 0)), torch.zeros(5, 8))
    two = grouped_mm(a, torch.randn(4, 8), offs=_offs(0, 0, 0))
    assert torch.equal(two, torch.zeros(3, 5, 8))  # every group contracts over nothing
    bias = torch.randn(3, 8)
    with_bias = grouped_mm(a, torch.randn(4, 8), offs=_offs(0, 0, 0), bias=bias)
    assert torch.equal(with_bias, bias[:, None, :].expand(3, 5, 8))
    none = grouped_mm(torch.randn(0, 4), torch.randn(0, 4, 8), offs=_offs())
    assert none.shape == (0, 8)
    assert grouped_mm(a, torch.randn(4, 8), offs=_offs()).shape == (0, 5, 8)


def test_any_strides_run() -> None:
    gen = torch.Generator().manual_seed(5)
    w_GNK = torch.randn(4, 5, 7, generator=gen)  # nn.Linear layout, passed transposed
    a_KM = torch.randn(7, 13, generator=gen)
    offs = _offs(3, 3, 9, 13)
    out = grouped_mm(a_KM.t(), w_GNK.transpose(-2, -1), offs=offs)
    assert_close_to_reference(out, a_KM.t(), w_GNK.transpose(-2, -1), offs)
    strided = torch.randn(13, 14, generator=gen)[:, ::2]  # torch._grouped_mm refuses this
    out = grouped_mm(strided, w_GNK.transpose(-2, -1), offs=offs)
    assert_close_to_reference(out, strided, w_GNK.transpose(-2, -1), offs)


def test_equals_torchs_own_op_where_it_runs() -> None:
    native = gemm_internals.native_grouped_mm()
    assert native is not None
    gen = torch.Generator().manual_seed(7)
    a, b, offs = torch.randn(40, 16, generator=gen), torch.randn(5, 16, 8, generator=gen), None
    offs = _offs(3, 3, 20, 30, 36)
    ours, theirs = grouped_mm(a, b, offs=offs), native(a, b, offs=offs)
    torch.testing.assert_close(ours[:36], theirs[:36])
    a2, b2 = torch.randn(8, 40, generator=gen), torch.randn(40, 4, generator=gen)
    torch.testing.assert_close(grouped_mm(a2, b2, offs=offs), native(a2, b2, offs=offs))


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("mode", ["2d3d", "3d2d", "2d2d"])
def test_large_problems_split_across_threads_stay_exact_enough(
    mode: str, threads: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Every size takes the worker threads (at 2 threads), so groups are cut between them;
    # the 16-bit case also goes through the widening path on the workers.
    monkeypatch.setattr(grouped_cpu, "_THREADED_MIN_MACS", 0)
    before = torch.get_num_threads()
    gen = torch.Generator().manual_seed(11)
    counts = torch.tensor([0, 190, 3, 0, 41, 7, 120, 1, 0, 60])
    offs = torch.cumsum(counts, 0).to(torch.int32)
    used, G = int(offs[-1]), len(counts)
    if mode == "2d3d":
        a, b = torch.randn(used + 3, 96, generator=gen), torch.randn(G, 96, 80, generator=gen)
    elif mode == "3d2d":
        a, b = torch.randn(G, 70, 96, generator=gen), torch.randn(96, used + 3, generator=gen)
    else:
        a, b = torch.randn(70, used + 3, generator=gen), torch.randn(used + 3, 80, generator=gen)
    bias = torch.randn(used + 3, generator=gen) if mode == "3d2d" else torch.randn(G, 80)
    try:
        torch.set_num_threads(threads)
        out = grouped_mm(a, b, offs=offs, bias=bias)
        assert torch.get_num_threads() == threads  # the worker threads' setting stays theirs
    finally:
        torch.set_num_threads(before)
    assert_close_to_reference(out, a, b, offs, bias)
    torch.set_num_threads(threads)
    try:
        half = grouped_mm(a.bfloat16(), b.bfloat16(), offs=offs, out_dtype=torch.float32)
    finally:
        torch.set_num_threads(before)
    assert_close_to_reference(half, a.bfloat16(), b.bfloat16(), offs)


def test_balanced_runs_cover_every_row_once() -> None:
    gen = torch.Generator().manual_seed(41)
    out = torch.zeros(500, 8)
    items = [
        (torch.randn(n, 16, generator=gen), torch.randn(16, 8, generator=gen), out[:n], None)
        for n in (3, 400, 0, 60, 37)
    ]
    for parts in (2, 3, 5):
        runs = grouped_cpu._balance(items, parts)
        assert 1 <= len(runs) <= parts
        for i, (a, _, o, _) in enumerate(items):
            pieces = [p for run in runs for p in run if p[1] is items[i][1]]
            assert sum(p[0].shape[0] for p in pieces) == a.shape[0]
            assert sum(p[2].shape[0] for p in pieces) == o.shape[0]


# --------------------------------------------------------------------------- autograd


@pytest.mark.parametrize("mode", MODES)
def test_gradients_are_right_in_float64(mode: str) -> None:
    gen = torch.Generator().manual_seed(13)
    a, b, offs, bias = _case(mode, torch.float64, gen)
    a, b, bias = (t.clone().requires_grad_() for t in (a, b, bias))
    assert torch.autograd.gradcheck(
        lambda a, b, x: grouped_mm(a, b, offs=offs, bias=x), (a, b, bias)
    )


def test_second_derivatives() -> None:
    gen = torch.Generator().manual_seed(17)
    a, b, offs, bias = _case("2d3d", torch.float64, gen)
    a, b = a.clone().requires_grad_(), b.clone().requires_grad_()
    assert torch.autograd.gradgradcheck(lambda a, b: grouped_mm(a, b, offs=offs), (a, b))


def test_float32_gradients_match_the_loop() -> None:
    gen = torch.Generator().manual_seed(19)
    a, b, offs, _ = _case("2d3d", torch.float32, gen)
    a1, b1 = a.clone().requires_grad_(), b.clone().requires_grad_()
    (grouped_mm(a1, b1, offs=offs) ** 2).sum().backward()
    a2, b2 = a.clone().requires_grad_(), b.clone().requires_grad_()
    (_loops(a2, b2, offs, None) ** 2).sum().backward()
    assert a1.grad is not None and b1.grad is not None
    torch.testing.assert_close(a1.grad, a2.grad)
    torch.testing.assert_close(b1.grad, b2.grad)
    assert torch.equal(a1.grad[11:], torch.zeros(2, 7))  # rows past offs[-1] get nothing


def test_the_op_passes_torchs_custom_op_checks() -> None:
    gen = torch.Generator().manual_seed(23)
    op = torch.ops.torchnext.grouped_mm.default
    for mode in MODES:
        a, b, offs, bias = _case(mode, torch.float32, gen)
        args = (a.requires_grad_(), b.requires_grad_(), offs, bias, None)
        torch.library.opcheck(op, args)


def test_compiles_in_one_graph() -> None:
    gen = torch.Generator().manual_seed(29)
    a, b, offs, bias = _case("2d3d", torch.float32, gen)

    def layer(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return torch.relu(grouped_mm(a, b, offs=offs, bias=bias)) * 2

    compiled = torch.compile(layer, fullgraph=True, backend="aot_eager")
    torch.testing.assert_close(compiled(a, b), layer(a, b))


# --------------------------------------------------------------------------- bad input


def _raises(kind: type[Exception], *patterns: str) -> Any:
    return pytest.raises(kind, match="(?s)" + "".join(f"(?=.*{re.escape(p)})" for p in patterns))


BAD = [
    ("int64 offs", lambda a, b, o: grouped_mm(a, b, offs=o.long()), "offs.dtype", "torch.int64"),
    ("2-D offs", lambda a, b, o: grouped_mm(a, b, offs=o.view(1, 3)), "offs.dim()", "2"),
    ("short offs", lambda a, b, o: grouped_mm(a, b, offs=o[:2]), "offs.shape[0]", "is 2"),
    ("decreasing", lambda a, b, o: grouped_mm(a, b, offs=_offs(5, 2, 7)), "offs[1]", "is 2"),
    ("negative", lambda a, b, o: grouped_mm(a, b, offs=_offs(-1, 2, 7)), "offs[0]", "is -1"),
    ("past M", lambda a, b, o: grouped_mm(a, b, offs=_offs(2, 5, 11)), "offs[-1]", "is 11"),
    ("no offs", lambda a, b, o: grouped_mm(a, b), "offs", "None"),
    ("inner dims", lambda a, b, o: grouped_mm(a, b.transpose(1, 2), offs=o), "mat_b.shape", "8"),
    ("4-D", lambda a, b, o: grouped_mm(a[None, None], b, offs=o), "mat_a.dim()", "4"),
    ("dtypes", lambda a, b, o: grouped_mm(a, b.double(), offs=o), "mat_b.dtype", "float64"),
    ("bias", lambda a, b, o: grouped_mm(a, b, offs=o, bias=torch.zeros(3, 5)), "bias", "(3, 5)"),
]


@pytest.mark.parametrize(("name", "call", "arg", "value"), BAD, ids=[c[0] for c in BAD])
def test_bad_input_names_argument_and_value(name: str, call: object, arg: str, value: str) -> None:
    a, b, offs = torch.randn(10, 4), torch.randn(3, 4, 8), _offs(2, 5, 7)
    with _raises(GemmInputError, arg, value):
        call(a, b, offs)  # type: ignore[operator]


def test_other_forms_check_their_own_offsets_and_sizes() -> None:
    a2, b2 = torch.randn(6, 12), torch.randn(12, 5)
    with _raises(GemmInputError, "offs[-1]", "13", "K = 12"):
        grouped_mm(a2, b2, offs=_offs(4, 13))
    with _raises(GemmInputError, "offs[-1]", "15", "N = 14"):
        grouped_mm(torch.randn(2, 6, 7), torch.randn(7, 14), offs=_offs(4, 15))
    with _raises(GemmInputError, "offs.shape[0]", "3", "mat_a.shape[0] = 2"):
        grouped_mm(torch.randn(2, 6, 7), torch.randn(7, 14), offs=_offs(1, 2, 3))
    with _raises(GemmInputError, "mat_b.shape[0]", "3", "mat_a.shape[0] = 2"):
        grouped_mm(torch.randn(2, 6, 7), torch.randn(3, 7, 5))
    with _raises(GemmInputError, "offs", "None for 3-D x 3-D"):
        grouped_mm(torch.randn(2, 6, 7), torch.randn(2, 7, 5), offs=_offs(1, 2))
    with _raises(GemmInputError, "offs.device", "meta"):
        grouped_mm(a2, b2, offs=_offs(4, 12).to("meta"))


def test_unsupported_dtypes_say_what_runs() -> None:
    with _raises(GemmUnsupportedError, "mat_a.dtype", "torch.int32", "torch.float32"):
        grouped_mm(
            torch.ones(4, 4, dtype=torch.int32),
            torch.ones(1, 4, 4, dtype=torch.int32),
            offs=_offs(4),
        )
    with _raises(GemmUnsupportedError, "out_dtype", "torch.bfloat16", "None or torch.float32"):
        grouped_mm(torch.ones(4, 4), torch.ones(1, 4, 4), offs=_offs(4), out_dtype=torch.bfloat16)


def test_importing_the_module_does_not_import_triton() -> None:
    probe = "import sys, torchnext.gemm.grouped; print('triton' in sys.modules)"
    out = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True, timeout=120
    ).stdout
    assert out.strip() == "False"


def test_available_routes_for_the_doctor() -> None:
    cpu = available_routes("cpu")
    assert cpu["loop"] and cpu["torch-loop"]
    assert not cpu["torch-kernel"] and not cpu["triton"]
    assert set(available_routes("cuda")) == set(cpu)


def test_results_are_contiguous_even_where_torchs_op_pads_rows() -> None:
    w_GNK = torch.randn(3, 5, 16)  # N = 5 floats: torch's op pads each output row to 8
    out = grouped_mm(torch.randn(10, 16), w_GNK.transpose(-2, -1), offs=_offs(2, 5, 9))
    assert out.is_contiguous() and out.shape == (10, 5)
    assert torch.equal(out[9], torch.zeros(5))


def test_eager_fast_path_and_the_registered_op_agree() -> None:
    gen = torch.Generator().manual_seed(31)
    for mode in MODES:
        a, b, offs, bias = _case(mode, torch.float32, gen)
        plain = grouped_mm(a, b, offs=offs, bias=bias)  # dispatch skipped: nothing to track
        tracked = grouped_mm(a.requires_grad_(), b, offs=offs, bias=bias)  # through the op
        assert torch.equal(plain, tracked.detach())
        direct = torch.ops.torchnext.grouped_mm(a.detach(), b, offs, bias, None)
        assert torch.equal(plain, direct)


def test_concurrent_callers_share_the_worker_threads() -> None:
    from concurrent.futures import ThreadPoolExecutor

    gen = torch.Generator().manual_seed(37)
    offs = torch.cumsum(torch.tensor([90, 0, 270, 40]), 0).to(torch.int32)  # > 4M MACs
    a, b = torch.randn(400, 128, generator=gen), torch.randn(4, 128, 96, generator=gen)
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        with ThreadPoolExecutor(3) as callers:
            outs = list(callers.map(lambda _: grouped_mm(a, b, offs=offs), range(6)))
    finally:
        torch.set_num_threads(before)
    for out in outs:
        assert_close_to_reference(out, a, b, offs)


def test_meta_tensors_give_the_output_shape() -> None:
    a, b = torch.empty(10, 4, device="meta"), torch.empty(3, 4, 8, device="meta")
    out = grouped_mm(a, b, offs=_offs(2, 5, 7).to("meta"), out_dtype=torch.float32)
    assert out.device.type == "meta" and out.shape == (10, 8)


def test_offsets_given_as_a_list_say_how_to_make_the_tensor() -> None:
    with pytest.raises(GemmInputError, match=r"type\(offs\) is list.*torch\.tensor\(ends"):
        grouped_mm(torch.randn(5, 4), torch.randn(2, 4, 3), offs=[2, 5])  # type: ignore[arg-type]
