"""Control flow: the same 2.14 programs on native 2.14.1 and on 2.13 + torchnext.backport."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from collections.abc import Callable
from typing import Any

import torch

PRELUDE = """
import json, warnings
import torch
import torchnext.backport
torchnext.backport.install()
"""


def _run_here(program: str) -> Any:
    proc = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(program)],
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads([ln for ln in proc.stdout.splitlines() if ln.strip()][-1])


def _both(run_on_torch213: Callable[[str], Any], body: str) -> tuple[Any, Any]:
    program = PRELUDE + textwrap.dedent(body)
    return _run_here(program), run_on_torch213(program)


SWITCH_PROGRAM = """
from torch._higher_order_ops import switch
torch.manual_seed(0)
x = torch.randn(4)
branches = [lambda x, k=k: (x.sin() * (k + 1), k) for k in range(5)]
out = {}
for i in [-3, 0, 2, 4, 9]:
    y, k = switch(torch.tensor(i), branches, (x,))
    out[f"eager{i}"] = [y.tolist(), int(k)]
    out[f"int{i}"] = switch(i, branches, (x,))[0].tolist()
f = torch.compile(lambda i, x: switch(i, branches, (x,))[0], backend="eager", fullgraph=True)
out["compiled"] = [f(torch.tensor(i), x).tolist() for i in (-1, 1, 3, 7)]
class M(torch.nn.Module):
    def forward(self, i, x):
        return switch(i, [lambda x: x * 2, lambda x: x - 1, lambda x: x.exp()], (x,))
ep = torch.export.export(M(), (torch.tensor(1), x))
out["export"] = [ep.module()(torch.tensor(i), x).tolist() for i in (-2, 1, 5)]
a = torch.randn(3, requires_grad=True)
switch(torch.tensor(1), [lambda a: a * a, lambda a: a.sin()], (a,)).sum().backward()
out["grad"] = a.grad.tolist()
errors = {}
cases = {
    "dtype": [lambda x: x.sin(), lambda x: x.double()],
    "ndim": [lambda x: x.sin(), lambda x: x.sum()],
    "structure": [lambda x: (x.sin(),), lambda x: (x.cos(), x.cos())],
    "alias": [lambda x: x, lambda x: x.cos()],
}
for name, brs in cases.items():
    try:
        switch(torch.tensor(1), brs, (x,))
        errors[name] = None
    except Exception as e:
        errors[name] = [c.__name__ for c in type(e).__mro__ if c.__module__.startswith("torch")][:1]
for name, args in {"index": (torch.tensor([0, 1]), branches, (x,)), "empty": (torch.tensor(0), [], (x,)),
                   "noncall": (torch.tensor(0), [branches[0], 3], (x,)), "operand": (torch.tensor(0), branches, (x, 3))}.items():
    try:
        switch(*args)
    except RuntimeError as e:
        errors[name] = "RuntimeError"
out["errors"] = errors
print(json.dumps(out))
"""


def _close(a: Any, b: Any) -> None:
    torch.testing.assert_close(
        torch.tensor(a, dtype=torch.float64),
        torch.tensor(b, dtype=torch.float64),
        rtol=1e-5,
        atol=1e-6,
    )


def test_switch_same_results_and_error_types(run_on_torch213: Callable[[str], Any]) -> None:
    native, ours = _both(run_on_torch213, SWITCH_PROGRAM)
    assert native["errors"] == ours["errors"]
    for key in native:
        if key == "errors":
            continue
        if isinstance(native[key], list) and native[key] and isinstance(native[key][-1], int):
            assert native[key][1] == ours[key][1], key
            _close(native[key][0], ours[key][0])
        else:
            _close(native[key], ours[key])


def test_torchnext_switch_matches_native_switch_in_process() -> None:
    from torch._higher_order_ops import switch as native_switch

    from torchnext.control_flow import switch

    x = torch.randn(5)
    branches = [lambda x, k=k: x.cos() + k for k in range(6)]
    for i in (-2, 0, 3, 5, 11):
        torch.testing.assert_close(
            switch(torch.tensor(i), branches, (x,)), native_switch(torch.tensor(i), branches, (x,))
        )


def test_torchnext_switch_compiled_on_214_matches_native_with_gradients() -> None:
    # The flat op hooks into Dynamo and AOT internals; check it still holds on 2.14.
    from torch._higher_order_ops import switch as native_switch

    from torchnext.control_flow import switch

    w = torch.randn(6)
    branches = [lambda x: x + w, lambda x: x.sin(), lambda x: x * 3, lambda x: x.cos()]
    ours = torch.compile(
        lambda i, x: switch(i, branches, (x,)), backend="aot_eager", fullgraph=True
    )
    native = torch.compile(
        lambda i, x: native_switch(i, branches, (x,)), backend="aot_eager", fullgraph=True
    )
    x = torch.randn(6, requires_grad=True)
    for i in (-1, 1, 2, 7):
        got, want = ours(torch.tensor(i), x), native(torch.tensor(i), x)
        torch.testing.assert_close(got, want)
        torch.testing.assert_close(
            torch.autograd.grad(got.sum(), x), torch.autograd.grad(want.sum(), x)
        )


DYNAMIC_SPEC_PROGRAM = """
from torch.fx.experimental.dynamic_spec import ShapeVar, TensorSpec, ParamsSpec, STATIC, dynamic_spec
B = ShapeVar("B", min=2, max=64)
out = {}
def builtin(e):
    # torchnext's errors subclass the builtin type 2.14 raises; compare on that.
    return [c.__name__ for c in type(e).__mro__ if c.__module__ == "builtins"][0]
