"""Every collective of FaultTolerantGroup gives torch.distributed's result on the same inputs;
bad input gets a clear error and never hangs; split and revoke callbacks; interop."""

from __future__ import annotations

import time
from datetime import timedelta

import pytest
import torch
import torch.distributed as dist

from torchnext.distributed import FaultTolerantGroup, GroupConfig, P2POp
from torchnext.distributed.group.config import ETCD_HEARTBEAT_INTERVAL, defaults_for
from torchnext.errors import (
    CollectiveMismatchError,
    CommRevokedError,
    GroupShutdownError,
    MembershipError,
    StoreUnreachableError,
)
from torchnext.testing import WorkerContext, run_workers

T30 = timedelta(seconds=30)


def _inputs(rank: int, size: int, dtype: torch.dtype) -> torch.Tensor:
    g = torch.Generator().manual_seed(100 + rank)
    return (torch.rand(6, generator=g) * 4 + 1).to(dtype)


def _both(ctx: WorkerContext) -> dict:
    """Run each op on our group and on plain torch.distributed; return mismatches."""
    group = FaultTolerantGroup.from_env()
    dist.init_process_group(
        "gloo", store=dist.PrefixStore("plain", ctx.store), rank=group.rank, world_size=group.size
    )
    rank, size = group.rank, group.size
    bad: list[str] = []

    def same(name: str, a: object, b: object) -> None:
        ok = torch.equal(a, b) if isinstance(a, torch.Tensor) else a == b  # type: ignore[arg-type]
        if not ok:
            bad.append(f"{name}: {a} != {b}")

    for dtype in (torch.float32, torch.int64):
        ops = [dist.ReduceOp.SUM, dist.ReduceOp.MIN, dist.ReduceOp.MAX, dist.ReduceOp.PRODUCT]
        for op in ops:
            a, b = _inputs(rank, size, dtype), _inputs(rank, size, dtype)
            group.all_reduce(a, op)
            dist.all_reduce(b, op)
            same(f"all_reduce {op} {dtype}", a, b)
            a, b = _inputs(rank, size, dtype), _inputs(rank, size, dtype)
            group.reduce(a, dst=1, op=op)
            dist.reduce(b, dst=1, op=op)
            if rank == 1:
                same(f"reduce {op} {dtype}", a, b)
    a = _inputs(rank, size, torch.float32)
    group.all_reduce(a, dist.ReduceOp.AVG)
    b = _inputs(rank, size, torch.float32)
    dist.all_reduce(b)
    same("all_reduce avg", a, b / size)

    a, b = _inputs(rank, size, torch.float32), _inputs(rank, size, torch.float32)
    group.broadcast(a, src=2)
    dist.broadcast(b, src=2)
    same("broadcast", a, b)

    x = _inputs(rank, size, torch.float32)
    la = [torch.zeros(6) for _ in range(size)]
    lb = [torch.zeros(6) for _ in range(size)]
    group.all_gather(la, x)
    dist.all_gather(lb, x)
    same("all_gather", torch.stack(la), torch.stack(lb))
    oa, ob = torch.zeros(6 * size), torch.zeros(6 * size)
    group.all_gather_into_tensor(oa, x)
    dist.all_gather_into_tensor(ob, x)
    same("all_gather_into_tensor", oa, ob)

    ins = [_inputs(rank * 10 + i, size, torch.float32) for i in range(size)]
    ra = torch.zeros(6)
    group.reduce_scatter(ra, ins)
    expected = torch.zeros(6)
    dist.reduce_scatter(expected, [t.clone() for t in ins])
    same("reduce_scatter", ra, expected)
    rt = torch.zeros(6)
    group.reduce_scatter_tensor(rt, torch.cat(ins))
    expected_t = torch.zeros(6)
    dist.reduce_scatter_tensor(expected_t, torch.cat(ins))
    same("reduce_scatter_tensor", rt, expected_t)

    # all_to_all_single with uneven splits: rank r sends r+1+j elements to rank j.
    in_splits = [rank + 1 + j for j in range(size)]
    out_splits = [r + 1 + rank for r in range(size)]
    src = torch.arange(sum(in_splits), dtype=torch.float32) + 100 * rank
    oa, ob = torch.zeros(sum(out_splits)), torch.zeros(sum(out_splits))
    group.all_to_all_single(oa, src, out_splits, in_splits)
    dist.all_to_all_single(ob, src, out_splits, in_splits)
    same("all_to_all_single uneven", oa, ob)
    ins_l = list(src.split(in_splits))
    outs_l = [torch.zeros(n) for n in out_splits]
    group.all_to_all(outs_l, ins_l)
    same("all_to_all list", torch.cat(outs_l), ob)

    gl = [torch.zeros(6) for _ in range(size)] if rank == 0 else None
    group.gather(x, gl, dst=0)
    if rank == 0:
        same("gather", torch.stack(gl), torch.stack(lb))  # type: ignore[arg-type]
    sc = torch.zeros(6)
    group.scatter(
        sc, [torch.full((6,), float(i)) for i in range(size)] if rank == 1 else None, src=1
    )
    same("scatter", sc, torch.full((6,), float(rank)))
    group.barrier()

    nxt, prv = (rank + 1) % size, (rank - 1) % size
    recv = torch.zeros(3)
    works = group.batch_isend_irecv(
        [P2POp("isend", torch.full((3,), float(rank)), nxt), P2POp(dist.irecv, recv, prv)]
    )
    for w in works:
        w.wait(T30)
    same("batch_isend_irecv", recv, torch.full((3,), float(prv)))
    if rank == 0:
        group.send(torch.tensor([7.0]), dst=1)
    elif rank == 1:
        t = torch.zeros(1)
        group.recv(t, src=0)
        same("send/recv", t, torch.tensor([7.0]))

    w = group.all_reduce(torch.ones(2), async_op=True)
    assert w is not None
    w.wait(T30)
    assert w.is_completed() and w.exception() is None
    dist.destroy_process_group()
    group.shutdown()
    return {"bad": bad}


