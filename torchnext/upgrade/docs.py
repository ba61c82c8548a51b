"""Per-rule documentation pages, generated from the rule table.

``torchnext upgrade --explain TNU001`` prints one page; :func:`all_rules_markdown`
renders the whole reference (What it does / Why / Example / Fix safety, as ruff's
rule pages) so the docs can never drift from the rules themselves.
"""

from __future__ import annotations

from torchnext.upgrade.release_notes import NOTE_ITEMS
from torchnext.upgrade.rules import RULES, Rule

__all__ = ["rule_markdown", "all_rules_markdown"]


def rule_markdown(rule: Rule) -> str:
    refs = ", ".join(f"pytorch/pytorch{r}" for r in rule.references)
    lines = [
        f"# {rule.code} {rule.name}",
        "",
        f"{rule.message}",
        "",
        f"Fix: **{rule.fix.value}**" + (f"  \nUpstream: {refs}" if refs else ""),
        "",
        "## What it does",
        rule.what,
        "",
        "## Why",
        rule.why,
        "",
        "## Example",
        "```python",
        rule.before,
        "```",
        "Use instead:",
        "```python",
        rule.after,
        "```",
        "",
        "## Fix safety",
        rule.fix_safety,
    ]
    return "\n".join(lines)


def all_rules_markdown() -> str:
    parts = ["# torchnext upgrade rules", ""]
    parts += [f"- `{r.code}` {r.name}: {r.message}" for r in RULES]
    parts += ["", "## Release-notes items handled by hand", ""]
    parts += [
        f"- {n.title} ({', '.join(n.prs)}): {n.wont_handle}" for n in NOTE_ITEMS if n.wont_handle
    ]
    for rule in RULES:
        parts += ["", rule_markdown(rule)]
    return "\n".join(parts) + "\n"
