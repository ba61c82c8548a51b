"""The flat switch node: its op in every dispatch mode, its Dynamo capture, its Inductor code."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch._dynamo.exc import TorchRuntimeError, UncapturedHigherOrderOpError

from torchnext.control_flow import switch
from torchnext.control_flow._flat_switch import flat_switch, pick
from torchnext.errors import ControlFlowError

W = torch.randn(6)
V = torch.randn(6)
LINEAR = torch.nn.Linear(6, 6)
# Branches that close over different tensors and a module: Dynamo lifts a different set
# of inputs for each, and the node must hand every branch the same argument list.
FREEVAR_BRANCHES: list[Callable[[torch.Tensor], torch.Tensor]] = [
    lambda x: x + W,
    lambda x: x * V,
    lambda x: LINEAR(x),
    lambda x: x.cos(),
]


def _clamp(i: int, k: int) -> int:
    return max(0, min(i, k - 1))


def _compiled(fn: Callable[..., Any], backend: str, **kwargs: Any) -> Callable[..., Any]:
    torch._dynamo.reset()
    return torch.compile(fn, backend=backend, fullgraph=True, **kwargs)


@pytest.mark.parametrize(("index", "expected"), [(-3, 0), (0, 0), (1, 1), (2, 2), (9, 2)])
def test_op_in_eager_clamps(index: int, expected: int) -> None:
    branches = [lambda x, k=k: (x + k,) for k in range(3)]
    (out,) = flat_switch(torch.tensor(index), branches, (torch.zeros(2),))
    torch.testing.assert_close(out, torch.full((2,), float(expected)))


def test_pick_truncates_float_indices_like_214() -> None:
    assert pick(torch.tensor(1.9), 4) == 1
    assert pick(torch.tensor(-0.5), 4) == 0
    assert pick(torch.tensor(True), 4) == 1
    assert pick(7, 4) == 3


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
def test_capture_merges_different_lifted_inputs(backend: str) -> None:
    f = _compiled(lambda i, x: switch(i, FREEVAR_BRANCHES, (x,)), backend)
    x = torch.randn(6)
    for i in range(-1, 6):
        torch.testing.assert_close(f(torch.tensor(i), x), FREEVAR_BRANCHES[_clamp(i, 4)](x))


def test_capture_is_one_node_whose_branches_share_one_signature() -> None:
    graphs: list[torch.fx.GraphModule] = []

    def backend(gm: torch.fx.GraphModule, example_inputs: object) -> object:
        graphs.append(gm)
        return gm

    _compiled(lambda i, x: switch(i, FREEVAR_BRANCHES, (x,)), backend)(
        torch.tensor(1), torch.randn(6)
    )
    [gm] = graphs
    [node] = [n for n in gm.graph.nodes if n.target is flat_switch]
    _, branch_attrs, operands = node.args
    arity = {
        len(list(getattr(gm, a.target).graph.find_nodes(op="placeholder"))) for a in branch_attrs
    }
    assert arity == {len(operands)}
    # x, W, V and the Linear's weight and bias: each passed once, not once per branch.
    assert len(operands) == 5


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
def test_autograd_through_the_taken_branch(backend: str) -> None:
    a = torch.randn(5, requires_grad=True)
    b = torch.randn(5, requires_grad=True)
    branches = [lambda a, b: a * a, lambda a, b: (a * b).sin(), lambda a, b: b.exp()]
    f = _compiled(lambda i, a, b: switch(i, branches, (a, b)), backend)
    for i in range(3):
        got = torch.autograd.grad(f(torch.tensor(i), a, b).sum(), (a, b))
        # A branch that ignores an operand gives it a zero gradient, not None.
        want = torch.autograd.grad(
            branches[i](a, b).sum(), (a, b), allow_unused=True, materialize_grads=True
        )
        torch.testing.assert_close(got, want)


def test_autograd_reaches_parameters_a_branch_closes_over() -> None:
    f = _compiled(lambda i, x: switch(i, FREEVAR_BRANCHES, (x,)), "aot_eager")
    x = torch.randn(6)
    LINEAR.zero_grad()
    f(torch.tensor(2), x).sum().backward()
    assert LINEAR.weight.grad is not None
    torch.testing.assert_close(LINEAR.weight.grad, x.expand(6, 6))


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
def test_output_sizes_may_differ_between_branches(backend: str) -> None:
    branches = [lambda x: x.sin(), lambda x: x[:2].cos(), lambda x: x[:4] * 2]
    f = _compiled(lambda i, x: switch(i, branches, (x,)), backend)
    x = torch.randn(6)
    for i in range(3):
        torch.testing.assert_close(f(torch.tensor(i), x), branches[i](x))


def test_int_and_none_outputs() -> None:
    branches = [lambda x, k=k: (x + k, k * 10, None) for k in range(4)]
    x = torch.randn(3)
    with torch._dynamo.config.patch(capture_scalar_outputs=True):
        f = _compiled(lambda i, x: switch(i, branches, (x,)), "aot_eager")
        for i in range(4):
            out, n, none = f(torch.tensor(i), x)
            assert (n, none) == (10 * i, None)
            torch.testing.assert_close(out, x + i)


def test_symint_index_from_a_shape() -> None:
    f = _compiled(
        lambda x: switch(x.shape[0] - 3, FREEVAR_BRANCHES, (x[:6],)), "aot_eager", dynamic=True
    )
    for n in (6, 7, 8, 9, 12):
        y = torch.randn(n)
        torch.testing.assert_close(f(y), FREEVAR_BRANCHES[_clamp(n - 3, 4)](y[:6]))


@pytest.mark.parametrize(
    ("branches", "error", "match"),
    [
        (
            [lambda x: x.sin(), lambda x: x.add_(1), lambda x: x.cos()],
            UncapturedHigherOrderOpError,
            "mutat",
        ),
        (
            [lambda x: x.sin(), lambda x: x[:3], lambda x: x.cos()],
            UncapturedHigherOrderOpError,
            "aliasing",
        ),
        (
            [lambda x: x.sin(), lambda x: x.double(), lambda x: x.cos()],
            TorchRuntimeError,
            "float64",
        ),
        (
            [lambda x: x.sin(), lambda x: (x.sin(), x.cos()), lambda x: x.cos()],
            TorchRuntimeError,
            "branch1 returns",
        ),
    ],
)
def test_bad_branches_fail_at_compile_time(branches: list, error: type, match: str) -> None:
    f = _compiled(lambda i, x: switch(i, branches, (x,)), "eager")
    x = torch.randn(6)
    with pytest.raises(error, match=match):
        f(torch.tensor(1), x)


def test_make_fx_and_functionalize_trace_the_op() -> None:
    from torch.fx.experimental.proxy_tensor import make_fx

    def scale(k: int) -> Callable[[torch.Tensor], tuple[torch.Tensor]]:
        return lambda x: (x * (k + 1),)

    branches = [scale(k) for k in range(4)]

    def f(i: torch.Tensor, x: torch.Tensor) -> Any:
        return flat_switch(i, branches, (x,))

    for traced in (f, torch.func.functionalize(f)):
        gm = make_fx(traced)(torch.tensor(1), torch.randn(3))
        [node] = [n for n in gm.graph.nodes if n.target is flat_switch]
        assert len(node.args[1]) == 4
        x = torch.randn(3)
        torch.testing.assert_close(gm(torch.tensor(3), x)[0], x * 4)


def _inductor_code(fn: Callable[..., Any], *args: Any) -> tuple[Any, str]:
    from torch._inductor.utils import run_and_get_code

    torch._dynamo.reset()
    out, codes = run_and_get_code(torch.compile(fn, fullgraph=True), *args)
    return out, codes[-1]


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # Inductor's own imports warn
def test_inductor_dispatches_once_whatever_k() -> None:
    branches = [lambda x, k=k: (x * (k + 1)).sin() + k for k in range(9)]
    x = torch.randn(16)
    out, code = _inductor_code(lambda i, x: switch(i, branches, (x,)), torch.tensor(4), x)
    torch.testing.assert_close(out, branches[4](x))
    call = code[code.index("def call(") :]
    # One host read of the index and no per-level predicate kernels.
    assert len(re.findall(r"\.item\(\)", call)) == 1
    assert "_lt_" not in code
    assert len(re.findall(r"elif buf\d+_index == \d+:", call)) == len(branches) - 2


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # Inductor's own imports warn
def test_inductor_freevars_autograd_sizes_and_symint_index() -> None:
    torch._dynamo.reset()
    f = torch.compile(lambda i, x: switch(i, FREEVAR_BRANCHES, (x,)), fullgraph=True)
    x = torch.randn(6, requires_grad=True)
    for i in (-1, 0, 1, 2, 3, 8):
        got = torch.autograd.grad(f(torch.tensor(i), x).sum(), x)
        want = torch.autograd.grad(FREEVAR_BRANCHES[_clamp(i, 4)](x).sum(), x)
        torch.testing.assert_close(got, want)
    sized = [lambda x: x.sin(), lambda x: x[:2].cos(), lambda x: x[:4] * 2]
    g = torch.compile(lambda i, x: switch(i, sized, (x,)), fullgraph=True)
    y = torch.randn(6)
    for i in range(3):
        torch.testing.assert_close(g(torch.tensor(i), y), sized[i](y))
    h = torch.compile(
        lambda x: switch(x.shape[0] - 3, FREEVAR_BRANCHES, (x[:6],)), fullgraph=True, dynamic=True
    )
    for n in (6, 8, 12):
        z = torch.randn(n)
        torch.testing.assert_close(h(z), FREEVAR_BRANCHES[_clamp(n - 3, 4)](z[:6]))


@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # Inductor's own imports warn
def test_cpp_wrapper_is_refused_with_the_way_out() -> None:
    import torch._inductor.config as inductor_config

    branches = [lambda x, k=k: x + k for k in range(3)]
    torch._dynamo.reset()
    f = torch.compile(lambda i, x: switch(i, branches, (x,)), fullgraph=True)
    with inductor_config.patch(cpp_wrapper=True), pytest.raises(Exception) as info:
        f(torch.tensor(1), torch.randn(3))
    assert "TORCHNEXT_SWITCH_FLAT=0" in str(info.value)
    assert isinstance(info.value.__cause__ or info.value, (ControlFlowError, RuntimeError))


def test_eager_calls_run_the_flat_op_from_three_branches(monkeypatch: pytest.MonkeyPatch) -> None:
    import torchnext.control_flow._flat_switch as flat_module

    picks: list[int] = []

    def counting_pick(index: Any, n_branches: int) -> int:
        picks.append(n_branches)
        return pick(index, n_branches)

    monkeypatch.setattr(flat_module, "pick", counting_pick)
    branches = [lambda x, k=k: x + k for k in range(5)]
    x = torch.randn(3)
    for i in (-1, 2, 9):
        torch.testing.assert_close(switch(torch.tensor(i), branches, (x,)), x + _clamp(i, 5))
    assert picks == [5, 5, 5]
    # Two branches are one cond; vmap keeps the cond tree (cond has a batching rule).
    switch(torch.tensor(1), branches[:2], (x,))
    torch.vmap(lambda x: switch(torch.tensor(3), branches, (x,)))(torch.randn(2, 3))
    assert picks == [5, 5, 5]


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
def test_vmap_under_compile_with_shared_and_per_example_index(backend: str) -> None:
    branches = [lambda x, k=k: x.sin() * (k + 1) for k in range(5)]
    xs = torch.randn(4, 3)
    shared = _compiled(torch.vmap(lambda x: switch(torch.tensor(3), branches, (x,))), backend)
    torch.testing.assert_close(shared(xs), branches[3](xs))
    per_example = _compiled(
        lambda i, xs: torch.vmap(lambda i, x: switch(i, branches, (x,)))(i, xs), backend
    )
    idx = torch.tensor([-2, 2, 4, 9])
    want = torch.stack([branches[_clamp(int(i), 5)](x) for i, x in zip(idx, xs, strict=True)])
    torch.testing.assert_close(per_example(idx, xs), want)


def test_op_under_vmap_picks_per_example_and_truncates_floats() -> None:
    branches = [lambda x, k=k: (x + 10 * k, x * k) for k in range(3)]
    xs = torch.randn(5, 2)
    idx = torch.tensor([-1.0, 0.9, 1.7, 2.0, 5.5])
    plus, times = torch.vmap(lambda i, x: flat_switch(i, branches, (x,)))(idx, xs)
    for row, i in enumerate(idx.tolist()):
        k = _clamp(int(i), 3)
        torch.testing.assert_close(plus[row], xs[row] + 10 * k)
        torch.testing.assert_close(times[row], xs[row] * k)


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # Inductor's own imports warn
def test_inductor_graph_cache_hits_and_tells_branches_apart(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    import torch._inductor.config as inductor_config
    from torch._dynamo.utils import counters

    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path))
    x = torch.randn(8)

    def run(branches: list[Callable[[torch.Tensor], torch.Tensor]]) -> None:
        torch._dynamo.reset()
        f = torch.compile(lambda i, x: switch(i, branches, (x,)), fullgraph=True)
        for i in (-1, 1, 2, 7):
            torch.testing.assert_close(f(torch.tensor(i), x), branches[_clamp(i, 3)](x))

    sines = [lambda x, k=k: (x * (k + 1)).sin() for k in range(3)]
    cosines = [lambda x, k=k: (x * (k + 1)).cos() for k in range(3)]
    counters.clear()
    with inductor_config.patch(fx_graph_cache=True):
        run(sines)
        run(sines)
        run(cosines)  # same structure, other branch bodies: must not reuse the entry
    assert counters["inductor"]["fxgraph_cache_hit"] == 1
    assert counters["inductor"]["fxgraph_cache_miss"] == 2


def test_a_torch_without_the_internals_gets_the_cond_tree(monkeypatch: pytest.MonkeyPatch) -> None:
    from torchnext.control_flow import _flat_switch_compile

    monkeypatch.setattr(_flat_switch_compile, "supported", lambda: False)
    graphs: list[torch.fx.GraphModule] = []

    def backend(gm: torch.fx.GraphModule, example_inputs: object) -> object:
        graphs.append(gm)
        return gm

    f = _compiled(lambda i, x: switch(i, FREEVAR_BRANCHES, (x,)), backend)
    x = torch.randn(6)
    for i in (-1, 2, 5):
        torch.testing.assert_close(f(torch.tensor(i), x), FREEVAR_BRANCHES[_clamp(i, 4)](x))
    nodes = [
        n
        for g in graphs
        for m in g.modules()
        if isinstance(m, torch.fx.GraphModule)
        for n in m.graph.nodes
    ]
    assert not any(n.target is flat_switch for n in nodes)
    assert sum(n.target is torch.ops.higher_order.cond for n in nodes) == 3


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
def test_nested_control_flow_and_zero_operands(backend: str) -> None:
    inner = [lambda x, k=k: x * (k + 2) for k in range(3)]
    outer = [
        lambda x: switch(torch.tensor(1), inner, (x,)) + 1,  # a flat switch inside one
        lambda x: x.sin(),
        lambda x: torch.cond(x.sum() > 0, lambda x: x.cos(), lambda x: x.tan(), (x,)),
    ]
    x = torch.randn(4)
    expected = [x * 3 + 1, x.sin(), x.cos() if x.sum() > 0 else x.tan()]
    f = _compiled(lambda i, x: switch(i, outer, (x,)), backend)
    for i in (0, 1, 2, 5):
        torch.testing.assert_close(f(torch.tensor(i), x), expected[_clamp(i, 3)])

    def constant(k: int) -> Callable[[], torch.Tensor]:
        return lambda: torch.full((3,), float(k))

    constants = [constant(k) for k in range(3)]
    g = _compiled(lambda i: switch(i, constants, ()), backend)
    for i in (-1, 1, 2):
        torch.testing.assert_close(g(torch.tensor(i)), torch.full((3,), float(_clamp(i, 3))))
