"""backport: adds only missing 2.14 names, never overrides, reports, and undoes."""

from __future__ import annotations

import dataclasses
import importlib
import json
import sys
import types

import pytest
import torch

import torchnext.backport as backport
from torchnext._capabilities import CAPABILITIES, Backport, Capability, Registration
from torchnext._doctor import collect
from torchnext.control_flow import STATIC, ParamsSpec, ShapeVar, TensorSpec


@pytest.fixture(autouse=True)
def _clean() -> object:
    backport.uninstall()
    yield
    backport.uninstall()


def _linalg_has(name: str) -> bool:
    try:
        return hasattr(importlib.import_module("torchnext.linalg"), name)
    except ImportError:
        return False


def test_report_is_json_and_accounts_for_every_backport() -> None:
    info = backport.report()
    json.dumps(info)
    names = {bp.name for bp in backport.BACKPORTS}
    listed = set(info["installed"]) | set(info["would_install"]) | set(info["native"])
    assert listed | set(info["unavailable"]) == names
    assert info["installed"] == []


def test_install_adds_missing_names_and_uninstall_removes_them() -> None:
    had_switch = hasattr(torch._higher_order_ops, "switch")
    info = backport.install()
    assert set(info["installed"]) == set(backport.installed_names())
    assert hasattr(torch._higher_order_ops, "switch")
    assert hasattr(importlib.import_module("torch.fx.experimental.dynamic_spec"), "dynamic_spec")
    for name in ("polar", "matrix_sqrth"):
        assert hasattr(torch.linalg, name) == (
            _linalg_has(name) or f"torch.linalg.{name}" in info["native"]
        )
    removed = backport.uninstall()
    assert set(removed) == set(info["installed"])
    assert hasattr(torch._higher_order_ops, "switch") == had_switch
    assert backport.installed_names() == []


def test_install_twice_is_idempotent() -> None:
    first = backport.install()["installed"]
    compile_after_first = torch.compile
    assert backport.install()["installed"] == first
    assert torch.compile is compile_after_first


def test_never_overrides_a_native_name(monkeypatch: pytest.MonkeyPatch) -> None:
    # Look like 2.14.1: torch ships the module torch._higher_order_ops.switch, and the
    # package attribute of that name is torch's own function.
    native_switch = types.SimpleNamespace(name="native switch")
    native_module = types.ModuleType("torch._higher_order_ops.switch")
    monkeypatch.setitem(sys.modules, "torch._higher_order_ops.switch", native_module)
    monkeypatch.setattr(torch._higher_order_ops, "switch", native_switch, raising=False)
    info = backport.install()
    assert "torch._higher_order_ops.switch" in info["native"]
    assert torch._higher_order_ops.switch is native_switch
    status = {c["name"]: c["status"] for c in collect()["capabilities"]}
    assert status["control_flow.switch"] == "native"


def _capability(name: str) -> Capability:
    return next(cap for cap in CAPABILITIES if cap.name == name)


def test_torchnext_switch_alone_does_not_count_as_native() -> None:
    switch = _capability("control_flow.switch")
    if switch.native():
        pytest.skip("this torch ships switch itself")
    info = backport.install(names=["torch._higher_order_ops.switch"])
    assert info["installed"] == ["torch._higher_order_ops.switch"]
    assert hasattr(torch._higher_order_ops, "switch")
    assert not switch.native()
    status = {c["name"]: c["status"] for c in collect()["capabilities"]}
    assert status["control_flow.switch"] == "torchnext"


def test_every_fact_has_exactly_one_native_check() -> None:
    names = [cap.name for cap in CAPABILITIES]
    assert len(names) == len(set(names))
    backport_names = [bp.name for bp in backport.BACKPORTS]
    assert len(backport_names) == len(set(backport_names))
    assert backport_names == [bp.name for cap in CAPABILITIES for bp in cap.backports]
    native_fields = [f.name for f in dataclasses.fields(Capability) if f.name == "native"]
    assert native_fields == ["native"]
    for cap in CAPABILITIES:
        assert callable(cap.native), cap.name
        assert isinstance(cap.native(), bool), cap.name
    # The install records carry no check of their own: their capability's decides.
    for kind in (Backport, Registration):
        assert not [f.name for f in dataclasses.fields(kind) if "native" in f.name], kind