def test_results_identical_to_torch_distributed() -> None:
    result = run_workers(_both, world_size=3, timeout=T30)
    for r in result:
        assert r.outcome == "returned", result.describe()
        assert r.value["bad"] == []


def _bad_inputs(ctx: WorkerContext) -> dict:
    group = FaultTolerantGroup.from_env(config=GroupConfig(validate=True))
    errors: dict[str, str] = {}

    def expect(name: str, exc_type: type[BaseException], fn: object) -> None:
        try:
            fn()  # type: ignore[operator]
        except exc_type as exc:
            errors[name] = str(exc)
        else:
            errors[name] = "NO ERROR"

    expect("rank", MembershipError, lambda: group.broadcast(torch.ones(2), src=5))
    expect("device", ValueError, lambda: group.all_reduce(torch.ones(2, device="meta")))
    # Mismatched shapes and dtypes across ranks: a clear error on every rank, no hang.
    expect("shape", CollectiveMismatchError, lambda: group.all_reduce(torch.ones(2 + group.rank)))
    dtype = torch.float32 if group.rank == 0 else torch.float64
    expect("dtype", CollectiveMismatchError, lambda: group.all_reduce(torch.ones(2, dtype=dtype)))
    group.all_reduce(torch.ones(2))  # still usable after a caught mismatch
    group.barrier()
    group.revoke("test revoke")
    expect("revoked", CommRevokedError, lambda: group.all_reduce(torch.ones(2)))
    group.shutdown()
    expect("shutdown", GroupShutdownError, lambda: group.all_reduce(torch.ones(2)))
    return errors


def test_bad_input_errors_are_clear() -> None:
    result = run_workers(_bad_inputs, world_size=2, timeout=T30)
    for r in result:
        assert r.outcome == "returned", result.describe()
        errs = r.value
        assert "src=5" in errs["rank"] and "0..1" in errs["rank"]
        assert "meta" in errs["device"]
        assert "differ" in errs["shape"]
        assert "differ" in errs["dtype"]
        assert "test revoke" in errs["revoked"]
        assert "shut down" in errs["shutdown"]


