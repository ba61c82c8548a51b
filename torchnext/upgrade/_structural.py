"""Rules that need statement, scope or class context rather than one call.

TNU004 (``split_group`` / local-sync ``new_group`` results compared with None),
TNU005 (``new_group`` methods of ProcessGroup subclasses without ``backend=``), TNU107
(a bare ``register_generator_state`` statement, removed) and the import-site report of
deprecated names used as values (found by :mod:`.value_uses`).
"""

from __future__ import annotations

import libcst as cst

from torchnext.upgrade._guards import GuardTracking
from torchnext.upgrade._site import Diagnosis
from torchnext.upgrade.value_uses import value_uses

__all__ = ["StructuralRules"]

# Placeholder fix for rules that rewrite a statement or signature themselves.
_STATEMENT_FIX = cst.Name("_")


class StructuralRules(GuardTracking):
    """Adds the statement- and class-level rules to the guard-aware core."""

    def visit_Module(self, node: cst.Module) -> None:
        super().visit_Module(node)
        self._value_uses = value_uses(node, self.source_text)

    def leave_FunctionDef(
        self, original_node: cst.FunctionDef, updated_node: cst.FunctionDef
    ) -> cst.FunctionDef:
        self._func_depth -= 1
        self.scopes.pop()
        if (
            self.classes
            and self.classes[-1][0]
            and self.classes[-1][1] == self._func_depth
            and original_node.name.value == "new_group"
        ):
            return self._check_new_group(original_node, updated_node)
        return updated_node

    def _check_new_group(
        self, original: cst.FunctionDef, updated: cst.FunctionDef
    ) -> cst.FunctionDef:
        params = updated.params
        names = {
            p.name.value for p in [*params.params, *params.kwonly_params, *params.posonly_params]
        }
        if "backend" in names or isinstance(params.star_kwarg, cst.Param):
            return updated
        backend = cst.Param(
            name=cst.Name("backend"),
            default=cst.Name("None"),
            equal=cst.AssignEqual(
                whitespace_before=cst.SimpleWhitespace(""),
                whitespace_after=cst.SimpleWhitespace(""),
            ),
        )
        if isinstance(params.star_arg, cst.Param | cst.ParamStar):
            kwonly = list(params.kwonly_params)
            index = next((i + 1 for i, p in enumerate(kwonly) if p.name.value == "timeout"), 0)
            kwonly.insert(index, backend)
            new_params = params.with_changes(kwonly_params=kwonly)
        else:
            new_params = params.with_changes(star_arg=cst.ParamStar(), kwonly_params=[backend])
        fix = updated.with_changes(params=new_params)
        # The fix is a whole new signature, applied here; the Diagnosis only needs *a* fix
        # node so that the finding is marked fixable.
        if self.report(original.name, Diagnosis("TNU005", fix=_STATEMENT_FIX)):
            return fix
        return updated

    def visit_ClassDef(self, node: cst.ClassDef) -> None:
        is_pg = False
        for base in node.bases:
            q = self.qualify(base.value)
            if q is not None and q.startswith("torch") and q.rsplit(".", 1)[-1] == "ProcessGroup":
                is_pg = True
        self.classes.append((is_pg, self._func_depth))
        self.push_class_scope()

    def leave_ClassDef(
        self, original_node: cst.ClassDef, updated_node: cst.ClassDef
    ) -> cst.ClassDef:
        self.classes.pop()
        self.scopes.pop()
        return updated_node

    def leave_SimpleStatementLine(
        self, original_node: cst.SimpleStatementLine, updated_node: cst.SimpleStatementLine
    ) -> cst.SimpleStatementLine | cst.RemovalSentinel | cst.FlattenSentinel[cst.BaseStatement]:
        first = original_node.body[0] if len(original_node.body) == 1 else None
        if isinstance(first, cst.Assign) and id(first.value) in self.svd_fixed:
            # torch.svd returned V; torch.linalg.svd returns Vh = V^H.
            v = cst.Name(self.svd_fixed.pop(id(first.value)))
            conj = cst.SimpleStatementLine(
                body=[
                    cst.Assign(
                        targets=[cst.AssignTarget(target=v)],
                        value=cst.Attribute(value=v, attr=cst.Name("mH")),
                    )
                ],
                leading_lines=(),
            )
            return cst.FlattenSentinel([updated_node, conj])
        if not isinstance(first, cst.Expr):
            return updated_node
        call = first.value
        if not (
            isinstance(call, cst.Call)
            and isinstance(call.func, cst.Attribute)
            and call.func.attr.value == "register_generator_state"
            and self.imports_torch
        ):
            return updated_node
        if self.report(call, Diagnosis("TNU107", fix=_STATEMENT_FIX, unsafe=True)):
            return cst.RemovalSentinel.REMOVE
        return updated_node

    # ------------------------------------------------------------------ split_group checks

    def _split_name(self, node: cst.BaseExpression) -> str | None:
        if isinstance(node, cst.Name) and any(node.value in s.split_groups for s in self.scopes):
            return node.value
        return None

    def _sentinel(self) -> cst.BaseExpression:
        base = None
        for name, target in self.aliases.items():
            if target == "torch.distributed":
                base = cst.Name(name)
                break
        if base is None:
            if not self.has_torch_binding():
                self.needs_torch_import = True
            self.extra_imports.add("torch.distributed")
            base = cst.Attribute(value=cst.Name(self.torch_name), attr=cst.Name("distributed"))
        return cst.Attribute(
            value=cst.Attribute(value=base, attr=cst.Name("GroupMember")),
            attr=cst.Name("NON_GROUP_MEMBER"),
        )

    def visit_BooleanOperation(self, node: cst.BooleanOperation) -> None:
        if "NON_GROUP_MEMBER" in self.code_for_node(node.right):
            self.exempt.add(id(node.left))
            if isinstance(node.left, cst.UnaryOperation):
                self.exempt.add(id(node.left.expression))

    def leave_Comparison(
        self, original_node: cst.Comparison, updated_node: cst.Comparison
    ) -> cst.BaseExpression:
        if id(original_node) in self.exempt or len(original_node.comparisons) != 1:
            return updated_node
        name = self._split_name(original_node.left)
        target = original_node.comparisons[0]
        if name is None or not (
            isinstance(target.comparator, cst.Name) and target.comparator.value == "None"
        ):
            return updated_node
        op = target.operator
        var = cst.Name(name)
        if isinstance(op, cst.Is | cst.Equal):
            new: cst.BaseExpression = cst.BooleanOperation(
                left=cst.Comparison(var, [cst.ComparisonTarget(cst.Is(), cst.Name("None"))]),
                operator=cst.Or(),
                right=cst.Comparison(
                    var, [cst.ComparisonTarget(cst.Equal(), self._sentinel_lazy())]
                ),
            )
        elif isinstance(op, cst.IsNot | cst.NotEqual):
            new = cst.BooleanOperation(
                left=cst.Comparison(var, [cst.ComparisonTarget(cst.IsNot(), cst.Name("None"))]),
                operator=cst.And(),
                right=cst.Comparison(
                    var, [cst.ComparisonTarget(cst.NotEqual(), self._sentinel_lazy())]
                ),
            )
        else:
            return updated_node
        return self._split_fix(original_node, updated_node, new)

    def _sentinel_lazy(self) -> cst.BaseExpression:
        return cst.Name("__tnu_sentinel__")

    def _split_fix(
        self, original: cst.BaseExpression, updated: cst.BaseExpression, new: cst.BaseExpression
    ) -> cst.BaseExpression:
        if id(original) not in self.bare_exprs:
            new = new.with_changes(lpar=[cst.LeftParen()], rpar=[cst.RightParen()])
        if self.report(original, Diagnosis("TNU004", fix=new, unsafe=True)):
            sentinel = self._sentinel()
            return new.visit(_ReplaceName("__tnu_sentinel__", sentinel))  # type: ignore[return-value]
        return updated

    def leave_UnaryOperation(
        self, original_node: cst.UnaryOperation, updated_node: cst.UnaryOperation
    ) -> cst.BaseExpression:
        if (
            not isinstance(original_node.operator, cst.Not)
            or id(original_node.expression) in self.exempt
        ):
            return updated_node
        name = self._split_name(original_node.expression)
        if name is None:
            return updated_node
        var = cst.Name(name)
        new = cst.BooleanOperation(
            left=cst.Comparison(var, [cst.ComparisonTarget(cst.Is(), cst.Name("None"))]),
            operator=cst.Or(),
            right=cst.Comparison(var, [cst.ComparisonTarget(cst.Equal(), self._sentinel_lazy())]),
        )
        return self._split_fix(original_node, updated_node, new)


class _ReplaceName(cst.CSTTransformer):
    def __init__(self, name: str, value: cst.BaseExpression) -> None:
        super().__init__()
        self.name = name
        self.value = value

    def leave_Name(self, original_node: cst.Name, updated_node: cst.Name) -> cst.BaseExpression:
        return self.value if original_node.value == self.name else updated_node
