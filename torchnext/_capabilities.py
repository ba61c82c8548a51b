"""The table of PyTorch 2.14 capabilities and how each is provided on this torch.

Each :class:`Capability` says how to detect the capability in the running torch
(``native``), and where torchnext provides it (``provider``, ``"module:attribute"``).
``torchnext doctor`` prints its table from :data:`CAPABILITIES`, and a test checks
that the README's feature table lists the same capabilities.

Detection never imports heavy optional packages eagerly and never raises: a probe
that fails counts as "not native", with the reason recorded in ``detail``.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

import torch

__all__ = ["Capability", "CAPABILITIES", "CapabilityStatus", "probe", "probe_all"]

Status = Literal["native", "torchnext", "unavailable"]


def _has(path: str) -> Callable[[], bool]:
    """A probe: True when the dotted attribute path exists under ``torch``."""

    def check() -> bool:
        obj: object = torch
        for part in path.split(".")[1:]:
            try:
                obj = getattr(obj, part)
            except Exception:  # noqa: BLE001 - a lazy attribute may raise anything
                return False
        return True

    return check


def _has_module(name: str) -> Callable[[], bool]:
    def check() -> bool:
        try:
            importlib.import_module(name)
        except Exception:  # noqa: BLE001
            return False
        return True

    return check


def _switch_native() -> bool:
    return _has_module("torch._higher_order_ops.switch")()


def _dynamic_spec_native() -> bool:
    try:
        mod = importlib.import_module("torch.fx.experimental.dynamic_spec")
    except Exception:  # noqa: BLE001
        return False
    return hasattr(mod, "dynamic_spec")


def _torch_version() -> tuple[int, int]:
    parts = torch.__version__.split("+")[0].split(".")
    return int(parts[0]), int(parts[1])


def _clamp_214_native() -> bool:
    return _torch_version() >= (2, 14)


def _gloo_reconfigure_native() -> bool:
    return _has("torch.distributed._reconfigure")()


@dataclass(frozen=True, kw_only=True)
class Capability:
    """One 2.14 capability: name, README text, native probe and torchnext provider."""

    name: str
    """Short stable identifier, e.g. ``linalg.polar``."""
    summary: str
    """One line for the README table: what the capability is."""
    usage: str
    """How to use it through torchnext (one short code span or sentence)."""
    native: Callable[[], bool]
    """True when the running torch has the capability itself."""
    provider: str
    """``"module:attribute"`` of the torchnext implementation."""
    needs: str = ""
    """What else is required (e.g. ``"CUDA"``, ``"the [upgrade] extra"``); empty if nothing."""
    requirement: Callable[[], bool] | None = None
    """Probe for ``needs``; ``None`` means no extra requirement."""


@dataclass(frozen=True, kw_only=True)
class CapabilityStatus:
    name: str
    status: Status
    detail: str

    def as_dict(self) -> dict[str, str]:
        return {"name": self.name, "status": self.status, "detail": self.detail}


CAPABILITIES: tuple[Capability, ...] = (
    Capability(
        name="distributed.fault_tolerant_group",
        summary="Fault-tolerant process groups: revoke, agree, shrink, grow, split on any backend",
        usage="`torchnext.distributed.FaultTolerantGroup`",
        native=lambda: False,
        provider="torchnext.distributed:FaultTolerantGroup",
    ),
    Capability(
        name="distributed.reconfigure",
        summary="In-place process-group reconfiguration (2.14: gloo/nccl2 `_reconfigure`)",
        usage="`group.reconfigure(members)`",
        native=_gloo_reconfigure_native,
        provider="torchnext.distributed:FaultTolerantGroup",
    ),
    Capability(
        name="distributed.training_manager",
        summary="Training that heals in place, with a launcher (`torchnext run`)",
        usage="`torchnext.distributed.Manager`, `torchnext run --nproc N script.py`",
        native=lambda: False,
        provider="torchnext.distributed:Manager",
    ),
    Capability(
        name="distributed.flight_recorder",
        summary="Flight Recorder for any backend, JSON dumps, analyzer",
        usage="`torchnext.distributed.FlightRecorder`, `torchnext fr analyze DIR`",
        native=_has("torch._C._distributed_c10d.FlightRecorderHook"),
        provider="torchnext.distributed:FlightRecorder",
    ),
    Capability(
        name="distributed.rma_window",
        summary="One-sided RMA windows (put, get, accumulate, fence, lock) on CPU",
        usage="`torchnext.distributed.Window`",
        native=lambda: False,
        provider="torchnext.distributed:Window",
    ),
    Capability(
        name="distributed.dtensor_rules",
        summary="DTensor sharding rules for the 77 operators 2.14 added (`out=`, `cumsum_`, ...)",
        usage="`torchnext.backport.install()`",
        native=_clamp_214_native,
        provider="torchnext.compat.dtensor_rules:install_rules",
    ),
    Capability(
        name="compile.simple_overlap",
        summary="Compute/communication overlap in compiled graphs with collectives",
        usage="`torchnext.compile.enable_simple_overlap()`",
        native=_clamp_214_native,
        provider="torchnext.compile:enable_simple_overlap",
    ),
    Capability(
        name="control_flow.switch",
        summary="Multi-way `switch` in eager, compile, export (saveable), make_fx",
        usage="`torchnext.control_flow.switch(index, branches, operands)`",
        native=_switch_native,
        provider="torchnext.control_flow:switch",
    ),
    Capability(
        name="control_flow.while_loop_cuda_graph",
        summary="`while_loop` captured in CUDA graphs",
        usage="`torchnext.control_flow.capture_while_loop`",
        native=lambda: _clamp_214_native() and torch.cuda.is_available(),
        provider="torchnext.control_flow:capture_while_loop",
        needs="CUDA",
        requirement=torch.cuda.is_available,
    ),
    Capability(
        name="control_flow.dynamic_spec",
        summary="`@dynamic_spec`: one shape spec for compile, export and make_fx",
        usage="`torchnext.control_flow.dynamic_spec(spec)`",
        native=_dynamic_spec_native,
        provider="torchnext.control_flow:dynamic_spec",
    ),
    Capability(
        name="control_flow.complex_compile",
        summary="Complex tensors in `torch.compile` (inputs, intermediates, outputs)",
        usage="`torchnext.control_flow.complex_compile(fn)`",
        native=lambda: False,
        provider="torchnext.control_flow:complex_compile",
    ),
    Capability(
        name="linalg.polar",
        summary="`linalg.polar`: right and left, any shape, QDWH / Newton-Schulz / SVD",
        usage="`torchnext.linalg.polar(A)`",
        native=_has("torch.linalg.polar"),
        provider="torchnext.linalg:polar",
    ),
    Capability(
        name="linalg.matrix_sqrth",
        summary="`linalg.matrix_sqrth` with a fast path and a strict mode",
        usage="`torchnext.linalg.matrix_sqrth(A)`",
        native=_has("torch.linalg.matrix_sqrth"),
        provider="torchnext.linalg:matrix_sqrth",
    ),
    Capability(
        name="linalg.batched_small",
        summary="Jacobi SVD/eigh, QR, Cholesky fast on small batched matrices",
        usage="`torchnext.linalg.svd/eigh/qr/cholesky`",
        native=lambda: False,
        provider="torchnext.linalg:eigh",
    ),
    Capability(
        name="compat.clamp_grad",
        summary="2.14 clamp/clamp_min/clamp_max boundary gradients",
        usage="`torchnext.compat.clamp(x, lo, hi)`",
        native=_clamp_214_native,
        provider="torchnext.compat:clamp",
    ),
    Capability(
        name="compat.split_group_sentinel",
        summary="`split_group` returns the non-member sentinel",
        usage="`torchnext.compat.split_group(...)`",
        native=_clamp_214_native,
        provider="torchnext.compat:split_group",
    ),
    Capability(
        name="upgrade",
        summary="Find and fix every 2.14 breaking change in a codebase",
        usage="`torchnext upgrade PATHS [--fix]`",
        native=lambda: False,
        provider="torchnext.upgrade:check_paths",
        needs="the [upgrade] extra (libcst)",
        requirement=_has_module("libcst"),
    ),
    Capability(
        name="backport",
        summary="Install 2.14's public names into an older torch",
        usage="`torchnext.backport.install()`",
        native=_clamp_214_native,
        provider="torchnext.backport:install",
    ),
)


def _provider_available(provider: str) -> tuple[bool, str]:
    module_name, _, attr = provider.partition(":")
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:  # noqa: BLE001 - report any import failure as the reason
        return False, f"{module_name} cannot be imported: {type(exc).__name__}: {exc}"
    if attr and not hasattr(module, attr):
        return False, f"{module_name} has no {attr!r} in this version of torchnext"
    return True, ""


def probe(cap: Capability) -> CapabilityStatus:
    """How ``cap`` is provided here: natively, by torchnext, or not at all (and why)."""
    try:
        is_native = cap.native()
    except Exception as exc:  # noqa: BLE001
        is_native = False
        native_note = f"native probe failed ({type(exc).__name__})"
    else:
        native_note = ""
    if cap.requirement is not None and not cap.requirement():
        return CapabilityStatus(
            name=cap.name, status="unavailable", detail=f"needs {cap.needs}, not present here"
        )
    if is_native:
        return CapabilityStatus(
            name=cap.name, status="native", detail=f"torch {torch.__version__} has it"
        )
    ok, why = _provider_available(cap.provider)
    if ok:
        detail = f"provided by {cap.provider.replace(':', '.')}"
        if native_note:
            detail += f"; {native_note}"
        return CapabilityStatus(name=cap.name, status="torchnext", detail=detail)
    return CapabilityStatus(name=cap.name, status="unavailable", detail=why)


def probe_all() -> list[CapabilityStatus]:
    return [probe(cap) for cap in CAPABILITIES]
