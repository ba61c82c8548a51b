"""Flight recorder and RMA windows on a FaultTolerantGroup, with a member SIGKILLed.

The recorder sees the group's ops through the observer hooks and dumps when the
epoch is revoked; the analyzer names the dead member; the window over the group is
revoked with it and fails fast with WindowRevokedError.
"""

from __future__ import annotations

import importlib
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from torchnext.distributed.fr_analyze import analyze
from torchnext.testing import Fault, MultiProcessHarness, WorkerContext


def _has_group() -> bool:
    try:
        return hasattr(importlib.import_module("torchnext.distributed"), "FaultTolerantGroup")
    except ImportError:
        return False


pytestmark = pytest.mark.skipif(
    not _has_group(), reason="torchnext.distributed.FaultTolerantGroup is not in this tree yet"
)

VICTIM = 2


def _worker(ctx: WorkerContext, dump_dir: str) -> dict[str, Any]:
    import torch

    from torchnext import distributed as tnd
    from torchnext.distributed import flight_recorder as fr
    from torchnext.distributed.rma import Window
    from torchnext.errors import WindowRevokedError

    fr.enable(fr.FlightRecorderConfig(dump_dir=dump_dir))
    group = tnd.FaultTolerantGroup.from_env()  # type: ignore[attr-defined]
    fr.attach(group)
    win = Window.allocate(group, (8,), torch.float32)
    outcome = "completed"
    try:
        for i in range(5):
            ctx.checkpoint(f"step:{i}")
            t = torch.ones(16 + i)
            group.all_reduce(t)
            win.put(t[:1], (group.rank + 1) % group.size, i)
    except Exception as exc:  # noqa: BLE001 - the failure is the point
        outcome = type(exc).__name__
    try:
        win.put(torch.ones(1), 0)
        after = "window still usable"
    except WindowRevokedError:
        after = "revoked"
    fr.dump(reason="end")
    return {"outcome": outcome, "after": after}


@pytest.mark.parametrize(("fault_kind", "kind"), [("kill", "crash"), ("stop", "hang")])
def test_group_failure_dumped_analyzed_and_window_revoked(
    tmp_path: Path, fault_kind: str, kind: str
) -> None:
    dump_dir = tmp_path / "dumps"
    fault = Fault(rank=VICTIM, at="step:3", kind=fault_kind)  # type: ignore[arg-type]
    with MultiProcessHarness(3, faults=[fault]) as harness:
        result = harness.run(_worker, str(dump_dir), timeout=timedelta(seconds=90))
    expected = "killed" if fault_kind == "kill" else "stopped"
    assert result[VICTIM].outcome == expected, result.describe()
    result.raise_if_failed([0, 1])
    for value in result.values():
        assert value["outcome"] != "completed" and value["after"] == "revoked", value
    analysis = analyze(dump_dir)
    named = [f for f in analysis.findings if f.kind == kind and f.culprits == (VICTIM,)]
    assert named, analysis.format_text()
    assert any("revoke" in p.name for p in dump_dir.glob("*.json"))


def _split_windows(ctx: WorkerContext) -> list[float]:
    import torch

    from torchnext import distributed as tnd
    from torchnext.distributed.rma import Window

    group = tnd.FaultTolerantGroup.from_env()  # type: ignore[attr-defined]
    # Two disjoint sub-groups with the parent's name and epoch: their windows must not mix.
    sub = group.split(color=group.rank % 2, key=group.rank)
    win = Window.allocate(sub, (4,), torch.float32)
    win.put(torch.full((1,), float(group.rank)), (sub.rank + 1) % sub.size, sub.rank)
    win.fence()
    values = win.tensor.tolist()
    win.close()
    group.shutdown()
    return values


def test_windows_on_split_subgroups_stay_apart() -> None:
    with MultiProcessHarness(4) as harness:
        result = harness.run(_split_windows, timeout=timedelta(seconds=90))
    result.raise_if_failed([0, 1, 2, 3])
    # Sub-group {0, 2} and {1, 3}: each member holds its sub-group peer's global rank.
    # Each member wrote its global rank into its peer's window at its sub-group rank.
    assert result[0].value == [0.0, 2.0, 0.0, 0.0]
    assert result[2].value == [0.0, 0.0, 0.0, 0.0]  # rank 0 wrote 0.0 at offset 0
    assert result[1].value == [0.0, 3.0, 0.0, 0.0]
    assert result[3].value == [1.0, 0.0, 0.0, 0.0]
