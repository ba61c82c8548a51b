"""The one table of PyTorch 2.14 facts: what each is, whether torch has it, who provides it.

Each :class:`Capability` is one 2.14 fact. It holds the one check that decides whether
the running torch has the fact natively (``native``), where torchnext provides it
(``provider``, ``"module:attribute"``), and how :mod:`torchnext.backport` puts it into
an older torch (``backports``: attributes to set, registries to fill). ``torchnext
doctor`` prints its table from :data:`CAPABILITIES`, the backport installs from the same
records, and a test checks that the README's feature table lists the same capabilities.

Use this module to ask "does this torch have 2.14's X?"; use :mod:`torchnext.backport`
to change the answer. What not to assume: a native check looks at what torch itself
ships, so it stays False on 2.13 after ``backport.install()`` put torchnext's version in
place. Detection never imports heavy optional packages eagerly and never raises: a
check that fails counts as "not native", with the reason recorded in ``detail``.
"""

from __future__ import annotations

import functools
import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

import torch

__all__ = [
    "Backport",
    "Capability",
    "CAPABILITIES",
    "CapabilityStatus",
    "Registration",
    "is_torchnext_value",
    "probe",
    "probe_all",
]

Status = Literal["native", "torchnext", "unavailable"]


@dataclass(frozen=True, kw_only=True, slots=True)
class Backport:
    """How the backport provides one 2.14 name: an attribute set on a torch module."""

    name: str
    """The public name as 2.14 spells it (a call form for keyword additions)."""
    owner: str
    """Dotted module path of the object that receives the attribute."""
    attr: str
    """Attribute set on ``owner``."""
    provide: Callable[[], Any]
    """Builds the value to install; raises ``ImportError`` if torchnext cannot provide it."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Registration:
    """How the backport provides a 2.14 fact kept in one of torch's registries."""

    name: str
    """What 2.14 has, in words."""
    available: Callable[[], None]
    """Raises ``ImportError`` (with the reason) when torchnext cannot provide it here."""
    register: Callable[[], list[str]]
    """Registers what is missing; returns what it added."""
    unregister: Callable[[], list[str]]
    """Removes what :attr:`register` added; returns what it removed."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Capability:
    """One 2.14 fact: name, README text, its one native check, and what torchnext provides."""

    name: str
    """Short stable identifier, e.g. ``linalg.polar``."""
    summary: str
    """One line for the README table: what the capability is."""
    usage: str
    """How to use it through torchnext (one short code span or sentence)."""
    native: Callable[[], bool]
    """The only check of whether the running torch itself has it (torchnext's installs
    do not count)."""
    provider: str
    """``"module:attribute"`` of the torchnext implementation."""
    needs: str = ""
    """What else is required (e.g. ``"CUDA"``, ``"the [upgrade] extra"``); empty if nothing."""
    requirement: Callable[[], bool] | None = None
    """Probe for ``needs``; ``None`` means no extra requirement."""
    backports: tuple[Backport | Registration, ...] = ()
    """What ``backport.install()`` adds when :attr:`native` is False; empty when the
    capability is used only through torchnext's own names."""


@dataclass(frozen=True, kw_only=True, slots=True)
class CapabilityStatus:
    """How one capability is provided on this machine, as ``torchnext doctor`` shows it."""

    name: str
    """The capability's :attr:`Capability.name`."""
    status: Status
    """``native``, ``torchnext`` or ``unavailable``."""
    detail: str
    """Who provides it, or why it is unavailable."""

    def as_dict(self) -> dict[str, str]:
        return {"name": self.name, "status": self.status, "detail": self.detail}


# --- native checks: one per capability, each looks only at what torch ships ----------


def is_torchnext_value(value: object) -> bool:
    """True when ``value`` is something torchnext made (and the backport may have installed)."""
    if hasattr(value, "__torchnext_original__"):
        return True  # a wrapper around a torch function (its __module__ is torch's)
    module = getattr(value, "__module__", None)
    return isinstance(module, str) and (module == "torchnext" or module.startswith("torchnext."))


