"""The flake8 entry point yields (line, col, 'TNUxxx message', type) tuples."""

from __future__ import annotations

import ast

import pytest

pytest.importorskip("libcst")

from torchnext.upgrade.flake8 import Plugin  # noqa: E402


def test_plugin_reports_with_flake8_columns() -> None:
    source = "import torch\nL = torch.cholesky(A)\ny = torch.clamp(x, 0, 1)\n"
    lines = source.splitlines(keepends=True)
    found = list(Plugin(ast.parse(source), lines=lines, filename="x.py").run())
    assert [(line, col, msg.split()[0]) for line, col, msg, _ in found] == [
        (2, 4, "TNU001"),
        (3, 4, "TNU401"),
    ]
    assert all(kind is Plugin for *_, kind in found)


def test_plugin_is_declared_in_pyproject() -> None:
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    assert 'TNU = "torchnext.upgrade.flake8:Plugin"' in (root / "pyproject.toml").read_text()
