"""Install torch 2.14's public names into an older torch, and take them out again.

Use it when code written against 2.14 must run on 2.13 unchanged::

    import torchnext.backport
    torchnext.backport.install()          # or: with torchnext.backport.backported(): ...
    U, H = torch.linalg.polar(A)

What :func:`install` adds, each only where the running torch lacks it (it never
replaces what torch already has):

* ``torch.linalg.polar``, ``torch.linalg.matrix_sqrth`` (from :mod:`torchnext.linalg`,
  with 2.14.1's exact contract);
* ``torch.fx.experimental.dynamic_spec.dynamic_spec`` (the decorator);
* ``torch.compile(dynamic_shapes=...)`` (2.13 calls it ``shapes_spec``), honouring the
  decorator;
* ``torch.export.export(dynamic_shapes=ShapesSpec/ParamsSpec)`` and
  ``make_fx(dynamic_shapes=..., tracing_mode="fake")``;
* ``torch._higher_order_ops.switch``;
* DTensor sharding rules for the 77 operators 2.14 added (``out=`` variants of
  reductions, pooling, softmax and losses, ``sort``/``topk`` values, ``cumsum_``,
  ``tril_``/``triu_``, ``prims.amax``/``amin``, ``_foreach_addcdiv``/``addcmul``), from
  :mod:`torchnext.compat.dtensor_rules`;
* Inductor's simple compute/communication overlap for compiled graphs with functional
  collectives (on by default in 2.14), from :mod:`torchnext.compile`.

:func:`report` says what is installed, what :func:`install` would install, what was
skipped because torch has it natively, what cannot be provided here (and why), and how
many operators DTensor can shard; ``torchnext doctor`` prints it. What not to assume: the installed functions are
torchnext's, with the documented differences (for example ``switch`` graphs hold
``cond`` nodes); names bound before ``install()`` (``from torch import compile``) keep
the original objects.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import inspect
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch

__all__ = [
    "install",
    "uninstall",
    "backported",
    "report",
    "installed_names",
    "BACKPORTS",
    "Backport",
    "Registration",
]

_ABSENT = object()


@dataclass(frozen=True, kw_only=True)
class Backport:
    """One 2.14 name: where it lives, how to tell torch has it, what torchnext provides."""

    name: str
    """The public name as 2.14 spells it (a call form for keyword additions)."""
    owner: str
    """Dotted module path of the object that receives the attribute."""
    attr: str
    """Attribute set on ``owner``."""
    native: Callable[[], bool]
    """True when the running torch already has it."""
    provide: Callable[[], Any]
    """Builds the value to install; raises ``ImportError`` if torchnext cannot provide it."""


@dataclass(frozen=True, kw_only=True)
class Registration:
    """A 2.14 fact kept in one of torch's registries rather than in an attribute."""

    name: str
    """What 2.14 has, in words."""
    native: Callable[[], bool]
    """True when the running torch already has all of it."""
    available: Callable[[], None]
    """Raises ``ImportError`` (with the reason) when torchnext cannot provide it here."""
    register: Callable[[], list[str]]
    """Registers what is missing; returns what it added."""
    unregister: Callable[[], list[str]]
    """Removes what :attr:`register` added; returns what it removed."""


def _module(path: str) -> Any:
    return importlib.import_module(path)


def _has_attr(owner: str, attr: str) -> Callable[[], bool]:
    def check() -> bool:
        try:
            return hasattr(_module(owner), attr)
        except ImportError:
            return False

    return check


def _accepts(owner: str, attr: str, keyword: str) -> Callable[[], bool]:
    def check() -> bool:
        fn = getattr(_module(owner), attr, None)
        fn = getattr(fn, "__torchnext_original__", fn)
        if fn is None:
            return False
        try:
            return keyword in inspect.signature(fn).parameters
        except (TypeError, ValueError):
            return False

    return check


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
        if dynamic_shapes is None and getattr(ds._target(model), "_dynamic_spec", None) is None:
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
        has_decorator = getattr(ds._target(mod), "_dynamic_spec", None) is not None
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


