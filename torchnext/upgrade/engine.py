"""Check and fix one Python source text: parse, transform, fix imports, verify.

:func:`process_source` is the single entry point every front end uses (files,
notebook cells, the flake8 plugin). It never raises for bad input: a file that does
not parse gives a ``TNU901`` finding, a rule that throws on one site gives ``TNU902``
there and the rest of the file is still processed. A fix is returned only if the new
text parses and a second pass over it finds nothing more to fix (idempotence); if not,
the fixes are withdrawn and reported as a ``TNU902`` finding.
"""

from __future__ import annotations

import ast
import dataclasses
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING

from torchnext.upgrade.findings import Finding
from torchnext.upgrade.rules import RULES_BY_CODE

if TYPE_CHECKING:
    import libcst as cst

    from torchnext.upgrade.transform import UpgradeTransformer

__all__ = ["EngineOptions", "process_source", "prefilter", "collect_aliases"]

# Per rule, the text a file must contain for the rule to possibly match; files that
# match none of the active rules' patterns are not parsed at all.
_TRIGGERS: dict[str, str] = {
    "TNU001": r"\bcholesky\b",
    "TNU002": r"\bqr\b",
    "TNU003": r"\buse_cuda\b",
    "TNU004": r"\b(?:split|new)_group\b",
    "TNU005": r"\bnew_group\b",
    "TNU006": r"\bacc_policy\b",
    "TNU007": r"\btvm",
    "TNU008": r"\bregister_mem_pool\b",
    "TNU009": r"\buse_cuda\b",
    "TNU101": r"\bjit\b",
    "TNU102": r"\bwith_modules\b",
    "TNU103": r"\bprofiler_m",
    "TNU104": r"\bcontext_fn\b",
    "TNU105": r"\bcompile_on_one_rank\b",
    "TNU106": r"\b_set_pg_timeout\b",
    "TNU107": r"\bregister_generator_state\b",
    "TNU108": r"\b(?:set|pop)_context\b",
    "TNU109": r"\benable_faithful_generator_behavior\b",
    "TNU201": r"\bsymeig\b",
    "TNU202": r"\beig\b",
    "TNU203": r"\blstsq\b",
    "TNU204": r"\bsolve\b",
    "TNU205": r"\bmatrix_rank\b",
    "TNU206": r"\blu\b",
    "TNU207": r"\blu_solve\b",
    "TNU208": r"\btriangular_solve\b",
    "TNU209": r"\bnorm\b",
    "TNU210": r"\.range\s*\(|import[^\n]*\brange\b",
    "TNU211": r"\bger\b",
    "TNU212": r"\bsvd\b",
    "TNU213": r"\bchain_matmul\b",
    "TNU214": r"\bpinverse\b",
    "TNU215": r"\bamp\b",
    "TNU401": r"\b(?:clamp|clamp_min|clamp_max|clip|fmin|fmax)_?\b",
}
_MAX_PASSES = 3
_PREFILTER_CACHE: dict[frozenset[str], re.Pattern[str] | None] = {}


@dataclass(frozen=True, kw_only=True)
class EngineOptions:
    """What to look for and how far to fix."""

    active: frozenset[str]
    """Active rule codes."""
    fix_level: str = "none"
    """``"none"`` (check), ``"safe"`` or ``"unsafe"``."""

    def __post_init__(self) -> None:
        if self.fix_level not in ("none", "safe", "unsafe"):
            raise ValueError(
                f"EngineOptions.fix_level={self.fix_level!r}: use none, safe or unsafe"
            )
        unknown = sorted(c for c in self.active if c not in RULES_BY_CODE)
        if unknown:
            raise ValueError(f"EngineOptions.active has unknown codes {unknown}")


def prefilter(source: str, active: frozenset[str]) -> bool:
    """False when no active rule can match ``source`` (so it need not be parsed)."""
    if "torch" not in source:
        return False
    pattern = _PREFILTER_CACHE.get(active)
    if active not in _PREFILTER_CACHE:
        parts = [_TRIGGERS[c] for c in sorted(active) if c in _TRIGGERS]
        pattern = re.compile("|".join(parts)) if parts else None
        _PREFILTER_CACHE[active] = pattern
    return pattern is not None and pattern.search(source) is not None


def _finding(
    code: str,
    detail: str,
    line: int,
    col: int,
    end_line: int,
    end_col: int,
    applicability: str | None = None,
    fixed: bool = False,
) -> Finding:
    base = RULES_BY_CODE[code].message
    return Finding(
        code=code,
        message=f"{base} ({detail})" if detail else base,
        line=line,
        column=col,
        end_line=end_line,
        end_column=end_col,
        applicability=applicability,
        fixed=fixed,
    )


