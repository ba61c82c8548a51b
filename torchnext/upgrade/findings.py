"""What a check produces: :class:`Finding` per site and :class:`FileResult` per file.

Plain data (standard library only) so results cross process boundaries and feed every
output format. Lines are 1-based; columns are 1-based, as ruff prints them.
"""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["Finding", "FileResult"]


@dataclass(frozen=True, kw_only=True)
class Finding:
    """One rule hit at one site."""

    code: str
    """Rule code (``TNU001``)."""
    message: str
    """The rule's message plus site detail."""
    line: int
    """1-based line of the site (in the cell, for notebooks)."""
    column: int
    """1-based column."""
    end_line: int
    """1-based last line."""
    end_column: int
    """1-based column after the end."""
    applicability: str | None = None
    """``"safe"``, ``"unsafe"`` or None when no fix is offered here."""
    fixed: bool = False
    """The fix was applied (in ``--fix`` / ``--diff`` runs)."""
    cell: int | None = None
    """1-based code-cell number for notebooks."""

    def to_dict(self) -> dict[str, object]:
        return {
            "code": self.code,
            "message": self.message,
            "location": {"row": self.line, "column": self.column},
            "end_location": {"row": self.end_line, "column": self.end_column},
            "fix": None if self.applicability is None else {"applicability": self.applicability},
            "fixed": self.fixed,
            "cell": self.cell,
        }


@dataclass(kw_only=True)
class FileResult:
    """The outcome for one file."""

    path: str
    """The path as given (or found under a given folder)."""
    findings: list[Finding] = field(default_factory=list)
    """Every finding, fixed or not, in source order."""
    original: str = ""
    """The file's text before fixing (kept only when it changed)."""
    fixed_source: str | None = None
    """The new text if fixes changed it, else None."""
    error: str = ""
    """Set when the file could not be read or written; the run went on."""

    @property
    def remaining(self) -> list[Finding]:
        return [f for f in self.findings if not f.fixed]

    @property
    def changed(self) -> bool:
        return self.fixed_source is not None
