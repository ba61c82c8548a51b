"""A fault-injecting HSDP worker: replica groups with FSDP2, for tests and the benchmark.

Started by ``torchnext run --nproc N --group-size G -m torchnext.demo.hsdp_trainer``
(or an :class:`~torchnext.distributed.launch.agent.Agent` in a test). Every process
shards a small MLP (or, with ``--transformer FILE``, the transformer example; see
:mod:`torchnext.demo.hsdp_tasks`) with FSDP2 inside its replica group and trains with the
fault-tolerant :class:`~torchnext.distributed.training.manager.Manager`. It appends one
JSON line per committed step (step, replica, shard, loss, the CRC of its model shard
and optimizer state, the data slice it trained on), per manager event (shrink, grow,
heal...) and per fault to ``RECORDS/<member id>.jsonl``: the tests compare
shards across groups from those files, and the benchmark reads recovery and heal times.
With ``--diloco H`` (and ``--fragments F``) it trains with DiLoCo inside the replica
groups instead: a "step" is then a round, its CRC covers the global parameters and the
outer optimizer, and the final record holds the held-out loss of the global parameters
(:mod:`torchnext.demo.diloco_reference` simulates the failure-free run).

``--fault KIND:MEMBER:STEP`` (repeatable) makes the initial process ``MEMBER`` fail at
the first step from ``STEP`` on that starts with every group present: ``backward``
(SIGKILL inside backward), ``sync`` (SIGKILL as the replicate all-reduce starts),
``stop`` (SIGSTOP at the step's start). While a group is missing, the survivors wait
before each step (bounded) until the restarted group waits to join, so every failure
is followed by a heal within the run, whatever the start-up time of a process.

What not to assume: the records' times are wall-clock (``time.time()``), comparable
between processes of one host only.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
import warnings
from datetime import timedelta
from pathlib import Path
from typing import IO, Any

import torch
from torch.distributed import ReduceOp

from torchnext.demo.hsdp_tasks import (
    SAMPLES,
    Task,
    build_model,
    make_data,
    mlp_task,
    transformer_task,
)

__all__ = ["INNER_LR", "main", "reference_losses"]


INNER_LR = 1e-2
"""Adam's learning rate (the optimizer of HSDP, DiLoCo's inner optimizer)."""


def reference_losses(*, steps: int, width: int, seed: int, batch: int) -> list[float]:
    """The global-batch loss of every step of a failure-free, single-process run of the
    same model, data order and optimizer (what the HSDP run must reproduce)."""
    from torchnext.distributed.training.sampler import ElasticSampler, SamplerConfig

    model = build_model(width, seed)
    opt = torch.optim.Adam(model.parameters(), lr=INNER_LR)
    x, y = make_data(SAMPLES, seed)
    sampler = ElasticSampler(
        SamplerConfig(dataset_size=SAMPLES, global_batch_size=batch, seed=seed)
    )
    losses = []
    for _ in range(steps):
        i = torch.tensor(sampler.global_batch(), dtype=torch.int64)
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(x[i]), y[i], reduction="sum")
        (loss * sampler.loss_scale()).backward()
        opt.step()
        sampler.commit()
        losses.append(float(loss.detach()) * sampler.loss_scale())
    return losses


class _OpClock:
    """Records when the first op of each new epoch completes, and fires the sync fault."""

    def __init__(self, kill_at_allreduce: bool) -> None:
        self.first_done: dict[int, float] = {}
        self.arm = False
        self._kill = kill_at_allreduce
        self._epochs: dict[int, int] = {}
        self._n = 0

    def on_start(self, info: Any) -> int:
        self._n += 1
        self._epochs[self._n] = int(info.epoch)
        numel = 1
        for size in info.input_sizes[:1]:
            for d in size:
                numel *= d
        if self._kill and self.arm and info.op == "allreduce" and numel > 1:
            # During the replicate sync: the peers are in the all-reduce, this process dies
            # as it would issue its part. (A timer a few ms later could land after a fast
            # round had committed on a loaded machine, and the kill then hit the next round.)
            os.kill(os.getpid(), signal.SIGKILL)
        return self._n

    def on_finish(self, token: int, state: str) -> None:
        epoch = self._epochs.pop(token, -1)
        if state == "completed" and epoch not in self.first_done:
            self.first_done[epoch] = time.time()


def _await_restart(manager: Any, deadline: float) -> None:
    """A group is missing: wait (until ``deadline``) for its restart to wait to join, so
    it is admitted at the next step's end. Every process leaves together: each round
    takes the max over the group of "ready or out of time", as a process that started
    its step alone would wait for its group-mates in FSDP's collectives and time out."""
    flag = torch.zeros(1)
    while True:
        ready = time.monotonic() >= deadline or manager.layout.joiners_ready(manager.group)
        flag.fill_(float(ready))
        try:
            manager.group.all_reduce(flag, ReduceOp.MAX, timeout=timedelta(seconds=30))
        except Exception:  # noqa: BLE001 - a failure here: the step recovers from it
            return
        if flag.item() > 0:
            return
        time.sleep(0.05)


