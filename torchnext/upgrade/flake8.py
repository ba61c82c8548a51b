"""flake8 plugin: ``flake8 --select=TNU`` reports the upgrade rules (no fixes).

Registered as the ``TNU`` entry point in pyproject.toml. flake8 handles ``# noqa`` and
selection itself; the plugin runs every rule that is on by default (the noisy
``TNU4xx`` too, so that ``--select TNU401`` can reach it; flake8 drops what is not
selected). Use ``torchnext upgrade --fix`` to apply fixes.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from importlib.metadata import PackageNotFoundError, version

__all__ = ["Plugin"]

try:
    _VERSION = version("torchnext")
except PackageNotFoundError:  # pragma: no cover - running from a source tree
    _VERSION = "0"


class Plugin:
    """flake8 AST-plugin interface; findings come from the LibCST engine."""

    name = "torchnext-upgrade"
    version = _VERSION

    def __init__(self, tree: ast.AST, lines: list[str] | None = None, filename: str = "") -> None:
        self.lines = lines
        self.filename = filename

    def _source(self) -> str:
        if self.lines is not None:
            return "".join(self.lines)
        with open(self.filename, encoding="utf-8") as fh:
            return fh.read()

    def run(self) -> Iterator[tuple[int, int, str, type]]:
        from torchnext.upgrade.engine import EngineOptions, process_source
        from torchnext.upgrade.registry import resolve_selection

        options = EngineOptions(active=resolve_selection(["ALL"]), fix_level="none")
        # flake8 applies # noqa itself; the engine's own noqa handling is harmless here.
        findings, _ = process_source(self._source(), options)
        for f in findings:
            # flake8 columns are 0-based; it adds 1 when printing.
            yield f.line, f.column - 1, f"{f.code} {f.message}", type(self)
