"""RMA windows: one-sided semantics across real processes, over shared memory and over TCP."""

from __future__ import annotations

import os
import select
import threading
import time
from datetime import timedelta
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from torchnext.distributed.rma import StoreGroup, Window, WindowConfig
from torchnext.errors import CommTimeoutError, WindowError, WindowRevokedError
from torchnext.testing import Fault, MultiProcessHarness, WorkerContext, run_workers

N = 64


def _group(ctx: WorkerContext, name: str = "t") -> StoreGroup:
    return StoreGroup(dist.PrefixStore("rma", ctx.store), ctx.rank, ctx.world_size, name=name)


def _semantics(ctx: WorkerContext, transport: str) -> dict[str, object]:
    g = _group(ctx)
    cfg = WindowConfig(transport=transport, timeout=timedelta(seconds=20))  # type: ignore[arg-type]
    win = Window.allocate(g, (N,), torch.float32, cfg)
    r, size = ctx.rank, ctx.world_size
    nxt, prv = (r + 1) % size, (r - 1) % size
    out: dict[str, object] = {}
    # put + fence: each rank writes its id into the next rank's window.
    win.put(torch.full((4,), float(r)), nxt, 4 * r)
    win.fence()
    out["put"] = win.tensor[4 * prv : 4 * prv + 4].tolist()
    # get: read what the previous rank holds from its own predecessor.
    out["get"] = win.get(prv, 4 * ((prv - 1) % size), 4).tolist()
    win.fence()
    # accumulate: everyone adds into rank 0 concurrently, without locks (atomic per target).
    for _ in range(50):
        win.accumulate(torch.ones(8), 0, 32)
    win.accumulate(torch.full((2,), float(r)), 0, 40, op="max")
    win.accumulate(torch.full((2,), float(r)), 0, 42, op="min")
    win.fence()
    if r == 0:
        out["acc"] = win.tensor[32:40].tolist()
        out["max"] = win.tensor[40:42].tolist()
        out["min"] = win.tensor[42:44].tolist()
    win.fence()
    # put + signal: the reader waits for the signal, then sees the data.
    win.put(torch.full((4,), 100.0 + r), nxt, 48)
    win.signal(nxt)
    win.wait_signal(prv)
    out["signal"] = win.tensor[48:52].tolist()
    # exclusive locks: read-modify-write of one counter on rank 0 by everyone.
    for _ in range(20):
        win.lock(0, exclusive=True)
        value = win.get(0, 60, 1)
        win.put(value + 1, 0, 60)
        win.unlock(0)
    # nonblocking: handles complete, get's handle carries the tensor.
    h = win.put(torch.full((2,), 7.0), nxt, 56, async_op=True)
    assert h is not None
    h.wait(timedelta(seconds=10))
    win.fence()
    hg = win.get(nxt, 56, 2, async_op=True)
    out["async_get"] = hg.wait(timedelta(seconds=10)).tolist()
    win.fence()
    if r == 0:
        out["counter"] = win.tensor[60].item()
    win.close()
    return out


@pytest.mark.parametrize("transport", ["auto", "tcp"])
def test_one_sided_semantics(transport: str) -> None:
    size = 3
    result = run_workers(_semantics, transport, world_size=size, timeout=timedelta(seconds=90))
    result.raise_if_failed(list(range(size)))
    outs = result.values()
    for r, o in enumerate(outs):
        prv = (r - 1) % size
        assert o["put"] == [float(prv)] * 4
        assert o["get"] == [float((prv - 1) % size)] * 4
        assert o["signal"] == [100.0 + prv] * 4
        assert o["async_get"] == [7.0, 7.0]
    assert outs[0]["acc"] == [50.0 * size] * 8
    assert outs[0]["max"] == [float(size - 1)] * 2 and outs[0]["min"] == [0.0, 0.0]
    assert outs[0]["counter"] == 20.0 * size


def _busy_target(ctx: WorkerContext, transport: str) -> list[float]:
    """Rank 1's main thread is blocked until rank 0 has written and read its window."""
    win = Window.allocate(_group(ctx), (1 << 16,), torch.float32, WindowConfig(transport=transport))  # type: ignore[arg-type]
    if ctx.rank == 1:
        # Blocked in the store, outside any window call, until rank 0 says it is done:
        # whatever rank 0 did meanwhile was served without this thread.
        ctx.store.wait(["busy/done"], timedelta(seconds=30))
        value = win.tensor[:4].tolist()
    else:
        win.put(torch.full((1 << 16,), 5.0), 1)
        value = win.get(1, 0, 4).tolist()
        ctx.store.set("busy/done", "1")
    win.fence()
    win.close()
    return value


@pytest.mark.parametrize("transport", ["auto", "tcp"])
def test_target_main_thread_need_not_participate(transport: str) -> None:
    result = run_workers(_busy_target, transport, world_size=2, timeout=timedelta(seconds=60))
    result.raise_if_failed([0, 1])
    assert result[0].value == [5.0] * 4  # read back while rank 1 was blocked
    assert result[1].value == [5.0] * 4  # and it landed in rank 1's memory


