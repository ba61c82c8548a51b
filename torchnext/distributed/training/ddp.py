"""A DDP-shaped front for the training manager: a plain DDP loop, fault tolerant.

Use it when you have a ``DistributedDataParallel`` loop and want it to survive members
dying, with as few changed lines as possible (``examples/ddp_plain.py`` and
``examples/ddp_fault_tolerant.py`` differ in ten lines of code): no
``init_process_group`` or ``destroy_process_group``; ``DDP(net)`` becomes
``FaultTolerantDDP(net)``; the ``DistributedSampler`` becomes an
:class:`~torchnext.distributed.ElasticSampler` given to the ``DataLoader`` as its
``batch_sampler``; the loop iterates :meth:`FaultTolerantDDP.steps`; and
``loss.backward()`` becomes ``model.backward(loss)``::

    model = FaultTolerantDDP(net)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=steps)
    sampler = ElasticSampler(SamplerConfig(dataset_size=len(data), global_batch_size=64))
    loader = DataLoader(data, batch_sampler=sampler)
    for step, (x, y) in model.steps(loader, opt, steps, state={"lr": sched}):
        opt.zero_grad()
        loss = F.cross_entropy(model(x), y)
        model.backward(loss)
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()

Equivalent Python for one yielded batch (a step is yielded until it commits)::

    idx = manager.start_step()                  # shrink, grow, heal as needed
    batch = the loader's batch of this member's share of the step
    snapshot = registered entries' state        # sched, scaler, ...
    yield manager.step + 1, batch               # the body runs forward
    # model.backward(loss):
    (loss * share_weight).backward()            # gradients all-reduce during backward
    committed = manager.finish_step(...).committed   # every member voted
    if not committed:
        grads = None                            # opt.step() in the body is a no-op
    # the body runs clip, opt.step(), sched.step(); then, before the redo:
    if not committed:
        registered entries <- snapshot          # sched.step() of the attempt is undone
    # after the last step: manager.finish()

So after ``model.backward(loss)`` returns, ``p.grad`` holds the global batch's mean
gradient, as after DDP's backward, and every member has already agreed to commit the
step: clipping, ``opt.step()`` and ``sched.step()`` run as in the DDP loop.

What not to assume: the body of an aborted attempt still runs to its end; its
optimizer step finds no gradients (a no-op for torch's optimizers) and the registered
entries (``state=``) are put back before the step is redone, but anything else the
body changes (a plain counter, a log line) happens twice: test the value
``model.backward`` returns (``False``: the step will be redone) and ``continue``, or
register the object. A ``GradScaler`` needs that test (``scaler.step`` refuses an
optimizer without gradients). Registered entries are copied at every step's start.
The loss is this member's mean over its batch (``loss_reduction="mean"``, DDP's
convention; ``"sum"`` for a sum); the manager weights it so the gradient is the mean
over the global batch, whatever the split. Every member must get at least one sample
per step. Buffers the forward changes (BatchNorm's running statistics) are not rolled
back. Gradient accumulation is :meth:`Manager.run_step`'s ``micro_batches``.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterator, Mapping
from datetime import timedelta
from typing import Any

import torch
from torch.utils.data import DataLoader

from torchnext.distributed.group.fault_tolerant_group import FaultTolerantGroup
from torchnext.distributed.training.config import ManagerConfig, ManagerEvent, StepResult
from torchnext.distributed.training.loader import LoaderFeed
from torchnext.distributed.training.manager import Manager
from torchnext.distributed.training.sampler import ElasticSampler
from torchnext.distributed.training.state import Stateful
from torchnext.distributed.training.step import LOSS_REDUCTIONS
from torchnext.errors import TrainingStateError

__all__ = ["FaultTolerantDDP"]


def _applied_in_the_loop() -> None:
    """The optimizer step of a committed step runs in the user's loop, after backward."""


