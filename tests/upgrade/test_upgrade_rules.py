"""The rule table, the release-notes map and rule selection."""

from __future__ import annotations

import pytest

from torchnext.errors import UpgradeError
from torchnext.upgrade.docs import all_rules_markdown, rule_markdown
from torchnext.upgrade.registry import ALL_CODES, resolve_selection, split_codes
from torchnext.upgrade.release_notes import NOTE_ITEMS, NoteItem
from torchnext.upgrade.rules import RULES, RULES_BY_CODE, FixClass, Rule


def test_codes_are_unique_and_documented() -> None:
    assert len({r.code for r in RULES}) == len(RULES)
    assert len({r.name for r in RULES}) == len(RULES)
    for rule in RULES:
        page = rule_markdown(rule)
        for heading in ("## What it does", "## Why", "## Example", "## Fix safety"):
            assert heading in page
        assert "\n" not in rule.message
    assert all_rules_markdown().count("# TNU") == len(RULES)


def test_every_release_note_item_has_a_rule_or_a_reason() -> None:
    """A release-notes item with neither a rule nor a written reason fails here."""
    for item in NOTE_ITEMS:
        if item.rules:
            for code in item.rules:
                assert code in RULES_BY_CODE, f"{item.title}: unknown rule {code}"
        else:
            assert len(item.wont_handle) > 30, f"{item.title}: the reason is too thin"
    # The items the issue names, by upstream PR, are all present.
    prs = {pr for item in NOTE_ITEMS for pr in item.prs}
    for pr in (
        "#186817",
        "#186815",
        "#192543",
        "#191142",
        "#190725",
        "#188489",
        "#189914",
        "#192808",
        "#187204",
        "#190581",
        "#187869",
        "#187387",
        "#176753",
        "#188419",
        "#188283",
        "#186928",
        "#190766",
        "#192112",
        "#187115",
        "#180248",
        "#188645",
        "#189894",
    ):
        assert pr in prs, f"release-notes item {pr} is not mapped"
    legacy = {item.title for item in NOTE_ITEMS if item.section == "legacy"}
    for name in (
        "symeig",
        "eig",
        "lstsq",
        "solve",
        "matrix_rank",
        "lu",
        "lu_solve",
        "triangular_solve",
        "norm",
        "range",
        "ger",
        "svd",
        "chain_matmul",
        "pinverse",
    ):
        assert f"torch.{name}" in legacy


def test_every_rule_traces_to_an_item() -> None:
    mapped = {code for item in NOTE_ITEMS for code in item.rules}
    tool_rules = {r.code for r in RULES if r.code.startswith(("TNU3", "TNU9"))}
    assert {r.code for r in RULES} - tool_rules <= mapped


def test_note_item_needs_exactly_one_of_rule_or_reason() -> None:
    with pytest.raises(ValueError, match="exactly one"):
        NoteItem(section="bc", area="x", title="y", prs=())
    with pytest.raises(ValueError, match="exactly one"):
        NoteItem(section="bc", area="x", title="y", prs=(), rules=("TNU001",), wont_handle="z")


def test_rule_validates_its_fields() -> None:
    good = RULES[0]
    with pytest.raises(ValueError, match="TNU"):
        Rule(**{**good.__dict__, "code": "TOR001"})
    with pytest.raises(ValueError, match="empty"):
        Rule(**{**good.__dict__, "why": " "})
    assert {r.fix for r in RULES} == set(FixClass)


def test_selection_by_code_prefix_and_all() -> None:
    default = resolve_selection()
    assert "TNU001" in default and "TNU401" not in default
    assert resolve_selection(["TNU0"]) == {c for c in ALL_CODES if c.startswith("TNU0")}
    assert "TNU401" in resolve_selection(["ALL"])
    assert "TNU401" in resolve_selection([], [], ["TNU401"])
    assert "TNU401" not in resolve_selection(["TNU"])
    assert resolve_selection(["TNU2"], ["TNU21"]) == {
        c for c in ALL_CODES if c.startswith("TNU2") and not c.startswith("TNU21")
    }
    assert split_codes(["tnu001, TNU1", "TNU2"]) == ["TNU001", "TNU1", "TNU2"]


def test_unknown_selector_is_an_error() -> None:
    with pytest.raises(UpgradeError, match="TOR001"):
        resolve_selection(["TOR001"])