def _cuda_at_least(major: int) -> Callable[[], bool]:
    """A check: a CUDA device of compute capability ``major`` or newer, where torch's own
    kernel runs the recipe (block-scaled GEMM needs sm100, grouped GEMM sm90)."""

    def check() -> bool:
        return torch.cuda.is_available() and torch.cuda.get_device_capability()[0] >= major

    return check


def _torch_has(owner: str, attr: str) -> Callable[[], bool]:
    """A check: ``owner`` has ``attr`` and it is torch's own, not a torchnext backport."""

    def check() -> bool:
        try:
            obj: object = importlib.import_module(owner)
        except Exception:  # noqa: BLE001 - a torch module may fail to import in any way
            # Extension submodules such as torch._C._distributed_c10d are attributes,
            # not importable modules: walk there from torch.
            obj = torch
            for part in owner.split(".")[1:]:
                try:
                    obj = getattr(obj, part)
                except Exception:  # noqa: BLE001 - a lazy attribute may raise anything
                    return False
        try:
            value = getattr(obj, attr)
        except Exception:  # noqa: BLE001 - a lazy attribute may raise anything
            return False
        return not is_torchnext_value(value)

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
    # 2.14.1 ships the module torch/_higher_order_ops/switch.py (and the HOP
    # torch.ops.higher_order.switch); 2.13 has neither. The package attribute of the same
    # name is what the backport sets, so it cannot tell torch's switch from torchnext's.
    return _has_module("torch._higher_order_ops.switch")()


def _torch_version() -> tuple[int, int]:
    parts = torch.__version__.split("+")[0].split(".")
    return int(parts[0]), int(parts[1])


def _is_214() -> bool:
    return _torch_version() >= (2, 14)


def _dtensor_rules() -> Any:
    return importlib.import_module("torchnext.compat.dtensor_rules")


def _dtensor_rules_native() -> bool:
    # Torch shards every rule itself: none missing and none of them torchnext's.
    try:
        rules = _dtensor_rules()
        return not rules.missing_rules() and rules.rule_counts()["torchnext"] == 0
    except ImportError:
        return False


def _overlap_native() -> bool:
    try:
        from torchnext.compat import inductor_passes

        return bool(inductor_passes.native_overlap())
    except ImportError:
        return False


# --- what the backport installs ------------------------------------------------------


def _linalg(name: str) -> Callable[[], Any]:
    def provide() -> Any:
        # Prefer the variant with 2.14.1's exact contract (signature, errors such as
        # polar refusing wide matrices); torchnext.linalg's own functions go further.
        for module_name in ("torchnext.linalg.compat214", "torchnext.linalg"):
            try:
                module = importlib.import_module(module_name)
            except ImportError:
                continue
            if hasattr(module, name):
                return getattr(module, name)
        raise ImportError(f"torchnext.linalg has no {name!r} in this version of torchnext")

    return provide


def _spec_module() -> Any:
    # The package re-exports the function `dynamic_spec`, which shadows the submodule
    # of the same name for `from ... import`; fetch the module itself.
    return importlib.import_module("torchnext.control_flow.dynamic_spec")


def _spec_target(fn_or_module: Any) -> Any:
    # Where @dynamic_spec leaves its mark: a module's forward, or the function itself.
    return fn_or_module.forward if isinstance(fn_or_module, torch.nn.Module) else fn_or_module


def _provide_decorator() -> Any:
    from torchnext.control_flow.dynamic_spec import dynamic_spec

    return dynamic_spec


def _provide_switch() -> Any:
    from torchnext.control_flow.switch import switch

    return switch


def _wrap(original: Any, replacement: Callable[..., Any]) -> Any:
    functools.update_wrapper(replacement, original)
    replacement.__torchnext_original__ = original  # type: ignore[attr-defined]
    # update_wrapper sets __wrapped__, which would make inspect.signature report the
    # old signature (without dynamic_shapes); the wrapper's own signature is the truth.
    del replacement.__wrapped__  # type: ignore[attr-defined]
    return replacement


def _provide_compile() -> Any:
    ds = _spec_module()
    original = torch.compile

    def compile(model: Any = None, *, dynamic_shapes: Any = None, **kwargs: Any) -> Any:
        if model is None:
            return functools.partial(compile, dynamic_shapes=dynamic_shapes, **kwargs)
        if dynamic_shapes is None and getattr(_spec_target(model), "_dynamic_spec", None) is None:
            return original(model, **kwargs)
        return ds.compile(model, dynamic_shapes=dynamic_shapes, **kwargs)

    return _wrap(original, compile)


