"""What an upgrade rule is: :class:`Rule` (code, message, fix class, docs) and :class:`FixClass`.

Use these to read or write rule records; the records themselves are in the
``rules_*`` modules and :mod:`torchnext.upgrade.rules` gathers them into one table.
What not to assume: a rule's fix class is its best case, not what every site gets.
This module imports nothing outside the standard library.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

__all__ = ["FixClass", "Rule"]


class FixClass(str, enum.Enum):
    """How far a rule can rewrite code (its best case)."""

    SAFE = "safe"
    UNSAFE = "unsafe"
    REPORT_ONLY = "report-only"


@dataclass(frozen=True, kw_only=True)
class Rule:
    """One rule and its documentation page."""

    code: str
    """``TNU`` plus three digits; unique."""
    name: str
    """kebab-case name, stable across releases."""
    message: str
    """One line shown with every finding."""
    fix: FixClass
    """Best-case fix class."""
    what: str
    """What it does."""
    why: str
    """Why the old code is a problem on 2.14."""
    before: str
    """Example of code the rule flags."""
    after: str
    """The same example after the fix (or the manual fix for report-only rules)."""
    fix_safety: str
    """When the fix is safe, when unsafe, when none is offered."""
    references: tuple[str, ...] = ()
    """Upstream pull requests (``#186817``) the rule is about."""

    def __post_init__(self) -> None:
        if not (len(self.code) == 6 and self.code.startswith("TNU") and self.code[3:].isdigit()):
            raise ValueError(f"Rule.code={self.code!r}: expected 'TNU' plus three digits")
        for field_name in ("name", "message", "what", "why", "before", "after", "fix_safety"):
            if not getattr(self, field_name).strip():
                raise ValueError(f"Rule {self.code}: field {field_name!r} is empty; document it")
