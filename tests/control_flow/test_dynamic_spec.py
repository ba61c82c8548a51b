"""dynamic_spec: one spec for compile, export and make_fx on torch 2.13; 2.14's errors."""

from __future__ import annotations

import pytest
import torch

from torchnext.control_flow import (
    STATIC,
    ParamsSpec,
    ShapesSpec,
    ShapeVar,
    TensorSpec,
    compile,
    dynamic_spec,
    export,
    make_fx,
)
from torchnext.errors import DynamicSpecError


class _Counter:
    def __init__(self) -> None:
        self.calls = 0

    def __call__(self, gm: torch.fx.GraphModule, example_inputs: object) -> object:
        self.calls += 1
        return gm


def test_decorator_rejects_bad_spec_type_stacking_and_unknown_arguments() -> None:
    with pytest.raises(TypeError, match="expects a dict, ShapesSpec, or ParamsSpec, got int"):
        dynamic_spec(3)
    B = ShapeVar("B")
    with pytest.raises(ValueError, match="Stacking multiple @dynamic_spec"):

        @dynamic_spec({"x": TensorSpec([B])})
        @dynamic_spec({"x": TensorSpec([B])})
        def f(x: torch.Tensor) -> torch.Tensor:
            return x

    with pytest.raises(DynamicSpecError, match=r"\['y'\] that .*g does not have"):

        @dynamic_spec({"y": TensorSpec([B])})
        def g(x: torch.Tensor) -> torch.Tensor:
            return x


def test_compile_rejects_a_spec_for_a_missing_argument() -> None:
    def f(x: torch.Tensor) -> torch.Tensor:
        return x

    with pytest.raises(DynamicSpecError, match=r"\['y'\]"):
        compile(f, dynamic_shapes={"y": TensorSpec([ShapeVar("B")])})


def test_spec_given_twice_is_rejected() -> None:
    B = ShapeVar("B")

    @dynamic_spec({"x": TensorSpec([B])})
    def f(x: torch.Tensor) -> torch.Tensor:
        return x

    with pytest.raises(ValueError, match="Provide only one"):
        compile(f, dynamic_shapes={"x": TensorSpec([B])})
    with pytest.raises(ValueError, match="cannot both be set"):
        compile(lambda x: x, dynamic_shapes={"x": TensorSpec([B])}, dynamic=True)


def test_compile_one_graph_for_every_size_in_range_and_clear_error_outside() -> None:
    torch._dynamo.reset()
    B = ShapeVar("B", min=2, max=64)

    @dynamic_spec({"x": TensorSpec([B, STATIC])})
    def f(x: torch.Tensor) -> torch.Tensor:
        return x.sin() * 2

    counter = _Counter()
    g = compile(f, backend=counter)
    for b in (2, 3, 17, 64):
        x = torch.randn(b, 3)
        torch.testing.assert_close(g(x), f(x))
    assert counter.calls == 1
    with pytest.raises(
        DynamicSpecError, match=r"'x' dim 0 has size 100, outside the range \[2, 64\]"
    ):
        g(torch.randn(100, 3))
    with pytest.raises(DynamicSpecError, match="size 1"):
        g(torch.randn(1, 3))


def test_compile_module_with_decorated_forward() -> None:
    torch._dynamo.reset()
    B = ShapeVar("B", min=1, max=32)

    class M(torch.nn.Module):
        @dynamic_spec({"x": TensorSpec([B, 4])})
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x.relu()

    counter = _Counter()
    m = compile(M(), backend=counter)
    for b in (1, 5, 9):
        m(torch.randn(b, 4))
    assert counter.calls == 1
    with pytest.raises(DynamicSpecError, match="pins it to 4"):
        m(torch.randn(3, 5))


class _Two(torch.nn.Module):
    B = ShapeVar("B", min=2, max=128)

    @dynamic_spec({"x": TensorSpec([B, STATIC]), "y": TensorSpec([2 * B])})
    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return x.sum(1) + y[::2]


def test_export_derives_shared_and_derived_dims() -> None:
    ep = export(_Two(), (torch.randn(4, 3), torch.randn(8)))
    ranges = sorted((int(r.lower), int(r.upper)) for r in ep.range_constraints.values())
    assert ranges == [(2, 128), (4, 256)]
    x, y = torch.randn(10, 3), torch.randn(20)
    torch.testing.assert_close(ep.module()(x, y), x.sum(1) + y[::2])


def test_export_errors_for_unknown_keys_and_pinned_dims() -> None:
    class M(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x * 2

    B = ShapeVar("B")
    with pytest.raises(ValueError, match=r"entries \['z'\] that do not match"):
        export(M(), (torch.randn(2, 3),), dynamic_shapes=ParamsSpec({"z": TensorSpec([B])}))
    with pytest.raises(ValueError, match="static with value 5, but got 3"):
        export(M(), (torch.randn(2, 3),), dynamic_shapes=ParamsSpec({"x": TensorSpec([B, 5])}))


@pytest.mark.skipif(
    tuple(int(p) for p in torch.__version__.split("+")[0].split(".")[:2]) >= (2, 14),
    reason="2.14 exports assumptions natively",
)
def test_export_assumptions_are_refused_on_213_not_dropped() -> None:
    class M(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x * 2

    B = ShapeVar("B")
    spec = ShapesSpec(ParamsSpec({"x": TensorSpec([B])}), assumptions=[B % 2 == 0])
    with pytest.raises(DynamicSpecError, match="assumptions"):
        export(M(), (torch.randn(4),), dynamic_shapes=spec)


def test_make_fx_traces_declared_dims_symbolically_and_others_static() -> None:
    B = ShapeVar("B", min=1)

    @dynamic_spec({"x": TensorSpec([B, STATIC])})
    def f(x: torch.Tensor) -> torch.Tensor:
        return x.cos() + 1

    gm = make_fx(f)(torch.randn(4, 3))
    (placeholder,) = [n for n in gm.graph.nodes if n.op == "placeholder"]
    size = placeholder.meta["val"].shape
    assert isinstance(size[0], torch.SymInt) and size[1] == 3
    x = torch.randn(7, 3)
    torch.testing.assert_close(gm(x), f(x))


def test_make_fx_shares_and_derives_dims() -> None:
    gm = make_fx(_Two().forward)(torch.randn(4, 3), torch.randn(8))
    vals = [n.meta["val"] for n in gm.graph.nodes if n.op == "placeholder"]
    assert str(vals[1].shape[0]) == f"2*{vals[0].shape[0]}"


def test_make_fx_requires_fake_tracing_mode() -> None:
    with pytest.raises(ValueError, match="requires tracing_mode='fake'"):
        make_fx(
            lambda x: x, dynamic_shapes={"x": TensorSpec([ShapeVar("B")])}, tracing_mode="symbolic"
        )
