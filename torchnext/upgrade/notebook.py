"""Jupyter notebooks (``.ipynb``): check and fix code cells one by one.

Each code cell is processed as its own module, with the imports of the cells above
it known (``import torch`` in cell 1 makes ``torch.qr`` in cell 5 resolvable). IPython
line magics and shell escapes (``%time``, ``!pip``) are masked as comments while a cell
is processed and restored after; cells that start with a cell magic (``%%bash``) are
skipped. From-imports are never removed from a notebook cell, since a later cell may
use them. Findings carry the 1-based number of the code cell and lines within it.
Outputs, metadata and the JSON layout (indentation) are preserved.
"""

from __future__ import annotations

import dataclasses
import json
import re
from typing import Any

from torchnext.upgrade.engine import EngineOptions, collect_aliases, process_source
from torchnext.upgrade.findings import Finding

__all__ = ["process_notebook"]

_MAGIC = re.compile(r"^(\s*)([%!?].*|.*\?\s*)$")
_MASKED = re.compile(r"^(\s*)# tnu-magic: (.*)$")


def _mask(source: str) -> str:
    return "\n".join(
        _MAGIC.sub(lambda m: f"{m.group(1)}# tnu-magic: {m.group(2)}", line)
        if _MAGIC.match(line)
        else line
        for line in source.split("\n")
    )


def _unmask(source: str) -> str:
    return "\n".join(_MASKED.sub(r"\1\2", line) for line in source.split("\n"))


def _cell_text(cell: dict[str, Any]) -> str:
    src = cell.get("source", "")
    return "".join(src) if isinstance(src, list) else str(src)


def _split_like(original: Any, text: str) -> Any:
    if isinstance(original, list):
        return text.splitlines(keepends=True)
    return text


def _indent_of(text: str) -> int:
    for line in text.splitlines()[1:3]:
        stripped = line.lstrip(" ")
        if stripped:
            return len(line) - len(stripped)
    return 1


def process_notebook(text: str, options: EngineOptions) -> tuple[list[Finding], str | None]:
    """Findings for every code cell and the new notebook JSON if any cell changed."""
    try:
        nb = json.loads(text)
        cells = nb["cells"]
        if not isinstance(cells, list):
            raise TypeError("cells is not a list")
    except (ValueError, KeyError, TypeError) as exc:
        return [
            Finding(
                code="TNU901",
                message=f"not a readable notebook: {exc}",
                line=1,
                column=1,
                end_line=1,
                end_column=1,
            )
        ], None
    findings: list[Finding] = []
    aliases: dict[str, str] = {}
    changed = False
    code_index = 0
    for cell in cells:
        if not isinstance(cell, dict) or cell.get("cell_type") != "code":
            continue
        code_index += 1
        source = _cell_text(cell)
        if source.lstrip().startswith("%%"):
            continue
        masked = _mask(source)
        cell_findings, new_source = process_source(
            masked, options, aliases=dict(aliases), remove_imports=False
        )
        findings += [dataclasses.replace(f, cell=code_index) for f in cell_findings]
        if new_source is not None:
            cell["source"] = _split_like(cell.get("source", ""), _unmask(new_source))
            changed = True
        aliases.update(collect_aliases(masked))
    if not changed:
        return findings, None
    out = json.dumps(nb, indent=_indent_of(text), ensure_ascii=False)
    return findings, out + ("\n" if text.endswith("\n") else "")
