"""switch: 2.14 semantics in eager, compile, export (save/load), make_fx, autograd, vmap."""

from __future__ import annotations

import io
import warnings

import pytest
import torch
from torch._dynamo.exc import TorchRuntimeError, UncapturedHigherOrderOpError

from torchnext.control_flow import switch
from torchnext.control_flow._flat_switch import flat_switch
from torchnext.errors import ControlFlowError, TorchnextError

BRANCHES = [lambda x, k=k: x.sin() * (k + 1) for k in range(5)]


def _expected(i: int, x: torch.Tensor) -> torch.Tensor:
    return BRANCHES[max(0, min(i, len(BRANCHES) - 1))](x)


@pytest.mark.parametrize("i", [-4, -1, 0, 1, 2, 3, 4, 5, 100])
def test_tensor_index_clamps_into_range(i: int) -> None:
    x = torch.randn(3)
    torch.testing.assert_close(switch(torch.tensor(i), BRANCHES, (x,)), _expected(i, x))


@pytest.mark.parametrize("i", [-2, 0, 3, 9])
def test_python_int_index_clamps_and_does_not_trace(i: int) -> None:
    x = torch.randn(3)
    # Mismatched branches are fine with an int index in eager (2.14: not traced).
    branches = [lambda x: x.sin(), lambda x: x.double(), lambda x: (x, x)]
    out = switch(i, branches, (x,))
    j = max(0, min(i, 2))
    expected = branches[j](x)
    assert type(out) is type(expected)


def test_float_and_bool_tensor_indices_truncate_like_214() -> None:
    x = torch.randn(3)
    torch.testing.assert_close(switch(torch.tensor(1.7), BRANCHES, (x,)), BRANCHES[1](x))
    torch.testing.assert_close(switch(torch.tensor(True), BRANCHES, (x,)), BRANCHES[1](x))
    torch.testing.assert_close(switch(torch.tensor(-0.5), BRANCHES, (x,)), BRANCHES[0](x))


def test_pytree_operands_and_int_outputs() -> None:
    ops = {"a": torch.ones(2), "b": torch.full((2,), 3.0)}
    branches = [lambda d: (d["a"] + d["b"], 1), lambda d: (d["a"] * d["b"], 2)]
    out, n = switch(torch.tensor(1), branches, (ops,))
    torch.testing.assert_close(out, torch.full((2,), 3.0))
    assert n == 2


def test_int_outputs_through_nested_branches() -> None:
    x = torch.randn(3)
    branches = [lambda x, k=k: (x + k, k * 10) for k in range(5)]
    for i in (-1, 2, 4, 9):
        out, n = switch(torch.tensor(i), branches, (x,))
        j = max(0, min(i, 4))
        assert n == j * 10 and type(n) is int
        torch.testing.assert_close(out, x + j)


@pytest.mark.parametrize("k", [2, 3])
def test_none_outputs_are_allowed(k: int) -> None:
    x = torch.randn(3)
    out, nothing = switch(torch.tensor(1), [lambda x: (x + 1, None)] * k, (x,))
    assert nothing is None
    torch.testing.assert_close(out, x + 1)


def test_single_branch_and_zero_operands() -> None:
    assert switch(torch.tensor(7), [lambda: torch.ones(1)]).item() == 1.0
    out = switch(torch.tensor(1), [lambda: torch.zeros(2), lambda: torch.ones(2)])
    torch.testing.assert_close(out, torch.ones(2))


@pytest.mark.parametrize(
    ("index", "branches", "operands", "match"),
    [
        (torch.tensor([0, 1]), BRANCHES, (torch.ones(1),), "single-element tensor"),
        (1.0, BRANCHES, (torch.ones(1),), "single-element tensor"),
        (torch.tensor(0), [], (torch.ones(1),), "non-empty"),
        (torch.tensor(0), [BRANCHES[0], 3], (torch.ones(1),), "branch1 is not callable"),
        (torch.tensor(0), BRANCHES, (torch.ones(1), 3), "operand leaves must be a Tensor"),
    ],
)
def test_bad_arguments_raise_runtime_error_before_running(
    index: object, branches: object, operands: object, match: str
) -> None:
    with pytest.raises(ControlFlowError, match=match) as info:
        switch(index, branches, operands)  # type: ignore[arg-type]
    assert isinstance(info.value, RuntimeError)


