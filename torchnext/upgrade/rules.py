"""The upgrade rules, as data: code, message, fix class and the docs of each rule.

Use this table to list, select or document rules; the code that finds and rewrites
sites lives in ``torchnext.upgrade.fixers_*`` and is keyed by the same codes.

Code policy (like TorchFix's):

* ``TNU0xx``: APIs removed or changed in torch 2.14; old code fails or changes numbers.
* ``TNU1xx``: APIs deprecated in torch 2.14; old code still runs but warns.
* ``TNU2xx``: linalg and amp APIs deprecated or removed before 2.14.
* ``TNU3xx``: upgrade hygiene (version-guarded legacy branches).
* ``TNU4xx``: noisy rules, off unless selected.
* ``TNU9xx``: the tool itself (unparsable file, a rule that failed on one site).

Fix classes follow ruff: a *safe* fix keeps the program's meaning, an *unsafe* fix
probably does but cannot be proved (applied only with ``--unsafe-fixes``), and
*report-only* rules never rewrite. A rule's class is its best case: a safe rule may
still offer an unsafe fix, or none, at a site where the proof fails.

The records live in one module per code family (:mod:`.rules_214`, :mod:`.rules_pre214`,
:mod:`.rules_hygiene`) and the record type in :mod:`.rule_model`; this module joins them
in code order and is the one to import. This module and its parts import nothing outside
the standard library.
"""

from __future__ import annotations

from torchnext.upgrade.rule_model import FixClass, Rule
from torchnext.upgrade.rules_214 import DEPRECATED_214, REMOVED_214
from torchnext.upgrade.rules_hygiene import HYGIENE_AND_TOOL
from torchnext.upgrade.rules_pre214 import EARLIER_LINALG_AMP

__all__ = ["FixClass", "Rule", "RULES", "RULES_BY_CODE", "DISABLED_BY_DEFAULT"]

RULES: tuple[Rule, ...] = REMOVED_214 + DEPRECATED_214 + EARLIER_LINALG_AMP + HYGIENE_AND_TOOL
"""Every rule, in code order (the order of the docs and of ``--list``)."""

RULES_BY_CODE: dict[str, Rule] = {r.code: r for r in RULES}
if len(RULES_BY_CODE) != len(RULES):  # pragma: no cover - guarded by a test too
    raise RuntimeError("torchnext.upgrade.rules: duplicate rule codes")

DISABLED_BY_DEFAULT: tuple[str, ...] = ("TNU4",)
"""Code prefixes off unless selected explicitly (by code, prefix or ``ALL``)."""
