"""The training manager with real processes and real faults.

Every test checks the two promises: the run finishes with parameters equal (within fp
tolerance) to a failure-free single-process run over the same global batches, and
all replicas are bit-identical after every committed step.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
import tiny_task
import torch

from torchnext.distributed.sampler import ElasticSampler, SamplerConfig
from torchnext.testing import Fault, MultiProcessHarness, WorkerContext, run_workers

N_SAMPLES, BATCH = 192, 24


def _data() -> tuple[torch.Tensor, torch.Tensor]:
    return tiny_task.data(N_SAMPLES)


def _model(ballast_numel: int = 0, width: int = 32) -> torch.nn.Module:
    model = tiny_task.model(width)
    if ballast_numel:
        # A large buffer makes the healing transfer long enough to be killed mid-way.
        model.register_buffer("ballast", torch.arange(ballast_numel, dtype=torch.float32))
    return model


def _sampler() -> ElasticSampler:
    return ElasticSampler(SamplerConfig(dataset_size=N_SAMPLES, global_batch_size=BATCH, seed=5))


def _loss(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor, idx: list[int]) -> torch.Tensor:
    i = torch.tensor(idx, dtype=torch.int64)
    return torch.nn.functional.cross_entropy(model(x[i]), y[i], reduction="sum")


def _scheduler(opt: torch.optim.Optimizer) -> torch.optim.lr_scheduler.LRScheduler:
    return torch.optim.lr_scheduler.StepLR(opt, step_size=3, gamma=0.5)


CLIP = 0.05  # below the gradient norms of this model, so clipping changes every step


def _reference(steps: int, scheduler: bool = False, clip: bool = False) -> dict[str, torch.Tensor]:
    x, y = _data()
    model = _model()
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    sched = _scheduler(opt) if scheduler else None
    sampler = _sampler()
    for _ in range(steps):
        opt.zero_grad()
        (_loss(model, x, y, sampler.global_batch()) * sampler.loss_scale()).backward()
        if clip:
            torch.nn.utils.clip_grad_norm_(model.parameters(), CLIP)
        opt.step()
        sampler.commit()
        if sched is not None:
            sched.step()
    return {k: v.clone() for k, v in model.state_dict().items()}


def _train(ctx: WorkerContext, cfg: dict[str, Any]) -> dict[str, Any]:
    from torchnext.distributed import FaultTolerantGroup
    from torchnext.distributed.manager import Manager, ManagerConfig, ManagerEvent

    joining = ctx.rank >= cfg["world"]
    # A replacement starts once the survivors evicted the victim, then joins and heals.
    group = (
        tiny_task.join_after_eviction(ctx, cfg["replaces"])
        if joining
        else FaultTolerantGroup.from_env()
    )
    x, y = _data()
    model = _model(cfg.get("ballast", 0), cfg.get("joiner_width", 32) if joining else 32)
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    crcs: dict[int, int] = {}
    draws: dict[int, list[float]] = {}
    timings: dict[int, tuple[float, float, float, float]] = {}
    state: dict[str, Any] = {}
    sched = _scheduler(opt) if cfg.get("scheduler") else None
    if sched is not None:
        state["lr"] = sched
    if ctx.rank == cfg.get("extra_entry_rank", -1):
        state["extra_counter"] = _scheduler(torch.optim.SGD([torch.zeros(1)], lr=1.0))
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**10) if cfg.get("amp") else None
    if scaler is not None:
        state["scaler"] = scaler

    def optimizer_step() -> None:
        # The user's own step: unscale, clip the summed gradients, step through the scaler.
        if scaler is not None:
            scaler.unscale_(opt)
        torch.nn.utils.clip_grad_norm_(model.parameters(), CLIP)
        if scaler is not None:
            scaler.step(opt)
            scaler.update()
        else:
            opt.step()

    def on_event(e: ManagerEvent) -> None:
        ctx.checkpoint(f"event:{e.kind}")

    sampler = _sampler()
    loader = None
    if cfg.get("loader"):
        data = torch.utils.data.TensorDataset(x, y, torch.arange(N_SAMPLES))
        loader = torch.utils.data.DataLoader(
            data, batch_sampler=sampler, num_workers=2, prefetch_factor=2
        )
    fed: dict[int, tuple[int, int, list[int]]] = {}
    manager = Manager(
        group,
        model,
        opt,
        sampler,
        config=ManagerConfig(
            check_replicas=cfg.get("check_replicas", True),
            step_timeout=timedelta(seconds=20),
            bucket_cap_bytes=512,
        ),
        joining=joining,
        on_event=on_event,
        state=state,
        optimizer_step=optimizer_step if cfg.get("clip") else None,
    )
    if ctx.rank == cfg.get("lost_vote_rank", -1):
        _lose_the_vote_at(manager, step=cfg["lost_vote_step"])
    reduction = cfg.get("loss_reduction", "sum")
    while manager.step < cfg["steps"]:
        ctx.checkpoint(f"step:{manager.step}")

        def closure(idx: list[int]) -> torch.Tensor:
            # One draw per attempt: an aborted step is redone from the same random state.
            draws.setdefault(manager.step, []).append(float(torch.rand(())))
            ctx.checkpoint(f"forward:{manager.step}")
            loss = _loss(model, x, y, idx) / (len(idx) if reduction == "mean" else 1)
            return scaler.scale(loss) if scaler is not None else loss

        def batch_closure(batch: list[torch.Tensor]) -> torch.Tensor:
            xb, yb, ids = batch
            fed[manager.step] = (manager.rank, manager.world_size, ids.tolist())
            ctx.checkpoint(f"forward:{manager.step}")
            return torch.nn.functional.cross_entropy(model(xb), yb, reduction="sum")

        if loader is not None:
            result = manager.run_step(batch_closure, batches=loader)
        else:
            result = manager.run_step(
                closure, micro_batches=cfg.get("micro_batches", 1), loss_reduction=reduction
            )
        if sched is not None:
            sched.step()
        if ctx.rank == cfg.get("diverge_rank", -1) and result.step == 3:
            opt.param_groups[0]["lr"] *= 0.5  # a change on one member only
        crcs[result.step] = manager.checksum()
        timings[result.step] = (
            result.compute_s,
            result.allreduce_s,
            result.commit_s,
            result.recovery_s,
        )
    manager.finish()
    # numpy, not tensors: torch would pass tensors through shared memory, which the
    # harness's pipe cannot hand over once this process has exited.
    state = {k: v.detach().numpy().copy() for k, v in model.state_dict().items() if k != "ballast"}
    out = {
        "member": manager.member_id,
        "crcs": crcs,
        "state": state,
        "mismatches": manager.replica_mismatches,
        "checks": manager.replica_checks,
        "redone": manager.steps_redone,
        "healed": len(manager.heal_stats),
        "world": manager.world_size,
        "draws": draws,
        "fed": {s: f for s, f in fed.items() if s < manager.step},
        "lr": opt.param_groups[0]["lr"],
        "timings": timings,
    }
    group.shutdown()
    return out


def _lose_the_vote_at(manager: Any, *, step: int) -> None:
    """Make this member's last all-reduce of ``step`` (the loss's: the collective vote)
    complete, then fail: the others commit the step and this member does not."""
    from torchnext.errors import CommError

    group, real = manager.group, manager.group.all_reduce
    fired = []

    def all_reduce(tensor: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        out = real(tensor, *args, **kwargs)
        is_vote = tensor.dtype == torch.float64 and tensor.numel() == 2
        if is_vote and manager.step == step and not fired:
            fired.append(step)
            raise CommError("injected: the vote's all-reduce completed, then this member failed")
        return out

    group.all_reduce = all_reduce


def _check(
    values: list[dict[str, Any]], steps: int, scheduler: bool = False, clip: bool = False
) -> None:
    assert values, "no worker returned"
    reference = _reference(steps, scheduler, clip)
    for v in values:
        assert v["mismatches"] == 0, f"{v['member']} saw replicas differ"
        for k, ref in reference.items():
            torch.testing.assert_close(torch.from_numpy(v["state"][k]), ref, rtol=1e-4, atol=1e-5)
    # Bit-identical replicas after every committed step that several members saw.
    by_step: dict[int, set[int]] = {}
    for v in values:
        for step, crc in v["crcs"].items():
            by_step.setdefault(step, set()).add(crc)
    assert all(len(c) == 1 for c in by_step.values()), {
        s: c for s, c in by_step.items() if len(c) > 1
    }
    first = values[0]["state"]
    for v in values[1:]:
        for k in first:
            assert (v["state"][k] == first[k]).all()


def _run(
    world: int,
    steps: int,
    faults: list[Fault],
    *,
    replace: str = "",
    ballast: int = 0,
    joiner_width: int = 0,
    **options: Any,
) -> Any:
    cfg: dict[str, Any] = {"world": world, "steps": steps, "replaces": replace, "ballast": ballast}
    cfg.update(options)
    if joiner_width:
        cfg["joiner_width"] = joiner_width
    # A 3 s heartbeat timeout: on a loaded 2-core test machine, the 1 s default can
    # suspect a live but descheduled member, which would make these tests flaky.
    env = {"TORCHNEXT_HEARTBEAT_TIMEOUT": "3"}
    with MultiProcessHarness(world, faults=faults, env=env) as h:
        h.start(_train, cfg)
        if replace or joiner_width:
            h.spawn(_train, cfg)
        result = h.join(timedelta(seconds=90))
    return result


def test_failure_free_run_matches_reference() -> None:
    result = _run(3, 12, [])
    result.raise_if_failed()
    values = result.values()
    _check(values, 12)
    assert all(v["checks"] == 12 and v["redone"] == 0 for v in values)


def test_kill_during_forward_is_redone_on_survivors() -> None:
    result = _run(3, 14, [Fault(rank=1, at="forward:5", kind="kill")])
    assert result[1].outcome == "killed", result.describe()
    result.raise_if_failed([0, 2])
    values = [result[0].value, result[2].value]
    _check(values, 14)
    assert all(v["redone"] >= 1 and v["world"] == 2 for v in values)
    for v in values:  # the aborted step 5 was redone from the random state it began with
        assert len(v["draws"][5]) >= 2 and len(set(v["draws"][5])) == 1, v["draws"][5]
        assert all(len(d) == 1 for s, d in v["draws"].items() if s != 5)
        # Step 6 (the redone step 5, committed) waited for the shrink; steps 2-5 did not
        # (step 1 includes the first synchronisation).
        timings = v["timings"]
        assert timings[6][3] > 0 and all(timings[s][3] == 0 for s in (2, 3, 4, 5)), timings
        assert all(t[0] > 0 and t[1] >= 0 and t[2] > 0 for t in timings.values()), timings


def test_a_member_left_behind_by_the_collective_vote_heals_from_one_ahead() -> None:
    # Member 1's vote (the loss all-reduce) of step 4 completes everywhere but fails on
    # member 1 afterwards: members 0 and 2 commit step 4, member 1 aborts it. At the
    # next agreement member 1 is one step behind and heals from a member ahead.
    result = _run(3, 10, [], check_replicas=False, lost_vote_rank=1, lost_vote_step=4)
    result.raise_if_failed()
    values = result.values()
    _check(values, 10)
    assert [v["healed"] for v in values] == [0, 1, 0], [v["healed"] for v in values]
    assert values[1]["redone"] == 1 and all(v["world"] == 3 for v in values)
    assert 5 not in values[1]["crcs"] and 5 in values[0]["crcs"]


def test_registered_lr_scheduler_heals_into_the_replacement() -> None:
    faults = [Fault(rank=1, at="step:4", kind="kill")]
    result = _run(3, 12, faults, replace="w1", scheduler=True)
    assert result[1].outcome == "killed", result.describe()
    result.raise_if_failed([0, 2, 3])
    values = [result[r].value for r in (0, 2, 3)]
    _check(values, 12, scheduler=True)  # replica check on: identical optimizer and lr
    assert result[3].value["healed"] == 1
    assert len({v["lr"] for v in values}) == 1 and values[0]["lr"] == pytest.approx(1e-2 / 16)
    # The replacement's random state came with the heal: its draws continue the others'.
    joined = result[3].value["draws"]
    assert all(set(joined[s]) == {result[0].value["draws"][s][-1]} for s in joined)


def test_a_change_on_one_member_stops_the_job_naming_the_entry() -> None:
    result = _run(3, 8, [], diverge_rank=2)
    for r in range(3):  # every member raised the same error; nothing was committed
        assert result[r].outcome == "raised", result.describe()
        assert result[r].error_type.endswith("ReplicaDivergenceError"), result.describe()
        assert "'optimizer' differs on w2" in result[r].message
        assert "before committing step 4" in result[r].message


def test_members_that_register_different_entries_fail_before_the_first_step() -> None:
    result = _run(2, 4, [], extra_entry_rank=1)
    for r in range(2):
        assert result[r].outcome == "raised", result.describe()
        assert result[r].error_type.endswith("TrainingStateError"), result.describe()
        assert "w1: ['extra_counter']" in result[r].message and "w0: nothing" in result[r].message


def test_kill_of_rank_zero_during_gradient_allreduce() -> None:
    # allreduce op 20 is inside a backward pass a few steps in (several buckets per step).
    result = _run(3, 14, [Fault(rank=0, at="allreduce:20:during", kind="kill")])
    assert result[0].outcome == "killed"
    result.raise_if_failed([1, 2])
    _check([result[1].value, result[2].value], 14)


@pytest.mark.slow
def test_stopped_member_is_evicted_and_replaced() -> None:
    result = _run(3, 30, [Fault(rank=2, at="step:4", kind="stop")], replace="w2")
    assert result[2].outcome == "stopped"
    result.raise_if_failed([0, 1, 3])
    _check([result[0].value, result[1].value, result[3].value], 30)


@pytest.mark.slow
@pytest.mark.parametrize("victim", ["healer", "joiner"])
def test_kill_during_healing(victim: str) -> None:
    # w1 dies at step 3; the replacement w3 joins; then either the healer (group rank 0,
    # harness rank 0) or the joiner is killed while the state is on the wire.
    at = "event:serving_heal" if victim == "healer" else "event:healing"
    rank = 0 if victim == "healer" else 3
    faults = [
        Fault(rank=1, at="step:3", kind="kill"),
        Fault(rank=rank, at=at, kind="kill", delay=timedelta(milliseconds=15)),
    ]
    result = _run(3, 24, faults, replace="w1", ballast=8_000_000)
    assert result[rank].outcome == "killed"
    survivors = [r for r in (0, 2, 3) if r != rank]
    result.raise_if_failed(survivors)
    _check([result[r].value for r in survivors], 24)
    if victim == "healer":
        # The joiner lost its healer mid-transfer, then healed from the other survivor.
        assert result[3].value["healed"] == 1 and result[3].value["world"] == 2


def test_joiner_with_a_different_model_is_refused_and_the_job_goes_on() -> None:
    result = _run(2, 40, [], joiner_width=48)
    assert result[2].outcome == "raised"
    assert result[2].error_type.endswith("HealingRefusedError")
    assert "differs from the group's" in result[2].message and "0.weight" in result[2].message
    result.raise_if_failed([0, 1])
    values = [result[0].value, result[1].value]
    _check(values, 40)
    assert all(v["world"] == 2 for v in values)


def test_joiner_with_other_registered_entries_is_refused_and_the_job_goes_on() -> None:
    result = _run(2, 30, [], joiner_width=32, extra_entry_rank=2)
    assert result[2].outcome == "raised", result.describe()
    assert result[2].error_type.endswith("HealingRefusedError")
    assert "joiner 'w2' registered 'extra_counter', which the group does not have" in (
        result[2].message
    )
    result.raise_if_failed([0, 1])
    _check([result[0].value, result[1].value], 30)


def test_own_optimizer_step_with_clipping_amp_scaler_accumulation_and_mean_loss() -> None:
    # Mean losses over 3 micro-batches, scaled by a GradScaler, clipped after the
    # all-reduce: the same trajectory as one process clipping the global-batch mean.
    options = {"clip": True, "amp": True, "micro_batches": 3, "loss_reduction": "mean"}
    result = _run(3, 10, [Fault(rank=1, at="forward:4", kind="kill")], **options)
    assert result[1].outcome == "killed", result.describe()
    result.raise_if_failed([0, 2])
    _check([result[0].value, result[2].value], 10, clip=True)


def _bad_steps(ctx: WorkerContext) -> dict[str, str]:
    from torchnext.distributed import FaultTolerantGroup
    from torchnext.distributed.manager import Manager

    x, y = _data()
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    sampler = _sampler()
    manager = Manager(FaultTolerantGroup.from_env(), model, opt, sampler)
    seen: dict[str, str] = {}
    data = torch.utils.data.TensorDataset(x, y)
    plain_loader = torch.utils.data.DataLoader(data, batch_size=4)
    loader = torch.utils.data.DataLoader(data, batch_sampler=sampler)
    attempts = {
        "vector": lambda: manager.run_step(lambda idx: model(x[idx]).sum(dim=1)),
        "micro": lambda: manager.run_step(lambda idx: _loss(model, x, y, idx), micro_batches=0),
        "reduction": lambda: manager.run_step(
            lambda idx: _loss(model, x, y, idx), loss_reduction="avg"
        ),
        "loader_wrong": lambda: manager.run_step(lambda b: b[0].sum(), batches=plain_loader),
        "loader_micro": lambda: manager.run_step(
            lambda b: b[0].sum(), batches=loader, micro_batches=2
        ),
        "raising_step": lambda: manager.run_step(
            lambda idx: _loss(model, x, y, idx), optimizer_step=lambda: 1 / 0
        ),
    }
    for name, attempt in attempts.items():
        try:
            attempt()
        except Exception as exc:  # noqa: BLE001 - the message is what the test reads
            seen[name] = f"{type(exc).__name__}: {exc}"
        manager.optimizer.zero_grad()
    try:
        Manager(manager.group, model, opt, _sampler(), optimizer_step="opt.step")  # type: ignore[arg-type]
    except TypeError as exc:
        seen["not_callable"] = str(exc)
    manager.finish()
    manager.group.shutdown()
    return seen


def test_bad_step_arguments_and_a_raising_optimizer_step_are_named() -> None:
    result = run_workers(_bad_steps, world_size=1, timeout=timedelta(seconds=60))
    result.raise_if_failed()
    seen = result[0].value
    assert seen["vector"].startswith("TypeError: run_step: the closure returned Tensor(24,)")
    assert "micro_batches=0 must be an int >= 1" in seen["micro"]
    assert "loss_reduction='avg'" in seen["reduction"]
    assert seen["raising_step"].startswith("OptimizerStepError: optimizer_step=")
    assert "ZeroDivisionError" in seen["raising_step"] and "at step 1" in seen["raising_step"]
    assert "optimizer_step='opt.step'" in seen["not_callable"]
    assert "batch_sampler is BatchSampler, not the manager's ElasticSampler" in seen["loader_wrong"]
    assert "a loader's batch cannot be split" in seen["loader_micro"]


def test_dataloader_workers_feed_the_steps_and_refill_after_a_shrink() -> None:
    # Two loader workers prefetch shares split for 3 members; a member dies, and the
    # survivors' prefetched shares are wrong for 2: they are loaded again, re-split.
    result = _run(3, 14, [Fault(rank=1, at="forward:5", kind="kill")], loader=True)
    assert result[1].outcome == "killed", result.describe()
    result.raise_if_failed([0, 2])
    values = [result[0].value, result[2].value]
    _check(values, 14)  # the same trajectory as index mode and the reference
    reference = _sampler()
    for step in range(14):
        for v in values:  # each committed step trained on exactly its share, no more
            rank, world, ids = v["fed"][step]
            assert ids == reference.indices(rank, world), (v["member"], step)
        if step >= 6:  # after the shrink the survivors' shares cover the global batch
            covered = sorted(i for v in values for i in v["fed"][step][2])
            assert covered == sorted(reference.global_batch()), step
        reference.commit()
