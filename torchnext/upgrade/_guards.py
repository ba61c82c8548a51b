"""Version-guarded legacy branches (TNU301) and ``except TypeError`` fallbacks (TNU009).

A site inside ``if torch.__version__ ...``, ``if hasattr(torch, ...)``, a version
constant test, or a ``try`` whose handler catches TypeError/AttributeError/ImportError
is reported without a fix, and the guard itself gets a TNU301 finding: rewriting one
branch of a compatibility shim makes both branches identical. After
``if <version test>: ... return`` without ``else``, the rest of the block is treated as
the fallback branch too.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

import libcst as cst
from libcst.metadata import PositionProvider

from torchnext.upgrade._core import Guard, TransformerCore, TryFrame
from torchnext.upgrade._cst import dotted_name
from torchnext.upgrade._retries import retry_handler
from torchnext.upgrade._site import Diagnosis

__all__ = ["GuardTracking"]

_VERSION_TEST = re.compile(
    r"__version__|version|TORCH_(GE|GT|LT|LE|VERSION)|_GE_\d|_LT_\d|hasattr\(\s*torch", re.I
)
_GUARD_EXCEPTIONS = {"TypeError", "AttributeError", "ImportError", "ModuleNotFoundError"}
_SWALLOW_TYPEERROR = {"TypeError", "Exception", "BaseException"}


class GuardTracking(TransformerCore):
    """Pushes and pops guard frames while walking; reports TNU301 and TNU009."""

    def _push_guard(self, node: cst.CSTNode, kind: str) -> None:
        pos = self.get_metadata(PositionProvider, node)
        self.guards.append(Guard(pos.start.line, pos.start.column + 1, kind))

    def _pop_guard(self, node: cst.CSTNode) -> None:
        guard = self.guards.pop()
        if guard.count:
            self.report(
                node, Diagnosis("TNU301", detail=f"{guard.count} site(s) in this {guard.kind}")
            )

    def visit_While(self, node: cst.While) -> None:
        self.bare_exprs.add(id(node.test))

    def _mark_trailing(self, body: Sequence[cst.CSTNode]) -> None:
        """After ``if <version test>: ... return`` (no else), the rest of the block is the
        legacy branch: mark those statements as guarded."""
        for i, stmt in enumerate(body):
            if not (isinstance(stmt, cst.If) and stmt.orelse is None):
                continue
            if not _VERSION_TEST.search(self.code_for_node(stmt.test)):
                continue
            inner = stmt.body.body if isinstance(stmt.body, cst.IndentedBlock) else []
            last = inner[-1] if inner else None
            if isinstance(last, cst.SimpleStatementLine) and any(
                isinstance(s, cst.Return | cst.Raise) for s in last.body
            ):
                pos = self.get_metadata(PositionProvider, stmt)
                for later in body[i + 1 :]:
                    self.trailing[id(later)] = Guard(
                        pos.start.line, pos.start.column + 1, "version guard's fallback"
                    )

    def visit_IndentedBlock(self, node: cst.IndentedBlock) -> None:
        if any(isinstance(stmt, cst.If) for stmt in node.body):
            self._mark_trailing(node.body)

    def visit_Module(self, node: cst.Module) -> None:
        self._mark_trailing(node.body)

    def on_visit(self, node: cst.CSTNode) -> bool:
        guard = self.trailing.get(id(node))
        if guard is not None:
            self.guards.append(Guard(guard.line, guard.column, guard.kind))
        return super().on_visit(node)

    def on_leave(
        self, original_node: cst.CSTNode, updated_node: cst.CSTNode
    ) -> cst.CSTNode | cst.RemovalSentinel | cst.FlattenSentinel[cst.CSTNode]:
        result = super().on_leave(original_node, updated_node)
        if id(original_node) in self.trailing:
            self._pop_guard(original_node)
        return result

    def visit_If(self, node: cst.If) -> None:
        self.bare_exprs.add(id(node.test))
        if _VERSION_TEST.search(self.code_for_node(node.test)):
            self._push_guard(node, "version guard")
            self.if_guards.add(id(node))

    def leave_If(self, original_node: cst.If, updated_node: cst.If) -> cst.BaseStatement:
        if id(original_node) in self.if_guards:
            self.if_guards.discard(id(original_node))
            self._pop_guard(original_node)
        return updated_node

    def _handler_names(self, handler: cst.ExceptHandler) -> set[str]:
        if handler.type is None:
            return {"BaseException"}
        exprs = (
            [e.value for e in handler.type.elements]
            if isinstance(handler.type, cst.Tuple)
            else [handler.type]
        )
        return {n.rsplit(".", 1)[-1] for n in (dotted_name(e) for e in exprs) if n}

    def visit_Try(self, node: cst.Try) -> None:
        frame = TryFrame(node)
        self.tries.append(frame)
        caught = (
            set().union(*(self._handler_names(h) for h in node.handlers))
            if node.handlers
            else set()
        )
        retry = retry_handler(node, self.qualify, self._handler_names)
        if retry is not None:
            # Both branches pass the removed keyword: a retry, not a version guard.
            frame.retry_line = self.get_metadata(PositionProvider, retry).start.line
        elif caught & _GUARD_EXCEPTIONS:
            frame.guard = True
            self._push_guard(node, "try/except fallback")

    def visit_ExceptHandler(self, node: cst.ExceptHandler) -> None:
        if self.tries:
            self.tries[-1].in_body = False

    def visit_Finally(self, node: cst.Finally) -> None:
        if self.tries:
            self.tries[-1].in_body = False

    def visit_Else(self, node: cst.Else) -> None:
        if self.tries and any(node is getattr(t.node, "orelse", None) for t in self.tries[-1:]):
            self.tries[-1].in_body = False

    def leave_Try(self, original_node: cst.Try, updated_node: cst.Try) -> cst.BaseStatement:
        frame = self.tries.pop()
        if frame.guard:
            self._pop_guard(original_node)
        if frame.raises_typeerror_214:
            for handler in original_node.handlers:
                if self._handler_names(handler) & _SWALLOW_TYPEERROR:
                    detail = "it retries with the same keyword" if frame.retry_line else ""
                    self.report(handler, Diagnosis("TNU009", detail=detail))
        return updated_node
