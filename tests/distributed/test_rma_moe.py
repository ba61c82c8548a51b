"""The mixture-of-experts example: a one-sided irregular exchange equals all_to_all."""

from __future__ import annotations

import importlib.util
from datetime import timedelta
from pathlib import Path
from types import ModuleType
from typing import Any

from torchnext.testing import WorkerContext, run_workers

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "moe_exchange.py"


def _load() -> ModuleType:
    spec = importlib.util.spec_from_file_location("moe_exchange_example", EXAMPLE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _worker(ctx: WorkerContext, tokens: int, hidden: int) -> Any:
    return _load().worker(ctx, tokens, hidden)


def test_moe_exchange_matches_all_to_all() -> None:
    world = 4
    result = run_workers(_worker, 96, 16, world_size=world, timeout=timedelta(seconds=90))
    result.raise_if_failed(list(range(world)))
    values = result.values()
    assert all(v["match"] for v in values), values
    # Irregular: ranks received different numbers of rows, 96 * world in total.
    rows = [int(v["rows"]) for v in values]
    assert sum(rows) == 96 * world and len(set(rows)) > 1
