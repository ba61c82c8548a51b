"""Conformance suite: torchnext against native torch 2.14.1, on the same inputs.

Runs only when the running torch is 2.14 (``make conformance`` uses a second virtual
environment with torch 2.14.1). :func:`run_on_torch213` runs a program in the torch
2.13 environment (with torchnext installed there) and returns what it printed as JSON,
so one test can put "native 2.14.1" and "2.13 + torchnext" side by side.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from collections.abc import Callable
from typing import Any

import pytest
import torch

TORCH_214 = tuple(int(p) for p in torch.__version__.split("+")[0].split(".")[:2]) >= (2, 14)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if "tests/conformance" in str(item.fspath).replace(os.sep, "/"):
            item.add_marker(pytest.mark.conformance)
            if not TORCH_214:
                item.add_marker(
                    pytest.mark.skip(
                        reason=f"conformance needs torch 2.14; this is {torch.__version__}"
                    )
                )


@pytest.fixture(scope="session")
def torch213_python() -> str:
    """Path of the python that has torch 2.13 + torchnext (TORCHNEXT_TORCH213_PYTHON)."""
    path = os.environ.get("TORCHNEXT_TORCH213_PYTHON", "")
    if not path:
        pytest.fail(
            "TORCHNEXT_TORCH213_PYTHON is unset: run the conformance suite through "
            "`make conformance`, which points it at .venv/bin/python"
        )
    return path


@pytest.fixture(scope="session")
def run_on_torch213(torch213_python: str) -> Callable[[str], Any]:
    """Run ``program`` under torch 2.13 + torchnext; it must print one JSON value last."""

    def run(program: str, timeout_s: float = 120.0) -> Any:
        proc = subprocess.run(
            [torch213_python, "-c", textwrap.dedent(program)],
            capture_output=True,
            text=True,
            timeout=timeout_s,
            check=False,
        )
        if proc.returncode != 0:
            raise AssertionError(
                f"program failed on torch 2.13 (exit {proc.returncode}):\n{proc.stderr[-4000:]}"
            )
        lines = [ln for ln in proc.stdout.splitlines() if ln.strip()]
        if not lines:
            raise AssertionError(f"program printed nothing on torch 2.13; stderr:\n{proc.stderr}")
        return json.loads(lines[-1])

    return run


@pytest.fixture(scope="session")
def this_python() -> str:
    return sys.executable
