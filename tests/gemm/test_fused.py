"""``torchnext.gemm.gemm``: every route computes the epilogue's stated semantics; the
autotuner's store survives concurrent processes; bad input names the argument."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from torchnext.compat.gemm_internals import onednn_has_bf16, onednn_linear_pointwise
from torchnext.errors import GemmInputError, GemmUnsupportedError
from torchnext.gemm import autotune, gemv, gemv_cpu
from torchnext.gemm.epilogue import Epilogue, add, gelu, mul, relu, scale, sigmoid, silu, tanh
from torchnext.gemm.fused import gemm, linear
from torchnext.gemm.routes import Problem, routes_for

# Shape legend: M rows, K contracted, N columns.


@pytest.fixture(autouse=True)
def _private_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TORCHNEXT_GEMM_CACHE_DIR", str(tmp_path / "gemm-cache"))
    autotune.clear()


def _reference(a, b, bias, epilogue):  # type: ignore[no-untyped-def]
    acc = a.double() @ b.double()
    if bias is not None:
        acc = acc + bias.double()
    for step in epilogue.steps:
        operand = step.operand
        acc = (
            step.apply(acc)
            if not isinstance(operand, torch.Tensor)
            else (
                acc + operand.double().reshape(-1 if operand.dim() == 1 else operand.shape)
                if step.op == "add"
                else acc * operand.double()
            )
        )
    return acc


def _tolerance(dtype: torch.dtype, k: int, scale_: float) -> float:
    # Output rounding (a few ulps of the output dtype, once per step) plus float32
    # accumulation over K, relative to the result's magnitude.
    return (16 * torch.finfo(dtype).eps + 4 * k * torch.finfo(torch.float32).eps) * scale_


def _epilogues(m: int, n: int, dtype: torch.dtype) -> list[Epilogue]:
    row = torch.randn(n, dtype=dtype)
    col = torch.randn(m, 1, dtype=dtype)
    full = torch.randn(m, n, dtype=dtype)
    return [
        Epilogue(),
        Epilogue(relu()),
        Epilogue(gelu(), add(full)),
        Epilogue(gelu("tanh"), mul(row)),
        Epilogue(silu(), mul(col), scale(0.5)),
        Epilogue(add(full), tanh()),
        Epilogue(scale(2.0), sigmoid(), add(row), add(col)),
    ]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(("m", "k", "n"), [(1, 16, 8), (5, 33, 17), (300, 64, 40)])
def test_every_route_computes_the_epilogue(dtype: torch.dtype, m: int, k: int, n: int) -> None:
    a = torch.randn(m, k, dtype=dtype)
    b = torch.randn(k, n, dtype=dtype)
    bias = torch.randn(n, dtype=dtype)
    for epilogue in _epilogues(m, n, dtype):
        want = _reference(a, b, bias, epilogue)
        problem = Problem(a, b, bias, epilogue, dtype)
        names = []
        for route in routes_for(problem):
            if route.name.endswith("inductor"):
                continue  # compiled once in its own test below
            got = route.run(problem)
            names.append(route.name)
            assert got.dtype == dtype and got.shape == (m, n), route.name
            err = (got.double() - want).abs().max().item()
            tol = _tolerance(dtype, k, max(1.0, want.abs().max().item()))
            assert err <= tol, (route.name, epilogue, err, tol)
        assert "aten+eager" in names and (not epilogue.steps or "aten+inplace" in names)
        if dtype == torch.bfloat16:
            assert "upcast+eager" in names
        if epilogue.steps and epilogue.steps[0].op in ("relu", "gelu", "silu"):
            # oneDNN's fused post-op: float32 always, bfloat16 where the CPU has it.
            native = dtype == torch.float32 or onednn_has_bf16()
            assert ("aten+onednn" in names) == (native and onednn_linear_pointwise() is not None)


@pytest.mark.parametrize("layout", ["strided", "expanded"])
def test_every_route_takes_a_bias_and_operands_of_any_strides(layout: str) -> None:
    # oneDNN read a strided bias as contiguous (wrong values) and an expanded one past its
    # one-element buffer; the tuner checks a route only on a class's first call.
    m, k, n = 40, 24, 32
    a, b = torch.randn(m, k), torch.randn(k, n)
    if layout == "strided":
        bias = torch.randn(n, 3)[:, 1]  # an interleaved q/k/v bias
        full = torch.randn(n, m).t()
    else:
        bias = torch.randn(1).expand(n)
        full = torch.randn(1, n).expand(m, n)
    for epilogue in (Epilogue(relu()), Epilogue(add(full), gelu()), Epilogue(gelu(), add(full))):
        want = _reference(a, b, bias, epilogue)
        problem = Problem(a, b, bias, epilogue, torch.float32)
        for route in routes_for(problem):
            if route.name.endswith("inductor"):
                continue
            err = (route.run(problem).double() - want).abs().max().item()
            assert err <= _tolerance(torch.float32, k, want.abs().max().item()), route.name


def test_a_route_replaces_aten_only_when_clearly_faster() -> None:
    reference = [1.00, 1.01, 0.99, 1.02, 1.00, 0.98, 1.01]
    assert autotune.clearly_faster([0.90, 0.91, 0.89, 0.92, 0.90, 0.88, 0.91], reference)
    # 3 % faster in the median but slower than ATen's median in its worse runs: kept out.
    assert not autotune.clearly_faster([0.95, 0.96, 0.97, 0.97, 1.05, 1.10, 1.20], reference)
    # Within the margin: ATen stays.
    assert not autotune.clearly_faster([0.99] * 7, reference)
    assert autotune.clearly_faster([0.5], [])


def test_the_fallback_is_torch_own_with_the_steps_in_place(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    a, b, residual = torch.randn(4, 8), torch.randn(8, 4), torch.randn(4, 4)
    steps = Epilogue(relu(), add(residual))
    assert autotune.fallback(Problem(a, b, None, steps, a.dtype)) == "aten+inplace"
    assert autotune.fallback(Problem(a, b, None, Epilogue(), a.dtype)) == "aten+eager"
    monkeypatch.setenv("TORCHNEXT_GEMM_AUTOTUNE", "off")
    assert autotune.choose(Problem(a, b, None, steps, a.dtype)).name == "aten+inplace"
    kept = residual.clone()
    torch.testing.assert_close(gemm(a, b, epilogue=steps), torch.relu(a @ b) + residual)
    assert torch.equal(residual, kept)  # in place on the GEMM's output, never on an operand


def test_an_operand_of_a_wider_dtype_falls_back_to_eager() -> None:
    # In place would keep bfloat16 where eager code promotes to float32.
    a, b = torch.randn(4, 8, dtype=torch.bfloat16), torch.randn(8, 4, dtype=torch.bfloat16)
    wide = Epilogue(add(torch.randn(4, 4)))
    assert autotune.fallback(Problem(a, b, None, wide, torch.float32)) == "aten+eager"


@pytest.mark.parametrize("rows", [1, 8, 128])
def test_half_operands_keep_float32_sums_for_a_float32_result_and_amax(rows: int) -> None:
    w = torch.randn(256, 512, dtype=torch.bfloat16)
    x = torch.randn(rows, 512, dtype=torch.bfloat16)
    residual = torch.randn(rows, 256)
    ref = F.gelu(x.double() @ w.double().T) + residual.double()
    got = linear(x, w, epilogue=Epilogue(gelu(), add(residual)), out_dtype=torch.float32)
    assert got.dtype == torch.float32 and not torch.equal(got, got.bfloat16().float())
    torch.testing.assert_close(got.double(), ref, rtol=1e-5, atol=1e-4)
    amax = torch.zeros((), dtype=torch.float32)
    out = linear(x, w, epilogue=Epilogue(gelu(), amax_into=amax))
    assert out.dtype == torch.bfloat16
    true_amax = F.gelu(x.double() @ w.double().T).abs().max().item()
    assert abs(amax.item() - true_amax) <= 1e-5 * true_amax  # from the float32 sums


def test_empty_k_and_n_give_torch_answers() -> None:
    bias = torch.randn(64)
    got = linear(torch.randn(4, 1, 0), torch.randn(64, 0), bias, epilogue=Epilogue(relu()))
    torch.testing.assert_close(got, torch.relu(bias).expand(4, 1, 64))
    none = linear(torch.randn(4, 1, 32), torch.randn(0, 32), epilogue=Epilogue(gelu()))
    assert none.shape == (4, 1, 0)


def test_inductor_route_matches_eager() -> None:
    a, b = torch.randn(128, 32), torch.randn(32, 24)
    full = torch.randn(128, 24)
    epilogue = Epilogue(gelu(), add(full), scale(0.25))
    problem = Problem(a, b, None, epilogue, torch.float32)
    (route,) = [r for r in routes_for(problem) if r.name == "aten+inductor"]
    want = _reference(a, b, None, epilogue)
    assert (route.run(problem).double() - want).abs().max().item() <= _tolerance(
        torch.float32, 32, want.abs().max().item()
    )


def test_gemm_takes_leading_dims_and_output_shaped_operands() -> None:
    x = torch.randn(2, 3, 16)
    w = torch.randn(8, 16)
    residual = torch.randn(2, 3, 8)
    got = linear(x, w, torch.zeros(8), epilogue=Epilogue(relu(), add(residual)))
    want = torch.relu(F.linear(x, w)) + residual
    assert got.shape == (2, 3, 8)
    torch.testing.assert_close(got, want)


def test_amax_is_written_before_the_cast() -> None:
    a, b = torch.randn(9, 20), torch.randn(20, 7)
    amax = torch.zeros((), dtype=torch.float32)
    out = gemm(a, b, epilogue=Epilogue(scale(3.0), amax_into=amax), out_dtype=torch.bfloat16)
    want = (a.double() @ b.double()) * 3.0
    assert out.dtype == torch.bfloat16
    assert abs(amax.item() - want.abs().max().item()) <= 1e-4 * want.abs().max().item()


def test_recording_autograd_takes_the_eager_chain_and_backpropagates() -> None:
    x = torch.randn(4, 6, requires_grad=True)
    w = torch.randn(5, 6, requires_grad=True)
    out = linear(x, w, epilogue=Epilogue(gelu()))
    out.sum().backward()
    x2, w2 = x.detach().requires_grad_(), w.detach().requires_grad_()
    F.gelu(F.linear(x2, w2)).sum().backward()
    torch.testing.assert_close(x.grad, x2.grad)
    torch.testing.assert_close(w.grad, w2.grad)


def test_the_choice_is_tuned_once_stored_and_reused(tmp_path: Path) -> None:
    a, b, full = torch.randn(8, 16), torch.randn(16, 8), torch.randn(8, 8)
    gemm(a, b, epilogue=Epilogue(relu(), add(full)))
    files = list(Path(os.environ["TORCHNEXT_GEMM_CACHE_DIR"]).glob("*.json"))
    assert len(files) == 1
    record = json.loads(files[0].read_text())
    assert record["route"] in record["median_s"] and "aten+eager" in record["median_s"]
    # A new process state reads the stored choice instead of timing again.
    autotune.clear()
    files[0].write_text(json.dumps({**record, "route": "aten+inplace"}))
    gemm(a, b, epilogue=Epilogue(relu(), add(full)))
    assert list(autotune.tuned_choices().values()) == ["aten+inplace"]


def test_a_torn_cache_file_is_retuned(monkeypatch: pytest.MonkeyPatch) -> None:
    a, b = torch.randn(4, 8), torch.randn(8, 4)
    gemm(a, b, epilogue=Epilogue(tanh()))
    (path,) = Path(os.environ["TORCHNEXT_GEMM_CACHE_DIR"]).glob("*.json")
    path.write_text('{"key": "')
    autotune.clear()
    gemm(a, b, epilogue=Epilogue(tanh()))
    assert json.loads(path.read_text())["route"]


_RACER = textwrap.dedent(
    """
    import json, sys, torch
    from torchnext.gemm import autotune, gemv, gemv_cpu
    from torchnext.gemm.epilogue import Epilogue, gelu, add
    from torchnext.gemm.fused import gemm
    torch.manual_seed(0)
    a, b, r = torch.randn(40, 32), torch.randn(32, 24), torch.randn(40, 24)
    for _ in range(3):
        autotune.clear()
        out = gemm(a, b, epilogue=Epilogue(gelu(), add(r)))
    want = torch.nn.functional.gelu(a @ b) + r
    print(json.dumps({"ok": bool(torch.allclose(out, want, atol=1e-4)),
                      "choices": list(autotune.tuned_choices().values())}))
    """
)


def test_processes_racing_on_one_cache_folder_all_get_a_valid_choice(tmp_path: Path) -> None:
    env = {**os.environ, "TORCHNEXT_GEMM_CACHE_DIR": str(tmp_path / "shared")}
    procs = [
        subprocess.Popen([sys.executable, "-c", _RACER], env=env, stdout=subprocess.PIPE, text=True)
        for _ in range(4)
    ]
    results = [json.loads(p.communicate(timeout=120)[0]) for p in procs]
    assert all(p.returncode == 0 for p in procs)
    assert all(r["ok"] and len(r["choices"]) == 1 for r in results), results
    stored = list((tmp_path / "shared").glob("*.json"))
    assert len(stored) == 1 and json.loads(stored[0].read_text())["route"]
    assert not list((tmp_path / "shared").glob(".tune-*")), "a temporary file was left behind"


def test_modes_off_and_cached_never_time(monkeypatch: pytest.MonkeyPatch) -> None:
    a, b = torch.randn(4, 8), torch.randn(8, 4)
    monkeypatch.setenv("TORCHNEXT_GEMM_AUTOTUNE", "cached")
    gemm(a, b, epilogue=Epilogue(relu()))
    assert not list(Path(os.environ["TORCHNEXT_GEMM_CACHE_DIR"]).glob("*.json"))
    monkeypatch.setenv("TORCHNEXT_GEMM_AUTOTUNE", "sometimes")
    with pytest.raises(GemmInputError, match="TORCHNEXT_GEMM_AUTOTUNE='sometimes'"):
        gemm(a, b, epilogue=Epilogue(relu()))


@pytest.mark.parametrize(
    ("call", "match"),
    [
        (lambda: gemm(torch.randn(3, 4), torch.randn(5, 6)), r"K=4.*K=5"),
        (lambda: gemm(torch.randn(3, 4), torch.randn(4, 6), bias=torch.randn(5)), r"bias.*\[6\]"),
        (
            lambda: gemm(torch.randn(3, 4), torch.randn(4, 6), bias=torch.randn(6, device="meta")),
            r"bias.*on cpu",
        ),
        (
            lambda: gemm(torch.randn(3, 4), torch.randn(4, 6, device="meta")),
            r"a is on cpu, b on meta",
        ),
        (
            lambda: gemm(
                torch.randn(3, 4), torch.randn(4, 6), epilogue=Epilogue(add(torch.randn(2, 6)))
            ),
            r"add\(operand\): shape \[2, 6\]",
        ),
        (lambda: Epilogue(*(add(torch.randn(6)) for _ in range(5))), r"5 captured tensors"),
        (lambda: Epilogue(amax_into=torch.zeros(2)), r"amax_into"),
        (lambda: Epilogue("gelu"), r"steps\[0\]\): got str"),  # type: ignore[arg-type]
        (lambda: scale(float("nan")), r"scale\(value\): got nan"),
        (lambda: gelu("fast"), r"approximate='fast'"),  # type: ignore[arg-type]
        (lambda: linear(torch.randn(3, 4), torch.randn(4)), r"linear\(weight\)"),
    ],
)
def test_bad_input_names_the_argument(call, match: str) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(GemmInputError, match=match):
        call()


def test_unsupported_dtypes_say_where_to_go() -> None:
    a = torch.randn(3, 4).to(torch.float8_e4m3fn)
    with pytest.raises(GemmUnsupportedError, match="scaled_mm"):
        gemm(a, a.t().contiguous())
    with pytest.raises(GemmUnsupportedError, match="a=torch.float32, b=torch.bfloat16"):
        gemm(torch.randn(3, 4), torch.randn(4, 2, dtype=torch.bfloat16))


def test_linear_sends_decode_and_quantized_weights_to_the_gemv_path() -> None:
    from torchnext.gemm.quantized_weight import NVFP4Weight

    w = torch.randn(1024, 1024, dtype=torch.bfloat16)
    x = torch.randn(2, 1, 1024, dtype=torch.bfloat16)
    residual = torch.randn(2, 1, 1024, dtype=torch.bfloat16)
    assert gemv.route(x, w) in ("cpu-dense512", "cpu-dense-gemv") or gemv_cpu.kernels() is None
    got = linear(x, w, epilogue=Epilogue(relu(), add(residual)))
    # A float32 bias with bfloat16 operands: the GEMV route passes, gemm's accepts it.
    b32 = torch.randn(1024)
    with_bias = linear(x, w, b32)
    torch.testing.assert_close(
        with_bias.float(), F.linear(x.float(), w.float(), b32), rtol=0.02, atol=0.05
    )
    want = torch.relu(x.double() @ w.double().t()) + residual.double()
    assert got.shape == (2, 1, 1024) and got.dtype == torch.bfloat16
    assert (got.double() - want).abs().max().item() <= 0.05 * want.abs().max().item()
    q = NVFP4Weight.from_float(torch.randn(64, 256))
    xq = torch.randn(3, 256)
    amax = torch.zeros((), dtype=torch.float32)
    got_q = linear(xq, q, epilogue=Epilogue(gelu(), amax_into=amax))
    want_q = F.gelu(xq.double() @ q.dequantize(torch.float64).t())
    torch.testing.assert_close(got_q.double(), want_q, rtol=1e-4, atol=1e-4)
    assert abs(amax.item() - want_q.abs().max().item()) <= 1e-4 * want_q.abs().max().item()


def test_a_first_call_on_nan_inputs_tunes_without_failing() -> None:
    # Every route's NaN output "disagrees" with the reference's; the reference stays usable.
    a = torch.full((4, 8), float("nan"))
    out = gemm(a, torch.randn(8, 4), epilogue=Epilogue(relu()))
    assert out.isnan().all()
    assert list(autotune.tuned_choices().values()) == ["aten+eager"]


def test_meta_tensors_give_the_shape_without_tuning() -> None:
    out = linear(torch.randn(64, 32, device="meta"), torch.randn(16, 32, device="meta"))
    assert out.is_meta and out.shape == (64, 16)


def test_integer_operands_are_told_to_convert_to_a_float_dtype() -> None:
    with pytest.raises(GemmUnsupportedError, match=r"convert, e\.g\. a\.to\(torch\.float32\)"):
        gemm(torch.ones(4, 4, dtype=torch.int32), torch.ones(4, 4, dtype=torch.int32))
