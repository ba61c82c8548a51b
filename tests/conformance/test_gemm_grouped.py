"""torchnext.gemm.grouped_mm on torch 2.13 against torch 2.14.1's native F.grouped_mm (CPU).

The inputs are made here (2.14.1) and shipped to the 2.13 program as JSON, so both sides
see bit-identical operands. Where 2.14.1 runs a case, torchnext must give the same shape
and dtype and the same values within float32-accumulation tolerance; rows (columns) past
``offs[-1]``, which 2.14.1 leaves uninitialised, must be zero on torchnext's side. Where
2.14.1 raises for malformed input, torchnext must raise its GEMM error naming the same
argument. Three kinds of case differ on purpose and are checked as such:

* offsets that decrease or pass the end: 2.14.1 does not check them and returns whatever
  its loop of ``mm`` leaves; torchnext raises ``GemmInputError`` (never a silent result);
* extensions, where 2.14.1 raises "not supported yet" (bias, float32 output of 16-bit
  inputs, float64, any strides, non-contiguous offsets): torchnext runs them, and its
  result equals the reference built from 2.14.1's own runs;
* the error *class*: 2.14.1 raises ``RuntimeError``; torchnext raises ``GemmInputError``
  (a ``ValueError``) or ``GemmUnsupportedError`` (a ``NotImplementedError``, itself a
  ``RuntimeError``).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F


def _enc(t: torch.Tensor | None) -> Any:
    if t is None:
        return None
    return {"v": t.double().tolist(), "dtype": str(t.dtype), "t": False}


def _enc_t(w: torch.Tensor) -> Any:
    """``w.transpose(-2, -1)`` (column-major), shipped as ``w``; decoding transposes back."""
    return {"v": w.double().tolist(), "dtype": str(w.dtype), "t": True}


def _dec(o: Any) -> torch.Tensor | None:
    if o is None:
        return None
    t = torch.tensor(o["v"], dtype=torch.float64).to(getattr(torch, o["dtype"].split(".")[-1]))
    return t.transpose(-2, -1) if o["t"] else t


def _offs(*ends: int) -> torch.Tensor:
    return torch.tensor(ends, dtype=torch.int32)


_PROGRAM = """
import json, torch
from torchnext.gemm.grouped import grouped_mm
from torchnext.errors import GemmInputError, GemmUnsupportedError
with open({path!r}) as f:
    cases = json.load(f)
def dec(o):
    if o is None:
        return None
    t = torch.tensor(o["v"], dtype=torch.float64).to(getattr(torch, o["dtype"].split(".")[-1]))
    return t.transpose(-2, -1) if o["t"] else t
out = []
for c in cases:
    kw = dict(offs=dec(c["offs"]), bias=dec(c["bias"]))
    if c["offs_stride2"]:
        kw["offs"] = torch.stack([kw["offs"], kw["offs"]], 1)[:, 0]
    if c["out_dtype"]:
        kw["out_dtype"] = getattr(torch, c["out_dtype"])
    try:
        r = grouped_mm(dec(c["a"]), dec(c["b"]), **kw)
        out.append(dict(ok=True, v=r.double().tolist(), shape=list(r.shape), dtype=str(r.dtype)))
    except (GemmInputError, GemmUnsupportedError) as e:
        out.append(dict(ok=False, kind=type(e).__name__, msg=str(e)))
