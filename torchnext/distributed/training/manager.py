"""Fault-tolerant data-parallel training that heals in place: the training :class:`Manager`.

Use it when a training job must keep going while members die and take replacements
back without a restart. Each member (one process) holds a full replica of the model
(with ``from_env(..., replica=ReplicaGroup.from_env())`` a replica is instead a group of
processes sharding it with FSDP2, and the replica shape is a :mod:`.layout`: :mod:`.hsdp`);
the manager wraps a :class:`~torchnext.distributed.FaultTolerantGroup`, the model, the
optimizer and an :class:`~torchnext.distributed.sampler.ElasticSampler`, and runs every
step as a small replicated state machine (learned from torchft's Manager, but with a
*member* rather than a replica group as the unit of failure)::

    manager = Manager.from_env(model, optimizer, sampler)   # under `torchnext run`
    while manager.step < total_steps:
        # the closure returns the loss *summed* over this member's samples
        result = manager.run_step(
            lambda idx: F.cross_entropy(model(x[idx]), y[idx], reduction="sum")
        )
    manager.finish()

Per step:

1. *Quorum*: if the last step failed or joiners were admitted, the members agree on a
   membership (``agree`` + ``shrink``, or ``grow``), compare their committed step
   counts, and anyone behind (a joiner) receives model, optimizer, data position, RNG
   state, step and every registered entry (an LR scheduler, a GradScaler, EMA weights:
   :mod:`.state`) from a live peer over the network (:mod:`.healing`); the others go
   on and wait at most for that transfer, in the step's first collective.
2. Forward and backward on this member's share of the step's global batch; gradients
   are summed in buckets whose all-reduce starts during backward (:mod:`.bucketing`).
3. *Commit*: the step is applied (optimizer step, data cursor advanced, ``step += 1``)
   only if every member of the membership finished it. The step's last all-reduce (of
   the loss) is the vote: a member whose all-reduce completed knows that every member
   finished backward, and commits, with no store round trip on the step's path
   (``ManagerConfig.commit_vote="store"`` votes through the store instead:
   :mod:`.commit`). A member whose all-reduce failed discards the step, rolls its
   random number generators back to the step's start, and redoes it on the new
   membership with the same global batch; a survivor that committed the step while
   another did not (a failure inside that last all-reduce) is ahead by one step at the
   next agreement, which heals the ones behind from it. So replicas never diverge and
   the trajectory (dropout included) equals a failure-free run's up to floating-point
   summation order. With
   ``ManagerConfig.check_replicas`` the replicated state is compared before the vote
   and a difference stops the job with :class:`~torchnext.errors.ReplicaDivergenceError`
   naming the entry (:mod:`.replica_check`).

What not to assume: ``run_step`` scales the closure's loss (a sum, or a mean with
``loss_reduction="mean"``) so the all-reduced gradient is the global batch's mean;
with ``start_step``/``finish_step`` you scale it yourself by ``sampler.loss_scale()``.
The manager calls ``zero_grad()`` at each step's start and applies a committed step
with ``optimizer_step`` (default ``optimizer.step``; give your own for clipping or a
``GradScaler``), only after every member voted to commit it; a process whose group evicted
it (it hung) gets :class:`~torchnext.errors.StaleEpochError` and should exit with
:data:`~torchnext.distributed.launch.exits.EXIT_EVICTED` so the agent replaces it.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator, Mapping
from datetime import timedelta
from typing import TYPE_CHECKING, Any

import torch
from torch.utils.data import DataLoader

from torchnext.distributed.group.fault_tolerant_group import FaultTolerantGroup
from torchnext.distributed.launch.keys import FINISHED_KEY
from torchnext.distributed.training.commit import CommitVote, Decision
from torchnext.distributed.training.config import ManagerConfig, ManagerEvent, StepResult
from torchnext.distributed.training.events import EventReporter
from torchnext.distributed.training.heal_exchange import HealExchange
from torchnext.distributed.training.healing import TransferStats, rng_state, set_rng_state
from torchnext.distributed.training.layout import DDPLayout, ReplicaLayout
from torchnext.distributed.training.loader import LoaderFeed
from torchnext.distributed.training.membership_change import admit_joiners, shrink_to_survivors
from torchnext.distributed.training.replica_check import check_replicas
from torchnext.distributed.training.sampler import ElasticSampler
from torchnext.distributed.training.state import Stateful, TrainingState, fingerprint
from torchnext.distributed.training.step import check_step_args, compute
from torchnext.errors import (
    CommError,
    CommTimeoutError,
    HealingRefusedError,
    OptimizerStepError,
    ReplicaDivergenceError,
    StaleEpochError,
    StoreLostError,
    TrainingStateError,
)

if TYPE_CHECKING:
    from torchnext.distributed.training.replica_groups import ReplicaGroup

__all__ = ["ManagerConfig", "ManagerEvent", "StepResult", "Manager"]


class Manager:
    """Runs fault-tolerant data-parallel steps on one member (see the module docstring)."""

    def __init__(
        self,
        group: FaultTolerantGroup,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer,
        sampler: ElasticSampler,
        *,
        config: ManagerConfig | None = None,
        joining: bool = False,
        on_event: Callable[[ManagerEvent], None] | None = None,
        state: Mapping[str, Stateful] | None = None,
        optimizer_step: Callable[[], object] | None = None,
        layout: ReplicaLayout | None = None,
    ) -> None:
        if optimizer_step is not None and not callable(optimizer_step):
            raise TypeError(
                f"Manager(optimizer_step={optimizer_step!r}): give a function of no arguments "
                "that applies the step, e.g. lambda: (clip_grad_norm_(params, 1.0), opt.step())."
            )
        self.group = group
        self.model = model
        self.optimizer = optimizer
        self.sampler = sampler
        self.optimizer_step: Callable[[], object] = optimizer_step or optimizer.step
        """What applies a committed step (default ``optimizer.step``)."""
        self.training_state = TrainingState(model, optimizer, sampler, state)
        """Model, optimizer, sampler and the registered entries (see :meth:`register`)."""
        self.config = config or ManagerConfig()
        self.on_event = on_event
        self.step = -1 if joining else 0
        self.steps_redone = 0
        self.recoveries = 0
        self.replica_mismatches = 0
        self.replica_checks = 0
        self.heal_stats: list[TransferStats] = []
        self._vote = CommitVote(group.store)
        self.layout: ReplicaLayout = layout or DDPLayout()
        """Replica shape: a member per replica (default) or replica groups (:mod:`.hsdp`)."""
        self._bucketer = self.layout.gradient_reducer(
            model,
            self._all_reduce_async,
            bucket_cap_bytes=self.config.bucket_cap_bytes,
            failed=lambda: self.group.is_revoked,
        )
        self._needs_recovery = ""
        self._needs_sync = True
        self.heals = HealExchange(
            group,
            heal_host=self.config.heal_host,
            timeout=self.config.heal_timeout,
            emit=self.emit_event,
        )
        self._events = EventReporter(group, on_event, publish_events=self.config.publish_events)
        self._compute_t0 = self._recovery_s = 0.0
        self._started = False
        self._feed: LoaderFeed | None = None
        self._step_rng: dict[str, Any] | None = None
        group.add_revoke_callback(self._on_revoke)

    def register(self, name: str, obj: Stateful, *, replicated: bool = True) -> None:
        """Heal, checkpoint and check ``obj`` (anything with ``state_dict``/``load_state_dict``).

        Call it before the first step, with the same names on every member. With
        ``replicated=False`` the entry (a per-member counter, say) is carried to a
        replacement from its healer but left out of the replica check.
        """
        if self._started:
            raise TrainingStateError(
                f"register({name!r}) after the first step: a replacement would heal without "
                "it. Register every entry before the first start_step()/run_step()."
            )
        self.training_state.register(name, obj, replicated=replicated)

    # ------------------------------------------------------------------ construction

    @classmethod
    def from_env(
        cls,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer,
        sampler: ElasticSampler,
        *,
        config: ManagerConfig | None = None,
        on_event: Callable[[ManagerEvent], None] | None = None,
        join_timeout: timedelta = timedelta(seconds=120),
        state: Mapping[str, Stateful] | None = None,
        optimizer_step: Callable[[], object] | None = None,
        replica: ReplicaGroup | None = None,
    ) -> Manager:
        """Create or join the group the launcher described in the environment.

        A replacement started by ``torchnext run`` (``TORCHNEXT_JOIN=1``) joins the
        running group and heals at its first step; initial members create the group. A
        warm spare (``torchnext run --spares``) waits here, its model built, until the
        agent gives it a dead worker's place, then joins as a replacement does
        (:mod:`~torchnext.distributed.launch.spares`). ``state`` registers more entries
        by name (see :meth:`register`); ``optimizer_step`` applies committed steps.
        ``replica`` (a :class:`~.replica_groups.ReplicaGroup`, its model sharded over
        ``replica.mesh``) makes this process one shard of a replica group (:mod:`.hsdp`).
        """
        from torchnext._env import TORCHNEXT_JOIN, TORCHNEXT_MEMBER_ID, TORCHNEXT_STORE_ADDR
        from torchnext.distributed.launch.spares import await_assignment
        from torchnext.distributed.launch.store import connect_store
        from torchnext.distributed.training.hsdp import HSDPLayout

        store, member_id = await_assignment() or (None, TORCHNEXT_MEMBER_ID.get())
        joining = store is not None or bool(TORCHNEXT_JOIN.get())
        # A replica group's process says which group it belongs to before it joins.
        layout = None if replica is None else HSDPLayout(replica, member_id=member_id)
        if joining:
            if store is None:
                store = connect_store(TORCHNEXT_STORE_ADDR.get(), timedelta(seconds=30))
            group = FaultTolerantGroup.join(store, member_id=member_id, timeout=join_timeout)
        else:
            group = FaultTolerantGroup.from_env()
        return cls(
            group,
            model,
            optimizer,
            sampler,
            config=config,
            joining=joining,
            on_event=on_event,
            state=state,
            optimizer_step=optimizer_step,
            layout=layout,
        )

    # ------------------------------------------------------------------ properties

    @property
    def rank(self) -> int:
        return int(self.group.rank)

    @property
    def world_size(self) -> int:
        return int(self.group.size)

    @property
    def member_id(self) -> str:
        return str(self.group.member_id)

    # ------------------------------------------------------------------ events

    def emit_event(self, kind: str, **detail: Any) -> None:
        """Report a manager event (``on_event``, and the launcher's log when published)."""
        self._events.emit(kind, step=self.step, **detail)

    def _on_revoke(self, exc: BaseException) -> None:
        self._events.on_revoke(exc, step=self.step)

    # ------------------------------------------------------------------ communication

    def _all_reduce_async(self, tensor: torch.Tensor) -> Any:
        return self.group.all_reduce(tensor, async_op=True, timeout=self.config.step_timeout)

    def _failure_reason(self) -> str:
        # Only the current epoch's revoke counts: errored() also remembers errors of
        # epochs already recovered from.
        return "group revoked (a member failed)" if self.group.is_revoked else ""

    # ------------------------------------------------------------------ the step

    def start_step(self) -> list[int]:
        """Settle membership and healing, then return this member's sample indices."""
        self._started = True
        t0 = time.monotonic()
        settled = not (self._needs_recovery or self._needs_sync)
        while self._needs_recovery or self._needs_sync:
            try:
                if self._needs_recovery:
                    self._recover(self._needs_recovery)
                if self._needs_sync:
                    self.layout.sync_and_heal(self)
                    self._needs_sync = False
            except (StaleEpochError, StoreLostError):
                raise  # evicted, or the store is gone: this process must exit
            except HealingRefusedError as exc:
                if self.step < 0:
                    raise  # this joiner can never match the group: a bug, not a fault
                # A refused joiner will exit; continue without it.
                self._needs_recovery = f"refused a joiner: {exc}"
            except (CommError, CommTimeoutError, OSError) as exc:
                # Another failure while recovering or healing: agree again.
                self._needs_recovery = f"recovery or healing failed: {type(exc).__name__}: {exc}"
        self.optimizer.zero_grad(set_to_none=True)
        # An aborted step is redone from the random state it started with.
        self._step_rng = rng_state()
        self._compute_t0 = time.monotonic()
        self._recovery_s = 0.0 if settled else self._compute_t0 - t0
        return self.sampler.indices(*self.layout.data_position(self.group))

    @contextlib.contextmanager
    def no_sync(self) -> Iterator[None]:
        """Backward passes inside accumulate gradients locally, without all-reducing them.

        For gradient accumulation with :meth:`start_step`/:meth:`finish_step`: run every
        micro-batch but the last under ``no_sync()``; the last backward all-reduces the
        accumulated sums (``run_step(..., micro_batches=K)`` does this for you).
        """
        self._bucketer.enabled = False
        try:
            yield
        finally:
            self._bucketer.enabled = True

    def interruptible(self) -> contextlib.AbstractContextManager[None]:
        """Wrap a step's forward and backward: once the group fails they stop at the next
        module or gradient (silently), and :meth:`finish_step` aborts the step."""
        return self._bucketer.interruptible()

    def finish_step(
        self,
        loss: torch.Tensor | float | None = None,
        *,
        optimizer_step: Callable[[], object] | None = None,
    ) -> StepResult:
        """Wait for the gradients, vote, and apply the step only if every member finished it.

        ``loss`` is this member's scaled loss (sum over its samples times
        ``sampler.loss_scale()``); it is summed over members into the global-batch loss.
        ``optimizer_step`` (default: the manager's, see :class:`Manager`) applies the
        step once every member voted to commit it, with the summed gradients in
        ``p.grad``: the place for ``clip_grad_norm_`` and ``GradScaler.step``/``update``.
        """
        t_reduce = time.monotonic()
        ok, reason = True, ""
        # [loss, joiners seen]: with the collective vote this all-reduce is the vote.
        loss_buf = torch.zeros(2, dtype=torch.float64)
        if loss is not None:
            loss_buf[0] = float(loss.detach() if isinstance(loss, torch.Tensor) else loss)
        by_store = (
            self.config.check_replicas
            or self.config.commit_vote == "store"
            or self.layout.atomic_commit
        )
        if not by_store:
            # Asked every step: the monitor's view (at most a heartbeat old) costs no
            # store request on the step's path (on etcd, a read through the leader).
            loss_buf[1] = float(self._joiners_pending(fresh=False))
        try:
            self._bucketer.finish(self.config.step_timeout)
            self.group.all_reduce(loss_buf, timeout=self.config.step_timeout)
        except (CommError, CommTimeoutError, OSError) as exc:
            ok, reason = False, f"{self.member_id}: {type(exc).__name__}: {exc}"
            self._bucketer.abandon()
            if not self.group.is_revoked:
                # Wake members still blocked in this step's collectives.
                self.group.revoke(reason)
        if ok and self.config.check_replicas:
            ok, reason = self._check_replicas()
        t_vote = time.monotonic()
        epoch, size = int(self.group.epoch), self.world_size
        if not by_store:
            # Every member entered the all-reduce only after its backward finished, so
            # completing it means every member finished the step (see commit_vote).
            decision = Decision(commit=ok, grow=ok and float(loss_buf[1]) > 0, reason=reason)
        else:
            decision = self._vote.decide(
                epoch=epoch,
                step=self.step,
                rank=self.rank,
                size=size,
                ok=ok,
                timeout=self.config.step_timeout,
                failed=self._failure_reason,
                joiners_pending=self._joiners_pending,  # the vote talks to the store anyway
                local_reason=reason,
            )
        if not decision.commit:
            return self._abort(decision)
        self._apply(optimizer_step or self.optimizer_step)
        self.sampler.commit()
        self.step += 1
        if by_store and self.step > 2 and self.rank == 0:
            self._vote.cleanup(epoch, self.step - 3, size)
        self._events.step_committed(step=self.step)
        t_done = time.monotonic()
        if decision.grow:
            self._grow()
        return StepResult(
            committed=True,
            step=self.step,
            loss=float(loss_buf[0]),
            world_size=size,
            compute_s=t_reduce - self._compute_t0,
            allreduce_s=t_vote - t_reduce,
            commit_s=t_done - t_vote,
            recovery_s=self._recovery_s,
        )

    def run_step(
        self,
        closure: Callable[[list[int]], torch.Tensor],
        *,
        micro_batches: int = 1,
        loss_reduction: str = "sum",
        optimizer_step: Callable[[], object] | None = None,
        batches: DataLoader[Any] | None = None,
    ) -> StepResult:
        """Run one step to commit, redoing it after failures.

        ``closure(indices)`` computes the loss of the given samples of this member's share
        and returns it without calling ``backward``: their *sum* (``loss_reduction="sum"``;
        the list may then be empty) or their *mean* (``"mean"``; never called empty). The
        manager scales it so the all-reduced gradient is the global batch's mean, runs
        backward (overlapping the all-reduce) and commits. With ``micro_batches=K`` the
        share is cut into K contiguous pieces, one closure call and backward each;
        gradients accumulate locally and only the last backward all-reduces.
        ``optimizer_step`` is as in :meth:`finish_step`. With ``batches=loader`` (a
        ``DataLoader`` whose ``batch_sampler`` is this manager's sampler) the closure gets
        the loader's batch of this member's share instead of indices (:mod:`.loader`).

        Equivalent Python, for one attempt (the loop redoes aborted attempts)::

            idx = manager.start_step()
            for piece in split(idx, micro_batches):        # contiguous, in order
                w = (len(piece) if loss_reduction == "mean" else 1) * sampler.loss_scale()
                with manager.no_sync() if piece is not last else nullcontext():
                    (closure(piece) * w).backward()
            manager.finish_step(total_weighted_loss, optimizer_step=optimizer_step)
        """
        check_step_args(micro_batches, loss_reduction)
        feed = self._loader_feed(batches, micro_batches)
        while True:
            indices = self.start_step()
            where = self.layout.data_position(self.group)
            batch = feed.batch(*where, empty=not indices) if feed else None
            loss = 0.0
            with self.interruptible():  # a failure noticed mid-step cuts its compute short
                loss = compute(
                    closure,
                    indices,
                    batch,
                    from_loader=feed is not None,
                    micro_batches=micro_batches,
                    loss_reduction=loss_reduction,
                    loss_scale=self.sampler.loss_scale(),
                    no_sync=self.no_sync,
                )
            result = self.finish_step(loss, optimizer_step=optimizer_step)
            if result.committed:
                return result

    def _loader_feed(self, loader: DataLoader[Any] | None, micro_batches: int) -> LoaderFeed | None:
        if loader is None:
            return None
        if micro_batches != 1:
            raise ValueError(
                f"run_step(batches=loader, micro_batches={micro_batches}): a loader's batch "
                "cannot be split; use index mode (no batches=) for micro-batches."
            )
        if self._feed is None or self._feed.loader is not loader:
            self._feed = LoaderFeed(loader, self.sampler)
        return self._feed

    def _apply(self, optimizer_step: Callable[[], object]) -> None:
        try:
            optimizer_step()
        except Exception as exc:
            name = getattr(optimizer_step, "__qualname__", repr(optimizer_step))
            raise OptimizerStepError(
                f"optimizer_step={name} raised {type(exc).__name__}: {exc} at step "
                f"{self.step + 1}, after every member voted to commit it; this member's state "
                "is now unknown, so it stops here. Fix the function (it runs after the "
                "gradient all-reduce, with the summed gradients in p.grad)."
            ) from exc

    def _joiners_pending(self, fresh: bool = True) -> bool:
        try:
            return self.layout.joiners_ready(self.group, fresh=fresh)
        except Exception:  # noqa: BLE001 - a failed query only delays admitting joiners
            return False

    def _abort(self, decision: Decision) -> StepResult:
        self._bucketer.abandon()
        self.optimizer.zero_grad(set_to_none=True)
        if self._step_rng is not None:
            set_rng_state(self._step_rng)
        self.steps_redone += 1
        self._events.step_failed()
        self.emit_event("step_aborted", reason=decision.reason)
        self._needs_recovery = decision.reason or "step aborted"
        return StepResult(
            committed=False,
            step=self.step,
            loss=float("nan"),
            world_size=self.world_size,
            reason=decision.reason,
        )

    # ------------------------------------------------------------------ membership

    def _recover(self, reason: str) -> None:
        """Agree on the survivors and shrink to them (bounded, retried on new failures)."""
        self.recoveries += 1
        if self.recoveries > self.config.max_recoveries:
            raise CommError(
                f"{self.member_id}: gave up after {self.config.max_recoveries} membership changes; "
                f"last reason: {reason}. Raise ManagerConfig.max_recoveries if this is expected."
            )
        timeout = self.config.recovery_timeout
        shrink_to_survivors(self.group, reason=reason, timeout=timeout, emit=self.emit_event)
        self._needs_recovery = ""
        self._needs_sync = True

    def _grow(self) -> None:
        failure = admit_joiners(self.group, timeout=self.config.grow_timeout, emit=self.emit_event)
        if failure:
            self._needs_recovery = failure
        else:
            self._needs_sync = True

    # ------------------------------------------------------------------ healing

    def state_dict(self) -> dict[str, Any]:
        """Everything a joiner needs to become an identical replica.

        Model, optimizer, sampler, registered entries (under ``"extra"``), RNG states and
        the step count; it loads with ``torch.load(..., weights_only=True)``.
        """
        return {
            **self.training_state.state_dict(),
            "step": self.step,
            "steps_redone": self.steps_redone,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Load :meth:`state_dict`'s output (the same entries must be registered)."""
        self.training_state.load_state_dict(state)
        self.step = int(state["step"])
        self.steps_redone = int(state.get("steps_redone", 0))

    # ------------------------------------------------------------------ checks

    def checksum(self) -> int:
        """CRC32 of every parameter, buffer and optimizer-state tensor (bit-exact fingerprint)."""
        opt_tensors = [v for st in self.optimizer.state.values() for v in st.values()]
        tensors = [*self.model.state_dict().values(), *opt_tensors]
        return fingerprint([t for t in tensors if isinstance(t, torch.Tensor)])

    def _check_replicas(self) -> tuple[bool, str]:
        """(ok, reason) for the vote; raises when the replicas diverged (nothing committed)."""
        try:
            check_replicas(
                self.group, self.training_state, step=self.step, timeout=self.config.step_timeout
            )
        except (CommError, CommTimeoutError, OSError) as exc:
            return False, f"{self.member_id}: replica check failed: {type(exc).__name__}: {exc}"
        except ReplicaDivergenceError as exc:
            self.replica_mismatches += 1
            self._bucketer.abandon()
            self.emit_event(
                "replica_mismatch", entries=list(exc.entries), members=list(exc.members)
            )
            raise
        self.replica_checks += 1
        return True, ""

    # ------------------------------------------------------------------ end

    def finish(self) -> None:
        """Mark the job finished (late joiners and the agent stop waiting) and release sockets."""
        try:
            self.group.store.set(FINISHED_KEY, str(self.step))
        except Exception:  # noqa: BLE001
            pass
        self.emit_event("finished", steps_redone=self.steps_redone, recoveries=self.recoveries)
        self._bucketer.remove()
        self.heals.close()

    def evicted(self, exc: BaseException) -> bool:
        """Whether ``exc`` (or what the group saw) means the group moved on without this
        member: exit with ``EXIT_EVICTED`` and be replaced."""
        return isinstance(exc, StaleEpochError) or isinstance(self.group.errored(), StaleEpochError)
