"""Render results: ``text`` (ruff-like lines and a summary by rule), ``json``, ``github``.

Only findings that remain after fixing are listed as diagnostics (as ruff does); the
summary counts fixed ones too. JSON output is a list of objects with ruff's field
names (``code``, ``message``, ``filename``, ``location``, ``end_location``, ``fix``
with ``applicability``) plus ``cell`` for notebooks.
"""

from __future__ import annotations

import difflib
import json
from collections import Counter
from collections.abc import Sequence

from torchnext.upgrade.findings import FileResult, Finding
from torchnext.upgrade.rules import RULES_BY_CODE

__all__ = ["render", "render_diff", "summary_lines", "fix_hint_enabled"]


def _where(path: str, f: Finding) -> str:
    cell = f"cell {f.cell}:" if f.cell is not None else ""
    return f"{path}:{cell}{f.line}:{f.column}"


def fix_hint_enabled(f: Finding, fix_level: str) -> bool:
    """Would the fix of ``f`` be applied with ``--fix`` (given the unsafe setting)?"""
    if f.applicability == "safe":
        return True
    return f.applicability == "unsafe" and fix_level == "unsafe"


def _text(results: Sequence[FileResult], unsafe: bool) -> list[str]:
    lines = []
    for r in results:
        if r.error:
            lines.append(f"{r.path}: error: {r.error}")
        for f in r.remaining:
            mark = " [*]" if fix_hint_enabled(f, "unsafe" if unsafe else "safe") else ""
            lines.append(f"{_where(r.path, f)}: {f.code}{mark} {f.message}")
    return lines


def _json(results: Sequence[FileResult]) -> str:
    items = []
    for r in results:
        for f in r.remaining:
            item = f.to_dict()
            item["filename"] = r.path
            items.append(item)
        if r.error:
            items.append({"code": None, "message": r.error, "filename": r.path, "error": True})
    return json.dumps(items, indent=2)


def _escape(value: str) -> str:
    return value.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")


def _github(results: Sequence[FileResult]) -> list[str]:
    lines = []
    for r in results:
        if r.error:
            lines.append(f"::error file={r.path},title=torchnext upgrade::{_escape(r.error)}")
        for f in r.remaining:
            loc = (
                f"file={r.path},line={f.line},col={f.column},endLine={f.end_line},"
                f"endColumn={f.end_column}"
            )
            if f.cell is not None:  # annotations cannot point into a cell; name it instead
                loc = f"file={r.path}"
            lines.append(
                f"::error title=torchnext upgrade ({f.code}),{loc}::"
                f"{_escape(f'{_where(r.path, f)}: {f.code} {f.message}')}"
            )
    return lines


def summary_lines(results: Sequence[FileResult], *, unsafe: bool, fixing: bool) -> list[str]:
    """Totals and a table of findings and fixes by rule."""
    found: Counter[str] = Counter()
    fixed: Counter[str] = Counter()
    for r in results:
        for f in r.findings:
            found[f.code] += 1
            if f.fixed:
                fixed[f.code] += 1
    total, n_fixed = sum(found.values()), sum(fixed.values())
    remaining = total - n_fixed
    errors = sum(1 for r in results if r.error)
    lines: list[str] = []
    if total == 0 and errors == 0:
        return ["All checks passed!"]
    if found:
        lines.append("")
        lines.append("By rule:")
        for code in sorted(found):
            fixed_note = f" ({fixed[code]} fixed)" if fixed[code] else ""
            lines.append(f"  {found[code]:5d}  {code}  {RULES_BY_CODE[code].name}{fixed_note}")
    if n_fixed:
        lines.append(
            f"Found {total} error{'s' * (total != 1)} ({n_fixed} fixed, {remaining} remaining)."
        )
    else:
        lines.append(f"Found {total} error{'s' * (total != 1)}.")
    if errors:
        lines.append(f"{errors} file(s) could not be processed.")
    if not fixing:
        remaining_f = [f for r in results for f in r.remaining]
        safe = sum(1 for f in remaining_f if f.applicability == "safe")
        hidden = sum(1 for f in remaining_f if f.applicability == "unsafe")
        if unsafe:
            safe, hidden = safe + hidden, 0
        if safe:
            lines.append(f"[*] {safe} fixable with the `--fix` option.")
        if hidden:
            lines.append(f"{hidden} hidden fixes can be enabled with the `--unsafe-fixes` option.")
    else:
        hidden = sum(1 for r in results for f in r.remaining if f.applicability == "unsafe")
        if hidden and not unsafe:
            lines.append(f"{hidden} hidden fixes can be enabled with the `--unsafe-fixes` option.")
    return lines


def render(results: Sequence[FileResult], fmt: str, *, unsafe: bool) -> str:
    """The diagnostics in format ``fmt`` (text, json or github)."""
    if fmt == "json":
        return _json(results)
    if fmt == "github":
        return "\n".join(_github(results))
    if fmt == "text":
        return "\n".join(_text(results, unsafe))
    raise ValueError(f"output format {fmt!r}: use text, json or github")


def render_diff(results: Sequence[FileResult]) -> str:
    """Unified diffs of every file the fixes would change."""
    chunks = []
    for r in results:
        if r.fixed_source is None:
            continue
        chunks.append(
            "".join(
                difflib.unified_diff(
                    r.original.splitlines(keepends=True),
                    r.fixed_source.splitlines(keepends=True),
                    fromfile=f"a/{r.path}",
                    tofile=f"b/{r.path}",
                )
            )
        )
    return "".join(chunks)
