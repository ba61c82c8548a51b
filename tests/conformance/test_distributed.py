"""Fault-tolerant groups: torchnext on torch 2.13 against native 2.14 ``_reconfigure``,
and torchnext's group on torch 2.14 (fresh gloo groups per epoch, and the native path)."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from torchnext.distributed import FaultTolerantGroup, GroupConfig
from torchnext.errors import CommRevokedError
from torchnext.testing import Fault, WorkerContext, run_workers

T60 = timedelta(seconds=60)
HERE = os.path.dirname(os.path.abspath(__file__))


def _native_shrink(ctx: WorkerContext) -> dict[str, Any]:
    """torch 2.14: three ranks, then rank 2 leaves and 0, 1 reconfigure in place."""
    store = dist.PrefixStore("native", ctx.store)
    dist.init_process_group(
        "gloo", store=store, rank=ctx.rank, world_size=ctx.world_size, enable_reconfigure=True
    )

    def handles(tag: str, members: range) -> list[str]:
        store.set(f"{tag}/{ctx.rank}", dist._get_reconfigure_handle())
        return [store.get(f"{tag}/{r}").decode() for r in members]

    dist._reconfigure(1, handles("h1", range(3))).wait()
    t = torch.full((2,), float(ctx.rank + 1))
    dist.all_reduce(t)
    out: dict[str, Any] = {"sum3": t.tolist()}
    if ctx.rank == 2:
        return out
    dist._reconfigure(2, handles("h2", range(2))).wait()
    t = torch.full((2,), float(ctx.rank + 1))
    dist.all_reduce(t)
    out.update(sum2=t.tolist(), rank2=dist.get_rank(), size2=dist.get_world_size())
    return out


def _ft_shrink(ctx: WorkerContext, native: bool) -> dict[str, Any]:
    """torchnext: the same membership change through reconfigure()."""
    group = FaultTolerantGroup.from_env(config=GroupConfig(native_reconfigure=native))
    t = torch.full((2,), float(group.rank + 1))
    group.all_reduce(t)
    out: dict[str, Any] = {"sum3": t.tolist()}
    group.reconfigure(["w0", "w1"], timeout=T60)
    if group.member_id == "w2":
        return out
    t = torch.full((2,), float(group.rank + 1))
    group.all_reduce(t)
    out.update(sum2=t.tolist(), rank2=group.rank, size2=group.size)
    return out


def _ft_kill(ctx: WorkerContext, native: bool) -> dict[str, Any]:
    group = FaultTolerantGroup.from_env(config=GroupConfig(native_reconfigure=native))
    x = torch.ones(16)
    try:
        for i in range(500):
            ctx.checkpoint(f"step:{i}")
            group.all_reduce(x)
    except CommRevokedError:
        t1 = time.monotonic()
        group.agree(timeout=T60)
        group.shrink()
        y = torch.full((2,), float(group.rank + 1))
        group.all_reduce(y)
        return {"members": list(group.members), "sum": y.tolist(), "t3_s": time.monotonic() - t1}
    return {"members": None}


def _values(result: Any) -> list[Any]:
    assert all(r.outcome == "returned" for r in result), result.describe()
    return [r.value for r in result]


def test_shrink_matches_native_reconfigure(run_on_torch213: Callable[[str], Any]) -> None:
    native = _values(run_workers(_native_shrink, world_size=3, timeout=T60))
    ours_213 = run_on_torch213(
        f"""
        import json, sys
        from datetime import timedelta
        sys.path.insert(0, {HERE!r})
        from test_distributed import _ft_shrink
        from torchnext.testing import run_workers
        result = run_workers(_ft_shrink, False, world_size=3, timeout=timedelta(seconds=60))
        print(json.dumps([r.value if r.outcome == "returned" else r.describe() for r in result]))
        """
    )
    assert ours_213 == native
    assert native[0] == {"sum3": [6.0, 6.0], "sum2": [3.0, 3.0], "rank2": 0, "size2": 2}


def test_group_on_214_both_reconfigure_paths() -> None:
    for native in (False, True):
        values = _values(run_workers(_ft_shrink, native, world_size=3, timeout=T60))
        assert values[1] == {"sum3": [6.0, 6.0], "sum2": [3.0, 3.0], "rank2": 1, "size2": 2}


def test_kill_and_shrink_on_214_both_paths() -> None:
    for native in (False, True):
        result = run_workers(
            _ft_kill, native, world_size=3, faults=[Fault(rank=1, at="step:10")], timeout=T60
        )
        assert result[1].outcome == "killed", result.describe()
        for r in (0, 2):
            assert result[r].outcome == "returned", result.describe()
            assert result[r].value["members"] == ["w0", "w2"]
            assert result[r].value["sum"] == [3.0, 3.0]