@pytest.mark.parametrize(
    ("branches", "error", "match"),
    [
        ([lambda x: x.sin(), lambda x: x.double()], TorchRuntimeError, "branch1 .*float64"),
        (  # three branches: the flat op's path names the branch too
            [lambda x: x.sin(), lambda x: x.cos(), lambda x: x.double()],
            TorchRuntimeError,
            "branch2 .*float64",
        ),
        ([lambda x: x.sin(), lambda x: x.sum()], TorchRuntimeError, "branch1 .*0d"),
        (
            [lambda x: (x.sin(),), lambda x: (x.cos(), x.cos())],
            UncapturedHigherOrderOpError,
            "branch1 returns",
        ),
        ([lambda x: x, lambda x: x.cos()], UncapturedHigherOrderOpError, "branch0: .*aliasing"),
        (
            [lambda x: (x.sin(), 1.0), lambda x: (x.cos(), 2.0)],
            UncapturedHigherOrderOpError,
            "branch0: output 1 is a float",
        ),
    ],
)
def test_mismatched_branches_raise_214_types_naming_the_branch(
    branches: list, error: type, match: str
) -> None:
    with pytest.raises(error, match=match) as info:
        switch(torch.tensor(1), branches, (torch.randn(3),))
    assert isinstance(info.value, TorchnextError)


def test_sizes_may_differ_between_branches() -> None:
    x = torch.randn(3)
    out = switch(torch.tensor(1), [lambda x: x.sin(), lambda x: x[:2].cos()], (x,))
    assert out.shape == (2,)


class _Counter:
    def __init__(self) -> None:
        self.graphs: list[torch.fx.GraphModule] = []

    def __call__(self, gm: torch.fx.GraphModule, example_inputs: object) -> object:
        self.graphs.append(gm)
        return gm


def _count_conds(gm: torch.fx.GraphModule) -> int:
    return sum(
        1
        for mod in gm.modules()
        if isinstance(mod, torch.fx.GraphModule)
        for n in mod.graph.nodes
        if n.op == "call_function" and n.target is torch.ops.higher_order.cond
    )


def _captured_graph() -> torch.fx.GraphModule:
    """Compile switch over BRANCHES, check every index, return the one captured graph."""
    torch._dynamo.reset()
    counter = _Counter()
    f = torch.compile(lambda i, x: switch(i, BRANCHES, (x,)), backend=counter, fullgraph=True)
    x = torch.randn(4)
    for i in range(-1, 7):
        torch.testing.assert_close(f(torch.tensor(i), x), _expected(i, x))
    assert len(counter.graphs) == 1
    return counter.graphs[0]


def test_compile_fullgraph_one_graph_with_every_branch() -> None:
    gm = _captured_graph()
    [node] = [n for n in gm.graph.nodes if n.target is flat_switch]
    assert len(node.args[1]) == len(BRANCHES)
    assert _count_conds(gm) == 0


