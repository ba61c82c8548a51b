"""DTensor sharding rules: native 2.14.1 against 2.13 + ``torchnext.backport.install()``.

The same 2-rank gloo program (``tests/compat/dtensor_cases.py``) runs every one of the
77 operators 2.14 added, with inputs placed ``Shard(0)``, ``Shard(-1)``, ``Replicate()``
and ``Partial()``, and ``out=`` tensors replicated or sharded; each record (placements,
values, or the error) must be the same on both.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

CASES = Path(__file__).parents[1] / "compat" / "dtensor_cases.py"


def _records(python: str, out: Path, *flags: str) -> dict[tuple[str, str, str | None], Any]:
    proc = subprocess.run(
        [python, str(CASES), str(out), *flags],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    if proc.returncode != 0:
        pytest.fail(f"{python}: case program failed ({proc.returncode}):\n{proc.stderr[-4000:]}")
    return {(r["op"], r["placement"], r["out"]): r for r in json.loads(out.read_text())["records"]}


def _close(a: Any, b: Any) -> bool:
    if isinstance(a, list):
        return isinstance(b, list) and len(a) == len(b) and all(map(_close, a, b))
    if isinstance(a, float) and math.isnan(a):
        return isinstance(b, float) and math.isnan(b)
    if isinstance(a, (int, float)) and not isinstance(a, bool):
        return abs(a - b) <= 1e-12 * max(1.0, abs(a))
    return bool(a == b)


def test_placements_values_and_errors_match_native_214(
    torch213_python: str, tmp_path: Path
) -> None:
    native = _records(sys.executable, tmp_path / "native.json")
    ours = _records(torch213_python, tmp_path / "torchnext.json", "--backport")
    assert native.keys() == ours.keys()
    for key, want in native.items():
        got = ours[key]
        assert "crash" not in want and "crash" not in got, (key, want, got)
        if "error" in want:
            assert got.get("error") == want["error"], key
            continue
        assert "error" not in got, (key, got["error"])
        assert got["placements"] == want["placements"], key
        assert _close(got["value"], want["value"]), key
    assert sum("error" not in r for r in native.values()) > 400


def test_the_table_is_the_difference_between_the_two_registries(
    run_on_torch213: Callable[[str], Any],
) -> None:
    program = """
        import json
        from torch.distributed.tensor import DTensor
        import torchnext.backport

        def registered():
            p = DTensor._op_dispatcher.sharding_propagator
            regs = (p.op_strategy_funcs, p.op_single_dim_strategy_funcs, p.op_to_rules)
            return sorted({str(op) for reg in regs for op in reg})

        before = registered()
        torchnext.backport.install()
        print(json.dumps({"before": before, "after": registered()}))
    """
    from torchnext.compat.dtensor_rule_table import RULES, TORCH213_RULE_COUNT, TORCH214_RULE_COUNT

    # A fresh process: other tests register a few rules lazily in this one.
    fresh = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(program)],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    native = set(json.loads(fresh.stdout.strip().splitlines()[-1])["before"])
    result = run_on_torch213(program)
    before, after = set(result["before"]), set(result["after"])
    assert len(native) == TORCH214_RULE_COUNT and len(before) == TORCH213_RULE_COUNT
    assert native - before == {r.op for r in RULES}
    assert native <= after
    # 2.14 removed torch.cholesky; 2.13 still has it, and keeps its rules.
    assert after - native == {"aten.cholesky.default", "aten.cholesky.out"}
