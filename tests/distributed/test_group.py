"""FaultTolerantGroup with real processes on loopback: collectives, revoke, agree, shrink, grow."""

from __future__ import annotations

import time
from datetime import timedelta

import pytest
import torch

from torchnext.distributed import FaultTolerantGroup, GroupConfig
from torchnext.errors import CommRevokedError, StaleEpochError
from torchnext.testing import Fault, MultiProcessHarness, WorkerContext, run_workers

T30 = timedelta(seconds=30)
FAST = GroupConfig(
    heartbeat_timeout=timedelta(milliseconds=1500), collective_timeout=timedelta(seconds=60)
)


def _loop_until_failure(ctx: WorkerContext, slow_rank: int = -1, steps: int = 400) -> dict:
    """All-reduce in a loop; on the first failure agree, shrink and check the new group."""
    g = FaultTolerantGroup.from_env(config=FAST)
    x = torch.ones(64)
    try:
        for i in range(steps):
            ctx.checkpoint(f"step:{i}")
            if g.rank == slow_rank:
                time.sleep(0.005)
            g.all_reduce(x)
            x.fill_(1.0)
    except CommRevokedError as exc:
        t1 = time.monotonic()
        old_epoch = g.epoch
        membership = g.agree(timeout=T30)
        g.shrink()
        y = torch.full((5,), float(g.rank + 1))
        g.all_reduce(y)
        t3 = time.monotonic()
        return {
            "error": type(exc).__name__,
            "revoked_epoch": exc.epoch,
            "suspects": list(exc.suspects),
            "old_epoch": old_epoch,
            "epoch": g.epoch,
            "members": list(g.members),
            "failed": list(membership.failed),
            "rank": g.rank,
            "sum": y.tolist(),
            "t1": t1,
            "t3": t3,
        }
    return {"error": None}


def _check_shrunk(result, victims: set[int], world: int) -> None:
    survivors = [r for r in result if r.rank not in victims]
    kill_t = min(r.faults_fired[0][2] for r in result if r.rank in victims)
    n = world - len(victims)
    expected_members = [f"w{i}" for i in range(world) if i not in victims]
    ranks = set()
    for r in survivors:
        assert r.outcome == "returned", result.describe()
        v = r.value
        assert v["error"] == "CommRevokedError", result.describe()
        assert v["members"] == expected_members
        assert sorted(v["failed"]) == sorted(f"w{i}" for i in victims)
        assert v["epoch"] == v["old_epoch"] + 1
        assert v["sum"] == [float(n * (n + 1) / 2)] * 5
        assert v["t1"] - kill_t < 5.0  # bounded, far below the 60 s collective timeout
        ranks.add(v["rank"])
    assert ranks == set(range(n))


def test_sigkill_during_collective_non_neighbour_survivors_fail_fast() -> None:
    # Rank 3 is slow so the others sit inside the all-reduce when rank 1 dies.
    faults = [Fault(rank=1, at="allreduce:20:during", delay=timedelta(milliseconds=2))]
    result = run_workers(_loop_until_failure, 3, world_size=4, faults=faults, timeout=T30)
    assert result[1].outcome == "killed", result.describe()
    _check_shrunk(result, {1}, 4)


def test_sigkill_rank0_before_collective() -> None:
    faults = [Fault(rank=0, at="allreduce:10:before")]
    result = run_workers(_loop_until_failure, world_size=3, faults=faults, timeout=T30)
    _check_shrunk(result, {0}, 3)


def test_sigkill_after_collective_two_ranks_at_once() -> None:
    faults = [Fault(rank=1, at="allreduce:15:after"), Fault(rank=2, at="allreduce:15:after")]
    result = run_workers(_loop_until_failure, world_size=4, faults=faults, timeout=T30)
    _check_shrunk(result, {1, 2}, 4)