def _segments_of(pids: list[int]) -> list[str]:
    return [
        f
        for f in os.listdir("/dev/shm")
        if f.startswith("torchnext-rma-") and int(f.rsplit("-", 1)[1]) in pids
    ]


def _create_then_die(ctx: WorkerContext) -> None:
    Window.allocate(_group(ctx), (1024,), torch.float32)
    ctx.checkpoint("created")  # killed here
    raise AssertionError("the kill at 'created' did not happen")


@pytest.mark.skipif(not os.path.isdir("/dev/shm"), reason="needs /dev/shm")
def test_segments_unlinked_even_after_sigkill() -> None:
    faults = [Fault(rank=r, at="created", kind="kill") for r in range(3)]
    with MultiProcessHarness(3, faults=faults) as harness:
        result = harness.run(_create_then_die, timeout=timedelta(seconds=60))
        pids = harness.pids
    assert [r.outcome for r in result] == ["killed"] * 3, result.describe()
    assert _segments_of(pids) == []


def _lock_modes(ctx: WorkerContext, transport: str) -> list[str]:
    """Ranks 0 and 1 share a lock on rank 2; an exclusive request waits until both leave."""
    cfg = WindowConfig(transport=transport, timeout=timedelta(seconds=20))  # type: ignore[arg-type]
    win = Window.allocate(_group(ctx), (8,), torch.float32, cfg)
    seen: list[str] = []
    wait_s = timedelta(seconds=20)
    if ctx.rank in (0, 1):
        win.lock(2, exclusive=False)
        win.fence()  # both hold the shared lock at once past this point
        seen.append("shared-together")
        # Hold it until rank 2's exclusive request has been refused, then say so
        # before letting go: rank 2 can only be granted after both keys exist.
        ctx.store.wait(["locks/refused"], wait_s)
        ctx.store.set(f"locks/releasing-{ctx.rank}", "1")
        win.unlock(2)
    else:
        win.fence()
        with pytest.raises(CommTimeoutError):  # both shared holders still hold it
            win.lock(2, exclusive=True, timeout=timedelta(milliseconds=50))
        ctx.store.set("locks/refused", "1")
        win.lock(2, exclusive=True)
        released = [ctx.store.check([f"locks/releasing-{r}"]) for r in (0, 1)]
        seen.append(f"exclusive-after-release={released}")
        win.unlock(2)
    win.fence()
    win.close()
    return seen


@pytest.mark.parametrize("transport", ["auto", "tcp"])
def test_shared_and_exclusive_locks(transport: str) -> None:
    result = run_workers(_lock_modes, transport, world_size=3, timeout=timedelta(seconds=60))
    result.raise_if_failed([0, 1, 2])
    assert result[0].value == result[1].value == ["shared-together"]
    # Refused while shared, granted only once both holders were letting go.
    assert result[2].value == ["exclusive-after-release=[True, True]"]


def _mixed_dtypes(ctx: WorkerContext) -> str:
    dtype = torch.float64 if ctx.rank == 1 else torch.float32
    try:
        Window.allocate(_group(ctx), (8,), dtype, WindowConfig(timeout=timedelta(seconds=10)))
    except WindowError as exc:
        return str(exc)
    return "created"


def test_creation_with_mismatched_dtypes_fails_everywhere_and_cleans_up() -> None:
    with MultiProcessHarness(2) as harness:
        result = harness.run(_mixed_dtypes, timeout=timedelta(seconds=60))
        pids = harness.pids
    result.raise_if_failed([0, 1])
    assert all("same dtype" in v for v in result.values()), result.values()
    assert _segments_of(pids) == []


def _peer_dies(ctx: WorkerContext) -> str:
    win = Window.allocate(
        _group(ctx),
        (8,),
        torch.float32,
        WindowConfig(transport="tcp", timeout=timedelta(seconds=5)),
    )
    if ctx.rank == 1:
        ctx.store.set("peer/pid", str(os.getpid()))
    ctx.checkpoint("created")  # rank 1 is killed here
    if ctx.rank == 1:
        raise AssertionError("the kill at 'created' did not happen")
    _wait_until_exited(int(ctx.store.get("peer/pid")), timedelta(seconds=30))
    start = time.perf_counter()
    try:
        win.put(torch.ones(2), 1)
    except (CommTimeoutError, RuntimeError) as exc:
        return f"{type(exc).__name__} after {time.perf_counter() - start:.1f}s"
    return "no error"


def _wait_until_exited(pid: int, timeout: timedelta) -> None:
    """Block until process ``pid`` has exited (a pidfd is readable then, reaped or not)."""
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:  # already exited and reaped
        return
    try:
        ready, _, _ = select.select([fd], [], [], timeout.total_seconds())
    finally:
        os.close(fd)
    if not ready:
        raise TimeoutError(f"process {pid} was still running after {timeout}")