def _assert_doctor_and_backport_agree() -> None:
    status = {c["name"]: c["status"] for c in collect()["capabilities"]}
    info = backport.report()
    for cap in CAPABILITIES:
        for bp in cap.backports:
            if status[cap.name] == "native":
                assert bp.name in info["native"], (cap.name, bp.name)
            else:
                assert bp.name not in info["native"], (cap.name, bp.name)
            if bp.name in info["installed"]:
                assert status[cap.name] == "torchnext", (cap.name, bp.name)


def test_doctor_and_backport_agree_for_every_fact() -> None:
    _assert_doctor_and_backport_agree()
    backport.install()
    _assert_doctor_and_backport_agree()
    backport.uninstall()
    _assert_doctor_and_backport_agree()


def test_context_manager_undoes_only_its_own_installs() -> None:
    original_compile = torch.compile
    backport.install(names=["torch._higher_order_ops.switch"])
    with backport.backported() as info:
        assert "torch._higher_order_ops.switch" in info["installed"]
        if "torch.compile(dynamic_shapes=)" in info["installed"]:
            assert torch.compile is not original_compile
    assert torch.compile is original_compile
    assert backport.installed_names() == ["torch._higher_order_ops.switch"] or (
        "torch._higher_order_ops.switch" in backport.report()["native"]
    )


def test_unknown_name_is_rejected() -> None:
    with pytest.raises(ValueError, match="unknown backport"):
        backport.install(names=["torch.nope"])


def test_installed_214_api_works_end_to_end() -> None:
    info = backport.install()
    if "torch.compile(dynamic_shapes=)" not in info["installed"]:
        pytest.skip("this torch has torch.compile(dynamic_shapes=) natively")
    from torch.fx.experimental.dynamic_spec import dynamic_spec

    torch._dynamo.reset()
    B = ShapeVar("B", min=1, max=16)

    class M(torch.nn.Module):
        @dynamic_spec({"x": TensorSpec([B, STATIC])})
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch._higher_order_ops.switch(
                torch.tensor(1), [lambda x: x * 0, lambda x: x + 1], (x,)
            )

    graphs: list[object] = []

    def backend(gm: torch.fx.GraphModule, example_inputs: object) -> object:
        graphs.append(gm)
        return gm

    m = torch.compile(M(), backend=backend, fullgraph=True)
    for b in (2, 3, 9):
        torch.testing.assert_close(m(torch.zeros(b, 2)), torch.ones(b, 2))
    assert len(graphs) == 1
    ep = torch.export.export(M(), (torch.zeros(4, 2),))
    torch.testing.assert_close(ep.module()(torch.zeros(7, 2)), torch.ones(7, 2))

    class Plain(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x * 2

    ep2 = torch.export.export(
        Plain(), (torch.zeros(4, 2),), dynamic_shapes=ParamsSpec({"x": TensorSpec([B, STATIC])})
    )
    torch.testing.assert_close(ep2.module()(torch.ones(3, 2)), torch.full((3, 2), 2.0))


def test_backported_linalg_names_come_from_torchnext_linalg() -> None:
    info = backport.install()
    for name in ("polar", "matrix_sqrth"):
        key = f"torch.linalg.{name}"
        if key in info["installed"]:
            assert getattr(torch.linalg, name).__module__.startswith("torchnext.linalg")
        elif key not in info["native"]:
            assert key in info["unavailable"]


def test_backported_polar_keeps_214_contract() -> None:
    info = backport.install()
    if "torch.linalg.polar" not in info["installed"]:
        pytest.skip("torch.linalg.polar is native here or not provided")
    a = torch.randn(5, 3, dtype=torch.double)
    u, h = torch.linalg.polar(a)
    torch.testing.assert_close(u @ h, a)
    with pytest.raises(RuntimeError, match="at least as many rows as columns"):
        torch.linalg.polar(torch.randn(3, 5))
