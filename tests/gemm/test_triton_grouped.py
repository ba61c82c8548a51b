"""The grouped-GEMM Triton kernel, run on the CPU through Triton's interpreter.

``TRITON_INTERPRET`` must be set before Triton is first imported, so the kernel runs in a
child process; this module never imports Triton itself. The child compares the kernel with
the CPU route of ``grouped_mm`` on small shapes with uneven and empty groups, rows/columns
past the last offset, bias, and few persistent programs (so each walks many groups). A
second child compiles the kernel for sm80 and sm90 without a GPU, which the interpreter
alone would not catch (Triton's compiler is stricter than its interpreter).
"""

from __future__ import annotations

import textwrap

import pytest
import torch
from triton_interpreter import SKIP_REASON, run_child

from torchnext.gemm.triton_grouped import triton_available

pytestmark = pytest.mark.skipif(not triton_available(), reason=SKIP_REASON)

_INTERPRETED = textwrap.dedent(
    """
    import json, torch
    from torchnext.gemm.grouped import grouped_mm
    from torchnext.gemm.triton_grouped import grouped_mm_triton
    gen = torch.Generator().manual_seed(0)
    def r(*shape, dt):
        return torch.randn(*shape, generator=gen).to(dt)
    o = lambda *e: torch.tensor(e, dtype=torch.int32)
    rows = []
    for dt in (torch.float32, torch.bfloat16, torch.float16):
        cases = [
            ("2d3d", r(37, 20, dt=dt), r(4, 20, 19, dt=dt), o(3, 3, 20, 33), r(4, 19, dt=dt)),
            ("3d3d", r(3, 18, 20, dt=dt), r(3, 20, 17, dt=dt), None, r(3, 17, dt=dt)),
            ("2d2d", r(18, 37, dt=dt), r(37, 17, dt=dt), o(5, 5, 21, 33), r(4, 17, dt=dt)),
            ("3d2d", r(4, 18, 20, dt=dt), r(20, 40, dt=dt), o(2, 2, 19, 35), r(40, dt=dt)),
            ("empty", r(9, 20, dt=dt), r(2, 20, 17, dt=dt), o(0, 0), None),
        ]
        # Every form in float32; the 16-bit dtypes on two forms each (the interpreter is slow).
        keep = {torch.float32: ("2d3d", "3d3d", "2d2d", "3d2d", "empty"),
                torch.bfloat16: ("2d3d", "3d2d"), torch.float16: ("2d2d", "3d3d")}[dt]
        for name, a, b, offs, bias in cases:
            if name not in keep:
                continue
            for use_bias in ((False, True) if bias is not None else (False,)):
                x = bias if use_bias else None
                got = grouped_mm_triton(a, b, offs, bias=x, programs=3)
                want = grouped_mm(a, b, offs=offs, bias=x)
                tail = 0 if offs is None or not offs.numel() else int(offs[-1])
                rows.append(dict(
                    case=name, dtype=str(dt), bias=use_bias, shape=list(got.shape),
                    want_shape=list(want.shape), same_dtype=got.dtype == want.dtype,
                    err=float((got.double() - want.double()).abs().max()),
                    scale=float(want.double().abs().max().clamp_min(1)),
                    tail_zero=bool(
                        (got[tail:] == 0).all() if name in ("2d3d", "empty")
                        else (got[:, tail:] == 0).all() if name == "3d2d" else True),
                ))
    a, b = torch.randn(30, 16, generator=gen), torch.randn(3, 16, 16, generator=gen)
    wide = grouped_mm_triton(a.bfloat16(), b.bfloat16(), o(10, 10, 30), out_dtype=torch.float32)
    rows.append(dict(case="bf16->f32", dtype="torch.bfloat16", bias=False, shape=list(wide.shape),
        want_shape=[30, 16], same_dtype=wide.dtype == torch.float32,
        err=float((wide - grouped_mm(a.bfloat16(), b.bfloat16(), offs=o(10, 10, 30),
                                     out_dtype=torch.float32)).abs().max()),
        scale=1.0, tail_zero=True))
    print(json.dumps(rows))
    """
)

