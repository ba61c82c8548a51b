"""Notebooks are checked and fixed cell by cell; magics, outputs and layout survive."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("libcst")

from torchnext.upgrade import check_paths  # noqa: E402


def _nb(cells: list[dict[str, object]]) -> str:
    return (
        json.dumps(
            {
                "cells": cells,
                "metadata": {"kernelspec": {"name": "python3"}},
                "nbformat": 4,
                "nbformat_minor": 5,
            },
            indent=1,
        )
        + "\n"
    )


def _code(src: str, outputs: list[object] | None = None) -> dict[str, object]:
    return {
        "cell_type": "code",
        "execution_count": 1,
        "metadata": {},
        "outputs": outputs or [],
        "source": src.splitlines(keepends=True),
    }


def test_notebook_cells_fixed_with_imports_from_earlier_cells(tmp_path: Path) -> None:
    nb = tmp_path / "demo.ipynb"
    output = [{"output_type": "stream", "name": "stdout", "text": ["hi\n"]}]
    nb.write_text(
        _nb(
            [
                _code("import torch\nfrom torch import qr\n%matplotlib inline\n"),
                {"cell_type": "markdown", "metadata": {}, "source": ["torch.qr(A) in prose\n"]},
                _code("A = torch.eye(3)\n!nvidia-smi\nL = torch.cholesky(A)\nQ, R = qr(A)", output),
                _code("%%bash\necho torch.qr\n"),
            ]
        )
    )
    results = check_paths([nb], fix="safe", write=True, jobs=1)
    findings = results[0].findings
    assert [(f.cell, f.line, f.code) for f in findings] == [(2, 3, "TNU001"), (2, 4, "TNU002")]
    data = json.loads(nb.read_text())
    cells = data["cells"]
    assert "".join(cells[2]["source"]) == (
        "A = torch.eye(3)\n!nvidia-smi\nL = torch.linalg.cholesky(A)\nQ, R = torch.linalg.qr(A)"
    )
    assert "".join(cells[0]["source"]) == "import torch\nfrom torch import qr\n%matplotlib inline\n"
    assert cells[2]["outputs"] == output
    assert cells[1]["source"] == ["torch.qr(A) in prose\n"]
    assert nb.read_text().startswith('{\n "cells"')  # indentation kept
    assert check_paths([nb], jobs=1)[0].findings == []


def test_broken_notebook_is_reported(tmp_path: Path) -> None:
    nb = tmp_path / "bad.ipynb"
    nb.write_text("{not json")
    findings = check_paths([nb], jobs=1)[0].findings
    assert [f.code for f in findings] == ["TNU901"]
