"""Wire-byte counters: how many bytes a member of a fault-tolerant group put on the network.

Use :meth:`FaultTolerantGroup.wire_bytes
<torchnext.distributed.group.fault_tolerant_group.FaultTolerantGroup.wire_bytes>` to
compare what training schemes cost in traffic (DDP-style gradient all-reduce every
step against DiLoCo's sync every H steps), and :func:`with_heal` to add the bytes a
replacement received while healing (the training manager's ``heal_stats``), which
travel over their own TCP connection, not through the group.

The counters are *modelled*, not measured on the socket: each op adds the bytes the
standard algorithm for it makes this member send, from the payload ``P`` (bytes of
one member's tensor) and the group size ``n`` at the time the op is issued:

==================  =====================================  ==========================
op (key)            bytes this member sends                algorithm
==================  =====================================  ==========================
``allreduce``       ``2 (n-1) P // n``                     ring (reduce-scatter, then
                                                           all-gather)
``reduce_scatter``  ``(n-1) P_in // n`` (``P_in``: the     ring
                    whole input, n chunks)
``allgather``       ``(n-1) P`` (``P``: one input)         ring
``broadcast``       root ``(n-1) P``, others 0             flat (root to each)
``reduce``          root 0, others ``P``                   flat (each to root)
``gather``          root 0, others ``P``                   flat
``scatter``         root ``(n-1) P_in // n``, others 0     flat (even chunks)
``all_to_all``      ``(n-1) P_in // n``                    pairwise (even splits)
``send``            ``P``                                  point to point
``validate``        ``16 (n-1)``                           ``GroupConfig.validate``'s
                                                           extra all-gather
==================  =====================================  ==========================

``recv`` and ``barrier`` send no payload and are not counted. Summed over the members,
the counters give the group's whole traffic under that model; ``n = 1`` sends nothing.

When counts change: when an op is *issued* (an op that fails afterwards still counts
in full: its bytes were, or were about to be, on the wire). The counters belong to the
group object, not to an epoch: they keep growing across shrink and grow, and a split
sub-group adds to its parent's. Counting is one ``dict`` update on the caller's thread,
without a lock: ops of a group are issued from one thread anyway.

What not to assume: headers, acknowledgements and the store's traffic (heartbeats,
votes) are not counted; gloo's real algorithm may differ from the model for small
tensors (it is the same order of bytes); uneven ``all_to_all`` splits are modelled as
even.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Protocol

import torch

__all__ = ["HEAL_KEY", "WireCounters", "payload_bytes", "wire_cost", "with_heal"]

HEAL_KEY = "heal"
"""The key :func:`with_heal` adds: bytes received as a healing replacement."""

_VALIDATE_ROW_BYTES = 16  # two int64 per member: the op's crc and the rank


class _Transfer(Protocol):
    @property
    def total_bytes(self) -> int: ...


def payload_bytes(tensors: Sequence[torch.Tensor]) -> int:
    """Bytes of the tensors' elements (what a collective moves for one member)."""
    return sum(t.numel() * t.element_size() for t in tensors)


def wire_cost(op: str, *, size: int, rank: int, root: int, in_bytes: int) -> int:
    """Bytes this member sends for ``op`` with ``in_bytes`` of input (the module's table)."""
    n = size
    if n <= 1:
        return 0
    if op == "allreduce":
        return 2 * (n - 1) * in_bytes // n
    if op in ("reduce_scatter", "all_to_all"):
        return (n - 1) * in_bytes // n
    if op == "allgather":
        return (n - 1) * in_bytes
    if op == "broadcast":
        return (n - 1) * in_bytes if rank == root else 0
    if op in ("reduce", "gather"):
        return 0 if rank == root else in_bytes
    if op == "scatter":
        return (n - 1) * in_bytes // n if rank == root else 0
    if op == "send":
        return in_bytes
    if op == "validate":
        return _VALIDATE_ROW_BYTES * (n - 1)
    return 0  # recv, barrier: no payload leaves this member


class WireCounters:
    """Bytes put on the wire by one group (and its split sub-groups), per op kind."""

    __slots__ = ("_bytes", "_ops")

    def __init__(self) -> None:
        self._bytes: dict[str, int] = {}
        self._ops: dict[str, int] = {}

    def add(self, op: str, *, size: int, rank: int, root: int, in_bytes: int) -> None:
        """Count one issued op (see :func:`wire_cost`)."""
        cost = wire_cost(op, size=size, rank=rank, root=root, in_bytes=in_bytes)
        # Plain dict updates from the one thread that issues the group's ops: no lock.
        self._bytes[op] = self._bytes.get(op, 0) + cost
        self._ops[op] = self._ops.get(op, 0) + 1

    def count(
        self, op: str, *, size: int, rank: int, root: int, inputs: Sequence[torch.Tensor]
    ) -> None:
        """Count one issued op whose inputs are ``inputs``."""
        self.add(op, size=size, rank=rank, root=root, in_bytes=payload_bytes(inputs))

    def bytes(self) -> dict[str, int]:
        """A copy of the bytes sent so far, per op kind (only kinds that were issued)."""
        return dict(self._bytes)

    def ops(self) -> dict[str, int]:
        """A copy of the number of ops issued so far, per op kind."""
        return dict(self._ops)

    def total(self) -> int:
        """All bytes sent so far."""
        return sum(self._bytes.values())


def with_heal(counts: Mapping[str, int], transfers: Iterable[_Transfer]) -> dict[str, int]:
    """``counts`` plus :data:`HEAL_KEY`: the payload bytes of ``transfers``.

    ``transfers`` are the training manager's ``heal_stats`` (one
    :class:`~torchnext.distributed.training.healing.TransferStats` per heal this member
    received); each heal is counted once, by its receiver, so summing over members
    counts every heal once.
    """
    out = dict(counts)
    out[HEAL_KEY] = out.get(HEAL_KEY, 0) + sum(int(t.total_bytes) for t in transfers)
    return out