def test_sigstop_detected_by_heartbeat() -> None:
    faults = [Fault(rank=2, at="step:10", kind="stop")]
    with MultiProcessHarness(3, faults=faults) as h:
        result = h.run(_loop_until_failure, timeout=T30)
    assert result[2].outcome == "stopped", result.describe()
    _check_shrunk(result, {2}, 3)
    for r in result.survivors():
        assert r.value["suspects"] == [2]


def _fenced(g: FaultTolerantGroup, x: torch.Tensor, ctx: WorkerContext, exc: Exception) -> dict:
    # The stopped member woke up in an old epoch: it is fenced out, and stays out.
    try:
        g.all_reduce(x)
    except StaleEpochError:
        return {"stale": True, "message": str(exc)}
    finally:
        ctx.store.set("stale/checked", "1")
    return {"stale": "op was allowed"}


def _stale_member(ctx: WorkerContext) -> dict:
    g = FaultTolerantGroup.from_env(config=FAST)
    x = torch.ones(8)
    try:
        for i in range(400):
            ctx.checkpoint(f"step:{i}")
            g.all_reduce(x)
    except CommRevokedError:
        pass
    except StaleEpochError as exc:
        # Its monitor read the decision that left it out before an op failed (fencing).
        return _fenced(g, x, ctx, exc)
    try:
        g.agree(timeout=T30)
        g.shrink()
    except StaleEpochError as exc:
        return _fenced(g, x, ctx, exc)
    # Survivors keep working while the stale member is out, and stay until it has
    # tried its old epoch (an event, not a sleep: its resume time is the fault's).
    for _ in range(5):
        g.all_reduce(x)
    ctx.store.wait(["stale/checked"], T30)
    return {"stale": False, "members": list(g.members)}


def test_stopped_member_resumes_fenced_out() -> None:
    faults = [Fault(rank=1, at="step:5", kind="stop", resume_after=timedelta(seconds=2))]
    result = run_workers(_stale_member, world_size=3, faults=faults, timeout=T30)
    assert result[1].outcome == "returned", result.describe()
    assert result[1].value["stale"] is True, result.describe()
    assert "left out" in result[1].value["message"]
    assert result[0].value == {"stale": False, "members": ["w0", "w2"]}


def _grow_worker(ctx: WorkerContext) -> dict:
    if ctx.rank >= ctx.world_size:  # the replacement
        g = FaultTolerantGroup.join(ctx.store, member_id="r0", timeout=T30, config=FAST)
        epoch_joined = g.epoch
    else:
        g = FaultTolerantGroup.from_env(config=FAST)
        x = torch.ones(4)
        try:
            for i in range(400):
                ctx.checkpoint(f"step:{i}")
                g.all_reduce(x)
        except CommRevokedError:
            g.agree(timeout=T30)
            g.shrink()
        ctx.store.set(f"shrunk/{g.member_id}", "1")
        deadline = time.monotonic() + 20
        while not g.pending_joiners():
            assert time.monotonic() < deadline, "joiner never appeared"
            time.sleep(0.05)
        g.grow(timeout=T30)
        epoch_joined = g.epoch
    y = torch.full((3,), float(g.rank + 1))
    g.all_reduce(y)
    b = torch.tensor([float(g.rank)])
    g.broadcast(b, src=g.size - 1)
    return {"members": list(g.members), "sum": y[0].item(), "b": b.item(), "epoch": epoch_joined}


def test_replacement_joins_after_kill() -> None:
    faults = [Fault(rank=2, at="step:8")]
    with MultiProcessHarness(3, faults=faults) as h:
        h.start(_grow_worker)
        h.store.wait(["shrunk/w0", "shrunk/w1"], T30)
        h.spawn(_grow_worker)
        result = h.join(T30)
    values = [result[r].value for r in (0, 1, 3)]
    assert all(result[r].outcome == "returned" for r in (0, 1, 3)), result.describe()
    for v in values:
        assert v["members"] == ["w0", "w1", "r0"]
        assert v["sum"] == 6.0
        assert v["b"] == 2.0
        assert v["epoch"] == 2