def _heldout_loss(task: Task, diloco: Any) -> float:
    """The held-out loss of the agreed parameters (DiLoCo's global copies: with fragments
    the local ones differ); a collective over the replica group (FSDP2 gathers)."""
    if diloco is not None and diloco.fragmented is not None:
        diloco.fragmented.start_local()
    return task.heldout_loss()


def _write(out: IO[str], kind: str, **fields: Any) -> None:
    out.write(json.dumps({"kind": kind, "t": time.time(), **fields}, default=str) + "\n")
    out.flush()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="hsdp_trainer")
    parser.add_argument("--records", required=True)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--width", type=int, default=64, help="MLP width, or transformer d_model")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--batch", type=int, default=48)
    parser.add_argument(
        "--fault", action="append", default=[], help="KIND:MEMBER:STEP (backward, sync, stop)"
    )
    parser.add_argument("--deadline-s", type=float, default=120.0)
    parser.add_argument(
        "--diloco", type=int, default=0, help="H: train with DiLoCo, syncing every H steps"
    )
    parser.add_argument("--fragments", type=int, default=1, help="streaming DiLoCo's F")
    parser.add_argument(
        "--transformer", default="", help="train the transformer of this example file instead"
    )
    parser.add_argument("--lr", type=float, default=INNER_LR, help="Adam's (inner) learning rate")
    args = parser.parse_args(argv)

    from torchnext._env import TORCHNEXT_JOIN, TORCHNEXT_MEMBER_ID, TORCHNEXT_WORLD_SIZE
    from torchnext.distributed.group import hooks
    from torchnext.distributed.launch.exits import EXIT_EVICTED
    from torchnext.distributed.training.config import ManagerConfig, ManagerEvent
    from torchnext.distributed.training.hsdp import shard_checksum
    from torchnext.distributed.training.manager import Manager
    from torchnext.distributed.training.replica_groups import ReplicaGroup
    from torchnext.distributed.training.sampler import ElasticSampler, SamplerConfig
    from torchnext.distributed.training.semisync import DiLoCo, SyncConfig

    member = TORCHNEXT_MEMBER_ID.get()
    joiner = TORCHNEXT_JOIN.get()
    full_world = TORCHNEXT_WORLD_SIZE.get()
    faults = [f.split(":") for f in args.fault]
    mine = [(k, int(at)) for k, victim, at in faults if victim == member and not joiner]
    kind, fault_step = mine[0] if mine else ("", -1)
    clock = _OpClock(kill_at_allreduce=kind == "sync")
    hooks.register_observer(clock)
    Path(args.records).mkdir(parents=True, exist_ok=True)
    out = open(Path(args.records) / f"{member}.jsonl", "a", encoding="utf-8")  # noqa: SIM115

    replica = ReplicaGroup.from_env()
    if args.transformer:
        # FSDP2 warns that the head's reshaped logits are a view; nothing changes them.
        warnings.filterwarnings("ignore", message="FSDP2-wrapped module .* returned a view")
        task = transformer_task(
            Path(args.transformer), d_model=args.width, layers=2, heads=4, seq=32, seed=args.seed
        )
    else:
        task = mlp_task(args.width, args.seed)
    model = task.model
    task.shard(replica.mesh)
    opt = torch.optim.Adam(model.parameters(), lr=args.lr)
    sampler = ElasticSampler(
        SamplerConfig(dataset_size=task.dataset_size, global_batch_size=args.batch, seed=args.seed)
    )
    config = ManagerConfig(step_timeout=timedelta(seconds=30))

    def on_event(event: ManagerEvent) -> None:  # what the manager did, for post-mortems
        fields = {"event": event.kind, "epoch": event.epoch, "world": event.world_size}
        _write(out, "event", member=member, step=event.step, detail=event.detail, **fields)

    diloco: DiLoCo | None = None
    if args.diloco:
        sync = SyncConfig(sync_every=args.diloco, fragments=args.fragments)
        diloco = DiLoCo(
            model,
            opt,
            sampler,
            config=sync,
            manager_config=config,
            replica=replica,
            on_event=on_event,
        )
        manager = diloco.manager
    else:
        manager = Manager.from_env(
            model, opt, sampler, config=config, replica=replica, on_event=on_event
        )
    # What every group must hold alike after a committed step: with DiLoCo the global
    # parameters and the outer optimizer (the inner optimizers differ by design).
    agreed_model: torch.nn.Module = model
    if diloco is not None and diloco.fragmented is not None:
        agreed_model = diloco.fragmented.holder
    agreed_opt = opt if diloco is None else diloco.outer_optimizer
    rid, shard = replica.config.replica_id, replica.shard

    if kind == "backward":

        def kill_in_backward(module: Any, grad_in: Any, grad_out: Any) -> None:
            if clock.arm:
                _write(out, "fault", member=member, fault=kind, step=manager.step)
                os.kill(os.getpid(), signal.SIGKILL)

        task.fault_module.register_full_backward_hook(kill_in_backward)

    position: list[tuple[int, int]] = []  # the data slice this step trained on

    def closure(idx: list[int]) -> torch.Tensor:
        position[:] = [manager.layout.data_position(manager.group)]  # the latest attempt's
        if kind == "stop" and clock.arm:
            _write(out, "fault", member=member, fault=kind, step=manager.step)
            os.kill(os.getpid(), signal.SIGSTOP)
        # DiLoCo's inner steps take a mean loss; the manager's step a summed one.
        return task.loss(idx, "mean" if diloco is not None else "sum")

    deadline = time.monotonic() + args.deadline_s
    try:
        while manager.step < args.steps:
            if manager.world_size < full_world:
                _await_restart(manager, deadline)
            clock.arm = manager.step >= fault_step >= 0 and manager.world_size == full_world
            if clock.arm and kind == "sync":
                _write(out, "fault", member=member, fault=kind, step=manager.step)
            result = manager.run_step(closure) if diloco is None else diloco.run_round(closure)
            _write(
                out,
                "step",
                member=member,
                replica=rid,
                shard=shard,
                step=result.step,
                loss=result.loss,
                world=result.world_size,
                crc=shard_checksum(agreed_model, agreed_opt),
                position=position.pop() if position else None,
                epoch=int(manager.group.epoch),
                recovery_s=result.recovery_s,
            )
    except Exception as exc:
        if manager.evicted(exc):
            _write(out, "evicted", member=member, reason=str(exc))
            out.close()
            return EXIT_EVICTED
        raise
    stats = [
        {"bytes": s.total_bytes, "seconds": s.seconds, "mb_per_s": s.mb_per_s}
        for s in manager.heal_stats
    ]
    _write(
        out,
        "final",
        heldout=_heldout_loss(task, diloco),
        member=member,
        replica=rid,
        shard=shard,
        step=manager.step,
        first_op_done={str(k): v for k, v in clock.first_done.items()},
        heals=stats,
    )
    manager.finish()  # its "finished" event is recorded too
    out.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
