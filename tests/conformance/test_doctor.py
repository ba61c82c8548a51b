"""doctor's capability detection agrees with what each torch really has."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

import torchnext.backport as backport
from torchnext._capabilities import CAPABILITIES
from torchnext._doctor import collect


def _status(info: dict[str, Any]) -> dict[str, str]:
    return {c["name"]: c["status"] for c in info["capabilities"]}


def test_native_214_features_are_detected_native() -> None:
    status = _status(collect())
    assert hasattr(torch.linalg, "polar")
    assert status["linalg.polar"] == "native"
    assert status["linalg.matrix_sqrth"] == "native"
    assert status["compat.clamp_grad"] == "native"
    assert status["distributed.reconfigure"] == "native"


def test_same_capabilities_on_213_are_provided_by_torchnext(
    run_on_torch213: Callable[[str], Any],
) -> None:
    info = run_on_torch213(
        """
        import json
        from torchnext._doctor import collect
        info = collect()
        print(json.dumps({"torch": info["torch"], "capabilities": info["capabilities"]}))
        """
    )
    assert info["torch"].startswith("2.13")
    native_here = _status(collect())
    on_213 = _status(info)
    assert set(native_here) == set(on_213)
    for name, status in native_here.items():
        if status == "native":
            # What 2.14 has natively, 2.13 must not claim natively.
            assert on_213[name] != "native", name


def test_doctor_and_backport_agree_on_native_214() -> None:
    # One table decides both: every name the backport knows is native here, exactly
    # where doctor calls its capability native, and install() adds nothing.
    status = _status(collect())
    info = backport.report()
    for cap in CAPABILITIES:
        for bp in cap.backports:
            assert status[cap.name] == "native", cap.name
            assert bp.name in info["native"], bp.name
    assert info["would_install"] == [] and info["unavailable"] == {}
    assert status["control_flow.switch"] == "native"