print(json.dumps(out))
"""


def _cases() -> list[dict[str, Any]]:
    gen = torch.Generator().manual_seed(0)

    def r(*shape: int, dt: torch.dtype = torch.float32) -> torch.Tensor:
        return torch.randn(*shape, generator=gen).to(dt)

    cases: list[dict[str, Any]] = []

    def add(
        name: str,
        a: torch.Tensor,
        b: Any,
        *,
        kind: str = "same",
        arg: str = "",
        offs: torch.Tensor | None = None,
        bias: torch.Tensor | None = None,
        out_dtype: str = "",
        offs_stride2: bool = False,
    ) -> None:
        cases.append(dict(name=name, a=_enc(a), b=b if isinstance(b, dict) else _enc(b),
                          offs=_enc(offs), bias=_enc(bias), out_dtype=out_dtype, kind=kind,
                          arg=arg, offs_stride2=offs_stride2))  # fmt: skip

    for dt in (torch.float32, torch.bfloat16, torch.float16):
        add(f"2d3d {dt}", r(40, 16, dt=dt), r(4, 16, 24, dt=dt), offs=_offs(5, 5, 21, 33))
        add(f"3d3d {dt}", r(3, 12, 16, dt=dt), r(3, 16, 24, dt=dt))
        add(f"2d2d {dt}", r(12, 40, dt=dt), r(40, 24, dt=dt), offs=_offs(8, 8, 24, 32))
        add(f"3d2d {dt}", r(4, 12, 16, dt=dt), r(16, 48, dt=dt), offs=_offs(8, 8, 16, 40))
    add("col-major B", r(40, 16), _enc_t(r(4, 24, 16)), offs=_offs(10, 10, 30, 40))
    add("all empty", r(16, 16), r(2, 16, 8), offs=_offs(0, 0))
    # Malformed: both raise; torchnext names the argument.
    add("int64 offs", r(40, 16), r(4, 16, 24), kind="error", arg="offs.dtype",
        offs=_offs(5, 5, 21, 33).long())  # fmt: skip
    add("2-D offs", r(40, 16), r(4, 16, 24), kind="error", arg="offs.dim()",
        offs=_offs(5, 5, 21, 33).view(2, 2))  # fmt: skip
    add("offs length", r(40, 16), r(4, 16, 24), kind="error", arg="offs.shape[0]",
        offs=_offs(5, 21, 33))  # fmt: skip
    add("no offs", r(40, 16), r(4, 16, 24), kind="error", arg="offs")
    add(
        "offs for 3d3d",
        r(4, 12, 16),
        r(4, 16, 24),
        kind="error",
        arg="offs",
        offs=_offs(1, 2, 3, 4),
    )
    add(
        "contraction",
        r(40, 16),
        r(4, 24, 16),
        kind="error",
        arg="mat_b.shape",
        offs=_offs(1, 2, 3, 4),
    )
    add("batch", r(3, 12, 16), r(4, 16, 24), kind="error", arg="mat_b.shape[0]")
    add("mixed dtypes", r(40, 16), r(4, 16, 24, dt=torch.bfloat16), kind="error",
        arg="mat_b.dtype", offs=_offs(5, 5, 21, 33))  # fmt: skip
    add("int dtype", r(40, 16).int(), r(4, 16, 24).int(), kind="error", arg="mat_a.dtype",
        offs=_offs(5, 5, 21, 33))  # fmt: skip
    add("f32 to f16", r(40, 16), r(4, 16, 24), kind="error", arg="out_dtype",
        offs=_offs(5, 5, 21, 33), out_dtype="float16")  # fmt: skip
    # Unchecked by 2.14.1 (silent); torchnext raises.
    add("decreasing offs", r(40, 16), r(4, 16, 24), kind="unchecked", arg="offs[1]",
        offs=_offs(21, 5, 30, 33))  # fmt: skip
    add("offs past M", r(40, 16), r(4, 16, 24), kind="unchecked", arg="offs[-1]",
        offs=_offs(5, 5, 21, 48))  # fmt: skip
    # Extensions: 2.14.1 raises; torchnext runs (checked against 2.14.1's own pieces).
    add("bias", r(40, 16), r(4, 16, 24), kind="bias", offs=_offs(5, 5, 21, 33), bias=r(4, 24))
    add("bf16 to f32", r(40, 16, dt=torch.bfloat16), r(4, 16, 24, dt=torch.bfloat16),
        kind="wide", offs=_offs(5, 5, 21, 33), out_dtype="float32")  # fmt: skip
    add("float64", r(40, 16, dt=torch.float64), r(4, 16, 24, dt=torch.float64), kind="f64",
        offs=_offs(5, 5, 21, 33))  # fmt: skip
    add("odd strides", r(40, 7), r(4, 7, 5), kind="odd", offs=_offs(5, 5, 21, 33))
    add("offs stride 2", r(40, 16), r(4, 16, 24), kind="stride", offs=_offs(5, 5, 21, 33),
        offs_stride2=True)  # fmt: skip
    return cases


def _native(case: dict[str, Any]) -> tuple[torch.Tensor | None, str]:
    a, b, offs, bias = (_dec(case[k]) for k in ("a", "b", "offs", "bias"))
    kw: dict[str, Any] = {"offs": offs, "bias": bias}
    if case["offs_stride2"]:
        kw["offs"] = torch.stack([offs, offs], 1)[:, 0]  # type: ignore[list-item]
    if case["out_dtype"]:
        kw["out_dtype"] = getattr(torch, case["out_dtype"])
    try:
        return F.grouped_mm(a, b, **kw), ""  # type: ignore[arg-type]
    except RuntimeError as e:
        return None, str(e)


def _used(case: dict[str, Any], t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The part 2.14.1 defines, and the tail torchnext must zero (None: no tail)."""
    a, b, offs = (_dec(case[k]) for k in ("a", "b", "offs"))
    assert a is not None and b is not None
    if offs is None or a.dim() == b.dim():
        return t, None
    end = int(offs[-1]) if offs.numel() else 0
    if a.dim() == 2:
        return t[:end], t[end:]
    return t[:, :end], t[:, end:]


