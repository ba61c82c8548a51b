"""Fixture pairs: every ``fixtures/*.in.py`` must become its ``.out.py``, with exactly the
findings its ``# expect:`` header lists; every ``.out.py`` parses and is a fixed point."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

pytest.importorskip("libcst")

from fixture_support import cases, expected, options, out_path  # noqa: E402

from torchnext.upgrade.engine import process_source  # noqa: E402
from torchnext.upgrade.rules import RULES  # noqa: E402

CASES = cases()


def _id(path: Path) -> str:
    return path.name[: -len(".in.py")]


def test_fixtures_exist() -> None:
    assert len(CASES) >= 30
    for case in CASES:
        assert out_path(case).is_file(), f"{case.name} has no .out.py"


@pytest.mark.parametrize("case", CASES, ids=_id)
def test_fixture_rewrite_and_findings(case: Path) -> None:
    source = case.read_text()
    findings, new = process_source(source, options(source))
    assert (new if new is not None else source) == out_path(case).read_text()
    assert Counter(f.code for f in findings) == expected(source)


@pytest.mark.parametrize("case", CASES, ids=_id)
def test_fixture_output_parses_and_is_idempotent(case: Path) -> None:
    source = case.read_text()
    fixed = out_path(case).read_text()
    if expected(source).get("TNU901"):
        pytest.skip("the syntax-error fixture's output is broken on purpose")
    compile(fixed, str(out_path(case)), "exec")
    _, again = process_source(fixed, options(source))
    assert again is None, "a second run changed the fixed file"


def test_every_rule_has_a_fixture() -> None:
    covered: set[str] = set()
    for case in CASES:
        covered |= set(expected(case.read_text()))
    missing = sorted(r.code for r in RULES if r.code not in covered and r.code != "TNU902")
    assert not missing, f"rules without a fixture: {missing}"


@pytest.mark.parametrize("case", CASES, ids=_id)
def test_gate_never_hides_a_site(case: Path) -> None:
    source = case.read_text()
    with_gate = process_source(source, options(source))
    without = process_source(source, options(source), use_gate=False)
    assert with_gate == without
