"""Deprecated names used as values: ``from torch import cholesky`` then ``map(cholesky, xs)``.

Call rules see ``cholesky(A)``, but a name taken from a deprecated or removed API and
passed as an argument, stored or aliased (``solver = cholesky``) is never called at a
site a rule can see. Such a binding is reported at its import, where the fix belongs
(2.14 raises ImportError there for removed names).

Only names that are deprecated in themselves count: a rule that fires on every call of
the name (``torch.cholesky``, ``torch.jit.script``, ``torch.cuda.amp.autocast``). Names
whose rules depend on the arguments (``torch.profiler.profile``, ``torch.compile``) are
fine to pass around. References are resolved with LibCST's scope analysis, so a local
that shadows the import is not a use of it; the analysis runs only for files that
from-import such a name.
"""

from __future__ import annotations

import re
from functools import lru_cache

import libcst as cst
from libcst.metadata import MetadataWrapper, PositionProvider, ScopeProvider
from libcst.metadata.scope_provider import ImportAssignment

from torchnext.upgrade import fixers_linalg as _fixers_linalg  # noqa: F401  (fill the registry)
from torchnext.upgrade import fixers_misc as _fixers_misc  # noqa: F401
from torchnext.upgrade._cst import dotted_name
from torchnext.upgrade._site import CALL_FIXERS

__all__ = ["deprecated_name_code", "value_uses"]

# Rules that flag every call of their names, whatever the arguments.
_NAME_RULES = frozenset({"TNU001", "TNU002", "TNU101", "TNU106"}) | frozenset(
    f"TNU2{n:02d}" for n in range(1, 16)
)
_FROM_TORCH = re.compile(r"\bfrom\s+(torch[\w.]*)\s+import\s+(\([^)]*\)|[^\n]*)")
_IMPORTED = re.compile(r"(?:^|[(,])\s*(\w+)")


@lru_cache(maxsize=1)
def _table() -> dict[str, str]:
    table: dict[str, str] = {}
    for qname, fixers in CALL_FIXERS.items():
        codes = [f.code for f in fixers if f.code in _NAME_RULES]
        if codes and not qname.startswith("torch.Tensor."):
            table[qname] = codes[0]
    return table


def deprecated_name_code(qname: str) -> str | None:
    """The rule code for a name deprecated in itself, else None."""
    return _table().get(qname)


def _may_import_deprecated(source: str) -> bool:
    """A from-import in ``source`` may bind a deprecated name (text-level, may say yes)."""
    for m in _FROM_TORCH.finditer(source):
        names = re.sub(r"#[^\n]*", "", m.group(2)).replace("\\", " ")
        for name in _IMPORTED.findall(names):
            if deprecated_name_code(f"{m.group(1)}.{name}") is not None:
                return True
    return False


class _CalledNodes(cst.CSTVisitor):
    """Ids of the names that are called (or used as a bare decorator, reported there)."""

    def __init__(self) -> None:
        super().__init__()
        self.called: set[int] = set()

    def visit_Call(self, node: cst.Call) -> None:
        self.called.add(id(node.func))

    def visit_Decorator(self, node: cst.Decorator) -> None:
        self.called.add(id(node.decorator))


def _alias_for(node: cst.ImportFrom, bound: str) -> cst.ImportAlias | None:
    if isinstance(node.names, cst.ImportStar):
        return None
    for alias in node.names:
        name = alias.asname.name if alias.asname is not None else alias.name
        if isinstance(name, cst.Name) and name.value == bound:
            return alias
    return None


def value_uses(module: cst.Module, source: str) -> dict[int, int]:
    """``id(ImportAlias)`` -> line of the first non-call use, for each from-imported
    deprecated name used as a value. ``module`` must be the tree the caller walks (its
    nodes are not copied)."""
    if not _may_import_deprecated(source):
        return {}  # the scope analysis is costly; most files import nothing deprecated
    wrapper = MetadataWrapper(module, unsafe_skip_copy=True)
    scopes = wrapper.resolve(ScopeProvider)
    positions = wrapper.resolve(PositionProvider)
    called: _CalledNodes | None = None
    out: dict[int, int] = {}
    for scope in {s for s in scopes.values() if s is not None}:
        for assignment in scope.assignments:
            if not isinstance(assignment, ImportAssignment):
                continue
            node = assignment.node
            if not isinstance(node, cst.ImportFrom) or node.relative or node.module is None:
                continue
            alias = _alias_for(node, assignment.name)
            module_name = dotted_name(node.module)
            if alias is None or module_name is None:
                continue
            qname = f"{module_name}.{dotted_name(alias.name)}"
            if deprecated_name_code(qname) is None:
                continue
            if called is None:
                called = _CalledNodes()
                module.visit(called)
            lines = [
                positions[a.node].start.line
                for a in assignment.references
                if isinstance(a.node, cst.Name) and id(a.node) not in called.called
            ]
            if lines:
                out[id(alias)] = min(lines)
    return out