def _tolerance(dtype: torch.dtype, scale: float) -> float:
    unit = {torch.float32: 2e-6, torch.bfloat16: 2**-7, torch.float16: 2**-10}
    return unit.get(dtype, 1e-12) * max(1.0, scale) * 4


def _expected_extension(case: dict[str, Any]) -> torch.Tensor:
    """What 2.14.1 gives for an extension case, built from calls it does run."""
    a, b, offs, bias = (_dec(case[k]) for k in ("a", "b", "offs", "bias"))
    assert a is not None and b is not None and offs is not None
    kind = case["kind"]
    if kind == "odd":  # 2.14.1 needs 16-byte strides: run it on zero-padded copies
        pa, pb = torch.zeros(a.shape[0], 8), torch.zeros(b.shape[0], 8, 8)
        pa[:, :7], pb[:, :7, :5] = a, b
        return F.grouped_mm(pa, pb, offs=offs)[:, :5].double()
    if kind in ("f64", "wide"):
        return F.grouped_mm(a.float(), b.float(), offs=offs).double()
    if kind == "bias":
        assert bias is not None
        out = F.grouped_mm(a, b, offs=offs).double()
        start = 0
        for g, end in enumerate(offs.tolist()):
            out[start:end] += bias[g].double()
            start = end
        return out
    return F.grouped_mm(a, b, offs=offs).double()  # "stride": the contiguous offsets' result


def test_grouped_mm_conforms_to_native_214(
    run_on_torch213: Callable[[str], Any], tmp_path: Path
) -> None:
    cases = _cases()
    payload = tmp_path / "cases.json"  # too large for a command line
    payload.write_text(json.dumps(cases))
    ours = run_on_torch213(_PROGRAM.format(path=str(payload)))
    assert len(ours) == len(cases)
    for case, mine in zip(cases, ours, strict=True):
        name, kind = case["name"], case["kind"]
        theirs, message = _native(case)
        if kind == "same":
            assert theirs is not None, f"{name}: 2.14.1 raised {message}"
            assert mine["ok"], f"{name}: torchnext raised {mine.get('msg')}"
            got = torch.tensor(mine["v"], dtype=torch.float64).reshape(mine["shape"])
            assert list(theirs.shape) == mine["shape"], name
            assert str(theirs.dtype) == mine["dtype"], name
            want_used, _ = _used(case, theirs.double())
            got_used, tail = _used(case, got)
            scale = want_used.abs().max().item() if want_used.numel() else 1.0
            err = (got_used - want_used).abs().max().item() if got_used.numel() else 0.0
            assert err <= _tolerance(theirs.dtype, scale), (name, err)
            assert tail is None or bool((tail == 0).all()), f"{name}: tail not zero"
        elif kind in ("error", "unchecked"):
            if kind == "error":
                assert theirs is None, f"{name}: 2.14.1 ran a case torchnext calls malformed"
            assert not mine["ok"], f"{name}: torchnext ran it"
            assert mine["msg"].startswith(f"grouped_mm: {case['arg']}"), (name, mine["msg"])
        else:
            assert theirs is None, f"{name}: 2.14.1 now runs this extension; compare directly"
            assert mine["ok"], f"{name}: torchnext raised {mine.get('msg')}"
            got = torch.tensor(mine["v"], dtype=torch.float64).reshape(mine["shape"])
            want = _expected_extension(case)
            assert got.shape == want.shape, name
            (want_used, _), (got_used, tail) = _used(case, want), _used(case, got)
            # The references run in float32 on 2.14.1, so float32's tolerance applies.
            tol = _tolerance(torch.float32, want_used.abs().max().item())
            assert (got_used - want_used).abs().max().item() <= tol, name
            assert tail is None or bool((tail == 0).all()), f"{name}: tail not zero"
