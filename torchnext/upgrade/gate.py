"""A fast, conservative gate: could any active rule fire in this source?

LibCST's lossless tree costs far more to build and walk than Python's own ``ast``; most
files that merely mention ``norm`` or ``jit`` have no site at all. This module walks the
``ast`` with the same import-alias resolution the transformer uses and answers True
whenever a site *might* exist (a call of a registered name, a method call with a
registered name, a ``new_group`` method, a ``split_group`` assignment...). It may say
True for nothing (the transformer then finds nothing); it must never say False for a
file with a site, which the tests check by running every fixture with the gate off.
A file ``ast`` cannot parse goes to LibCST, which reports it.
"""

from __future__ import annotations

import ast
from functools import lru_cache

__all__ = ["may_have_sites"]

_ATTRIBUTE_SITES = {
    "TNU105": "compile_on_one_rank",
    "TNU109": "enable_faithful_generator_behavior",
    "TNU107": "register_generator_state",
    "TNU003": "use_cuda",
}


@lru_cache(maxsize=16)
def _tables(active: frozenset[str]) -> tuple[frozenset[str], frozenset[str], frozenset[str]]:
    from torchnext.upgrade import fixers_linalg, fixers_misc  # noqa: F401  (fill the registry)
    from torchnext.upgrade._site import CALL_FIXERS, METHOD_FIXERS

    calls = frozenset(q for q, fs in CALL_FIXERS.items() if any(f.code in active for f in fs))
    methods = frozenset(n for n, fs in METHOD_FIXERS.items() if any(f.code in active for f in fs))
    attrs = frozenset(a for code, a in _ATTRIBUTE_SITES.items() if code in active)
    return calls, methods, attrs


def _dotted(node: ast.expr) -> str | None:
    parts: list[str] = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        parts.append(node.id)
        return ".".join(reversed(parts))
    return None


def _resolve(node: ast.expr, aliases: dict[str, str]) -> str | None:
    name = _dotted(node)
    if name is None:
        return None
    head, _, rest = name.partition(".")
    target = aliases.get(head)
    if target is None:
        return None
    return f"{target}.{rest}" if rest else target


def _deprecated_name_code(qname: str) -> str | None:
    from torchnext.upgrade.value_uses import deprecated_name_code as lookup

    return lookup(qname)


def may_have_sites(
    source: str, active: frozenset[str], aliases: dict[str, str] | None = None
) -> bool:
    """False only when no active rule can have a site in ``source``."""
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError, RecursionError):
        return True
    calls, methods, attrs = _tables(active)
    known: dict[str, str] = dict(aliases or {})
    nodes = list(ast.walk(tree))
    for node in nodes:  # imports first: a site may come before a later import in walk order
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.asname:
                    known[alias.asname] = alias.name
                else:
                    head = alias.name.split(".")[0]
                    known[head] = head
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            if node.module == "torch._dynamo.backends.tvm" and "TNU007" in active:
                return True
            for alias in node.names:
                known[alias.asname or alias.name] = f"{node.module}.{alias.name}"
                # A deprecated name may be used as a value, reported at this import.
                if _deprecated_name_code(f"{node.module}.{alias.name}") in active:
                    return True
    split_group = "TNU004" in active
    new_group = "TNU005" in active
    for node in nodes:
        if isinstance(node, ast.Call):
            func = node.func
            q = _resolve(func, known)
            if q is not None and q in calls:
                return True
            if isinstance(func, ast.Attribute) and q is None and func.attr in methods:
                return True
            if isinstance(func, ast.Attribute) and func.attr in attrs:
                return True
        elif isinstance(node, ast.Attribute):
            if node.attr in attrs:
                return True
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            if new_group and node.name == "new_group":
                return True
            for deco in node.decorator_list:
                q = _resolve(deco, known)
                if q is not None and q in calls:
                    return True
        elif split_group and isinstance(node, ast.Assign) and isinstance(node.value, ast.Call):
            q = _resolve(node.value.func, known)
            if q is not None and q.endswith((".split_group", ".new_group")):
                return True
    return False
