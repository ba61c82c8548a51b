"""TORCHNEXT_* variables: typed parsing, defaults, clear errors, one registry."""

from __future__ import annotations

import re
from datetime import timedelta
from pathlib import Path

import pytest

from torchnext import _env


def test_defaults_and_typed_parsing(monkeypatch: pytest.MonkeyPatch) -> None:
    var = _env.TORCHNEXT_COLLECTIVE_TIMEOUT
    monkeypatch.delenv(var.name, raising=False)
    assert var.get() == var.default
    monkeypatch.setenv(var.name, "2.5")
    assert var.get() == timedelta(seconds=2.5)
    monkeypatch.setenv(_env.TORCHNEXT_FR_ENABLE.name, "yes")
    assert _env.TORCHNEXT_FR_ENABLE.get() is True


def test_bad_value_names_variable_value_and_fix(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TORCHNEXT_COLLECTIVE_TIMEOUT", "-1")
    with pytest.raises(ValueError, match=r"TORCHNEXT_COLLECTIVE_TIMEOUT='-1' is invalid.*unset"):
        _env.TORCHNEXT_COLLECTIVE_TIMEOUT.get()
    monkeypatch.setenv("TORCHNEXT_FR_ENABLE", "maybe")
    with pytest.raises(ValueError, match="TORCHNEXT_FR_ENABLE"):
        _env.TORCHNEXT_FR_ENABLE.get()
    # Not a number: said in words, with the default as it would be written (seconds).
    monkeypatch.setenv("TORCHNEXT_HEARTBEAT_INTERVAL", "fast")
    with pytest.raises(
        ValueError, match=r"number of seconds, e.g. 0.2; got 'fast'.*default: 0.1\)"
    ):
        _env.TORCHNEXT_HEARTBEAT_INTERVAL.get()
    monkeypatch.setenv("TORCHNEXT_HEARTBEAT_INTERVAL", "nan")
    with pytest.raises(ValueError, match="finite"):
        _env.TORCHNEXT_HEARTBEAT_INTERVAL.get()


def test_every_variable_is_documented_and_unique() -> None:
    names = [v.name for v in _env.ALL_VARS]
    assert len(names) == len(set(names))
    for var in _env.ALL_VARS:
        assert var.name.startswith("TORCHNEXT_")
        assert len(var.doc) > 20


def test_no_module_reads_torchnext_variables_behind_the_registry() -> None:
    """Every TORCHNEXT_* name used in the package is declared in _env.py."""
    root = Path(_env.__file__).parent
    declared = {v.name for v in _env.ALL_VARS}
    used: set[str] = set()
    for path in root.rglob("*.py"):
        used |= set(re.findall(r"\bTORCHNEXT_[A-Z0-9_]*[A-Z0-9]\b", path.read_text()))
    undeclared = {n for n in used if n not in declared and n not in dir(_env)}
    assert not undeclared, f"declare these in torchnext/_env.py: {sorted(undeclared)}"
