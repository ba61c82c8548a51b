"""compat.dtensor_rules: 2.14's 77 extra DTensor sharding rules, on 2.13, on 2 gloo ranks."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from torchnext import backport
from torchnext.compat import dtensor_rules
from torchnext.compat.dtensor_rule_table import RULES, TORCH213_RULE_COUNT

CASES = Path(__file__).with_name("dtensor_cases.py")
TORCH_213 = torch.__version__.startswith("2.13.")
# The refusals 2.14 itself gives (the conformance suite checks they are the same ones).
REFUSALS = ("no valid sharding strategy", "in-place operations that require placement changes")


def run_cases(tmp_path: Path, *flags: str) -> list[dict[str, Any]]:
    out = tmp_path / "records.json"
    try:
        proc = subprocess.run(
            [sys.executable, str(CASES), str(out), *flags],
            capture_output=True,
            text=True,
            timeout=90,
            check=False,
        )
    except subprocess.TimeoutExpired as exc:
        stderr = exc.stderr.decode(errors="replace") if isinstance(exc.stderr, bytes) else ""
        pytest.fail(f"case program did not finish in 90 s:\n{stderr[-4000:]}")
    if proc.returncode != 0:
        pytest.fail(f"case program failed ({proc.returncode}):\n{proc.stderr[-4000:]}")
    records: list[dict[str, Any]] = json.loads(out.read_text())["records"]
    return records


def close(got: Any, want: Any) -> bool:
    if isinstance(want, list):
        return isinstance(got, list) and len(got) == len(want) and all(map(close, got, want))
    if isinstance(want, float) and math.isnan(want):
        return isinstance(got, float) and math.isnan(got)
    if isinstance(want, (float, int)) and not isinstance(want, bool):
        return abs(got - want) <= 1e-12 * max(1.0, abs(want))
    return bool(got == want)


def test_the_table_holds_77_distinct_operators_with_a_case_each() -> None:
    sys.path.insert(0, str(CASES.parent))
    try:
        import dtensor_cases
    finally:
        sys.path.remove(str(CASES.parent))
    ops = [r.op for r in RULES]
    assert len(ops) == len(set(ops)) == 77
    assert sorted(dtensor_cases.CASES) == sorted(ops)
    assert not {r.base for r in RULES} & set(ops)


@pytest.mark.skipif(not TORCH_213, reason=f"counts 2.13.0's registry; this is {torch.__version__}")
def test_install_registers_exactly_the_missing_rules_and_uninstall_removes_them() -> None:
    assert sorted(dtensor_rules.missing_rules()) == sorted(r.op for r in RULES)
    name = "DTensor sharding rules (the 77 operators 2.14 added)"
    try:
        info = backport.install(names=[name])
        assert info["installed"] == [name]
        assert dtensor_rules.missing_rules() == []
        counts = info["dtensor_rules"]
        # torch registers a few rules lazily (on first use of some modules): at least 2.13.0's.
        assert counts["torchnext"] == 77 and counts["torch_2_14"] == 1239
        assert counts["torch"] >= TORCH213_RULE_COUNT
        assert counts["total"] == counts["torch"] + 77
        assert dtensor_rules.install_rules() == []  # idempotent
    finally:
        assert backport.uninstall() == [name]
    assert len(dtensor_rules.missing_rules()) == 77
    assert dtensor_rules.rule_counts()["torchnext"] == 0


@pytest.mark.skipif(not TORCH_213, reason=f"2.13 lacks these rules; this is {torch.__version__}")
def test_without_install_the_214_operators_fail_as_on_plain_213(tmp_path: Path) -> None:
    records = run_cases(tmp_path, "--only", "aten.sum.out,aten.cumsum_.default,prims.amax.default")
    sharded = [r for r in records if r["placement"].startswith("Shard")]
    assert len(sharded) == 8
    assert all("does not have a sharding strategy" in r.get("error", "") for r in sharded)


def test_every_rule_shards_to_the_plain_result_on_two_ranks(tmp_path: Path) -> None:
    records = run_cases(tmp_path, "--backport")
    crashes = [r for r in records if "crash" in r]
    assert not crashes, crashes[0]["crash"]
    worked: dict[str, int] = {}
    for r in records:
        where = f"{r['op']} with inputs {r['placement']}, out= {r['out']}"
        if "error" in r:
            if r["op"] in {rule.op for rule in RULES}:
                assert any(s in r["error"] for s in REFUSALS), f"{where}: {r['error']}"
            continue
        worked[r["op"]] = worked.get(r["op"], 0) + 1
        assert close(r["value"], r["ref"]), f"{where}: value differs from the plain tensor's"
        if r["out"] is not None:
            # An out= tensor is never redistributed: the result keeps its placement.
            assert r["placements"] == r["out_placements"], where
    assert sorted(worked) == sorted(rule.op for rule in RULES)
    # Linear ops keep Partial inputs partial instead of reducing them first.
    partial = {
        (r["op"], r["out"]): r["placements"]
        for r in records
        if r["placement"] == "Partial()" and "error" not in r
    }
    assert partial[("aten.cumsum_.default", None)] == [["P(sum)"]]
    unregistered = [r for r in records if r["op"] == "aten.renorm.default"]
    assert "does not have a sharding strategy registered" in unregistered[0]["error"]
