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
many operators DTensor can shard; ``torchnext doctor`` prints it. What to install and
whether torch has it natively both come from the one table of 2.14 facts,
:data:`torchnext._capabilities.CAPABILITIES`: a name is skipped exactly when ``doctor``
calls its capability native. What not to assume: the installed functions are
torchnext's, with the documented differences (for example ``switch`` graphs hold
``cond`` nodes); names bound before ``install()`` (``from torch import compile``) keep
the original objects.
"""

from __future__ import annotations

import contextlib
import importlib
import threading
from collections.abc import Iterator
from typing import Any

import torch

from torchnext._capabilities import CAPABILITIES, Backport, Capability, Registration

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

BACKPORTS: tuple[Backport | Registration, ...] = tuple(
    bp for cap in CAPABILITIES for bp in cap.backports
)
"""Every name the backport can install, in table order (read from the capability table)."""

# The capability whose single native check decides each backport.
_OWNER: dict[str, Capability] = {bp.name: cap for cap in CAPABILITIES for bp in cap.backports}


def _module(path: str) -> Any:
    return importlib.import_module(path)


def _native(bp: Backport | Registration) -> bool:
    return _OWNER[bp.name].native()


def _dtensor_rules() -> Any:
    return importlib.import_module("torchnext.compat.dtensor_rules")


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
            if _is_ours(bp) or _native(bp):
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
            is_native = _native(bp)
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
