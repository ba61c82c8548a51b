"""Suite-wide test settings: markers, GPU skips, deterministic seeds.

The per-test timeout and warnings-as-errors live in pyproject.toml so they apply to
every way of running pytest. Tests marked ``gpu`` are skipped where CUDA is absent;
tests under ``tests/conformance`` run only on torch 2.14 (their own conftest says so).
"""

from __future__ import annotations

import pytest
import torch


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if torch.cuda.is_available():
        return
    skip_gpu = pytest.mark.skip(reason="needs a CUDA device; none is present")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip_gpu)


@pytest.fixture(autouse=True)
def _seed() -> None:
    torch.manual_seed(0)
