"""The training script of ``torchnext bench ft-hosts``: one worker, run by ``torchnext run``.

Each test host's agent starts it (``torchnext run ... _ft_hosts_worker.py --records DIR``).
It trains the demo's pinned model (:mod:`torchnext.demo.trainer`: a 3-layer MLP on the
generated digits, seed 0, Adam) with the fault-tolerant :class:`Manager`, and appends one
JSON line per committed step and per manager event to ``DIR/<member id>.jsonl``. The
benchmark reads those files, not the store: they survive the store's host, and a
partitioned worker's record of what it did (or did not) commit reaches the benchmark
although its network does not.

``--wait-for FILE``: the worker imports torch and builds its model, then waits (bounded)
until ``FILE`` exists before it creates or joins the group. The benchmark starts the next
jobs this way while it waits for a lost job anyway, so no job's measurements share the
machine with another job's interpreter start-up, and then starts them with one file.

What not to assume: ``time.time()`` in the records is comparable across test hosts only
because they share one machine's clock; the records are written line-buffered, so a
process killed with SIGKILL loses at most the line it was writing.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
from datetime import timedelta
from pathlib import Path
from typing import IO, Any

EXIT_NOT_CALLED = 3
"""Exit code of a worker whose ``--wait-for`` file did not appear within ``--wait-timeout-s``."""


_WRITE = threading.Lock()  # manager events also come from the group's monitor thread


def _record(out: IO[str], member: str, kind: str, **fields: Any) -> None:
    line = json.dumps({"kind": kind, "member": member, "t": time.time(), **fields}, default=str)
    with _WRITE:
        out.write(line + "\n")


def _await_call(path: Path, timeout: timedelta) -> bool:
    """Wait until ``path`` exists; False when ``timeout`` passed first."""
    deadline = time.monotonic() + timeout.total_seconds()
    while not path.exists():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)  # a file, not the store: a waiting job adds no load to any store
    return True


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="_ft_hosts_worker.py")
    parser.add_argument("--records", required=True, help="folder of the per-member JSON lines")
    parser.add_argument("--pace-ms", type=float, default=40.0, help="minimum compute per step")
    parser.add_argument("--batch", type=int, default=48)
    parser.add_argument("--wait-for", default="", help="start training once this file exists")
    parser.add_argument("--wait-timeout-s", type=float, default=1800.0)
    args = parser.parse_args(argv)

    import torch

    from torchnext._env import TORCHNEXT_MEMBER_ID
    from torchnext.demo.data import load_dataset
    from torchnext.demo.trainer import build_model, build_optimizer, sampler_for, summed_loss
    from torchnext.distributed.launch.exits import EXIT_EVICTED
    from torchnext.distributed.training.manager import Manager, ManagerConfig, ManagerEvent

    torch.set_num_threads(1)
    member = TORCHNEXT_MEMBER_ID.get() or f"pid{os.getpid()}"
    folder = Path(args.records)
    out = open(folder / f"{member}.jsonl", "a", buffering=1, encoding="utf-8")  # noqa: SIM115
    data = load_dataset(prefer_real=False, seed=0)
    model = build_model(0, data.x_ND.shape[1], data.num_classes)
    optimizer = build_optimizer(model, 2e-3)
    sampler = sampler_for(data, batch=args.batch, seed=0)
    _record(out, member, "ready", pid=os.getpid())
    if args.wait_for and not _await_call(
        Path(args.wait_for), timedelta(seconds=args.wait_timeout_s)
    ):
        _record(out, member, "not_called")
        return EXIT_NOT_CALLED

    def on_event(e: ManagerEvent) -> None:
        _record(
            out,
            member,
            "event",
            event=e.kind,
            et=e.time,
            epoch=e.epoch,
            step=e.step,
            world=e.world_size,
            detail=e.detail,
        )

    config = ManagerConfig(step_timeout=timedelta(seconds=20))
    try:
        manager = Manager.from_env(
            model,
            optimizer,
            sampler,
            config=config,
            on_event=on_event,
            join_timeout=timedelta(seconds=120),
        )
    except Exception as exc:
        _record(out, member, "join_failed", error=str(exc)[:500])
        raise
    _record(out, member, "joined", step=manager.step, epoch=int(manager.group.epoch))
    pace_s = args.pace_ms / 1000.0

    def closure(indices: list[int]) -> torch.Tensor:
        t0 = time.monotonic()
        loss = summed_loss(model, data, indices)
        left = pace_s - (time.monotonic() - t0)
        if left > 0:
            time.sleep(left)
        return loss

    try:
        while True:
            # t0: when this attempt began, so a step started before a fault and committed
            # just after it is told apart from one run after the fault.
            t0 = time.time()
            result = manager.run_step(closure)
            if result.committed:
                _record(
                    out,
                    member,
                    "step",
                    t0=t0,
                    step=result.step,
                    epoch=int(manager.group.epoch),
                    world=result.world_size,
                    recovery_s=round(result.recovery_s, 4),
                )
    except Exception as exc:
        if manager.evicted(exc):
            _record(out, member, "evicted", error=str(exc)[:500])
            return EXIT_EVICTED
        _record(out, member, "error", error=f"{type(exc).__name__}: {str(exc)[:500]}")
        raise


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
