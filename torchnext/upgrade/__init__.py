"""torchnext.upgrade: find and fix every torch 2.14 breaking change in a codebase.

Use it as a command (``torchnext upgrade PATHS [--fix]``), a library
(:func:`check_paths`), a flake8 plugin (codes ``TNU``) or a pre-commit hook. Rules are
data (:data:`RULES`), one per release-notes item or earlier linalg/amp deprecation,
each with a fix class: safe, unsafe (``--unsafe-fixes``) or report-only.

Do not assume it proves types: names are resolved through imports, and Tensor-method
forms (``A.qr()``) are fixed safely only where the receiver is provably a tensor.
Importing this package needs only the standard library; checking needs libcst (the
``[upgrade]`` extra).
"""

from __future__ import annotations

from torchnext.upgrade.findings import FileResult, Finding
from torchnext.upgrade.rules import RULES, FixClass, Rule
from torchnext.upgrade.runner import check_paths

__all__ = [
    # entry point
    "check_paths",
    # results
    "FileResult",
    "Finding",
    # rule table
    "RULES",
    "Rule",
    "FixClass",
]