def _kill_during_agreement(ctx: WorkerContext) -> dict:
    g = FaultTolerantGroup.from_env(config=FAST)
    x = torch.ones(4)
    try:
        for i in range(400):
            ctx.checkpoint(f"step:{i}")
            g.all_reduce(x)
    except CommRevokedError:
        pass
    attempts = 0
    while True:
        attempts += 1
        try:
            ctx.checkpoint(f"agree:{attempts}")
            g.agree(timeout=T30)
            ctx.checkpoint(f"shrink:{attempts}")
            g.shrink()
            y = torch.ones(2)
            g.all_reduce(y)
            return {"members": list(g.members), "sum": y[0].item(), "attempts": attempts}
        except CommRevokedError:
            if attempts > 5:
                raise


def test_kill_during_agreement_and_reconfiguration() -> None:
    # w1 dies in the collective; w3 dies just after acking the agreement (before the new
    # epoch connects): survivors must not hang or split, and end up with {w0, w2}.
    faults = [Fault(rank=1, at="step:6"), Fault(rank=3, at="shrink:1")]
    result = run_workers(_kill_during_agreement, world_size=4, faults=faults, timeout=T30)
    for r in (0, 2):
        assert result[r].outcome == "returned", result.describe()
        assert result[r].value["members"] == ["w0", "w2"]
        assert result[r].value["sum"] == 2.0
    assert result[3].outcome == "killed"


def _epochs_reuse_store_connection(ctx: WorkerContext) -> dict:
    from torchnext.distributed import backend

    opened = []
    real_clone = backend.clone_store

    def counting_clone(store, timeout):  # type: ignore[no-untyped-def]
        opened.append(1)
        return real_clone(store, timeout)

    backend.clone_store = counting_clone
    g = FaultTolerantGroup.from_env(config=FAST)
    x = torch.ones(4)
    for _ in range(4):
        g.all_reduce(x)
        g.revoke("test: move to a new epoch")
        g.agree(timeout=T30)
        g.shrink()
    g.all_reduce(x)
    return {"epoch": g.epoch, "opened": len(opened)}


def test_new_epochs_open_no_new_store_connection() -> None:
    # Opening a store connection does a reverse DNS lookup on both ends (a lost packet
    # costs the resolver's 5 s retry): recovery must reuse the one it opened first.
    result = run_workers(_epochs_reuse_store_connection, world_size=3, timeout=T30)
    for r in result:
        assert r.outcome == "returned", result.describe()
        assert r.value["epoch"] == 4
        assert r.value["opened"] == 1, r.value


class _FakeStore:
    def __init__(self) -> None:
        self.clones = 0

    def clone(self) -> _FakeStore:
        self.clones += 1
        return _FakeStore()

    def set_timeout(self, timeout: timedelta) -> None:
        pass


def test_build_connection_is_reused_unless_a_build_kept_it() -> None:
    from torchnext.distributed.backend import BuildConnection

    store = _FakeStore()
    conns = BuildConnection(store, T30)
    first = conns.take()
    conns.give_back(first)
    assert conns.take() is first and store.clones == 1
    # ``first`` is now held by a build that was abandoned: the next build opens its own.
    second = conns.take()
    assert second is not first and store.clones == 2
    conns.give_back(second)
    conns.give_back(first)  # the abandoned build ended later: the idle one stays
    assert conns.take() is second


def test_a_group_whose_constructor_raised_reports_no_error_of_its_own() -> None:
    # A worker's error handler asks every live group what broke; one whose registration
    # raised has no epoch: it is not listed (it raised AttributeError in errored()).
    import torch.distributed as dist

    from torchnext.distributed.group.fault_tolerant_group import live_groups
    from torchnext.errors import MembershipError

    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    first = FaultTolerantGroup(store, member_id="a", world_size=1)
    try:
        with pytest.raises(MembershipError, match="member b is member #2 to create group"):
            FaultTolerantGroup(store, member_id="b", world_size=1)
        assert [g.errored() for g in live_groups()] == [None] * len(live_groups())
    finally:
        first.shutdown()
