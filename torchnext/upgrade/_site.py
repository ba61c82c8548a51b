"""The contract between the transformer and the rule fixers, and the fixer registry.

A fixer is a small function ``Site -> Diagnosis | None``: it looks at one call (already
holding the fixed versions of its nested calls), decides whether its rule applies, and
returns the finding with an optional replacement node. Fixers never mutate state and
never see the file; the transformer decides whether a fix is applied (selection,
``# noqa``, fix level, version guards).

Fixers register by qualified name (``torch.cholesky``) or, for Tensor-method forms, by
method name; ``tuple_aware`` fixers are called on ``call(...)[0]`` / ``call(...).attr``
so they can replace the whole indexing expression.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import libcst as cst

from torchnext.upgrade._cst import dotted

__all__ = ["Diagnosis", "Site", "Fixer", "CALL_FIXERS", "METHOD_FIXERS", "call_rule", "method_rule"]


@dataclass(frozen=True)
class Diagnosis:
    """A rule's verdict on one site."""

    code: str
    fix: cst.BaseExpression | None = None
    """Replacement for the call (or, for tuple-aware fixers, the whole ``[i]``/``.attr``)."""
    unsafe: bool = False
    detail: str = ""
    """Appended to the rule's message (why no fix, what to check)."""
    imports: tuple[str, ...] = ()
    """Modules the fix needs imported (``"torch"`` is handled through :meth:`Site.torch`)."""


@dataclass
class Site:
    """One call as a fixer sees it."""

    call: cst.Call
    qname: str
    """Resolved name of the callee (``torch.qr``), or ``.qr`` for a method call."""
    torch_name: str
    """The name bound to the torch module in this file (``torch``, or an alias)."""
    receiver: cst.BaseExpression | None = None
    """For Tensor-method forms, the object the method is called on."""
    receiver_is_tensor: bool = False
    """The receiver is provably a tensor (see :mod:`._receivers`); Tensor-method fixers
    run only when it is."""
    wrapper: tuple[str, str | int] | None = None
    """``("index", 0)`` or ``("attr", "solution")`` for tuple-aware calls."""
    used_torch: bool = field(default=False)

    def torch(self, path: str) -> cst.BaseExpression:
        """``<torch>.path`` as a node, noting that the fix needs the torch module."""
        self.used_torch = True
        return dotted(f"{self.torch_name}.{path}")

    @property
    def method_unsafe(self) -> bool:
        """A method-form site whose receiver is not proved to be a tensor (such sites no
        longer reach Tensor-method fixers; kept for fixers that do not need a tensor)."""
        return self.receiver is not None and not self.receiver_is_tensor


FixFn = Callable[[Site], "Diagnosis | None"]


@dataclass(frozen=True)
class Fixer:
    code: str
    fn: FixFn
    tuple_aware: bool = False
    needs_tensor: bool = True
    """Method form: run only when the receiver is provably a tensor (``False`` for
    methods of other objects: memory pools, green contexts)."""


CALL_FIXERS: dict[str, list[Fixer]] = {}
METHOD_FIXERS: dict[str, list[Fixer]] = {}


def call_rule(code: str, *qnames: str, tuple_aware: bool = False) -> Callable[[FixFn], FixFn]:
    """Register ``fn`` for calls of each qualified name."""

    def deco(fn: FixFn) -> FixFn:
        for q in qnames:
            CALL_FIXERS.setdefault(q, []).append(Fixer(code, fn, tuple_aware))
        return fn

    return deco


def method_rule(
    code: str, *names: str, tuple_aware: bool = False, needs_tensor: bool = True
) -> Callable[[FixFn], FixFn]:
    """Register ``fn`` for ``<expr>.name(...)`` calls in files that import torch."""

    def deco(fn: FixFn) -> FixFn:
        for n in names:
            METHOD_FIXERS.setdefault(n, []).append(Fixer(code, fn, tuple_aware, needs_tensor))
        return fn

    return deco