def _export_takes_spec() -> bool:
    # 2.14 added the decorator and ShapesSpec support in export together; a decorator
    # that torchnext installed says nothing about the exporter.
    ours = _installed.get("torch.fx.experimental.dynamic_spec.dynamic_spec")
    module = _module("torch.fx.experimental.dynamic_spec")
    value = getattr(module, "dynamic_spec", _ABSENT)
    return value is not _ABSENT and (not isinstance(ours, tuple) or value is not ours[3])


def _dtensor_rules() -> Any:
    return importlib.import_module("torchnext.compat.dtensor_rules")


def _dtensor_rules_native() -> bool:
    try:
        rules = _dtensor_rules()
        return not rules.missing_rules()
    except ImportError:
        return False


def _dtensor_rules_available() -> None:
    _dtensor_rules().missing_rules()  # raises ImportError where torch has no DTensor


def _overlap_switch() -> Any:
    return importlib.import_module("torchnext.compile.switch")


def _overlap_native() -> bool:
    try:
        from torchnext.compat import inductor_passes

        return inductor_passes.native_overlap()
    except ImportError:
        return False


def _overlap_available() -> None:
    importlib.import_module("torch._inductor.custom_graph_pass")


def _overlap_on() -> list[str]:
    _overlap_switch().enable_simple_overlap(True)
    return ["simple_overlap"]


def _overlap_off() -> list[str]:
    _overlap_switch().enable_simple_overlap(False)
    return ["simple_overlap"]


BACKPORTS: tuple[Backport | Registration, ...] = (
    Backport(
        name="torch.linalg.polar",
        owner="torch.linalg",
        attr="polar",
        native=_has_attr("torch.linalg", "polar"),
        provide=_linalg("polar"),
    ),
    Backport(
        name="torch.linalg.matrix_sqrth",
        owner="torch.linalg",
        attr="matrix_sqrth",
        native=_has_attr("torch.linalg", "matrix_sqrth"),
        provide=_linalg("matrix_sqrth"),
    ),
    Backport(
        name="torch.fx.experimental.dynamic_spec.dynamic_spec",
        owner="torch.fx.experimental.dynamic_spec",
        attr="dynamic_spec",
        native=_has_attr("torch.fx.experimental.dynamic_spec", "dynamic_spec"),
        provide=_provide_decorator,
    ),
    Backport(
        name="torch.compile(dynamic_shapes=)",
        owner="torch",
        attr="compile",
        native=_accepts("torch", "compile", "dynamic_shapes"),
        provide=_provide_compile,
    ),
    Backport(
        name="torch.export.export(dynamic_shapes=ShapesSpec)",
        owner="torch.export",
        attr="export",
        native=_export_takes_spec,
        provide=_provide_export,
    ),
    Backport(
        name="torch.fx.experimental.proxy_tensor.make_fx(dynamic_shapes=)",
        owner="torch.fx.experimental.proxy_tensor",
        attr="make_fx",
        native=_accepts("torch.fx.experimental.proxy_tensor", "make_fx", "dynamic_shapes"),
        provide=_provide_make_fx,
    ),
    Backport(
        name="torch._higher_order_ops.switch",
        owner="torch._higher_order_ops",
        attr="switch",
        native=_has_attr("torch._higher_order_ops", "switch"),
        provide=_provide_switch,
    ),
    Registration(
        name="DTensor sharding rules (the 77 operators 2.14 added)",
        native=_dtensor_rules_native,
        available=_dtensor_rules_available,
        register=lambda: _dtensor_rules().install_rules(),
        unregister=lambda: _dtensor_rules().uninstall_rules(),
    ),
    Registration(
        name="inductor aten_distributed_optimizations.enable_simple_overlap",
        native=_overlap_native,
        available=_overlap_available,
        register=_overlap_on,
        unregister=_overlap_off,
    ),
)