class FaultTolerantDDP(torch.nn.Module):
    """Wraps a model like ``DistributedDataParallel`` (see the module docstring).

    ``group`` is the fault-tolerant group to train in (default: the one ``torchnext
    run`` describes in the environment, created or joined by :meth:`Manager.from_env`);
    ``joining`` says that ``group`` was joined as a replacement. ``config`` and
    ``on_event`` go to the :class:`Manager`.
    """

    def __init__(
        self,
        module: torch.nn.Module,
        *,
        group: FaultTolerantGroup | None = None,
        joining: bool = False,
        config: ManagerConfig | None = None,
        on_event: Callable[[ManagerEvent], None] | None = None,
        join_timeout: timedelta = timedelta(seconds=120),
    ) -> None:
        if not isinstance(module, torch.nn.Module):
            raise TypeError(
                f"FaultTolerantDDP(module={type(module).__name__}): give the torch.nn.Module "
                "to train, as to DistributedDataParallel."
            )
        super().__init__()
        self.module = module
        self._group = group
        self._joining = joining
        self._config = config
        self._on_event = on_event
        self._join_timeout = join_timeout
        self.manager: Manager | None = None
        """The training manager, created by the first :meth:`steps`."""
        self.last_result: StepResult | None = None
        """What the last :meth:`backward` decided."""
        self._pending: tuple[int, float] | None = None  # (share, loss weight) of the open step

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        return self.module(*args, **kwargs)

    # ------------------------------------------------------------------ the loop

    def steps(
        self,
        loader: DataLoader[Any],
        optimizer: torch.optim.Optimizer,
        total_steps: int,
        *,
        state: Mapping[str, Stateful] | None = None,
        loss_reduction: str = "mean",
        finish: bool = True,
    ) -> Iterator[tuple[int, Any]]:
        """Yield ``(step, batch)`` until ``total_steps`` steps committed.

        ``step`` counts from 1 and ``batch`` is this member's share of that step. A step
        that did not commit (a member died) is yielded again, with the same number, on
        the new membership and with the same global batch. ``state`` registers more
        entries (schedulers, a ``GradScaler``, EMA) that heal, checkpoint and roll back
        with the model; ``loss_reduction`` says whether the loss given to
        :meth:`backward` is the mean (DDP's convention) or the sum over this member's
        batch. With ``finish`` (the default) the job is marked finished after the last
        step (:meth:`Manager.finish`); give False to call ``steps`` again later.
        """
        sampler = self._check_steps_args(loader, optimizer, total_steps, loss_reduction)
        manager = self._start(optimizer, sampler, state)
        feed = LoaderFeed(loader, sampler)
        try:
            while manager.step < total_steps:
                indices = manager.start_step()
                if not indices:
                    raise ValueError(
                        f"FaultTolerantDDP.steps: member {manager.rank} of "
                        f"{manager.world_size} got no sample in step {manager.step + 1} "
                        f"(global_batch_size={sampler.config.global_batch_size}); every member "
                        "must run the loop body each step. Use a global batch of at least one "
                        "sample per member, or Manager.run_step, which allows empty shares."
                    )
                batch = feed.batch(manager.rank, manager.world_size, empty=False)
                snapshot = copy.deepcopy(manager.training_state.entries_state_dict())
                weight = sampler.loss_scale() * (len(indices) if loss_reduction == "mean" else 1)
                self._pending = (len(indices), weight)
                yield manager.step + 1, batch
                if self._pending is not None:
                    self._pending = None
                    raise RuntimeError(
                        "FaultTolerantDDP.steps: the loop body did not call model.backward(loss) "
                        f"in step {manager.step + 1}; call it instead of loss.backward() once "
                        "per step, so the gradients are all-reduced and the step committed."
                    )
                if self.last_result is not None and not self.last_result.committed:
                    manager.training_state.load_entries_state_dict(snapshot)
        finally:
            feed.close()
        if finish:
            manager.finish()

    def backward(self, loss: torch.Tensor) -> bool:
        """``loss.backward()``, the gradient all-reduce and the commit vote.

        Returns True when every member finished the step, so the body goes on to the
        optimizer step; False when it was aborted and will be yielded again (the
        gradients are then None, and the body may ``continue``).
        """
        manager = self.manager
        if manager is None or self._pending is None:
            raise RuntimeError(
                "FaultTolerantDDP.backward: call it once per batch inside "
                "`for batch in model.steps(loader, optimizer, total_steps)`."
            )
        if not isinstance(loss, torch.Tensor) or loss.dim() != 0:
            shape = tuple(loss.shape) if isinstance(loss, torch.Tensor) else ""
            raise TypeError(
                f"FaultTolerantDDP.backward(loss={type(loss).__name__}{shape}): give the loss "
                "of this member's batch as a 0-dim tensor (its mean, or its sum with "
                "steps(..., loss_reduction='sum'))."
            )
        _, weight = self._pending
        self._pending = None
        with manager.interruptible():  # a failure noticed mid-backward cuts it short
            (loss * weight).backward()
        result = manager.finish_step(
            float(loss.detach()) * weight, optimizer_step=_applied_in_the_loop
        )
        self.last_result = result
        return result.committed

    @property
    def rank(self) -> int:
        """This member's rank in the current membership (it changes when members go)."""
        return self._manager("rank").rank

    @property
    def world_size(self) -> int:
        """The number of members training now."""
        return self._manager("world_size").world_size

    @property
    def step(self) -> int:
        """Committed steps so far."""
        return self._manager("step").step

    def _manager(self, what: str) -> Manager:
        if self.manager is None:
            raise RuntimeError(
                f"FaultTolerantDDP.{what}: not known before the first step; read it inside "
                "`for step, batch in model.steps(loader, optimizer, total_steps)`."
            )
        return self.manager

    # ------------------------------------------------------------------ set-up

    def _check_steps_args(
        self,
        loader: DataLoader[Any],
        optimizer: torch.optim.Optimizer,
        total_steps: int,
        loss_reduction: str,
    ) -> ElasticSampler:
        if not isinstance(loader, DataLoader) or not isinstance(
            loader.batch_sampler, ElasticSampler
        ):
            raise TypeError(
                f"FaultTolerantDDP.steps(loader={type(loader).__name__}): give a DataLoader "
                "built as DataLoader(dataset, batch_sampler=ElasticSampler(...), ...), which "
                "re-splits each step's global batch when members come and go."
            )
        if not isinstance(optimizer, torch.optim.Optimizer):
            raise TypeError(
                f"FaultTolerantDDP.steps(optimizer={type(optimizer).__name__}): give the "
                "torch.optim.Optimizer over model.parameters()."
            )
        if not isinstance(total_steps, int) or isinstance(total_steps, bool) or total_steps < 0:
            raise ValueError(
                f"FaultTolerantDDP.steps(total_steps={total_steps!r}): give the number of "
                "steps to train, an int >= 0 (committed steps; a resumed run counts on)."
            )
        if loss_reduction not in LOSS_REDUCTIONS:
            raise ValueError(
                f"FaultTolerantDDP.steps(loss_reduction={loss_reduction!r}): give 'mean' "
                "(the loss is the mean over this member's batch) or 'sum'."
            )
        return loader.batch_sampler

    def _start(
        self,
        optimizer: torch.optim.Optimizer,
        sampler: ElasticSampler,
        state: Mapping[str, Stateful] | None,
    ) -> Manager:
        if self.manager is not None:
            if self.manager.optimizer is not optimizer or self.manager.sampler is not sampler:
                raise TrainingStateError(
                    "FaultTolerantDDP.steps: called again with another optimizer or loader "
                    "sampler; a member trains one model with one optimizer and one sampler."
                )
            return self.manager
        owned = {id(p) for p in self.module.parameters()}
        foreign = [
            i
            for i, g in enumerate(optimizer.param_groups)
            if any(id(p) not in owned for p in g["params"])
        ]
        if foreign:
            raise ValueError(
                f"FaultTolerantDDP.steps(optimizer=...): param_groups {foreign} hold tensors "
                "that are not this model's parameters; build the optimizer over "
                "model.parameters()."
            )
        kwargs: dict[str, Any] = {
            "config": self._config,
            "on_event": self._on_event,
            "state": state,
            "optimizer_step": _applied_in_the_loop,
        }
        if self._group is None:
            self.manager = Manager.from_env(
                self.module, optimizer, sampler, join_timeout=self._join_timeout, **kwargs
            )
        else:
            self.manager = Manager(
                self._group, self.module, optimizer, sampler, joining=self._joining, **kwargs
            )
        return self.manager
