"""Rule selection: ``--select`` / ``--ignore`` by code, prefix or ``ALL``, as ruff does.

Use :func:`resolve_selection` to turn user text into the set of active codes. Prefixes
expand over :data:`~torchnext.upgrade.rules.RULES`; noisy rules (``TNU4xx``) are on only
when selected by their own code, a prefix of at least ``TNU4``, or ``ALL``. An unknown
code or prefix is an error naming the valid ones, never silently ignored.
"""

from __future__ import annotations

from collections.abc import Iterable

from torchnext.errors import UpgradeError
from torchnext.upgrade.rules import DISABLED_BY_DEFAULT, RULES

__all__ = ["ALL_CODES", "expand", "resolve_selection", "split_codes"]

ALL_CODES: tuple[str, ...] = tuple(r.code for r in RULES)


def split_codes(text: str | Iterable[str] | None) -> list[str]:
    """``"TNU001, TNU1"`` or ``["TNU001", "TNU1"]`` -> ``["TNU001", "TNU1"]`` (upper-cased)."""
    if text is None:
        return []
    parts = [text] if isinstance(text, str) else list(text)
    out: list[str] = []
    for part in parts:
        out += [p.strip().upper() for p in str(part).split(",") if p.strip()]
    return out


def expand(selector: str) -> set[str]:
    """Codes matched by one selector; :class:`UpgradeError` if it matches none."""
    if selector == "ALL":
        return set(ALL_CODES)
    matched = {c for c in ALL_CODES if c.startswith(selector)}
    if not matched:
        raise UpgradeError(
            f"unknown rule selector {selector!r}; use ALL, a prefix such as TNU0 or TNU2, "
            f"or one of: {', '.join(ALL_CODES)}"
        )
    return matched


def _disabled_by_default(code: str) -> bool:
    return any(code.startswith(p) for p in DISABLED_BY_DEFAULT)


def resolve_selection(
    select: Iterable[str] = (),
    ignore: Iterable[str] = (),
    extend_select: Iterable[str] = (),
) -> frozenset[str]:
    """Active codes: ``select`` (default: every rule on by default) plus ``extend_select``,
    minus ``ignore``. A noisy rule is on only if a selector reaches into its prefix."""
    selectors = list(select) or ["TNU"]
    active: set[str] = set()
    for selector in [*selectors, *extend_select]:
        for code in expand(selector):
            # "TNU" or "TNU0" must not switch on TNU4xx; "TNU4", "TNU401" and "ALL" do.
            explicit = selector == "ALL" or len(selector) >= 4 and _disabled_by_default(selector)
            if _disabled_by_default(code) and not explicit:
                continue
            active.add(code)
    for selector in ignore:
        active -= expand(selector)
    return frozenset(active)
