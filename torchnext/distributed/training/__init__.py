"""Fault-tolerant training on a :class:`~torchnext.distributed.FaultTolerantGroup`.

Use :class:`Manager` to run a data-parallel loop that survives members dying: it
all-reduces gradients in buckets (:mod:`.bucketing`), votes on each step's commit
(:mod:`.commit`), heals joiners from a live member's state (:mod:`.healing`) with
every registered entry (:class:`Stateful` objects such as LR schedulers, :mod:`.state`),
checks the replicas before each commit (:mod:`.replica_check`) and splits the data over
whoever is alive (:class:`ElasticSampler`, :mod:`.sampler`). :func:`save_checkpoint` and
:func:`load_checkpoint` carry all of it across a full job restart (:mod:`.checkpoint`).
:class:`FaultTolerantDDP` puts a DDP-shaped loop on the manager (:mod:`.ddp`);
:class:`DiLoCo` runs DiLoCo, streaming DiLoCo or LocalSGD rounds on it (:mod:`.semisync`,
:mod:`.semisync_fragments`). :class:`ReplicaGroup` makes a replica a group of processes
sharding the model with FSDP2 (fault-tolerant HSDP, :mod:`.hsdp`).

What not to assume: names are loaded on first use; importing
:class:`~torchnext.distributed.FaultTolerantGroup` alone never loads this package.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from torchnext._lazy import lazy_exports

if TYPE_CHECKING:
    from torchnext.distributed.training.checkpoint import (
        export_checkpoint,
        latest_checkpoint,
        load_checkpoint,
        read_checkpoint,
        save_checkpoint,
    )
    from torchnext.distributed.training.ddp import FaultTolerantDDP
    from torchnext.distributed.training.manager import (
        Manager,
        ManagerConfig,
        ManagerEvent,
        StepResult,
    )
    from torchnext.distributed.training.replica_groups import ReplicaGroup, ReplicaGroupConfig
    from torchnext.distributed.training.sampler import ElasticSampler, SamplerConfig
    from torchnext.distributed.training.semisync import DiLoCo, SyncConfig
    from torchnext.distributed.training.state import Stateful, TrainingState

__all__ = [
    "DiLoCo",
    "ElasticSampler",
    "FaultTolerantDDP",
    "Manager",
    "ManagerConfig",
    "ManagerEvent",
    "ReplicaGroup",
    "ReplicaGroupConfig",
    "SamplerConfig",
    "Stateful",
    "StepResult",
    "SyncConfig",
    "TrainingState",
    "export_checkpoint",
    "latest_checkpoint",
    "load_checkpoint",
    "read_checkpoint",
    "save_checkpoint",
]

__getattr__, __dir__ = lazy_exports(
    __name__,
    {
        "Manager": "manager",
        "ManagerConfig": "config",
        "ManagerEvent": "config",
        "StepResult": "config",
        "Stateful": "state",
        "TrainingState": "state",
        "ElasticSampler": "sampler",
        "SamplerConfig": "sampler",
        "FaultTolerantDDP": "ddp",
        "ReplicaGroup": "replica_groups",
        "ReplicaGroupConfig": "replica_groups",
        "DiLoCo": "semisync",
        "SyncConfig": "semisync",
        "export_checkpoint": "checkpoint",
        "latest_checkpoint": "checkpoint",
        "load_checkpoint": "checkpoint",
        "read_checkpoint": "checkpoint",
        "save_checkpoint": "checkpoint",
    },
)