_COMPILED = textwrap.dedent(
    """
    import json, warnings
    warnings.simplefilter("ignore")
    import triton
    from triton.backends.compiler import GPUTarget
    from torchnext.gemm.triton_grouped import kernel
    ints = ["G", "M", "N", "K", "s_ag", "s_am", "s_ak", "s_bg", "s_bk", "s_bn",
            "s_cg", "s_cm", "s_cn", "s_xg", "s_xn"]
    done = []
    for jagged in (0, 1, 2, 3):
        for dt, cc in (("bf16", 90), ("fp32", 80)):
            sig = {p: f"*{dt}" for p in ("a_ptr", "b_ptr", "c_ptr", "bias_ptr")}
            sig.update(offs_ptr="*i32", **{n: "i32" for n in ints})
            consts = dict(JAGGED=jagged, HAS_BIAS=True, IEEE=dt == "fp32", WIDEN=False,
                          BLOCK_M=64, BLOCK_N=128, BLOCK_K=64 if dt == "bf16" else 32)
            sig.update({c: "constexpr" for c in consts})
            src = triton.compiler.ASTSource(fn=kernel(), signature=sig, constexprs=consts)
            out = triton.compile(src, target=GPUTarget("cuda", cc, 32),
                                 options={"num_warps": 4, "num_stages": 3})
            done.append([jagged, dt, cc, len(out.asm["ptx"]) > 0])
    print(json.dumps(done))
    """
)


@pytest.fixture(scope="module")
def interpreted_rows() -> list[dict[str, object]]:
    rows = run_child(_INTERPRETED, interpret=True)
    assert isinstance(rows, list)
    return rows


def test_kernel_matches_the_cpu_route_in_every_form(
    interpreted_rows: list[dict[str, object]],
) -> None:
    assert len(interpreted_rows) == 9 + 4 + 4 + 1
    for row in interpreted_rows:
        assert row["shape"] == row["want_shape"], row
        assert row["same_dtype"], row
        assert row["tail_zero"], row
        # Both sides accumulate in float32; 16-bit outputs may differ by one rounding.
        unit = {"torch.float32": 1e-5, "torch.bfloat16": 2**-7, "torch.float16": 2**-10}
        assert float(row["err"]) <= unit[str(row["dtype"])] * float(row["scale"]), row  # type: ignore[arg-type]


def test_kernel_compiles_for_ampere_and_hopper_without_a_gpu() -> None:
    done = run_child(_COMPILED, interpret=False)
    assert isinstance(done, list) and len(done) == 8
    assert all(ok for *_, ok in done), done


@pytest.mark.gpu
def test_kernel_on_the_gpu_matches_the_cpu_route() -> None:
    from torchnext.gemm.grouped import grouped_mm
    from torchnext.gemm.triton_grouped import grouped_mm_triton

    gen = torch.Generator().manual_seed(1)
    counts = torch.tensor([0, 300, 7, 0, 129, 64, 1, 500])
    offs = torch.cumsum(counts, 0).to(torch.int32)
    for dt in (torch.bfloat16, torch.float16, torch.float32):
        a = torch.randn(int(offs[-1]) + 5, 256, generator=gen).to(dt)
        b = torch.randn(len(counts), 256, 384, generator=gen).to(dt)
        got = grouped_mm_triton(a.cuda(), b.cuda(), offs.cuda()).cpu()
        want = grouped_mm(a, b, offs=offs)
        tol = 1e-4 if dt == torch.float32 else 2e-2
        torch.testing.assert_close(got.float(), want.float(), rtol=tol, atol=tol * 16)
        assert (got[int(offs[-1]) :] == 0).all()