def _provide_export() -> Any:
    ds = _spec_module()
    original = torch.export.export

    def export(
        mod: Any,
        args: Any,
        kwargs: Any = None,
        *,
        dynamic_shapes: Any = None,
        **export_kwargs: Any,
    ) -> Any:
        has_decorator = getattr(_spec_target(mod), "_dynamic_spec", None) is not None
        if has_decorator or isinstance(dynamic_shapes, (ds.ShapesSpec, ds.ParamsSpec)):
            return ds.export(mod, args, kwargs, dynamic_shapes=dynamic_shapes, **export_kwargs)
        return original(mod, args, kwargs, dynamic_shapes=dynamic_shapes, **export_kwargs)

    return _wrap(original, export)


def _provide_make_fx() -> Any:
    from torch.fx.experimental import proxy_tensor

    ds = _spec_module()
    original = proxy_tensor.make_fx

    def make_fx(f: Any, *args: Any, dynamic_shapes: Any = None, **kwargs: Any) -> Any:
        if dynamic_shapes is None and getattr(f, "_dynamic_spec", None) is None:
            return original(f, *args, **kwargs)
        if args:
            raise TypeError(
                "make_fx(dynamic_shapes=...): pass decomposition_table/tracing_mode by keyword"
            )
        return ds.make_fx(f, dynamic_shapes=dynamic_shapes, **kwargs)

    return _wrap(original, make_fx)


def _dtensor_rules_available() -> None:
    _dtensor_rules().missing_rules()  # raises ImportError where torch has no DTensor


def _overlap_available() -> None:
    importlib.import_module("torch._inductor.custom_graph_pass")


def _overlap_on() -> list[str]:
    importlib.import_module("torchnext.compile.switch").enable_simple_overlap(True)
    return ["simple_overlap"]


def _overlap_off() -> list[str]:
    importlib.import_module("torchnext.compile.switch").enable_simple_overlap(False)
    return ["simple_overlap"]