@dynamic_spec({"x": TensorSpec([B, STATIC])})
def f(x):
    return x.sin() * 2
calls = []
def backend(gm, example_inputs):
    calls.append(1)
    return gm
g = torch.compile(f, backend=backend)
out["values"] = [float(g(torch.ones(b, 3)).sum()) for b in (2, 5, 64)]
out["compiles"] = len(calls)
errors = {}
try:
    dynamic_spec({"x": TensorSpec([B])})(f)
except Exception as e:
    errors["stacked"] = builtin(e)
try:
    torch.compile(f, dynamic_shapes={"x": TensorSpec([B, STATIC])})
except Exception as e:
    errors["twice"] = builtin(e)
try:
    torch.compile(lambda x: x, dynamic=True, dynamic_shapes={"x": TensorSpec([B])})
except Exception as e:
    errors["dynamic_and_spec"] = builtin(e)
try:
    dynamic_spec(3)
except Exception as e:
    errors["bad_type"] = builtin(e)
out["errors"] = errors
class M(torch.nn.Module):
    def forward(self, x, y):
        return x.sum(1) + y[::2]
C = ShapeVar("C", min=2, max=128)
ep = torch.export.export(M(), (torch.ones(4, 3), torch.ones(8)),
                         dynamic_shapes=ParamsSpec({"x": TensorSpec([C, STATIC]), "y": TensorSpec([2 * C])}))
out["export_ranges"] = sorted([int(r.lower), int(r.upper)] for r in ep.range_constraints.values())
out["export_value"] = ep.module()(torch.ones(10, 3), torch.ones(20)).tolist()
try:
    torch.export.export(M(), (torch.ones(4, 3), torch.ones(8)), dynamic_shapes=ParamsSpec({"z": TensorSpec([C])}))
except Exception as e:
    errors["export_unknown_key"] = builtin(e)
from torch.fx.experimental.proxy_tensor import make_fx
gm = make_fx(f, tracing_mode="fake")(torch.ones(4, 3))
ph = [n.meta["val"] for n in gm.graph.nodes if n.op == "placeholder"][0]
out["make_fx_dynamic"] = [not isinstance(s, int) for s in ph.shape]
try:
    make_fx(lambda x: x, tracing_mode="symbolic", dynamic_shapes={"x": TensorSpec([B])})(torch.ones(2))
except Exception as e:
    errors["make_fx_mode"] = builtin(e)
out["errors"] = errors
print(json.dumps(out))
"""


def test_dynamic_spec_same_results_and_error_types(run_on_torch213: Callable[[str], Any]) -> None:
    native, ours = _both(run_on_torch213, DYNAMIC_SPEC_PROGRAM)
    assert native["compiles"] == ours["compiles"] == 1
    assert native["values"] == ours["values"]
    assert native["export_value"] == ours["export_value"]
    assert native["make_fx_dynamic"] == ours["make_fx_dynamic"] == [True, False]
    assert native["export_ranges"] == ours["export_ranges"]
    assert native["errors"] == ours["errors"]
    assert native["errors"]["stacked"] == "ValueError"


WHILE_PROGRAM = """
out = {}
i, x = torch.tensor(0), torch.zeros(3)
res = torch.while_loop(lambda i, x: i < 4, lambda i, x: (i + 1, x + i), (i, x))
out["result"] = [int(res[0]), res[1].tolist()]
errs = {}
for name, body in {"shape": lambda i, x: (i + 1, torch.cat([x, x])), "dtype": lambda i, x: (i + 1, x.double())}.items():
    try:
        torch.while_loop(lambda i, x: i < 3, body, (i, x))
    except Exception as e:
        errs[name] = [c.__name__ for c in type(e).__mro__ if c.__module__.startswith("torch")][:1]
out["errors"] = errs
print(json.dumps(out))
"""


def test_while_loop_same_results_and_error_types(run_on_torch213: Callable[[str], Any]) -> None:
    native, ours = _both(run_on_torch213, WHILE_PROGRAM)
    assert native == ours


def test_torchnext_while_loop_error_keeps_native_type_on_214() -> None:
    import pytest
    from torch._dynamo.exc import UncapturedHigherOrderOpError

    from torchnext.control_flow import while_loop

    with pytest.raises(UncapturedHigherOrderOpError, match=r"carried_inputs\[1\]"):
        while_loop(
            lambda i, x: i < 3,
            lambda i, x: (i + 1, torch.cat([x, x])),
            (torch.tensor(0), torch.zeros(3)),
        )


def test_report_is_json(run_on_torch213: Callable[[str], Any]) -> None:
    ours = run_on_torch213(PRELUDE + "print(json.dumps(torchnext.backport.report()))")
    native = _run_here(PRELUDE + "print(json.dumps(torchnext.backport.report()))")
    assert "torch._higher_order_ops.switch" in native["native"]
    assert "torch._higher_order_ops.switch" in ours["installed"]
    assert "torch.compile(dynamic_shapes=)" in ours["installed"]
    assert json.loads(json.dumps(native)) == native
