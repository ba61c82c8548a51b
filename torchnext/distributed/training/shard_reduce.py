"""The replicate dimension of replica groups (HSDP): summing shard i with shard i.

Use :class:`ShardGradReducer` as the training manager's gradient reducer when every
replica is a group of G processes sharding the model with FSDP2 (:mod:`.hsdp` makes
it): after backward (FSDP2 has reduce-scattered inside the group), it sums each
process's local gradient shard with the same shard index of every other group. The
sum is one all-reduce per step on the *shard sub-group* of this process's shard index
(``group.split(color=shard)``, made at every membership change; revoked with its
epoch), of this process's local gradient shards only::

    flat = concat(local gradient shards)                # this process's shard i
    shard_group.all_reduce(flat)                         # shard i of every group
    my gradients = flat * G                              # FSDP2 averaged over the group

:func:`slot_all_reduce` (a buffer with one slot per shard index, all-reduced over the
whole group) serves the one-time step-0 copy, where one group's shards are broadcast.

What not to assume: every trainable parameter must be a ``DTensor`` sharded on dim 0
(what ``fully_shard`` makes), unless the module says its parameters are local shards
already (``holds_local_shards = True``, as streaming DiLoCo's carrier does); the sum
runs after backward, not overlapped with it.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Iterator, Sequence
from datetime import timedelta

import torch
import torch.distributed as dist

from torchnext.compat.fsdp_internals import local_tensor, wrap_like
from torchnext.distributed.group.fault_tolerant_group import FaultTolerantGroup
from torchnext.errors import ReplicaIncompleteError, ReplicaLayoutError

__all__ = ["ShardGradReducer", "slot_all_reduce", "slot_length"]


def slot_length(tensor: torch.Tensor, group_size: int) -> int:
    """Elements of ``tensor``'s slot: its largest local shard (dim-0 sharding, as
    ``fully_shard`` does), or its whole size when it is not sharded."""
    if not hasattr(tensor, "placements") or tensor.dim() == 0:
        return tensor.numel()
    rows = math.ceil(tensor.shape[0] / group_size)
    return rows * math.prod(tensor.shape[1:])


def slot_all_reduce(
    all_reduce: Callable[[torch.Tensor], object],
    tensors: Sequence[torch.Tensor],
    lengths: Sequence[int],
    *,
    shard: int,
    group_size: int,
    contribute: bool,
    dtype: torch.dtype,
) -> list[torch.Tensor]:
    """Sum, over every process, a buffer holding one slot per shard index; returns this
    process's slot cut into pieces shaped like ``tensors`` (its local shards).

    A process that ``contribute``-s writes its ``tensors`` into its shard's slot, the
    others add zeros; so shard i's result is the sum over the contributing processes of
    shard index i (all of them: the gradient sum; one group: a broadcast).
    """
    total = sum(lengths)
    buf = torch.zeros(group_size, total, dtype=dtype)
    if contribute:
        offset = 0
        for t, n in zip(tensors, lengths, strict=True):
            buf[shard, offset : offset + t.numel()] = t.detach().reshape(-1).to(dtype)
            offset += n
    all_reduce(buf.view(-1))
    row, out, offset = buf[shard], [], 0
    for t, n in zip(tensors, lengths, strict=True):
        out.append(row[offset : offset + t.numel()].view(t.shape))
        offset += n
    return out


def _is_transport_failure(exc: BaseException) -> bool:
    """Whether ``exc`` says a peer of a gloo collective is gone or silent (not a misuse)."""
    if isinstance(exc, dist.DistBackendError):
        return True
    text = str(exc).lower()
    gone = ("closed", "timed out", "timeout", "reset by peer", "broken pipe")
    return "gloo" in text and any(word in text for word in gone)


class ShardGradReducer:
    """Sums the local gradient shards of one shard index over the replica groups."""

    def __init__(
        self,
        model: torch.nn.Module,
        shard_group: Callable[[], FaultTolerantGroup],
        *,
        group_size: int,
    ) -> None:
        self.enabled = True
        self.params = [p for p in model.parameters() if p.requires_grad]
        # A module whose parameters are local shards already (streaming DiLoCo's
        # pseudo-gradient carrier) is summed as it is.
        local = bool(getattr(model, "holds_local_shards", False))
        plain = [
            n
            for n, p in model.named_parameters()
            if p.requires_grad and not _sharded(p) and not local
        ]
        if not self.params or plain:
            raise ReplicaLayoutError(
                f"model: parameters {plain or 'none'} are not sharded by fully_shard; apply "
                "fully_shard(module, mesh=replica.mesh) to the blocks and to the root module "
                "before making the optimizer."
            )
        self.shard_group = shard_group
        """The current epoch's sub-group of this process's shard index."""
        self.group_size = group_size

    @contextlib.contextmanager
    def interruptible(self) -> Iterator[None]:
        # Never cut a step short: the group's processes must issue the same FSDP
        # collectives. A failed one means this group lost a process.
        try:
            yield
        except RuntimeError as exc:
            if _is_transport_failure(exc):
                raise ReplicaIncompleteError(
                    f"a collective inside this replica group failed ({exc}); the group "
                    "lost a process and is dropped: exit with EXIT_EVICTED to be restarted"
                ) from exc
            raise

    def finish(self, timeout: timedelta) -> None:
        locals_ = [local_tensor(p) for p in self.params]
        grads = [
            local_tensor(p.grad) if p.grad is not None else torch.zeros_like(lp)
            for p, lp in zip(self.params, locals_, strict=True)
        ]
        flat = torch.cat([g.detach().reshape(-1).to(torch.float32) for g in grads])
        self.shard_group().all_reduce(flat, timeout=timeout)
        # FSDP2 averaged over the group's G processes (gloo has no pre-scaled sum); the
        # manager's loss scale wants the sum over every process.
        flat.mul_(self.group_size)
        offset = 0
        with torch.no_grad():
            for p, g in zip(self.params, grads, strict=True):
                value = flat[offset : offset + g.numel()].view(g.shape).to(g.dtype)
                offset += g.numel()
                if p.grad is None:
                    p.grad = wrap_like(value.clone(), p)
                else:
                    g.copy_(value)

    def abandon(self) -> None:
        """Nothing is in flight between steps (the reduce runs inside :meth:`finish`)."""

    def remove(self) -> None:
        """No hooks to detach."""


def _sharded(p: torch.Tensor) -> bool:
    return hasattr(p, "placements")
