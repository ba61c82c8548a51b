"""The training script of the multi-host fault tests, run by ``torchnext run`` on test hosts.

It trains the demo's pinned model (:mod:`torchnext.demo.trainer`) with the
fault-tolerant :class:`Manager` and appends one JSON line per committed step (epoch,
world size, state checksum) and per manager event to ``RECORDS/<member id>.jsonl``.
The tests read those files, not the store: they survive the store's host, and a
partitioned worker's record of what it committed reaches the test although its network
does not (the test hosts share one file system and one clock).

``--go FILE``: build the model, then wait (bounded) for ``FILE`` before making the
group, so that every worker's interpreter start-up is over when the group is made (a
short store timeout then bounds only what the test measures). ``--full-world W``: after
``--steps``, train on until the world size is ``W`` again (replacements admitted),
bounded by ``--deadline-s``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from datetime import timedelta
from pathlib import Path
from typing import IO, Any


def _record(out: IO[str], member: str, kind: str, **fields: Any) -> None:
    line = json.dumps({"kind": kind, "member": member, "t": time.time(), **fields}, default=str)
    out.write(line + "\n")


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="multihost_worker.py")
    parser.add_argument("--records", required=True)
    parser.add_argument("--steps", type=int, required=True)
    parser.add_argument("--full-world", type=int, default=0)
    parser.add_argument("--deadline-s", type=float, default=120.0)
    parser.add_argument("--go", default="")
    parser.add_argument("--pace-ms", type=float, default=30.0)
    args = parser.parse_args(argv)

    import torch

    from torchnext.demo.data import load_dataset
    from torchnext.demo.trainer import build_model, build_optimizer, sampler_for, summed_loss
    from torchnext.distributed.launch.exits import EXIT_EVICTED
    from torchnext.distributed.training.manager import Manager, ManagerConfig, ManagerEvent

    torch.set_num_threads(1)
    member = os.environ["TORCHNEXT_MEMBER_ID"]
    out = open(Path(args.records) / f"{member}.jsonl", "a", buffering=1, encoding="utf-8")  # noqa: SIM115
    data = load_dataset(prefer_real=False, seed=0)
    model = build_model(0, data.x_ND.shape[1], data.num_classes)
    optimizer = build_optimizer(model, 2e-3)
    sampler = sampler_for(data, batch=48, seed=0)
    deadline = time.monotonic() + args.deadline_s
    _record(out, member, "ready")
    while args.go and not Path(args.go).exists() and time.monotonic() < deadline:
        time.sleep(0.05)

    def on_event(e: ManagerEvent) -> None:
        _record(out, member, "event", event=e.kind, et=e.time, epoch=e.epoch, detail=e.detail)

    config = ManagerConfig(step_timeout=timedelta(seconds=20))
    manager = Manager.from_env(model, optimizer, sampler, config=config, on_event=on_event)
    _record(out, member, "joined", step=manager.step, epoch=int(manager.group.epoch))

    def closure(indices: list[int]) -> torch.Tensor:
        t0 = time.monotonic()
        loss = summed_loss(model, data, indices)
        time.sleep(max(0.0, args.pace_ms / 1000.0 - (time.monotonic() - t0)))
        return loss

    world = 0
    try:
        while manager.step < args.steps or (
            world < args.full_world and time.monotonic() < deadline
        ):
            result = manager.run_step(closure)
            world = result.world_size
            _record(
                out,
                member,
                "step",
                step=result.step,
                epoch=int(manager.group.epoch),
                world=world,
                loss=result.loss,
                checksum=manager.checksum(),
            )
    except Exception as exc:
        evicted = manager.evicted(exc)
        _record(out, member, "exit", evicted=evicted, error=f"{type(exc).__name__}: {exc}")
        if evicted:
            return EXIT_EVICTED
        raise  # a lost store: torchnext run's worker entry says so and exits
    _record(out, member, "done", step=manager.step, world=world)
    manager.finish()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
