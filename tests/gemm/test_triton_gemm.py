"""The Triton GEMM template with its fused epilogue, run on the CPU by Triton's interpreter.

``TRITON_INTERPRET`` must be set before Triton is first imported, so the kernel runs in a
child process (tiny shapes, one 16x16x16 tile configuration); this module never imports
Triton itself. Every case is checked against ``Epilogue.apply`` in float64 at a tolerance
scaled by the output dtype and by float32 accumulation over K. Bad input is checked in
process: the checks run before Triton is imported.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest
import torch
from triton_interpreter import HAS_TRITON, needs_triton, run_child

from torchnext.errors import GemmInputError, GemmUnsupportedError
from torchnext.gemm import epilogue as ep
from torchnext.gemm.epilogue import Epilogue
from torchnext.gemm.triton_gemm import MAX_STEPS, triton_available, triton_gemm

# Shared by the interpreted child and the GPU test: the cases and their float64 check.
_CASES = textwrap.dedent(
    """
    import math, torch
    from torchnext.gemm import epilogue as ep
    from torchnext.gemm.epilogue import Epilogue

    def operand(kind, m, n, dt, gen):
        if kind == "row":
            return torch.randn(n, generator=gen).to(dt)
        if kind == "row1":
            return torch.randn(1, n, generator=gen).to(dt)
        if kind == "row_strided":  # every other element of a longer vector
            return torch.randn(2 * n, generator=gen).to(dt)[::2]
        if kind == "column":
            return torch.randn(m, 1, generator=gen).to(dt)
        if kind == "full_t":  # a transposed (column-major) view
            return torch.randn(n, m, generator=gen).to(dt).t()
        return torch.randn(m, n, generator=gen).to(dt)

    def steps_for(spec, m, n, dt, gen):
        out = []
        for name in spec:
            op, _, kind = name.partition(":")
            if op in ("add", "mul"):
                out.append(getattr(ep, op)(operand(kind, m, n, dt, gen)))
            elif op == "scale":
                out.append(ep.scale(-0.75))
            elif op == "gelu_tanh":
                out.append(ep.gelu("tanh"))
            else:
                out.append(getattr(ep, op)())
        return out

    def growth(steps):
        # How much the steps can magnify an error in their input (Lipschitz bound).
        g = 1.0
        for s in steps:
            if isinstance(s.operand, torch.Tensor) and s.op == "mul":
                g *= max(1.0, float(s.operand.abs().max()))
            elif s.op == "scale":
                g *= max(1.0, abs(s.operand))
            elif s.op in ("gelu", "gelu_tanh"):
                g *= 1.13
        return g

    def run_case(fn, name, m, k, n, dt, spec, bias, out_dtype, amax, layout, gen, device):
        a = torch.randn(m, k, generator=gen).to(dt)
        b = torch.randn(k, n, generator=gen).to(dt)
        if layout == "small":  # |acc| < 0.125: the series branch of tanh
            a = (a.float() * 0.01).to(dt)
        if layout == "nan":
            a[0, 0] = float("nan")
        if layout == "transposed":  # a column-major a_MK and an nn.Linear-style b_KN
            a = a.t().contiguous().t()
            b = b.t().contiguous().t()
        bias_n = torch.randn(n, generator=gen).to(bias) if bias is not None else None
        steps = steps_for(spec, m, n, dt, gen)
        got_amax = torch.full((), 1e30) if amax else None  # must be overwritten
        ref_amax = torch.zeros((), dtype=torch.float32) if amax else None
        a, b = a.to(device), b.to(device)
        bias_n = None if bias_n is None else bias_n.to(device)
        dev_steps = [ep.Step(s.op, s.operand.to(device) if isinstance(s.operand, torch.Tensor)
                             else s.operand) for s in steps]
        if got_amax is not None:
            got_amax = got_amax.to(device)
        out = fn(a, b, bias_n, Epilogue(*dev_steps, amax_into=got_amax), out_dtype).cpu()
        acc = a.cpu().double() @ b.cpu().double()
        if bias_n is not None:
            acc = acc + bias_n.cpu().double()
        steps64 = [ep.Step(s.op, s.operand.double() if isinstance(s.operand, torch.Tensor)
                           else s.operand) for s in steps]
        ref = Epilogue(*steps64).apply(acc)
        want_dtype = out_dtype or dt
        scale = (a.cpu().double().abs() @ b.cpu().double().abs()).nan_to_num().amax().item() + 1.0
        tol = (2 * torch.finfo(want_dtype).eps * float(ref.abs().nan_to_num().amax())
               + 2 * max(k, 1) * torch.finfo(torch.float32).eps * scale * growth(steps))
        finite = ~ref.isnan()
        row = dict(name=name, dtype=str(dt), m=m, k=k, n=n, out_dtype=str(out.dtype),
                   want_dtype=str(want_dtype), shape=list(out.shape), tol=tol,
                   err=float((out.double() - ref)[finite].abs().max()) if finite.any() else 0.0,
                   nan_same=bool((out.isnan() == ref.isnan()).all()))
        if got_amax is not None:
            want = ref.abs().amax()
            row["amax_err"] = abs(float(got_amax) - float(want)) if not want.isnan() else 0.0
            row["amax_nan_same"] = bool(got_amax.isnan()) == bool(want.isnan())
            if out.dtype == torch.float32:  # the amax is of the very values stored
                stored = out.abs().amax()
                row["amax_exact"] = bool(got_amax.cpu() == stored) or bool(stored.isnan())
        return row

    ACTS = ["relu", "gelu", "gelu_tanh", "silu", "tanh", "sigmoid"]
    CASES = [
        # name, m, k, n, steps, bias dtype, out_dtype, amax, layout
        ("plain_m1", 1, 33, 17, [], torch.float32, None, False, ""),
        ("plain_k0", 3, 0, 5, ["relu"], torch.float32, None, False, ""),
        ("act_relu", 33, 40, 24, ["relu"], None, None, False, ""),
        ("act_gelu", 17, 5, 40, ["gelu"], torch.bfloat16, None, False, ""),
        ("act_gelu_tanh", 20, 19, 18, ["gelu_tanh"], None, None, False, ""),
        ("act_silu", 18, 21, 33, ["silu"], torch.float32, None, False, ""),
        ("act_tanh", 9, 16, 16, ["tanh"], None, None, False, ""),
        ("act_sigmoid", 16, 31, 9, ["sigmoid"], None, None, False, ""),
        ("small_tanh_gelu", 12, 20, 20, ["gelu_tanh", "tanh"], None, None, False, "small"),
        ("add_row", 5, 24, 19, ["add:row"], None, None, False, ""),
        ("add_row1_strided", 5, 24, 19, ["add:row1", "add:row_strided"], None, None, False, ""),
        ("add_column", 19, 8, 7, ["add:column"], None, None, False, ""),
        ("add_full", 17, 17, 17, ["add:full"], torch.float32, None, False, ""),
        ("mul_row_col_full", 21, 9, 20, ["mul:row", "mul:column", "mul:full_t"], None, None,
         False, ""),
        ("scale", 4, 7, 3, ["scale"], None, None, False, ""),
        ("chain4_amax", 34, 18, 17, ["add:row", "gelu", "mul:column", "add:full"],
         torch.float32, None, True, ""),
        ("amax_only", 2, 40, 33, [], None, None, True, ""),
        ("upcast_out", 18, 20, 16, ["silu", "scale"], torch.float32, torch.float32, True, ""),
        ("downcast_out", 16, 20, 18, ["sigmoid"], None, torch.bfloat16, False, ""),
        ("transposed", 20, 33, 17, ["relu", "add:full_t"], torch.float32, None, False,
         "transposed"),
        ("nan", 17, 9, 18, ["relu"], None, None, True, "nan"),
    ]

    def run_all(fn, device, dtypes):
        gen = torch.Generator().manual_seed(0)
        rows = []
        for dt in dtypes:
            for case in CASES:
                rows.append(run_case(fn, *case[:4], dt, *case[4:], gen, device))
        return rows
    """
)

_CHILD = _CASES + textwrap.dedent(
    """
        import json, time
        from torchnext.gemm.triton_gemm import triton_gemm
        start = time.perf_counter()
        rows = run_all(triton_gemm, "cpu", (torch.float32, torch.bfloat16))
        rows += run_all(triton_gemm, "cpu", (torch.float16,))[:3]
        print(json.dumps(dict(rows=rows, seconds=time.perf_counter() - start)))
        """
)


def _check_rows(rows: list[dict[str, object]]) -> None:
    for row in rows:
        assert row["shape"] == [row["m"], row["n"]], row
        assert row["out_dtype"] == row["want_dtype"], row
        assert row["nan_same"], row
        assert float(row["err"]) <= float(row["tol"]), row  # type: ignore[arg-type]
        if "amax_err" in row:
            assert row["amax_nan_same"], row
            assert float(row["amax_err"]) <= float(row["tol"]), row  # type: ignore[arg-type]
        if "amax_exact" in row:
            assert row["amax_exact"], row


@pytest.fixture(scope="module")
def interpreted() -> dict[str, object]:
    result: dict[str, object] = run_child(_CHILD)
    return result


@needs_triton
def test_interpreted_kernel_matches_the_float64_epilogue(interpreted: dict[str, object]) -> None:
    rows = interpreted["rows"]
    assert isinstance(rows, list) and len(rows) == 2 * 21 + 3
    _check_rows(rows)


@needs_triton
def test_interpreted_kernel_covers_every_step_and_operand_kind(
    interpreted: dict[str, object],
) -> None:
    names = {row["name"] for row in interpreted["rows"]}  # type: ignore[attr-defined]
    for act in ep.ACTIVATIONS:
        assert f"act_{act}" in names
    for kind in ("add_row", "add_column", "add_full", "mul_row_col_full", "scale", "amax_only"):
        assert kind in names
    bf16_amax = [
        r
        for r in interpreted["rows"]  # type: ignore[attr-defined]
        if r["dtype"] == "torch.bfloat16" and "amax_err" in r
    ]
    assert len(bf16_amax) == 4


def test_importing_the_module_does_not_import_triton() -> None:
    probe = (
        "import sys, json, torch\n"
        "before = set(sys.modules)\n"
        "import torchnext.gemm, torchnext.gemm.triton_gemm as t\n"
        "t.triton_available()\n"
        "print(json.dumps(sorted(m for m in set(sys.modules) - before if m.split('.')[0] == "
        "'triton')))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True, timeout=120
    ).stdout
    assert json.loads(out) == []


def test_triton_available_needs_a_device_or_the_interpreter(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    assert triton_available() == (HAS_TRITON and torch.cuda.is_available())
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert triton_available() == HAS_TRITON


def test_autotune_space_is_pruned_to_tiles_that_fit() -> None:
    from types import SimpleNamespace

    from torchnext.gemm.triton_gemm import _prune

    def cfg(m: int, n: int, k: int) -> SimpleNamespace:
        return SimpleNamespace(kwargs={"BLOCK_M": m, "BLOCK_N": n, "BLOCK_K": k})

    space = [cfg(128, 256, 64), cfg(128, 128, 64), cfg(64, 64, 32), cfg(16, 64, 64)]
    bf16: dict[str, object] = {"a_ptr": torch.ones(1, dtype=torch.bfloat16)}
    f32: dict[str, object] = {"a_ptr": torch.ones(1)}

    def kept(
        args: dict[str, object], m_bucket: int, n: int, precision: str
    ) -> list[tuple[int, ...]]:
        named = {**args, "M_BUCKET": m_bucket, "N": n}
        out = _prune(space, named, PRECISION=precision)  # type: ignore[arg-type]
        return [(c.kwargs["BLOCK_M"], c.kwargs["BLOCK_N"]) for c in out]

    assert kept(bf16, 4096, 4096, "ieee") == [(128, 256), (128, 128), (64, 64), (16, 64)]
    assert kept(bf16, 1, 4096, "ieee") == [(16, 64)]  # decode: one row
    assert kept(bf16, 64, 100, "ieee") == [(64, 64), (16, 64)]
    assert kept(bf16, 8, 17, "ieee") == [(16, 64)]  # nothing fits: the smallest tile
    assert kept(f32, 4096, 4096, "ieee") == [(64, 64)]  # FMA tiles only
    assert kept(f32, 4096, 4096, "tf32") == [(128, 256), (128, 128), (64, 64), (16, 64)]


# --------------------------------------------------------------------------- bad input


@pytest.fixture
def interpreting(monkeypatch: pytest.MonkeyPatch) -> None:
    # CPU tensors pass the device check only under the interpreter; every check below
    # raises before Triton would be imported.
    monkeypatch.setenv("TRITON_INTERPRET", "1")


def test_inner_dimensions_must_agree(interpreting: None) -> None:
    with pytest.raises(GemmInputError, match=r"a_MK is \[4, 5\] \(K=5\).*b_KN is \[6, 3\]"):
        triton_gemm(torch.ones(4, 5), torch.ones(6, 3))


def test_operands_must_be_matrices(interpreting: None) -> None:
    with pytest.raises(GemmInputError, match=r"triton_gemm\(a_MK\).*shape \[2, 4, 5\]"):
        triton_gemm(torch.ones(2, 4, 5), torch.ones(5, 3))
    with pytest.raises(GemmInputError, match=r"triton_gemm\(b_KN\): got \[\[1.0\]\]"):
        triton_gemm(torch.ones(1, 1), [[1.0]])  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("a_dtype", "b_dtype"),
    [(torch.float64, torch.float64), (torch.bfloat16, torch.float32), (torch.int8, torch.int8)],
)
def test_unsupported_dtype_pairs(
    interpreting: None, a_dtype: torch.dtype, b_dtype: torch.dtype
) -> None:
    a, b = torch.ones(2, 3, dtype=a_dtype), torch.ones(3, 2, dtype=b_dtype)
    with pytest.raises(GemmUnsupportedError, match=f"dtypes {a_dtype} and {b_dtype}"):
        triton_gemm(a, b)


def test_out_dtype_must_be_floating(interpreting: None) -> None:
    with pytest.raises(GemmUnsupportedError, match=r"out_dtype=torch.int32"):
        triton_gemm(torch.ones(2, 3), torch.ones(3, 2), out_dtype=torch.int32)


def test_cpu_tensors_need_the_interpreter(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    with pytest.raises(GemmUnsupportedError, match=r"triton_gemm\(a_MK\): on cpu; expected a CUDA"):
        triton_gemm(torch.ones(2, 3), torch.ones(3, 2))


def test_operands_on_other_devices(interpreting: None) -> None:
    a, b = torch.ones(2, 3), torch.ones(3, 4)
    with pytest.raises(GemmInputError, match=r"triton_gemm\(b_KN\): on meta, a_MK on cpu"):
        triton_gemm(a, torch.ones(3, 4, device="meta"))
    with pytest.raises(GemmInputError, match=r"steps\[1\] add\): operand is .* on meta"):
        triton_gemm(a, b, epilogue=Epilogue(ep.relu(), ep.add(torch.ones(4, device="meta"))))
    amax = torch.zeros((), device="meta")
    with pytest.raises(GemmInputError, match=r"amax_into\): on meta; expected"):
        triton_gemm(a, b, epilogue=Epilogue(amax_into=amax))


def test_bias_must_be_a_row(interpreting: None) -> None:
    a, b = torch.ones(2, 3), torch.ones(3, 4)
    with pytest.raises(
        GemmInputError, match=r"bias_N\): got a torch.float32 tensor of shape \[2\].*\[4\]"
    ):
        triton_gemm(a, b, torch.ones(2))
    with pytest.raises(GemmInputError, match=r"bias_N\): got a torch.int64 tensor"):
        triton_gemm(a, b, torch.ones(4, dtype=torch.int64))


def test_epilogue_operands_must_fit_the_output(interpreting: None) -> None:
    a, b = torch.ones(2, 3), torch.ones(3, 4)
    with pytest.raises(GemmInputError, match=r"add\(operand\): shape \[3, 4\].*\[2, 4\]"):
        triton_gemm(a, b, epilogue=Epilogue(ep.add(torch.ones(3, 4))))
    with pytest.raises(GemmInputError, match=r"steps\[0\] mul\): operand is a torch.int32"):
        triton_gemm(a, b, epilogue=Epilogue(ep.mul(torch.ones(4, dtype=torch.int32))))
    with pytest.raises(GemmInputError, match=r"triton_gemm\(epilogue\): got tuple"):
        triton_gemm(a, b, epilogue=(ep.relu(),))  # type: ignore[arg-type]


def test_at_most_four_steps(interpreting: None) -> None:
    five = Epilogue(*[ep.relu()] * (MAX_STEPS + 1))
    with pytest.raises(GemmUnsupportedError, match=r"5 steps .*at most 4"):
        triton_gemm(torch.ones(2, 3), torch.ones(3, 4), epilogue=five)


def test_no_autograd(interpreting: None) -> None:
    a = torch.ones(2, 3, requires_grad=True)
    with pytest.raises(GemmUnsupportedError, match="requires grad.*torch.no_grad"):
        triton_gemm(a, torch.ones(3, 4))


# --------------------------------------------------------------------------- real GPU


@pytest.mark.gpu
@pytest.mark.slow
@pytest.mark.timeout(600)  # each new epilogue compiles its tile configurations once
@needs_triton
def test_cuda_kernel_matches_the_float64_epilogue() -> None:
    namespace: dict[str, object] = {}
    exec(_CASES, namespace)  # noqa: S102 - the shared case table above
    with torch.no_grad():
        rows = namespace["run_all"](triton_gemm, "cuda", (torch.bfloat16, torch.float32))  # type: ignore[operator]
    assert len(rows) == 42
    _check_rows(rows)
    # Large enough for the real tile configurations and the autotuner.
    gen = torch.Generator().manual_seed(1)
    a = torch.randn(1000, 777, generator=gen).cuda()
    b = torch.randn(777, 1500, generator=gen).cuda()
    res = torch.randn(1000, 1500, generator=gen).cuda()
    amax = torch.zeros((), device="cuda")
    out = triton_gemm(
        a.bfloat16(), b.bfloat16(), None, Epilogue(ep.gelu(), ep.add(res), amax_into=amax)
    )
    ref = torch.nn.functional.gelu(a.bfloat16().double() @ b.bfloat16().double()) + res.double()
    assert ((out.double() - ref).abs().max() / ref.abs().max()) < 2e-2
    assert abs(float(amax) - float(ref.abs().max())) <= 1e-3 * float(ref.abs().max())
    # float32 without tf32 is float32 arithmetic (tf32 would be ~1e-3 off), and with it is not.
    exact = a.double() @ b.double()
    err = float((triton_gemm(a, b) - exact).abs().max() / exact.abs().max())
    assert err < 2e-6
    err_tf32 = float((triton_gemm(a, b, allow_tf32=True) - exact).abs().max() / exact.abs().max())
    assert err_tf32 < 1e-2
    if torch.cuda.get_device_capability() >= (8, 0):  # tf32 tensor cores exist
        assert err_tf32 > 2e-6
    # The package's route runs the template.
    from torchnext.gemm.routes import Problem, route

    problem = Problem(a, b, None, Epilogue(ep.relu()), torch.float32)
    assert torch.allclose(route("triton").run(problem), torch.relu(exact).float(), atol=1e-3)
