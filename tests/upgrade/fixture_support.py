"""Reads the fixture headers: ``# upgrade: unsafe-fixes``, ``# upgrade: select=ALL`` and
``# expect: TNU001=2 TNU301=1`` (the exact count of findings per code, fixed or not)."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

from torchnext.upgrade.engine import EngineOptions
from torchnext.upgrade.registry import resolve_selection

FIXTURES = Path(__file__).parent / "fixtures"


def cases() -> list[Path]:
    return sorted(FIXTURES.glob("*.in.py"))


def out_path(case: Path) -> Path:
    return case.with_name(case.name[: -len(".in.py")] + ".out.py")


def options(source: str) -> EngineOptions:
    unsafe = False
    select = ["TNU"]
    for line in source.splitlines():
        if line.startswith("# upgrade:"):
            for word in line[len("# upgrade:") :].split():
                if word == "unsafe-fixes":
                    unsafe = True
                elif word.startswith("select="):
                    select = word[len("select=") :].split(",")
    return EngineOptions(active=resolve_selection(select), fix_level="unsafe" if unsafe else "safe")


def expected(source: str) -> Counter[str]:
    for line in source.splitlines():
        if line.startswith("# expect:"):
            pairs = [w.split("=") for w in line[len("# expect:") :].split()]
            return Counter({code: int(n) for code, n in pairs})
    raise ValueError("fixture has no '# expect:' header")
