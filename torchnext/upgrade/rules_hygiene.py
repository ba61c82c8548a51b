"""The upgrade rules about the upgrade itself: hygiene (TNU3xx), noisy (TNU4xx), tool (TNU9xx).

TNU3xx flags version-guarded legacy branches, TNU4xx rules are off unless selected
(:data:`torchnext.upgrade.rules.DISABLED_BY_DEFAULT`), and TNU9xx report a file the tool
could not parse or a rule that failed on one site. Read them through
:data:`torchnext.upgrade.rules.RULES`. What not to assume: TNU9xx findings are about the
tool, not about the code's torch usage, and need no release-note item.
"""

from __future__ import annotations

from torchnext.upgrade.rule_model import FixClass, Rule

__all__ = ["HYGIENE_AND_TOOL"]

HYGIENE_AND_TOOL: tuple[Rule, ...] = (
    Rule(
        code="TNU301",
        name="version-guarded-legacy-branch",
        message="version-guarded branch uses APIs changed for torch 2.14; review it, it is not rewritten",
        fix=FixClass.REPORT_ONLY,
        what=(
            "Finds `if` tests on `torch.__version__`, version constants or `hasattr(torch, ...)`, "
            "and `try/except (TypeError, AttributeError, ImportError)` fallbacks, that contain "
            "findings of other rules. Those findings are reported without a fix."
        ),
        why="Rewriting one branch makes both identical; the guard itself is what should go.",
        before="if TORCH_GE_1_9:\n    Q, R = torch.linalg.qr(A)\nelse:\n    Q, R = torch.qr(A)",
        after="Q, R = torch.linalg.qr(A)",
        fix_safety="Report-only: deleting a branch is a support-policy decision.",
    ),
    # ------------------------------------------------------------------ noisy
    Rule(
        code="TNU401",
        name="clamp-boundary-gradient",
        message="clamp/clamp_min/clamp_max/fmin/fmax gradients at the bounds change in torch 2.14",
        fix=FixClass.REPORT_ONLY,
        what=(
            "Finds `clamp`, `clamp_min`, `clamp_max`, `fmin`, `fmax` calls (function and method "
            "forms). Off by default: almost every model calls clamp."
        ),
        why=(
            "At x == bound the input gradient is now 0 for scalar bounds and split 0.5/0.5 with "
            "tensor bounds (2.13: all to the input)."
        ),
        before="y = torch.clamp_min(x, 0.0)",
        after="y = torch.where(x >= 0.0, x, torch.zeros_like(x))  # only if you need the 2.13 gradient",
        fix_safety="Report-only: most code does not depend on the subgradient at a tie.",
        references=("#191142",),
    ),
    # ------------------------------------------------------------------ tool
    Rule(
        code="TNU901",
        name="syntax-error",
        message="file could not be parsed; it was not checked",
        fix=FixClass.REPORT_ONLY,
        what="Reports a file (or notebook cell) that is not valid Python.",
        why="Nothing in it can be checked or fixed.",
        before="def f(:",
        after="(fix the syntax)",
        fix_safety="Report-only.",
    ),
    Rule(
        code="TNU902",
        name="rule-error",
        message="a rule failed on this site; the rest of the file was processed",
        fix=FixClass.REPORT_ONLY,
        what="Reports a site where a rule raised, with the error text.",
        why="The site was left unchanged and needs a look; please report it as a bug.",
        before="(any)",
        after="(unchanged)",
        fix_safety="Report-only.",
    ),
)
"""Hygiene, noisy rules and the tool itself."""
