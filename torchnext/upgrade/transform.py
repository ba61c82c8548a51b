"""The one-pass LibCST transformer that finds every site and applies the allowed fixes.

Use :func:`torchnext.upgrade.engine.process_source` rather than this class directly.
The transformer works bottom-up (``leave_*``), so a nested old call is fixed before
the call around it is looked at and both are fixed in one run. Names are resolved
through the file's own imports (``import torch as t``, ``from torch import qr as q``),
in source order; a local variable that shadows an imported name is not tracked.

Context it keeps while walking: version guards (``if torch.__version__ ...``,
``hasattr(torch, ...)``, ``try/except (TypeError, AttributeError)``: sites inside are
reported without a fix), names provably holding tensors (Tensor-method rules fire
only on those receivers; ``self`` and objects of unknown type are left alone), names
bound to ``split_group(...)`` or a locally synchronized ``new_group(...)``, and
``ProcessGroup`` subclasses.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import libcst as cst

from torchnext.upgrade import fixers_misc as _fixers_misc
from torchnext.upgrade._core import SiteFinding, noqa_map
from torchnext.upgrade._cst import dotted_name, paren_if_needed
from torchnext.upgrade._placeholders import keep_only
from torchnext.upgrade._retries import RETRY_CODES
from torchnext.upgrade._site import Diagnosis, Fixer, Site
from torchnext.upgrade._structural import StructuralRules

__all__ = ["SiteFinding", "UpgradeTransformer", "noqa_map"]


def _retry_detail(detail: str, line: int) -> str:
    note = (
        f"the `except` at line {line} retries with the same keyword, so on torch 2.14 it "
        "would hide this TypeError; every branch is rewritten"
    )
    return f"{detail}; {note}" if detail else note


class UpgradeTransformer(StructuralRules):
    """Finds sites of the active rules; applies fixes the fix level allows."""

    def _run_fixers(
        self, node: cst.CSTNode, fixers: Sequence[Fixer], site: Site, *, method: bool
    ) -> cst.BaseExpression | None:
        """Run fixers in order on ``site``; return the replacement if any fix was applied."""
        replacement: cst.BaseExpression | None = None
        for fixer in fixers:
            if method and fixer.needs_tensor and not site.receiver_is_tensor:
                # Library classes define methods named like removed Tensor methods; a call
                # on `self` or on an object of unknown type is neither reported nor fixed.
                continue
            try:
                diag = fixer.fn(site)
            except Exception as exc:  # one odd site must not stop the file
                diag = Diagnosis(
                    "TNU902", detail=f"{fixer.code} raised {type(exc).__name__}: {exc}"
                )
            if diag is None:
                continue
            if diag.code == "TNU003" and self.tries and self.tries[-1].in_body:
                self.tries[-1].raises_typeerror_214 = True
            retry = self.tries[-1].retry_line if self.tries else None
            if retry is not None and diag.code in RETRY_CODES:
                diag = dataclasses.replace(diag, detail=_retry_detail(diag.detail, retry))
            if self.report(node, diag):
                replacement = diag.fix
                if isinstance(node, cst.Call) and isinstance(node.func, cst.Name):
                    binding = self.from_imports.get(node.func.value)
                    if binding is not None:
                        self.used_from_imports.add(binding)
                if site.used_torch and not self.has_torch_binding():
                    self.needs_torch_import = True
                if isinstance(replacement, cst.Call):
                    site = Site(
                        call=replacement,
                        qname=site.qname,
                        torch_name=site.torch_name,
                        receiver=site.receiver,
                        receiver_is_tensor=site.receiver_is_tensor,
                        wrapper=site.wrapper,
                    )
                else:
                    break
        return replacement

    # ------------------------------------------------------------------ tuple wrappers

    def visit_Subscript(self, node: cst.Subscript) -> None:
        if isinstance(node.value, cst.Call) and len(node.slice) == 1:
            element = node.slice[0].slice
            if isinstance(element, cst.Index) and isinstance(element.value, cst.Integer):
                self.wrapped[id(node.value)] = ("index", int(element.value.value))

    def visit_Attribute(self, node: cst.Attribute) -> None:
        if isinstance(node.value, cst.Call):
            self.wrapped[id(node.value)] = ("attr", node.attr.value)

    def leave_Subscript(
        self, original_node: cst.Subscript, updated_node: cst.Subscript
    ) -> cst.BaseExpression:
        return self._leave_wrapper(original_node, updated_node)

    def leave_Attribute(
        self, original_node: cst.Attribute, updated_node: cst.Attribute
    ) -> cst.BaseExpression:
        q = self.qualify(original_node)
        if q == "torch.distributed.config.compile_on_one_rank":
            diag = Diagnosis(
                "TNU105",
                fix=cst.Attribute(
                    value=cst.Attribute(
                        value=cst.Attribute(
                            value=cst.Name(self.torch_name), attr=cst.Name("compiler")
                        ),
                        attr=cst.Name("config"),
                    ),
                    attr=cst.Name("compile_on_one_rank"),
                ),
                imports=("torch.compiler.config",),
            )
            if self.report(original_node, diag):
                if not self.has_torch_binding():
                    self.needs_torch_import = True
                return diag.fix  # type: ignore[return-value]
            return updated_node
        if q == "torch._dynamo.config.enable_faithful_generator_behavior":
            self.report(original_node, Diagnosis("TNU109", detail="the setting is ignored"))
            return updated_node
        if original_node.attr.value == "use_cuda" and self.is_profiler(original_node.value):
            detail = "the `.use_cuda` attribute is gone too (AttributeError); read `.use_device`"
            self.report(original_node, Diagnosis("TNU003", detail=detail))
            return updated_node
        return self._leave_wrapper(original_node, updated_node)

    def _leave_wrapper(
        self, original: cst.Subscript | cst.Attribute, updated: cst.Subscript | cst.Attribute
    ) -> cst.BaseExpression:
        inner = original.value
        if not isinstance(inner, cst.Call) or id(inner) not in self.wrapped:
            return updated
        wrapper = self.wrapped.pop(id(inner))
        new_inner = updated.value
        if not isinstance(new_inner, cst.Call):
            return updated
        site, fixers = self._site_for(inner, new_inner, tuple_aware=True)
        if site is None or not fixers:
            return updated
        site.wrapper = wrapper
        replacement = self._run_fixers(inner, fixers, site, method=site.receiver is not None)
        return replacement if replacement is not None else updated

    # ------------------------------------------------------------------ calls

    def _site_for(
        self, original: cst.Call, updated: cst.Call, *, tuple_aware: bool
    ) -> tuple[Site | None, list[Fixer]]:
        q = self.qualify(original.func)
        if q is not None:
            fixers = [f for f in self.call_fixers.get(q, ()) if f.tuple_aware == tuple_aware]
            if not fixers:
                return None, []
            head = (dotted_name(original.func) or "").split(".")[0]
            torch_name = head if self.aliases.get(head) == "torch" else self.torch_name
            return Site(call=updated, qname=q, torch_name=torch_name), fixers
        func = original.func
        if isinstance(func, cst.Attribute) and self.imports_torch:
            name = func.attr.value
            fixers = [
                f
                for f in self.method_fixers.get(name, ())
                if f.tuple_aware == tuple_aware
                # set_context()/pop_context() are common names; only green-context files count.
                and (f.code != "TNU108" or self.green_contexts)
            ]
            if not fixers or self.qualify(func.value) is not None:
                return None, []  # a module attribute (np.linalg.qr), not a method call
            new_func = updated.func
            receiver = new_func.value if isinstance(new_func, cst.Attribute) else func.value
            return (
                Site(
                    call=updated,
                    qname=f".{name}",
                    torch_name=self.torch_name,
                    receiver=paren_if_needed(receiver),
                    receiver_is_tensor=self.is_tensor(func.value),
                ),
                fixers,
            )
        return None, []

    def visit_Decorator(self, node: cst.Decorator) -> None:
        q = self.qualify(node.decorator)
        if q is not None and q in _fixers_misc.JIT_DEPRECATED:
            self.report(node.decorator, Diagnosis("TNU101", detail=f"`@{q}`"))

    def leave_Call(self, original_node: cst.Call, updated_node: cst.Call) -> cst.BaseExpression:
        replacement: cst.BaseExpression | None = None
        site, fixers = self._site_for(original_node, updated_node, tuple_aware=False)
        if site is not None:
            replacement = self._run_fixers(
                original_node, fixers, site, method=site.receiver is not None
            )
        if replacement is None and id(original_node) not in self.wrapped:
            # Tuple-aware rules on a bare call (no [i] / .attr around it): report the tuple use.
            site, fixers = self._site_for(original_node, updated_node, tuple_aware=True)
            if site is not None:
                kept = self.kept.get(id(original_node))
                v_name = None if kept is not None else self.unpacked_v.get(id(original_node))
                if kept is not None:
                    site.wrapper = ("keep", kept)
                elif v_name is not None:
                    site.wrapper = ("unpack", v_name)
                replacement = self._run_fixers(
                    original_node, fixers, site, method=site.receiver is not None
                )
                if replacement is not None and v_name is not None and site.qname.endswith("svd"):
                    self.svd_fixed[id(original_node)] = v_name
                if replacement is not None and kept is not None:
                    self.kept_fixed[id(original_node)] = kept
        return replacement if replacement is not None else updated_node

    def leave_Assign(self, original_node: cst.Assign, updated_node: cst.Assign) -> cst.Assign:
        kept = self.kept_fixed.pop(id(original_node.value), None)
        # The call now returns the one result the placeholders did not drop.
        return updated_node if kept is None else keep_only(updated_node, kept)
