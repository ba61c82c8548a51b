"""Fault-tolerant HSDP: the training manager's layout for replica groups of G processes.

Use it through ``Manager.from_env(model, optimizer, sampler, replica=ReplicaGroup.from_env())``
under ``torchnext run --nproc N --group-size G``: inside a replica group the model is
sharded with FSDP2 over the group's own gloo group (:mod:`.replica_groups`); across
groups, every step's sharded gradients are summed shard by shard (shard i with shard i)
over the fault-tolerant group. One fault-tolerant group holds every process, so one
commit vote decides every step for every group. The loop, as Python::

    replica = ReplicaGroup.from_env()                 # shard group + 1-D mesh
    model = build_model()
    for block in model.blocks:
        fully_shard(block, mesh=replica.mesh)
    fully_shard(model, mesh=replica.mesh)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    manager = Manager.from_env(model, opt, sampler, replica=replica)
    while manager.step < steps:
        # sync: drop incomplete groups, re-plan, split shard sub-groups, heal shard i
        # compute: this process's slice (replica order * G + shard of R * G) of the global
        #          batch; FSDP2 reduce-scatters (an average) inside the group in backward
        # reduce:  sum of the local gradient shards with the same shard index (below)
        # commit:  every process of every group votes; apply, or discard and redo
        manager.run_step(closure)

A failure of any process drops its whole group: the launcher kills the group's other
processes and restarts the group; survivors shrink, and any member whose group misses
a shard leaves (:class:`~torchnext.errors.ReplicaIncompleteError`, exit
``EXIT_EVICTED``). A restarted group is admitted only once all its processes wait to
join, and each of its processes heals from a live process with the same shard index
(model shard, optimizer state, sampler, RNG, registered entries), all shards at once.

The shard-wise sum goes over the shard sub-group (``group.split(color=shard)``, made
at every sync, in replica order); the step-0 copy through one all-reduce of per-shard
slots over the whole group (:mod:`.shard_reduce`).

What not to assume: ``ManagerConfig.check_replicas`` compares whole-group fingerprints
and does not apply here (compare :func:`shard_checksum` between processes of the same
shard index); every trainable parameter must be sharded by ``fully_shard`` (a DTensor);
a step's compute is never cut short (a group's processes must run the same FSDP
collectives), so a failure elsewhere costs the step it happened in.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable
from typing import Any

import torch

from torchnext.compat.fsdp_internals import local_tensor, wrap_like
from torchnext.distributed.group.fault_tolerant_group import FaultTolerantGroup
from torchnext.distributed.training.bucketing import Work
from torchnext.distributed.training.healing import describe_tensors
from torchnext.distributed.training.layout import GradientReducer, ManagerView, fetch_state
from torchnext.distributed.training.replica_check import check_same_entries
from torchnext.distributed.training.replica_groups import (
    ReplicaGroup,
    ReplicaPlan,
    ReplicaSlot,
    plan_replicas,
)
from torchnext.distributed.training.shard_reduce import (
    ShardGradReducer,
    slot_all_reduce,
    slot_length,
)
from torchnext.distributed.training.state import fingerprint, restore_rng
from torchnext.errors import (
    CommError,
    HealingRefusedError,
    ReplicaIncompleteError,
    ReplicaLayoutError,
)

__all__ = [
    "HSDPLayout",
    "check_sharding",
    "load_local_state",
    "local_state",
    "shard_checksum",
    "sharding_spec_crc",
]

_SLOT_KEY = "torchnext/replica/member"


def local_state(obj: Any) -> Any:
    """``obj`` (a state tree) with every ``DTensor`` replaced by its local shard."""
    if isinstance(obj, dict):
        return {k: local_state(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(local_state(v) for v in obj)
    return local_tensor(obj)


def shard_checksum(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> int:
    """CRC32 of this process's model shard and optimizer state (equal between the
    processes of one shard index after every committed step)."""
    opt = [v for st in optimizer.state.values() for v in st.values()]
    tensors = [*model.state_dict().values(), *opt]
    return fingerprint([local_tensor(t) for t in tensors if isinstance(t, torch.Tensor)])


def sharding_spec_crc(model: torch.nn.Module, group_size: int) -> int:
    """Fingerprint of how ``model`` is sharded: names, global shapes, placements."""
    spec = [
        (name, tuple(t.shape), str(getattr(t, "placements", "local")))
        for name, t in model.state_dict().items()
    ]
    return zlib.crc32(repr((group_size, spec)).encode())


def check_sharding(me: str, specs: dict[str, int], steps: dict[str, int]) -> None:
    """Raise unless every member's :func:`sharding_spec_crc` is the same.

    A joiner (step < 0) that differs is refused (:class:`HealingRefusedError` in the
    others; the job goes on without it); otherwise, and in the odd member itself, the
    job's processes disagree on the model: :class:`ReplicaLayoutError`.
    """
    values = list(specs.values())
    common = max(set(values), key=values.count)
    odd = [m for m, s in specs.items() if s != common]
    if not odd:
        return
    message = (
        f"the model is sharded differently in {odd} than in the other replica groups "
        "(parameter names, shapes or fully_shard placements differ): apply the same "
        "fully_shard calls, with the same --group-size, in every process"
    )
    if me not in odd and all(steps[m] < 0 for m in odd):
        raise HealingRefusedError(f"refused joiners {odd}: {message}")
    raise ReplicaLayoutError(f"model (member {me}): {message}")


class HSDPLayout:
    """Replica groups of G processes sharding one model copy (see the module docstring)."""

    atomic_commit = True
    """A step's collective vote can complete on some processes and fail on others (a
    peer died inside it). A group whose shards were a step apart could never be made
    whole (shard i heals only from shard i), so every process adopts one decision."""

    def __init__(self, replica: ReplicaGroup, *, member_id: str = "") -> None:
        self.replica = replica
        self.first_sync = True
        self.plan: ReplicaPlan | None = None
        self.shard_group: FaultTolerantGroup | None = None
        if member_id:
            self.publish(member_id)

    def publish(self, member_id: str) -> None:
        """Tell the members which group this process belongs to (before it joins)."""
        c = self.replica.config
        self.replica.store.set(
            f"{_SLOT_KEY}/{member_id}", f"{c.replica_id}\n{c.shard}\n{c.group_size}"
        )

    def data_position(self, group: FaultTolerantGroup) -> tuple[int, int]:
        if self.plan is None:
            raise CommError("HSDP: no replica layout before the first sync")
        return self.plan.data_position(str(group.member_id))

    def gradient_reducer(
        self,
        model: torch.nn.Module,
        all_reduce: Callable[[torch.Tensor], Work],
        *,
        bucket_cap_bytes: int,
        failed: Callable[[], bool],
    ) -> GradientReducer:
        return ShardGradReducer(model, self.current_shard_group, group_size=self.replica.group_size)

    def current_shard_group(self) -> FaultTolerantGroup:
        """This epoch's sub-group of the processes holding this process's shard index."""
        if self.shard_group is None:
            raise CommError("HSDP: no shard sub-group before the first sync")
        return self.shard_group

    def joiners_ready(self, group: FaultTolerantGroup, *, fresh: bool = True) -> bool:
        """Admit joiners only once a whole restarted group waits to join."""
        pending = group.pending_joiners(fresh=fresh)
        if not pending:
            return False
        groups: dict[str, set[int]] = {}
        for member in pending:
            key = f"{_SLOT_KEY}/{member}"
            if not group.store.check([key]):
                continue
            replica_id, shard, _ = bytes(group.store.get(key)).decode().split("\n")
            groups.setdefault(replica_id, set()).add(int(shard))
        g = self.replica.group_size
        return any(len(shards) == g for shards in groups.values())

    # ------------------------------------------------------------------ sync

    def sync_and_heal(self, manager: ManagerView) -> None:
        group, timeout = manager.group, manager.config.step_timeout
        if manager.config.check_replicas:
            raise ReplicaLayoutError(
                "ManagerConfig.check_replicas=True with replica groups: it compares whole "
                "replicas, and a process holds one shard; leave it False and compare "
                "shard_checksum(model, optimizer) between processes of one shard index."
            )
        spec = sharding_spec_crc(manager.model, self.replica.group_size)
        slot = self.replica.slot
        while True:
            mine = [manager.step, manager.training_state.spec_crc(), slot.replica, slot.shard]
            mine += [slot.group_size, spec]
            width = len(mine)
            rows = torch.zeros(width * int(group.size), dtype=torch.int64)
            row = torch.tensor(mine, dtype=torch.int64)
            group.all_gather_into_tensor(rows, row, timeout=timeout)
            table = rows.view(-1, width).tolist()
            members = tuple(group.members)
            slots = {m: ReplicaSlot(r[2], r[3], r[4]) for m, r in zip(members, table, strict=True)}
            plan = plan_replicas(members, slots)
            if not plan.incomplete:
                break
            self._drop_incomplete(manager, plan)
        steps = {m: r[0] for m, r in zip(members, table, strict=True)}
        check_same_entries(
            group,
            manager.training_state,
            steps=[r[0] for r in table],
            crcs=[r[1] for r in table],
            timeout=timeout,
        )
        specs = {m: r[5] for m, r in zip(members, table, strict=True)}
        check_sharding(str(group.member_id), specs, steps)
        if not plan.replicas:
            raise CommError(f"{group.member_id}: no complete replica group is left")
        self.plan = plan
        # Shard i of every group, in replica order: the gradients' sum goes over it.
        sub = group.split(
            color=self.replica.shard,
            key=plan.replica_order(str(group.member_id)),
            timeout=timeout,
        )
        if not isinstance(sub, FaultTolerantGroup):
            raise CommError(f"{group.member_id}: no shard sub-group for shard {self.replica.shard}")
        self.shard_group = sub
        self._heal(manager, plan, steps)
        # Healers serve joiners at different speeds: leave the sync together, so no
        # process waits for its group-mate in FSDP's first collective, whose timeout
        # (twice the heartbeat timeout) is far shorter than a heal may take.
        group.barrier(timeout=timeout)

    def _drop_incomplete(self, manager: ManagerView, plan: ReplicaPlan) -> None:
        group = manager.group
        keep = [m for m in group.members if m not in plan.incomplete]
        manager.emit_event("replica_dropped", removed=list(plan.incomplete), members=keep)
        group.reconfigure(keep, timeout=manager.config.recovery_timeout)
        if str(group.member_id) in plan.incomplete:
            raise ReplicaIncompleteError(
                f"{group.member_id}: its replica group misses a process and was dropped; "
                "exit with EXIT_EVICTED so the launcher restarts the whole group"
            )

    def _heal(self, manager: ManagerView, plan: ReplicaPlan, steps: dict[str, int]) -> None:
        group, timeout = manager.group, manager.config.step_timeout
        me = str(group.member_id)
        live = [steps[m] for m in plan.members]
        best = max(live)
        if best < 0:
            raise CommError(f"{me}: no replica group has committed state to heal from")
        if best == 0 and (self.first_sync or min(live) < 0):
            # Nothing trained yet: the first group's shard i becomes every group's shard i.
            source = next(r for r in plan.replicas if all(steps[m] == best for m in r))
            tensors = [local_tensor(t) for t in manager.model.state_dict().values()]
            g = self.replica.group_size
            lengths = [slot_length(t, g) for t in manager.model.state_dict().values()]
            copies = slot_all_reduce(
                lambda flat: group.all_reduce(flat, timeout=timeout),
                tensors,
                lengths,
                shard=self.replica.shard,
                group_size=g,
                contribute=me in source,
                dtype=torch.float64,
            )
            with torch.no_grad():
                for t, value in zip(tensors, copies, strict=True):
                    t.copy_(value.to(t.dtype))
            manager.step = 0
            self.first_sync = False
            return
        self.first_sync = False
        sources = plan.heal_sources(steps)
        mine = [d for d, s in sources.items() if s == me]
        if mine:
            state = local_state(manager.state_dict())
            manager.heals.serve(state, mine, manager.training_state.spec_problems)
        if me in sources:
            spec = describe_tensors(local_state(manager.model.state_dict()))
            fetch_state(manager, sources[me], spec, load=lambda s: self._load(manager, s))

    def _load(self, manager: ManagerView, state: dict[str, Any]) -> None:
        """Load a healer's local shards into this process's sharded model, optimizer and
        registered entries (a second optimizer or module, as DiLoCo registers)."""
        ts = manager.training_state
        load_local_state(manager.model, state["model"])
        load_local_state(ts.optimizer, state["optimizer"])
        ts.sampler.load_state_dict(state["sampler"])
        for name, value in (state.get("extra") or {}).items():
            load_local_state(ts.entry(name), value)
        restore_rng(state["rng"])
        manager.step = int(state["step"])
        manager.steps_redone = int(state.get("steps_redone", 0))


def load_local_state(obj: Any, state: Any) -> None:
    """Load ``state``, holding local shards as :func:`local_state` made it, into ``obj``.

    A module's tensors are copied into its local shards; an optimizer's per-parameter
    state is wrapped as its sharded parameters are, then loaded; anything else gets its
    ``load_state_dict`` as it is.
    """
    if isinstance(obj, torch.nn.Module):
        with torch.no_grad():
            for name, tensor in obj.state_dict().items():
                local_tensor(tensor).copy_(state[name])
        return
    if isinstance(obj, torch.optim.Optimizer):
        params = [p for g in obj.param_groups for p in g["params"]]
        for idx, entry in state["state"].items():
            p = params[int(idx)]
            shape = local_tensor(p).shape
            for k, v in entry.items():
                if isinstance(v, torch.Tensor) and v.dim() > 0 and v.shape == shape:
                    entry[k] = wrap_like(v, p)
    obj.load_state_dict(state)