def test_compile_keeps_the_cond_tree_when_flat_is_switched_off(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("TORCHNEXT_SWITCH_FLAT", "0")
    gm = _captured_graph()
    assert _count_conds(gm) == len(BRANCHES) - 1
    assert not any(n.target is flat_switch for n in gm.graph.nodes)


def test_compile_with_two_branches_is_one_cond() -> None:
    torch._dynamo.reset()
    counter = _Counter()
    f = torch.compile(lambda i, x: switch(i, BRANCHES[:2], (x,)), backend=counter, fullgraph=True)
    x = torch.randn(4)
    torch.testing.assert_close(f(torch.tensor(5), x), BRANCHES[1](x))
    assert _count_conds(counter.graphs[0]) == 1


def test_compile_with_python_int_index_specialises_with_214_warning() -> None:
    torch._dynamo.reset()
    f = torch.compile(lambda x: switch(3, BRANCHES, (x,)), backend="eager", fullgraph=True)
    x = torch.randn(2)
    with pytest.warns(UserWarning, match="Index is a Python constant"):
        out = f(x)
    torch.testing.assert_close(out, BRANCHES[3](x))


class _M(torch.nn.Module):
    def forward(self, i: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        return switch(i, BRANCHES, (x,))


@pytest.mark.parametrize("strict", [False, True])
def test_export_keeps_every_branch_and_saves_and_loads(strict: bool) -> None:
    x = torch.randn(3)
    ep = torch.export.export(_M(), (torch.tensor(1), x), strict=strict)
    assert _count_conds(ep.graph_module) == len(BRANCHES) - 1
    buf = io.BytesIO()
    torch.export.save(ep, buf)
    buf.seek(0)
    loaded = torch.export.load(buf)
    for i in (-3, 0, 2, 4, 8):
        torch.testing.assert_close(loaded.module()(torch.tensor(i), x), _expected(i, x))


def test_export_with_symint_index_from_a_shape() -> None:
    class M(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return switch(x.shape[0], [lambda x: x * 0, lambda x: x + 1, lambda x: x * 2], (x,))

    batch = torch.export.Dim("batch", min=1, max=16)
    ep = torch.export.export(M(), (torch.ones(2),), dynamic_shapes={"x": {0: batch}})
    torch.testing.assert_close(ep.module()(torch.ones(1)), torch.full((1,), 2.0))
    torch.testing.assert_close(ep.module()(torch.ones(5)), torch.full((5,), 2.0))


def test_make_fx_traces_every_branch() -> None:
    from torch.fx.experimental.proxy_tensor import make_fx

    gm = make_fx(lambda i, x: switch(i, BRANCHES, (x,)))(torch.tensor(1), torch.randn(3))
    assert _count_conds(gm) == len(BRANCHES) - 1


def test_autograd_flows_through_the_taken_branch_only() -> None:
    a = torch.randn(3, requires_grad=True)
    branches = [lambda a: a * a, lambda a: a.sin(), lambda a: a.exp()]
    for i, expected in ((0, 2 * a.detach()), (1, a.detach().cos()), (7, a.detach().exp())):
        a.grad = None
        switch(torch.tensor(i), branches, (a,)).sum().backward()
        torch.testing.assert_close(a.grad, expected)


def test_vmap_over_operands_works_beyond_214() -> None:
    xs = torch.randn(4, 3)
    out = torch.vmap(lambda x: switch(torch.tensor(1), BRANCHES, (x,)))(xs)
    torch.testing.assert_close(out, BRANCHES[1](xs))


def test_repeated_eager_calls_reuse_the_trace() -> None:
    x = torch.randn(3)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for i in range(4):
            torch.testing.assert_close(switch(torch.tensor(i), BRANCHES, (x,)), _expected(i, x))


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # Inductor's own imports warn
def test_inductor_matches_eager() -> None:
    torch._dynamo.reset()
    f = torch.compile(lambda i, x: switch(i, BRANCHES[:3], (x,)), fullgraph=True)
    x = torch.randn(8)
    for i in (-1, 1, 5):
        torch.testing.assert_close(f(torch.tensor(i), x), BRANCHES[max(0, min(i, 2))](x))


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # Inductor's own imports warn
def test_inductor_picks_every_branch() -> None:
    # Every branch, both clamps and a truncated float index must land where eager puts
    # them (seven branches: the flat node, or a three-level tree with the flat path off).
    branches = [lambda x, k=k: x * (k + 1) + k for k in range(7)]
    torch._dynamo.reset()
    f = torch.compile(lambda i, x: switch(i, branches, (x,)), fullgraph=True)
    x = torch.randn(8)
    for i in (-3, 0, 1, 2, 3, 4, 5, 6, 40):
        torch.testing.assert_close(f(torch.tensor(i), x), branches[max(0, min(i, 6))](x))
    g = torch.compile(lambda i, x: switch(i, branches, (x,)), fullgraph=True)
    torch.testing.assert_close(g(torch.tensor(4.9), x), branches[4](x))
