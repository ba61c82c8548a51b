"""The private parts of ``torch.distributed`` that replica groups (HSDP) use, in one place.

A replica group shards its model with FSDP2 (``fully_shard``) over a 1-D
``DeviceMesh`` built on an ordinary gloo process group of the group's processes, and
*without* a default (world) process group: the fault-tolerant group is the job's
world, not c10d's. Neither ``DeviceMesh.from_group`` nor ``new_group`` works without a
default group, so this module builds the process group and the mesh by hand. Every
access to a torch internal for that goes through here, so a torch release that moves
one breaks one place.

========================================  ==========================================  ==============
access                                    what for                                    tested on
========================================  ==========================================  ==============
``ProcessGroup._register_backend``        a ProcessGroup around a gloo backend        2.13.0
``ProcessGroup._set_default_backend``     that backend serves every collective        2.13.0
``ProcessGroup._set_group_name``          the name FSDP2 resolves the group by        2.13.0
``distributed_c10d._register_process_group``  register that name                      2.13.0
``distributed_c10d._world``               the group's ranks (``get_process_group_ranks``) 2.13.0
``DeviceMesh(..., _init_backend, _rank)``  a mesh without a default group             2.13.0
``DeviceMesh._dim_group_names``           the mesh's dimension is that group          2.13.0
``DeviceMesh._pg_registry``               same (looked up by ``get_group``)           2.13.0
========================================  ==========================================  ==============

What not to assume: the process group is a plain gloo group with a fixed membership
and timeout: it cannot shrink, so a replica group that loses a process is dropped
whole, and its collectives fail (after ``timeout``) rather than recover.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.distributed_c10d as c10d
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor

__all__ = ["local_tensor", "mesh_on_group", "replica_process_group", "wrap_like"]


def replica_process_group(
    store: Any, *, prefix: str, rank: int, size: int, timeout: timedelta, name: str
) -> Any:
    """A gloo ``ProcessGroup`` of ``size`` processes rendezvousing under ``prefix``.

    Collective (every process of the group calls it); ``timeout`` bounds every op, the
    rendezvous included. ``name`` must be unique in the process.
    """
    prefixed = dist.PrefixStore(prefix, store)
    backend = dist.ProcessGroupGloo(prefixed, rank, size, timeout)
    pg = dist.ProcessGroup(prefixed, rank, size)
    pg._set_default_backend(dist.ProcessGroup.BackendType.GLOO)
    backend._set_sequence_number_for_group()
    pg._register_backend(torch.device("cpu"), dist.ProcessGroup.BackendType.GLOO, backend)
    group_name: Any = name  # c10d's GroupName is a str NewType
    pg._set_group_name(group_name)
    c10d._register_process_group(group_name, pg)
    world = c10d._world
    # Group ranks double as "global" ranks: there is no world group to map them to.
    world.pg_group_ranks[pg] = {r: r for r in range(size)}
    world.pg_names[pg] = group_name
    world.pg_map[pg] = ("gloo", prefixed)
    return pg


def mesh_on_group(pg: Any, *, rank: int, size: int, dim_name: str = "shard") -> DeviceMesh:
    """A 1-D CPU ``DeviceMesh`` over ``pg`` (from :func:`replica_process_group`)."""
    mesh = DeviceMesh(
        "cpu",
        torch.arange(size, dtype=torch.int),
        mesh_dim_names=(dim_name,),
        _init_backend=False,
        _rank=rank,
    )
    name: Any = pg.group_name
    mesh._dim_group_names = [name]
    mesh._pg_registry[name] = pg
    return mesh


def local_tensor(value: Any) -> Any:
    """``value``'s local shard if it is a ``DTensor``, else ``value``."""
    return value.to_local() if isinstance(value, DTensor) else value


def wrap_like(value: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """``value`` (a local shard) as a ``DTensor`` placed as ``like``; plain if ``like`` is."""
    if not isinstance(like, DTensor):
        return value
    return DTensor.from_local(
        value,
        like.device_mesh,
        like.placements,
        run_check=False,
        shape=like.shape,
        stride=like.stride(),
    )