_lock = threading.Lock()
# name -> (owner, attr, before, value) for an attribute; the Registration for a registry.
_installed: dict[str, tuple[Any, str, Any, Any] | Registration] = {}


def installed_names() -> list[str]:
    """Names currently installed by torchnext, in install order."""
    with _lock:
        return list(_installed)


def _is_ours(bp: Backport | Registration) -> bool:
    return bp.name in _installed


def _apply(bp: Backport | Registration) -> None:
    """Install one backport (the caller holds the lock and checked it is missing)."""
    if isinstance(bp, Registration):
        bp.register()
        _installed[bp.name] = bp
        return
    value = bp.provide()
    owner = _module(bp.owner)
    before = getattr(owner, bp.attr, _ABSENT)
    setattr(owner, bp.attr, value)
    _installed[bp.name] = (owner, bp.attr, before, value)


def _undo(name: str) -> bool:
    """Take one installed backport out again; False if someone else replaced it since."""
    entry = _installed.pop(name)
    if isinstance(entry, Registration):
        entry.unregister()
        return True
    owner, attr, before, value = entry
    if getattr(owner, attr, _ABSENT) is not value:
        return False
    if before is _ABSENT:
        delattr(owner, attr)
    else:
        setattr(owner, attr, before)
    return True


def install(*, names: list[str] | None = None) -> dict[str, Any]:
    """Add the 2.14 names this torch lacks; return :func:`report`'s dict.

    Args:
        names: restrict to these backport names (default: all of :data:`BACKPORTS`).

    Raises:
        ValueError: ``names`` contains a name that is not a known backport.
    """
    known = {bp.name for bp in BACKPORTS}
    if names is not None:
        unknown = sorted(set(names) - known)
        if unknown:
            raise ValueError(
                f"install(names=...): unknown backport(s) {unknown}; known: {sorted(known)}"
            )
    with _lock:
        for bp in BACKPORTS:
            if names is not None and bp.name not in names:
                continue
            if _is_ours(bp) or bp.native():
                continue
            try:
                _apply(bp)
            except ImportError:
                continue  # report() lists it as unavailable, with the reason
    return report()


def uninstall() -> list[str]:
    """Remove what :func:`install` added (newest first); return the names removed.

    An attribute someone else replaced after ``install()`` is left alone.
    """
    with _lock:
        return [name for name in reversed(list(_installed)) if _undo(name)]


@contextlib.contextmanager
def backported(*, names: list[str] | None = None) -> Iterator[dict[str, Any]]:
    """``install()`` for the duration of a ``with`` block; undone on exit.

    Only what this block installed is removed; names installed earlier stay.
    """
    before = set(installed_names())
    info = install(names=names)
    try:
        yield info
    finally:
        added = [n for n in installed_names() if n not in before]
        with _lock:
            for name in reversed(added):
                _undo(name)


def report() -> dict[str, Any]:
    """JSON-serialisable state: installed, would install, native, unavailable (with reasons)."""
    installed, would, native, unavailable = [], [], [], {}
    for bp in BACKPORTS:
        if _is_ours(bp):
            installed.append(bp.name)
            continue
        try:
            is_native = bp.native()
        except Exception as exc:  # noqa: BLE001 - a probe must never break the report
            unavailable[bp.name] = f"probe failed: {type(exc).__name__}: {exc}"
            continue
        if is_native:
            native.append(bp.name)
            continue
        try:
            if isinstance(bp, Registration):
                bp.available()
            else:
                bp.provide()
        except ImportError as exc:
            unavailable[bp.name] = str(exc)
            continue
        would.append(bp.name)
    try:
        dtensor_rules: dict[str, int] | None = _dtensor_rules().rule_counts()
    except ImportError:
        dtensor_rules = None
    return {
        "torch": torch.__version__,
        "installed": installed,
        "would_install": would,
        "native": native,
        "unavailable": unavailable,
        "dtensor_rules": dtensor_rules,
    }