def test_remote_peer_death_fails_fast() -> None:
    result = run_workers(
        _peer_dies,
        world_size=2,
        faults=[Fault(rank=1, at="created", kind="kill")],
        timeout=timedelta(seconds=60),
    )
    assert result[1].outcome == "killed"
    result.raise_if_failed([0])
    assert result[0].value.startswith("CommError after"), result[0].value


# --------------------------------------------------------------------------- in-process


def _solo(transport: str = "auto") -> tuple[StoreGroup, Window]:
    group = StoreGroup(dist.HashStore(), 0, 1, name=f"solo-{time.monotonic_ns()}")
    cfg = WindowConfig(transport=transport, timeout=timedelta(seconds=2))  # type: ignore[arg-type]
    return group, Window.create(group, torch.arange(8, dtype=torch.float32), cfg)


def test_bad_input_raises_at_caller_and_leaves_memory_intact() -> None:
    _, win = _solo()
    before = win.tensor.clone()
    cases = [
        (lambda: win.put(torch.ones(4), 0, 6), "overruns rank 0's window of 8"),
        (lambda: win.put(torch.ones(2), 0, -1), "target_offset_nelems=-1"),
        (lambda: win.get(0, 7, 2), "overruns"),
        (lambda: win.put(torch.ones(2, dtype=torch.float64), 0), "does not match the window dtype"),
        (
            lambda: win.accumulate(torch.ones(2, dtype=torch.int32), 0),
            "does not match the window dtype",
        ),
        (lambda: win.put(torch.ones(2), 3), "dst_rank=3 is outside"),
        (lambda: win.get(-1, 0, 1), "src_rank=-1 is outside"),
        (lambda: win.accumulate(torch.ones(2), 0, op="prod"), "op='prod'"),  # type: ignore[arg-type]
        (lambda: win.unlock(0), "holds no lock"),
    ]
    for fn, needle in cases:
        with pytest.raises(WindowError, match=needle):
            fn()
    assert torch.equal(win.tensor, before)
    win.lock(0)
    with pytest.raises(WindowError, match="already holds an exclusive lock"):
        win.lock(0)
    win.unlock(0)
    win.close()
    with pytest.raises(WindowError, match="closed"):
        win.put(torch.ones(1), 0)


def test_bounded_waits() -> None:
    _, win = _solo()
    start = time.monotonic()
    with pytest.raises(CommTimeoutError):
        win.wait_signal(0, timeout=timedelta(milliseconds=200))
    assert time.monotonic() - start < 2
    win.close()


def test_revocation_fails_waiters_and_later_ops() -> None:
    group, win = _solo()
    threading.Timer(0.2, group.revoke, args=("peer 3 died",)).start()
    start = time.monotonic()
    with pytest.raises(WindowRevokedError, match="peer 3 died"):
        win.wait_signal(0, timeout=timedelta(seconds=30))
    assert time.monotonic() - start < 5
    with pytest.raises(WindowRevokedError):
        win.put(torch.ones(1), 0)
    win.close()


def test_reconfigured_group_invalidates_window() -> None:
    group, win = _solo()
    group.epoch += 1  # what a fault-tolerant group does on shrink/grow/reconfigure
    with pytest.raises(WindowRevokedError, match="epoch 1"):
        win.get(0, 0, 1)
    win.close()


def test_pending_nonblocking_ops_fail_on_revoke(tmp_path: Path) -> None:
    group, win = _solo()
    gate = threading.Event()
    win._submit(lambda: gate.wait(5), async_op=True)  # occupy the async worker
    work = win.put(torch.ones(2), 0, async_op=True)
    assert work is not None
    group.revoke("test")
    gate.set()
    with pytest.raises(WindowRevokedError):
        work.wait(timedelta(seconds=5))
    win.close()


def test_progress_server_refuses_bad_requests_without_touching_memory() -> None:
    from torchnext.distributed.rma._progress import Op, RemotePeer

    _, win = _solo("tcp")  # a server runs even for one member when TCP is forced
    assert win._server is not None
    before = win.tensor.clone()
    peer = RemotePeer(win._server.address, 0)
    payload = torch.ones(4).numpy().data
    with pytest.raises(WindowError, match="overruns"):
        peer.request(Op.PUT, src=0, offset=6, nelems=4, timeout_s=2.0, payload=payload)
    with pytest.raises(WindowError, match="origin rank 5"):
        peer.request(Op.PUT, src=5, offset=0, nelems=4, timeout_s=2.0, payload=payload)
    with pytest.raises(WindowError, match="accumulate op code 9"):
        peer.request(Op.ACC, src=0, offset=0, nelems=4, acc=9, timeout_s=2.0, payload=payload)
    assert torch.equal(win.tensor, before)
    # The stream stayed in step: a valid request on the same connection still works.
    peer.request(Op.PUT, src=0, offset=4, nelems=4, timeout_s=2.0, payload=payload)
    assert win.tensor[4:].tolist() == [1.0] * 4
    peer.close()
    win.close()
