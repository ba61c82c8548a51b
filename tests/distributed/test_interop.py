"""torch.distributed code (dist.* collectives, DDP) running on a FaultTolerantGroup."""

from __future__ import annotations

from datetime import timedelta

import torch
import torch.distributed as dist

from torchnext.distributed import FaultTolerantGroup, GroupConfig
from torchnext.distributed.interop import as_process_group
from torchnext.errors import StaleEpochError
from torchnext.testing import Fault, WorkerContext, run_workers

T30 = timedelta(seconds=30)


def _dist_calls(ctx: WorkerContext) -> dict:
    group = FaultTolerantGroup.from_env()
    pg = as_process_group(group)
    rank, size = group.rank, group.size
    t = torch.full((3,), float(rank + 1))
    dist.all_reduce(t, group=pg)
    b = torch.tensor([float(rank)])
    dist.broadcast(b, src=1, group=pg)
    out = [torch.zeros(1) for _ in range(size)]
    dist.all_gather(out, torch.tensor([float(rank * 10)]), group=pg)
    w = dist.all_reduce(torch.ones(2), group=pg, async_op=True)
    w.wait()
    dist.barrier(group=pg)

    torch.manual_seed(0)
    model = torch.nn.Linear(4, 2)
    ddp = torch.nn.parallel.DistributedDataParallel(model, process_group=pg)
    x = torch.full((5, 4), float(rank + 1))
    ddp(x).sum().backward()
    grad = model.weight.grad.clone()
    # Reference: the average over ranks of each rank's local gradient.
    ref_model = torch.nn.Linear(4, 2)
    ref_model.load_state_dict(model.state_dict())
    ref = torch.zeros_like(grad)
    for r in range(size):
        ref_model.zero_grad()
        ref_model(torch.full((5, 4), float(r + 1))).sum().backward()
        ref += ref_model.weight.grad / size
    return {
        "sum": t.tolist(),
        "b": b.item(),
        "gathered": [o.item() for o in out],
        "ddp_ok": bool(torch.allclose(grad, ref)),
        "size": dist.get_world_size(pg),
    }


def test_dist_collectives_and_ddp_on_the_group() -> None:
    result = run_workers(_dist_calls, world_size=3, timeout=T30)
    for r in result:
        assert r.outcome == "returned", result.describe()
        assert r.value == {
            "sum": [6.0, 6.0, 6.0],
            "b": 1.0,
            "gathered": [0.0, 10.0, 20.0],
            "ddp_ok": True,
            "size": 3,
        }


def _ddp_survives(ctx: WorkerContext) -> dict:
    group = FaultTolerantGroup.from_env(config=GroupConfig(heartbeat_timeout=timedelta(seconds=3)))
    model = torch.nn.Linear(8, 8)
    errors = []
    steps_after = 0
    pg = as_process_group(group)
    ddp = torch.nn.parallel.DistributedDataParallel(model, process_group=pg)
    for i in range(200):
        ctx.checkpoint(f"step:{i}")
        try:
            ddp(torch.ones(4, 8)).sum().backward()
            if group.is_revoked:  # DDP's futures do not raise: the group holds the error
                raise RuntimeError(f"step dropped: {group.errored()}")
            if group.size < 3:
                steps_after += 1
                if steps_after == 3:
                    break
        except RuntimeError as exc:
            errors.append(type(exc).__name__ + ": " + str(exc)[:200])
            if not group.is_revoked:
                group.revoke(str(exc))
            group.agree(timeout=T30)
            group.shrink()
            try:
                dist.barrier(group=pg)
                stale = False
            except StaleEpochError:
                stale = True
            pg = as_process_group(group)
            ddp = torch.nn.parallel.DistributedDataParallel(model, process_group=pg)
            errors.append(f"stale_view_rejected={stale}")
    return {"errors": errors, "size": group.size, "steps_after": steps_after}


def test_ddp_error_on_kill_then_rebuilt_on_shrunk_group() -> None:
    result = run_workers(
        _ddp_survives, world_size=3, faults=[Fault(rank=2, at="step:5")], timeout=T30
    )
    for r in (0, 1):
        assert result[r].outcome == "returned", result.describe()
        v = result[r].value
        assert v["size"] == 2 and v["steps_after"] == 3
        assert "revoked" in v["errors"][0], v
        assert v["errors"][1] == "stale_view_rejected=True"