# --- the table -----------------------------------------------------------------------

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
        native=_torch_has("torch.distributed", "_reconfigure"),
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
        native=_torch_has("torch._C._distributed_c10d", "FlightRecorderHook"),
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
        native=_dtensor_rules_native,
        provider="torchnext.compat.dtensor_rules:install_rules",
        backports=(
            Registration(
                name="DTensor sharding rules (the 77 operators 2.14 added)",
                available=_dtensor_rules_available,
                register=lambda: list(_dtensor_rules().install_rules()),
                unregister=lambda: list(_dtensor_rules().uninstall_rules()),
            ),
        ),
    ),
    Capability(
        name="compile.simple_overlap",
        summary="Compute/communication overlap in compiled graphs with collectives",
        usage="`torchnext.compile.enable_simple_overlap()`",
        native=_overlap_native,
        provider="torchnext.compile:enable_simple_overlap",
        backports=(
            Registration(
                name="inductor aten_distributed_optimizations.enable_simple_overlap",
                available=_overlap_available,
                register=_overlap_on,
                unregister=_overlap_off,
            ),
        ),
    ),
    Capability(
        name="control_flow.switch",
        summary="Multi-way `switch` in eager, compile, export (saveable), make_fx",
        usage="`torchnext.control_flow.switch(index, branches, operands)`",
        native=_switch_native,
        provider="torchnext.control_flow:switch",
        backports=(
            Backport(
                name="torch._higher_order_ops.switch",
                owner="torch._higher_order_ops",
                attr="switch",
                provide=_provide_switch,
            ),
        ),
    ),
    Capability(
        name="control_flow.while_loop_cuda_graph",
        summary="`while_loop` captured in CUDA graphs",
        usage="`torchnext.control_flow.capture_while_loop`",
        native=lambda: _is_214() and torch.cuda.is_available(),
        provider="torchnext.control_flow:capture_while_loop",
        needs="CUDA",
        requirement=torch.cuda.is_available,
    ),
    Capability(
        name="control_flow.dynamic_spec",
        summary="`@dynamic_spec`: one shape spec for compile, export and make_fx",
        usage="`torchnext.control_flow.dynamic_spec(spec)`",
        # 2.14 added the decorator and the dynamic_shapes= support of compile, export
        # and make_fx together, so torch's own decorator stands for all four.
        native=_torch_has("torch.fx.experimental.dynamic_spec", "dynamic_spec"),
        provider="torchnext.control_flow:dynamic_spec",
        backports=(
            Backport(
                name="torch.fx.experimental.dynamic_spec.dynamic_spec",
                owner="torch.fx.experimental.dynamic_spec",
                attr="dynamic_spec",
                provide=_provide_decorator,
            ),
            Backport(
                name="torch.compile(dynamic_shapes=)",
                owner="torch",
                attr="compile",
                provide=_provide_compile,
            ),
            Backport(
                name="torch.export.export(dynamic_shapes=ShapesSpec)",
                owner="torch.export",
                attr="export",
                provide=_provide_export,
            ),
            Backport(
                name="torch.fx.experimental.proxy_tensor.make_fx(dynamic_shapes=)",
                owner="torch.fx.experimental.proxy_tensor",
                attr="make_fx",
                provide=_provide_make_fx,
            ),
        ),
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
        native=_torch_has("torch.linalg", "polar"),
        provider="torchnext.linalg:polar",
        backports=(
            Backport(
                name="torch.linalg.polar",
                owner="torch.linalg",
                attr="polar",
                provide=_linalg("polar"),
            ),
        ),
    ),
    Capability(
        name="linalg.matrix_sqrth",
        summary="`linalg.matrix_sqrth` with a fast path and a strict mode",
        usage="`torchnext.linalg.matrix_sqrth(A)`",
        native=_torch_has("torch.linalg", "matrix_sqrth"),
        provider="torchnext.linalg:matrix_sqrth",
        backports=(
            Backport(
                name="torch.linalg.matrix_sqrth",
                owner="torch.linalg",
                attr="matrix_sqrth",
                provide=_linalg("matrix_sqrth"),
            ),
        ),
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
        native=_is_214,
        provider="torchnext.compat:clamp",
    ),
    Capability(
        name="compat.split_group_sentinel",
        summary="`split_group` returns the non-member sentinel",
        usage="`torchnext.compat.split_group(...)`",
        native=_is_214,
        provider="torchnext.compat:split_group",
    ),
    Capability(
        name="gemm.fused_epilogue",
        summary="Autotuned GEMM with 2.14's fused epilogues (NVGEMM's set), and a compile backend",
        usage='`torchnext.gemm.gemm/linear(..., epilogue=...)`, `backend="torchnext_gemm"`',
        # 2.14 fuses epilogues only inside Inductor on NVIDIA GPUs with cutlass; no torch has
        # a callable fused-epilogue GEMM.
        native=lambda: False,
        provider="torchnext.gemm.fused:gemm",
    ),
    Capability(
        name="gemm.scaled_mm",
        summary="`F.scaled_mm` with block-wise, MX and NVFP4 recipes and swizzled scales",
        usage="`torchnext.gemm.scaled_mm(...)`, `mm_quantized(a, b)` for torchao tensors",
        native=_cuda_at_least(10),
        provider="torchnext.gemm.scaled:scaled_mm",
    ),
    Capability(
        name="gemm.grouped_mm",
        summary="`F.grouped_mm` for mixture-of-experts on any GPU, fast on the CPU",
        usage="`torchnext.gemm.grouped_mm(a, b, offs=...)`",
        native=_cuda_at_least(9),
        provider="torchnext.gemm.grouped:grouped_mm",
    ),
    Capability(
        name="gemm.decode_gemv",
        summary="Decode GEMV, and weight-only NVFP4/MXFP4/int4 with the dequantisation fused",
        usage="`torchnext.gemm.linear(x, NVFP4Weight.from_float(w))`",
        native=lambda: False,
        provider="torchnext.gemm.gemv:linear",
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
        native=_is_214,
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
    """:func:`probe` for every capability, in table order."""
    return [probe(cap) for cap in CAPABILITIES]
