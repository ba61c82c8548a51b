"""Retries that look like version guards: ``try: f(k=...) except TypeError: f(k=...)``.

A ``try`` whose handler catches TypeError is normally a compatibility shim (the body is
the new spelling, the handler the old one, or the reverse), so its sites are left alone.
When the handler calls the same function with the same keyword that torch 2.14 removed,
both branches fail on 2.14: it is a retry with other arguments, not a version guard, and
every branch is rewritten. The handler is named in the findings, because on 2.14 it is
what catches (and would hide) the TypeError the removed keyword raises in the body.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import libcst as cst

from torchnext.upgrade.fixers_misc import PROFILERS

__all__ = ["REMOVED_KEYWORDS", "RETRY_CODES", "retry_handler"]

REMOVED_KEYWORDS: dict[str, tuple[str, ...]] = {"use_cuda": PROFILERS}
"""Keyword -> the callables for which passing it raises TypeError in torch 2.14."""

RETRY_CODES = frozenset({"TNU003"})
"""Rules whose sites are those removed keywords."""

_CATCHES_TYPEERROR = {"TypeError", "Exception", "BaseException"}

Qualify = Callable[[cst.BaseExpression], "str | None"]


class _KeywordUses(cst.CSTVisitor):
    """(qualified callee, removed keyword) pairs of the calls under a node."""

    def __init__(self, qualify: Qualify) -> None:
        super().__init__()
        self.qualify = qualify
        self.found: set[tuple[str, str]] = set()

    def visit_Call(self, node: cst.Call) -> None:
        qname = self.qualify(node.func)
        if qname is None:
            return
        for arg in node.args:
            if arg.keyword is not None and qname in REMOVED_KEYWORDS.get(arg.keyword.value, ()):
                self.found.add((qname, arg.keyword.value))


def _uses(nodes: Iterable[cst.CSTNode], qualify: Qualify) -> set[tuple[str, str]]:
    visitor = _KeywordUses(qualify)
    for node in nodes:
        node.visit(visitor)
    return visitor.found


def retry_handler(
    node: cst.Try, qualify: Qualify, names: Callable[[cst.ExceptHandler], set[str]]
) -> cst.ExceptHandler | None:
    """The first handler that catches TypeError and calls a callee of the ``try`` body with
    the same removed keyword; None when the ``try`` is not such a retry."""
    body = _uses([node.body], qualify)
    if not body:
        return None
    for handler in node.handlers:
        if names(handler) & _CATCHES_TYPEERROR and _uses([handler.body], qualify) & body:
            return handler
    return None
