"""The point-to-point ops of a fault-tolerant group: send, recv and their batches.

Signatures follow ``torch.distributed`` (plus ``async_op`` and a per-op ``timeout``);
``dst``/``src``/``peer`` are ranks in the group's current epoch, never this rank.
:class:`PointToPoint` is a part of the group with one dependency, the
:class:`~torchnext.distributed.group.issue.OpIssuer` it is built with (shared with the
collectives, with its own sequence numbers).

What not to assume: a send completes when gloo handed the data over, not when the peer
received it; after a revoke, the peer may or may not have the data.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import timedelta
from typing import Any

import torch

from torchnext.distributed.group.issue import OpIssuer
from torchnext.distributed.group.work import Work

__all__ = ["P2POp", "PointToPoint"]


class P2POp:
    """One send or receive for :meth:`PointToPoint.batch_isend_irecv`.

    ``op`` is ``"isend"``/``"irecv"`` (or ``torch.distributed.isend``/``irecv``).
    """

    def __init__(self, op: Any, tensor: torch.Tensor, peer: int, tag: int = 0) -> None:
        name = op if isinstance(op, str) else getattr(op, "__name__", "")
        if name not in ("isend", "irecv", "send", "recv"):
            raise ValueError(f"P2POp op={op!r}: use 'isend' or 'irecv'")
        self.op = "isend" if name in ("isend", "send") else "irecv"
        self.tensor = tensor
        self.peer = peer
        self.tag = tag


class PointToPoint:
    """Send and receive of :class:`~torchnext.distributed.FaultTolerantGroup`."""

    def __init__(self, issuer: OpIssuer) -> None:
        self._p2p = issuer

    def wire_bytes(self) -> dict[str, int]:
        """Bytes this member has put on the wire so far, per op kind (``allreduce``,
        ``broadcast``, ``allgather``, ``send``...): collectives and point-to-point, across
        every epoch (shrink, grow) and split sub-group of the group.

        Modelled from each op's payload and algorithm; see :mod:`.wire` for the table.
        Add healing traffic with :func:`~torchnext.distributed.group.wire.with_heal`.
        """
        return self._p2p.wire.bytes()

    def send(
        self,
        tensor: torch.Tensor,
        dst: int,
        tag: int = 0,
        *,
        async_op: bool = False,
        timeout: timedelta | None = None,
    ) -> Work | None:
        """Send ``tensor`` to rank ``dst``."""
        self._p2p.tensor(tensor, "tensor")
        self._p2p.peer(dst, "dst")
        return self._p2p.issue(
            "send",
            lambda pg: pg.send([tensor], dst, tag),
            (tensor,),
            (),
            async_op,
            timeout,
            is_p2p=True,
        )

    def recv(
        self,
        tensor: torch.Tensor,
        src: int,
        tag: int = 0,
        *,
        async_op: bool = False,
        timeout: timedelta | None = None,
    ) -> Work | None:
        """Receive into ``tensor`` from rank ``src``."""
        self._p2p.tensor(tensor, "tensor")
        self._p2p.peer(src, "src")
        return self._p2p.issue(
            "recv",
            lambda pg: pg.recv([tensor], src, tag),
            (),
            (tensor,),
            async_op,
            timeout,
            is_p2p=True,
        )

    def isend(
        self, tensor: torch.Tensor, dst: int, tag: int = 0, *, timeout: timedelta | None = None
    ) -> Work:
        work = self.send(tensor, dst, tag, async_op=True, timeout=timeout)
        if work is None:  # pragma: no cover - async_op=True always returns a handle
            raise RuntimeError("internal error: isend returned no work")
        return work

    def irecv(
        self, tensor: torch.Tensor, src: int, tag: int = 0, *, timeout: timedelta | None = None
    ) -> Work:
        work = self.recv(tensor, src, tag, async_op=True, timeout=timeout)
        if work is None:  # pragma: no cover
            raise RuntimeError("internal error: irecv returned no work")
        return work

    def batch_isend_irecv(
        self, p2p_op_list: Sequence[Any], *, timeout: timedelta | None = None
    ) -> list[Work]:
        """Issue every send/recv of ``p2p_op_list`` (:class:`P2POp` or ``dist.P2POp``) at once."""
        if not p2p_op_list:
            raise ValueError("batch_isend_irecv: p2p_op_list is empty")
        works = []
        for item in p2p_op_list:
            op = (
                item
                if isinstance(item, P2POp)
                else P2POp(item.op, item.tensor, item.peer, getattr(item, "tag", 0) or 0)
            )
            if op.op == "isend":
                works.append(self.isend(op.tensor, op.peer, op.tag, timeout=timeout))
            else:
                works.append(self.irecv(op.tensor, op.peer, op.tag, timeout=timeout))
        return works
