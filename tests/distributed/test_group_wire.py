"""Wire-byte counters of FaultTolerantGroup with real gloo processes.

The promises: every op adds the bytes of the cost model in ``torchnext.distributed.group.wire``
(ring all-reduce 2(n-1)/n x payload per member, ...), the counters survive a shrink
(they keep counting in the new epoch, with the new size), a split sub-group counts into
its parent, and heal bytes are added by ``with_heal``.
"""

from __future__ import annotations

import time
from datetime import timedelta

import torch

from torchnext.distributed import FaultTolerantGroup, GroupConfig
from torchnext.distributed.group.wire import HEAL_KEY, wire_cost, with_heal
from torchnext.errors import CommRevokedError
from torchnext.testing import Fault, WorkerContext, run_workers

T30 = timedelta(seconds=30)
FAST = GroupConfig(
    heartbeat_timeout=timedelta(milliseconds=1500), collective_timeout=timedelta(seconds=60)
)


def _every_op(ctx: WorkerContext) -> dict:
    g = FaultTolerantGroup.from_env()
    n, rank = g.size, g.rank
    x = torch.ones(1000)  # 4000 bytes
    g.all_reduce(x)
    g.all_reduce(torch.ones(10, dtype=torch.float64))  # 80 bytes
    g.broadcast(x, src=1)
    out = torch.zeros(1000 * n)
    g.all_gather_into_tensor(out, x)
    g.all_gather([torch.zeros(1000) for _ in range(n)], x)
    g.reduce_scatter_tensor(torch.zeros(1000), torch.ones(1000 * n))
    g.reduce_scatter(torch.zeros(1000), [torch.ones(1000) for _ in range(n)])
    g.reduce(x, dst=0)
    g.all_to_all_single(torch.zeros(30 * n), torch.ones(30 * n))
    g.barrier()
    if rank == 0:
        g.send(torch.ones(250), dst=1)
    elif rank == 1:
        g.recv(torch.zeros(250), src=0)
    counts = g.wire_bytes()
    sub = g.split([0, 1])
    if isinstance(sub, FaultTolerantGroup):
        sub.all_reduce(torch.ones(100))  # 400 bytes over 2 members: 400 each
    after_split = g.wire_bytes()
    g.barrier()  # rank 2 must not leave while the others still build the sub-group
    g.shutdown()
    return {"n": n, "rank": rank, "counts": counts, "after_split": after_split}


def test_every_op_adds_its_modelled_bytes() -> None:
    result = run_workers(_every_op, world_size=3, timeout=T30)
    result.raise_if_failed()
    for r in result:
        v = r.value
        n, rank = v["n"], v["rank"]
        p = 4000
        expected = {
            "allreduce": 2 * (n - 1) * p // n + 2 * (n - 1) * 80 // n,
            "broadcast": (n - 1) * p if rank == 1 else 0,
            "allgather": 2 * (n - 1) * p,
            "reduce_scatter": 2 * ((n - 1) * p * n // n),
            "reduce": 0 if rank == 0 else p,
            "all_to_all": (n - 1) * 120 * n // n,
            "barrier": 0,
        }
        if rank == 0:
            expected["send"] = 1000
        if rank == 1:
            expected["recv"] = 0
        assert v["counts"] == expected, (rank, v["counts"])
        # The split's all-gather (color exchange) and its all-reduce count into the parent.
        split_gather = wire_cost("allgather", size=n, rank=rank, root=-1, in_bytes=24)
        grown = dict(expected)
        grown["allgather"] += split_gather
        if rank in (0, 1):
            grown["allreduce"] += 400  # 2 (2-1)/2 x 400
        assert v["after_split"] == grown, (rank, v["after_split"], split_gather)


def _count_across_a_shrink(ctx: WorkerContext) -> dict:
    g = FaultTolerantGroup.from_env(config=FAST)
    x = torch.ones(600)  # 2400 bytes
    done_before = 0
    try:
        for i in range(400):
            ctx.checkpoint(f"step:{i}")
            g.all_reduce(x)
            x.fill_(1.0)
            done_before += 1
            time.sleep(0.002)
    except CommRevokedError:
        g.shrink(timeout=T30)
    before = g.wire_bytes()
    for _ in range(5):
        g.all_reduce(x)
    after = g.wire_bytes()
    g.shutdown()
    return {"before": before, "after": after, "size": g.size, "done": done_before}


def test_counters_survive_a_shrink_and_count_with_the_new_size() -> None:
    faults = [Fault(rank=2, at="step:20", kind="kill")]
    result = run_workers(_count_across_a_shrink, world_size=3, faults=faults, timeout=T30)
    assert result[2].outcome == "killed", result.describe()
    result.raise_if_failed([0, 1])
    for rank in (0, 1):
        v = result[rank].value
        assert v["size"] == 2
        # Before: at least the 20 completed all-reduces at n = 3 (plus, possibly, the one
        # the kill interrupted, counted when issued).
        per_op_3 = 2 * 2 * 2400 // 3
        assert v["before"]["allreduce"] >= 20 * per_op_3
        assert v["before"]["allreduce"] in (v["done"] * per_op_3, (v["done"] + 1) * per_op_3)
        # After the shrink the counters went on, with n = 2: 2 (2-1)/2 x 2400 per op.
        assert v["after"]["allreduce"] - v["before"]["allreduce"] == 5 * 2400


def test_with_heal_adds_the_received_heal_bytes() -> None:
    class Stats:
        def __init__(self, n: int) -> None:
            self.total_bytes = n

    assert with_heal({"allreduce": 10}, [Stats(5), Stats(7)]) == {"allreduce": 10, HEAL_KEY: 12}
    assert with_heal({}, []) == {HEAL_KEY: 0}
    assert wire_cost("allreduce", size=1, rank=0, root=-1, in_bytes=100) == 0