def collect_aliases(source: str) -> dict[str, str]:
    """Top-level import bindings of ``source`` (for notebook cells that follow it)."""
    import libcst as cst

    from torchnext.upgrade._cst import dotted_name

    try:
        module = cst.parse_module(source)
    except cst.ParserSyntaxError:
        return {}
    aliases: dict[str, str] = {}
    for stmt in module.body:
        if not isinstance(stmt, cst.SimpleStatementLine):
            continue
        for small in stmt.body:
            if isinstance(small, cst.Import):
                for alias in small.names:
                    full = dotted_name(alias.name) or ""
                    if alias.asname is not None and isinstance(alias.asname.name, cst.Name):
                        aliases[alias.asname.name.value] = full
                    elif full:
                        aliases[full.split(".")[0]] = full.split(".")[0]
            elif (
                isinstance(small, cst.ImportFrom)
                and small.module is not None
                and not small.relative
            ):
                if isinstance(small.names, cst.ImportStar):
                    continue
                module_name = dotted_name(small.module) or ""
                for alias in small.names:
                    name = dotted_name(alias.name) or ""
                    bound = (
                        alias.asname.name.value
                        if alias.asname is not None and isinstance(alias.asname.name, cst.Name)
                        else name
                    )
                    aliases[bound] = f"{module_name}.{name}"
    return aliases


def _transform(
    source: str, options: EngineOptions, aliases: dict[str, str] | None, remove_imports: bool
) -> tuple[list[Finding], str | None]:
    import libcst as cst
    from libcst.metadata import MetadataWrapper

    from torchnext.upgrade.transform import UpgradeTransformer, noqa_map

    try:
        module = cst.parse_module(source)
    except cst.ParserSyntaxError as exc:
        detail = str(exc).splitlines()[0] if str(exc) else "syntax error"
        return [
            _finding(
                "TNU901", detail, exc.raw_line, exc.raw_column + 1, exc.raw_line, exc.raw_column + 1
            )
        ], None
    except RecursionError:
        return [_finding("TNU901", "too deeply nested to parse", 1, 1, 1, 1)], None
    wrapper = MetadataWrapper(module, unsafe_skip_copy=True)
    transformer = UpgradeTransformer(
        active=options.active,
        fix_level=options.fix_level,
        noqa=noqa_map(source),
        aliases=aliases,
        code_for_node=module.code_for_node,
        source_text=source,
    )
    new_module = wrapper.visit(transformer)
    findings = [
        _finding(
            f.code, f.detail, f.line, f.column, f.end_line, f.end_column, f.applicability, f.fixed
        )
        for f in transformer.findings
    ]
    if not any(f.fixed for f in findings):
        return findings, None
    new_module = _fix_imports(new_module, transformer, remove_imports)
    return findings, new_module.code


def _fix_imports(module: cst.Module, transformer: UpgradeTransformer, remove: bool) -> cst.Module:
    from libcst.codemod import CodemodContext
    from libcst.codemod.visitors import AddImportsVisitor, ImportItem, RemoveImportsVisitor

    items = [ImportItem(m) for m in sorted(transformer.extra_imports)]
    if transformer.needs_torch_import and not any(
        m.startswith("torch.") for m in transformer.extra_imports
    ):
        items.append(ImportItem("torch"))
    context = CodemodContext()
    if items:
        module = AddImportsVisitor(context, items).transform_module(module)
    # From-imports of old names (``from torch import qr``) whose calls were all rewritten
    # go away; RemoveImportsVisitor keeps any that are still used.
    stale = sorted(transformer.used_from_imports, key=str)
    if stale and remove:
        context = CodemodContext()
        for mod, name, asname in stale:
            RemoveImportsVisitor.remove_unused_import(context, mod, name, asname)
        module = RemoveImportsVisitor(context).transform_module(module)
    return module


def process_source(
    source: str,
    options: EngineOptions,
    *,
    aliases: dict[str, str] | None = None,
    remove_imports: bool = True,
    use_gate: bool = True,
) -> tuple[list[Finding], str | None]:
    """Findings for ``source`` and, when fixes were applied, the new text (else None).

    ``aliases`` pre-binds names imported elsewhere (earlier notebook cells);
    ``remove_imports=False`` keeps from-imports that the fixes left unused (a later
    notebook cell may still use them). ``use_gate=False`` skips the fast ``ast`` gate
    (tests use it to check the gate never hides a site).
    """
    from torchnext.upgrade.gate import may_have_sites

    if not aliases and not prefilter(source, options.active):
        return [], None
    if use_gate and not may_have_sites(source, options.active, aliases):
        return [], None
    findings, new_source = _transform(source, options, aliases, remove_imports)
    if new_source is None or new_source == source:
        return findings, None
    # Verify: the new text parses (for Python and for LibCST) and a further pass changes
    # nothing; a pass that still changes something (a fix exposed another site) is taken
    # and verified in turn. Anything else withdraws every fix of this text.
    merged, current = list(findings), new_source
    for _ in range(_MAX_PASSES):
        try:
            ast.parse(current)
            again, again_source = _transform(current, options, aliases, remove_imports)
        except Exception as exc:  # never hand back a text we could not re-read
            return _withdraw(findings, f"the fixed text did not re-parse ({exc})")
        if any(f.code == "TNU901" for f in again):
            return _withdraw(findings, "the fixed text did not parse")
        if again_source is None or again_source == current:
            return merged, current
        merged += [f for f in again if f.fixed]
        current = again_source
    return _withdraw(findings, f"fixes did not settle after {_MAX_PASSES} passes")


def _withdraw(findings: list[Finding], why: str) -> tuple[list[Finding], None]:
    withdrawn = [dataclasses.replace(f, fixed=False, applicability=None) for f in findings]
    withdrawn.append(_finding("TNU902", f"{why}; fixes withdrawn", 1, 1, 1, 1))
    return withdrawn, None
