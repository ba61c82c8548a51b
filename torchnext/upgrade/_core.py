"""Shared state of the upgrade transformer: import aliases, scopes, ``# noqa``, reporting.

The transformer is built in layers, each a module: this core (names and findings),
:mod:`.guards` (version-guarded branches), :mod:`._structural` (rules that need
statement or class context) and :mod:`.transform` (call sites and fixes). Names are
resolved through the file's own imports in source order; a local variable that shadows
an imported name is not tracked.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field

import libcst as cst
from libcst.metadata import PositionProvider

from torchnext.upgrade import fixers_linalg as _fixers_linalg  # noqa: F401  (registers fixers)
from torchnext.upgrade import fixers_misc as _fixers_misc
from torchnext.upgrade._cst import dotted_name
from torchnext.upgrade._nonmember import NEW_GROUP_CALLS, SPLIT_GROUP_CALLS, local_sync_new_group
from torchnext.upgrade._placeholders import kept_result
from torchnext.upgrade._receivers import TENSOR_ANNOTATIONS, is_tensor_expr, tensor_tuple_call
from torchnext.upgrade._site import CALL_FIXERS, METHOD_FIXERS, Diagnosis
from torchnext.upgrade.value_uses import deprecated_name_code

__all__ = ["Guard", "SiteFinding", "TransformerCore", "TryFrame", "noqa_map"]

_NOQA = re.compile(r"#\s*noqa(?::\s*(?P<codes>[A-Za-z]+[0-9]+(?:\s*,\s*[A-Za-z]+[0-9]+)*))?", re.I)


def noqa_map(source: str) -> dict[int, frozenset[str] | None]:
    """line -> codes silenced on it (None: all codes)."""
    out: dict[int, frozenset[str] | None] = {}
    if "noqa" not in source.lower():
        return out
    for lineno, line in enumerate(source.splitlines(), start=1):
        m = _NOQA.search(line)
        if m:
            codes = m.group("codes")
            out[lineno] = (
                None if not codes else frozenset(c.strip().upper() for c in codes.split(","))
            )
    return out


@dataclass
class SiteFinding:
    """A finding before it becomes a :class:`~torchnext.upgrade.findings.Finding`."""

    code: str
    detail: str
    line: int
    column: int
    end_line: int
    end_column: int
    applicability: str | None
    fixed: bool


@dataclass
class Guard:
    """An open version guard (``if``/``try``) and how many rule sites it holds so far."""

    line: int
    column: int
    kind: str
    count: int = 0


@dataclass
class TryFrame:
    """A ``try`` statement being walked: which part, and what its handlers say about it."""

    node: cst.Try
    in_body: bool = True
    raises_typeerror_214: bool = False
    guard: bool = False  # a version guard: its sites are reported, not rewritten
    retry_line: int | None = None  # line of the handler that retries the removed keyword


@dataclass
class _Scope:
    tensors: set[str] = field(default_factory=set)
    others: set[str] = field(default_factory=set)  # bound here to something not a tensor
    split_groups: set[str] = field(default_factory=set)
    profilers: set[str] = field(default_factory=set)
    is_class: bool = False  # a class body: its names are not visible from its methods


class TransformerCore(cst.CSTTransformer):
    """Imports, scopes and reporting; the layers above add the rules.

    The public attributes (``guards``, ``tries``, ``scopes``, ``wrapped``, ``kept`` ...) and
    methods (``report``, ``is_tensor``, ``has_torch_binding``) are the state and the
    services the rule layers in :mod:`._guards`, :mod:`._structural` and :mod:`.transform`
    share; underscore names stay inside this module.
    """

    METADATA_DEPENDENCIES = (PositionProvider,)

    def __init__(
        self,
        *,
        active: frozenset[str],
        fix_level: str,
        noqa: dict[int, frozenset[str] | None],
        aliases: dict[str, str] | None = None,
        code_for_node: Callable[[cst.CSTNode], str] | None = None,
        source_text: str = "",
    ) -> None:
        super().__init__()
        if fix_level not in ("none", "safe", "unsafe"):
            raise ValueError(f"fix_level={fix_level!r}: use none, safe or unsafe")
        self.active = active
        self.fix_level = fix_level
        self.noqa = noqa
        self.aliases: dict[str, str] = dict(aliases or {})
        self.from_imports: dict[str, tuple[str, str, str | None]] = {}
        self.code_for_node = code_for_node or cst.Module([]).code_for_node
        self.findings: list[SiteFinding] = []
        self.used_from_imports: set[tuple[str, str, str | None]] = set()
        self.needs_torch_import = False
        self.extra_imports: set[str] = set()
        self.source_text = source_text
        self.green_contexts = "GreenContext" in source_text or "green_context" in source_text
        self.guards: list[Guard] = []
        self.tries: list[TryFrame] = []
        self.scopes: list[_Scope] = [_Scope()]
        self.classes: list[tuple[bool, int]] = []  # (is ProcessGroup subclass, function depth)
        self._func_depth = 0
        self.wrapped: dict[int, tuple[str, str | int]] = {}
        self.exempt: set[int] = set()
        self.if_guards: set[int] = set()
        self.bare_exprs: set[int] = set()  # if/while tests and assigned values: no parens needed
        self.trailing: dict[int, Guard] = {}
        # `U, S, V = <call>`: call id -> "V"; and calls whose V must become `V = V.mH`.
        self.unpacked_v: dict[int, str] = {}
        self.svd_fixed: dict[int, str] = {}
        # `e, _ = <call>`: call id -> index of the one result kept; and the calls fixed so.
        self.kept: dict[int, int] = {}
        self.kept_fixed: dict[int, int] = {}
        self._line_assigns: set[int] = set()  # values of assignments alone on their line
        # from-import aliases of deprecated names used as values -> line of the first use
        self._value_uses: dict[int, int] = {}
        self.method_fixers = {
            name: [f for f in fixers if f.code in active] for name, fixers in METHOD_FIXERS.items()
        }
        self.call_fixers = {
            q: [f for f in fixers if f.code in active] for q, fixers in CALL_FIXERS.items()
        }

    # ------------------------------------------------------------------ names

    @property
    def torch_name(self) -> str:
        for name, target in self.aliases.items():
            if target == "torch":
                return name
        return "torch"

    @property
    def imports_torch(self) -> bool:
        return any(t == "torch" or t.startswith("torch.") for t in self.aliases.values())

    def qualify(self, node: cst.BaseExpression) -> str | None:
        name = dotted_name(node)
        if name is None:
            return None
        head, _, rest = name.partition(".")
        target = self.aliases.get(head)
        if target is None:
            return None
        return f"{target}.{rest}" if rest else target

    def visit_Import(self, node: cst.Import) -> None:
        for alias in node.names:
            full = dotted_name(alias.name)
            if full is None:
                continue
            if alias.asname is not None and isinstance(alias.asname.name, cst.Name):
                self.aliases[alias.asname.name.value] = full
            else:
                head = full.split(".")[0]
                self.aliases[head] = head

    def visit_ImportFrom(self, node: cst.ImportFrom) -> None:
        if node.relative or node.module is None or isinstance(node.names, cst.ImportStar):
            return
        module = dotted_name(node.module)
        if module is None:
            return
        for alias in node.names:
            name = dotted_name(alias.name)
            if name is None:
                continue
            asname = (
                alias.asname.name.value
                if alias.asname is not None and isinstance(alias.asname.name, cst.Name)
                else None
            )
            bound = asname or name
            self.aliases[bound] = f"{module}.{name}"
            self.from_imports[bound] = (module, name, asname)
            line = self._value_uses.get(id(alias))
            code = deprecated_name_code(f"{module}.{name}")
            if line is not None and code is not None:
                detail = f"`{bound}` is used without a call at line {line}; replace that use too"
                self.report(alias, Diagnosis(code, detail=detail))
            if module == "torch._dynamo.backends.tvm" and name in (
                "tvm_meta_schedule",
                "tvm_auto_scheduler",
            ):
                self.report(alias, Diagnosis("TNU007", detail=f"`{name}` no longer exists"))

    # ------------------------------------------------------------------ reporting

    def _silenced(self, code: str, line: int, end_line: int) -> bool:
        for ln in (line, end_line):
            codes = self.noqa.get(ln, frozenset())
            if codes is None or (codes and code in codes):
                return True
        return False

    def report(self, node: cst.CSTNode, diag: Diagnosis, *, fixable: bool = True) -> bool:
        """Record a finding; True if its fix should be applied."""
        if diag.code not in self.active:
            return False
        pos = self.get_metadata(PositionProvider, node)
        line, end_line = pos.start.line, pos.end.line
        if self._silenced(diag.code, line, end_line):
            return False
        detail = diag.detail
        guarded = bool(self.guards) and diag.code not in ("TNU301", "TNU009", "TNU902")
        if guarded:
            self.guards[-1].count += 1
            g = self.guards[-1]
            detail = (detail + "; " if detail else "") + (
                f"inside a version-guarded branch (line {g.line}); not rewritten"
            )
        applicability: str | None = None
        if diag.fix is not None and fixable and not guarded:
            applicability = "unsafe" if diag.unsafe else "safe"
        apply = applicability is not None and (
            self.fix_level == "unsafe" or (self.fix_level == "safe" and applicability == "safe")
        )
        self.findings.append(
            SiteFinding(
                code=diag.code,
                detail=detail,
                line=line,
                column=pos.start.column + 1,
                end_line=end_line,
                end_column=pos.end.column + 1,
                applicability=applicability,
                fixed=apply,
            )
        )
        if apply:
            self.extra_imports.update(diag.imports)
        return apply

    def has_torch_binding(self) -> bool:
        return any(t == "torch" for t in self.aliases.values())

    # ------------------------------------------------------------------ scopes

    def visit_FunctionDef(self, node: cst.FunctionDef) -> None:
        self._func_depth += 1
        self.scopes.append(self._param_scope(node.params))

    def _param_scope(self, params: cst.Parameters) -> _Scope:
        # Every parameter shadows outer names; only a Tensor-annotated one is a tensor.
        scope = _Scope()
        for param in [*params.params, *params.kwonly_params, *params.posonly_params]:
            ann = param.annotation
            if ann is not None and self._is_tensor_annotation(ann.annotation):
                scope.tensors.add(param.name.value)
            else:
                scope.others.add(param.name.value)
        for star in (params.star_arg, params.star_kwarg):
            if isinstance(star, cst.Param):
                scope.others.add(star.name.value)
        return scope

    def push_class_scope(self) -> None:
        self.scopes.append(_Scope(is_class=True))

    def visit_Lambda(self, node: cst.Lambda) -> None:
        self.scopes.append(self._param_scope(node.params))

    def leave_Lambda(self, original_node: cst.Lambda, updated_node: cst.Lambda) -> cst.Lambda:
        self.scopes.pop()
        return updated_node

    def _is_tensor_annotation(self, ann: cst.BaseExpression) -> bool:
        return self.qualify(ann) in TENSOR_ANNOTATIONS or (
            isinstance(ann, cst.SimpleString)
            and ann.value.strip("'\"") in ("Tensor", "torch.Tensor")
        )

    def _bind(self, target: cst.BaseExpression, tensor: bool) -> None:
        """Record that ``target`` now holds a tensor (or not) in the current scope."""
        scope = self.scopes[-1]
        if isinstance(target, cst.Name):
            (scope.tensors if tensor else scope.others).add(target.value)
            (scope.others if tensor else scope.tensors).discard(target.value)
        elif isinstance(target, cst.Tuple | cst.List):
            for element in target.elements:
                self._bind(element.value, tensor and not isinstance(element, cst.StarredElement))
        elif isinstance(target, cst.StarredElement):
            self._bind(target.value, False)

    def visit_For(self, node: cst.For) -> None:
        self._bind(node.target, False)

    def _push_comprehension(self, node: cst.BaseComp | cst.BaseDict) -> None:
        # The element is visited before its `for`: bind the loop targets first, in a scope
        # of their own so that they do not hide the outer names after the comprehension.
        self.scopes.append(_Scope())
        comp_for: cst.CompFor | None = getattr(node, "for_in", None)
        while comp_for is not None:
            self._bind(comp_for.target, False)
            comp_for = comp_for.inner_for_in

    def _pop_comprehension(self) -> None:
        self.scopes.pop()

    def visit_ListComp(self, node: cst.ListComp) -> None:
        self._push_comprehension(node)

    def leave_ListComp(
        self, original_node: cst.ListComp, updated_node: cst.ListComp
    ) -> cst.BaseExpression:
        self._pop_comprehension()
        return updated_node

    def visit_SetComp(self, node: cst.SetComp) -> None:
        self._push_comprehension(node)

    def leave_SetComp(
        self, original_node: cst.SetComp, updated_node: cst.SetComp
    ) -> cst.BaseExpression:
        self._pop_comprehension()
        return updated_node

    def visit_DictComp(self, node: cst.DictComp) -> None:
        self._push_comprehension(node)

    def leave_DictComp(
        self, original_node: cst.DictComp, updated_node: cst.DictComp
    ) -> cst.BaseExpression:
        self._pop_comprehension()
        return updated_node

    def visit_GeneratorExp(self, node: cst.GeneratorExp) -> None:
        self._push_comprehension(node)

    def leave_GeneratorExp(
        self, original_node: cst.GeneratorExp, updated_node: cst.GeneratorExp
    ) -> cst.BaseExpression:
        self._pop_comprehension()
        return updated_node

    def visit_AsName(self, node: cst.AsName) -> None:
        if isinstance(node.name, cst.Name | cst.Tuple | cst.List):
            self._bind(node.name, False)

    def visit_NamedExpr(self, node: cst.NamedExpr) -> None:
        self._bind(node.target, self.is_tensor(node.value))

    def visit_SimpleStatementLine(self, node: cst.SimpleStatementLine) -> None:
        if len(node.body) == 1 and isinstance(node.body[0], cst.Assign):
            self._line_assigns.add(id(node.body[0].value))

    def visit_Assign(self, node: cst.Assign) -> None:
        value = node.value
        self.bare_exprs.add(id(value))
        # The value is judged before the targets are rebound (`x = x.double()`).
        tensor = self.is_tensor(value)
        tuple_of_tensors = tensor_tuple_call(value, self.qualify)
        for t in node.targets:
            single = isinstance(t.target, cst.Name)
            self._bind(t.target, tensor if single else tuple_of_tensors)
        if not isinstance(value, cst.Call):
            return
        q = self.qualify(value.func)
        targets = [t.target.value for t in node.targets if isinstance(t.target, cst.Name)]
        op = (q or dotted_name(value.func) or "").rsplit(".", 1)[-1]
        kept = kept_result(node, op)
        if kept is not None:
            self.kept[id(value)] = kept
        unpack = node.targets[0].target if len(node.targets) == 1 else None
        if (
            id(value) in self._line_assigns
            and isinstance(unpack, cst.Tuple | cst.List)
            and len(unpack.elements) == 3
            and all(
                isinstance(e.value, cst.Name) and not isinstance(e, cst.StarredElement)
                for e in unpack.elements
            )
        ):
            third = unpack.elements[2].value
            if isinstance(third, cst.Name):
                self.unpacked_v[id(value)] = third.value
        if q is None:
            return
        if q in SPLIT_GROUP_CALLS or (q in NEW_GROUP_CALLS and local_sync_new_group(value)):
            self.scopes[-1].split_groups.update(targets)
        elif q in _fixers_misc.PROFILERS:
            self.scopes[-1].profilers.update(targets)

    def visit_WithItem(self, node: cst.WithItem) -> None:
        item = node.item
        if (
            isinstance(item, cst.Call)
            and node.asname is not None
            and isinstance(node.asname.name, cst.Name)
            and self.qualify(item.func) in _fixers_misc.PROFILERS
        ):
            self.scopes[-1].profilers.add(node.asname.name.value)

    def is_profiler(self, node: cst.BaseExpression) -> bool:
        return isinstance(node, cst.Name) and any(node.value in s.profilers for s in self.scopes)

    def visit_AnnAssign(self, node: cst.AnnAssign) -> None:
        tensor = self._is_tensor_annotation(node.annotation.annotation) or (
            node.value is not None and self.is_tensor(node.value)
        )
        self._bind(node.target, tensor)

    def _is_tensor_name(self, name: str) -> bool:
        for depth, scope in enumerate(reversed(self.scopes)):  # the innermost binding wins
            if scope.is_class and depth:
                continue
            if name in scope.tensors:
                return True
            if name in scope.others:
                return False
        return False

    def is_tensor(self, node: cst.BaseExpression) -> bool:
        return is_tensor_expr(node, self.qualify, self._is_tensor_name)