def test_unreachable_store_names_the_address(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TORCHNEXT_STORE_ADDR", "127.0.0.1:1")
    monkeypatch.setenv("TORCHNEXT_MEMBER_ID", "w0")
    monkeypatch.setenv("TORCHNEXT_WORLD_SIZE", "2")
    with pytest.raises(StoreUnreachableError, match="127.0.0.1:1"):
        FaultTolerantGroup.from_env(config=GroupConfig(store_timeout=timedelta(seconds=1)))


def test_config_validation() -> None:
    with pytest.raises(ValueError, match="heartbeat_timeout"):
        GroupConfig(heartbeat_timeout=timedelta(milliseconds=50))
    with pytest.raises(ValueError, match="poll_interval"):
        GroupConfig(poll_interval=timedelta(0))


class _StoreAt:
    def __init__(self, url: str) -> None:
        self.url = url


def test_defaults_follow_the_store(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TORCHNEXT_HEARTBEAT_INTERVAL", raising=False)
    monkeypatch.delenv("TORCHNEXT_BEACONS", raising=False)
    on_etcd = defaults_for(_StoreAt("etcd://10.0.0.1:2379,10.0.0.2:2379/job"))
    assert on_etcd.heartbeat_interval == ETCD_HEARTBEAT_INTERVAL == timedelta(milliseconds=200)
    assert on_etcd.heartbeat_timeout == GroupConfig().heartbeat_timeout
    assert defaults_for(_StoreAt("tcp://10.0.0.1:29500")) == GroupConfig()
    assert defaults_for(object()).heartbeat_interval == timedelta(milliseconds=100)
    # An interval the user set wins on etcd too; so does switching the datagrams off.
    monkeypatch.setenv("TORCHNEXT_HEARTBEAT_INTERVAL", "0.05")
    monkeypatch.setenv("TORCHNEXT_BEACONS", "0")
    chosen = defaults_for(_StoreAt("etcd://10.0.0.1:2379/job"))
    assert chosen.heartbeat_interval == timedelta(milliseconds=50) and not chosen.beacons
    monkeypatch.setenv("TORCHNEXT_BEACONS", "maybe")
    with pytest.raises(ValueError, match="TORCHNEXT_BEACONS='maybe'"):
        GroupConfig()


def _split(ctx: WorkerContext) -> dict:
    group = FaultTolerantGroup.from_env()
    seen: list[int] = []
    group.add_revoke_callback(lambda exc: seen.append(exc.epoch))
    evens = group.split(color=group.rank % 2, key=-group.rank)
    listed = group.split([3, 1])
    assert not isinstance(evens, int)
    t = torch.tensor([float(group.rank)])
    evens.all_reduce(t)
    out = {"color_members": list(evens.members), "color_sum": t.item(), "color_rank": evens.rank}
    if isinstance(listed, int):
        out["listed"] = listed
    else:
        u = torch.tensor([float(group.rank)])
        listed.broadcast(u, src=0)
        out["listed"] = [list(listed.members), u.item()]
    group.barrier()
    if group.rank == 0:
        group.revoke("parent revoked")
    deadline = time.monotonic() + 10
    while not group.is_revoked and time.monotonic() < deadline:
        time.sleep(0.01)
    try:
        evens.all_reduce(torch.ones(1), timeout=T30)
        out["child_revoked"] = False
    except CommRevokedError as exc:
        out["child_revoked"] = "parent revoked" in str(exc)
    out["callback_epochs"] = seen
    return out


def test_split_color_and_ranks_revoked_with_parent() -> None:
    result = run_workers(_split, world_size=4, timeout=T30)
    vals = [r.value for r in result]
    assert all(r.outcome == "returned" for r in result), result.describe()
    # color = rank % 2, key = -rank: higher parent rank first.
    assert vals[0]["color_members"] == ["w2", "w0"] and vals[0]["color_sum"] == 2.0
    assert vals[1]["color_members"] == ["w3", "w1"] and vals[1]["color_sum"] == 4.0
    assert vals[0]["color_rank"] == 1 and vals[2]["color_rank"] == 0
    # split(ranks) keeps the given order (2.14 semantics); non-members get -100.
    assert vals[0]["listed"] == dist.GroupMember.NON_GROUP_MEMBER
    assert vals[3]["listed"] == [["w3", "w1"], 3.0]
    assert vals[1]["listed"] == [["w3", "w1"], 3.0]
    for v in vals:
        assert v["child_revoked"] is True
        assert v["callback_epochs"] == [0]


def _op_timeout(ctx: WorkerContext) -> dict:
    from torchnext.errors import CommTimeoutError

    group = FaultTolerantGroup.from_env()
    out: dict = {}
    if group.rank == 0:
        w = group.all_reduce(torch.ones(2), async_op=True, timeout=timedelta(seconds=20))
        assert w is not None
        try:
            w.wait(timedelta(milliseconds=200))  # a short wait: not a failure of the op
        except CommTimeoutError:
            out["short_wait_revoked"] = group.is_revoked
        try:
            group.barrier(timeout=timedelta(milliseconds=500))
        except CommTimeoutError as exc:
            out["op_timeout"] = "timeout=0:00:00.500000" in str(exc)
        out["revoked_after"] = group.is_revoked
    else:
        deadline = time.monotonic() + 20
        while not group.is_revoked and time.monotonic() < deadline:
            time.sleep(0.01)
        out["peer_saw_revoke"] = group.is_revoked
    return out


def test_per_op_timeout_revokes_and_short_wait_does_not() -> None:
    result = run_workers(_op_timeout, world_size=2, timeout=T30)
    assert all(r.outcome == "returned" for r in result), result.describe()
    assert result[0].value == {
        "short_wait_revoked": False,
        "op_timeout": True,
        "revoked_after": True,
    }
    assert result[1].value == {"peer_saw_revoke": True}
