"""The collectives of a fault-tolerant group, with ``torch.distributed``'s signatures.

Every op has the ``torch.distributed`` argument order and results, plus ``async_op``
(returns a :class:`~torchnext.distributed.group.work.Work`) and a per-op ``timeout``
(default ``GroupConfig.collective_timeout``). Ranks (``src``, ``dst``) are ranks *in
the group's current epoch*. Ops are issued straight to the epoch's backend group from
the caller's thread through an :class:`~torchnext.distributed.group.issue.OpIssuer`,
the only state :class:`Collectives` has; the only additions on the fast path are local
argument checks and the revoke-aware wait.

Gloo lacks a few reductions and layouts; they are composed here, with the same
results as ``torch.distributed`` where it supports them: ``ReduceOp.AVG`` (sum, then
divide, floating dtypes only) and ``all_to_all`` with tensor lists (through
``all_to_all_single`` on packed buffers).

What not to assume: output tensors of a failed or revoked op hold undefined values.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from torchnext.compat.distributed_internals import (
    AllgatherOptions,
    allgather_base,
    reduce_scatter_base,
)
from torchnext.distributed.group.issue import OpIssuer
from torchnext.distributed.group.p2p import P2POp
from torchnext.distributed.group.work import Work

__all__ = ["Collectives", "P2POp"]

ReduceOp = dist.ReduceOp
_SUM = ReduceOp.SUM


class Collectives:
    """The collectives of :class:`~torchnext.distributed.FaultTolerantGroup`.

    A part of the group with one dependency, the :class:`OpIssuer` it is built with.
    """

    def __init__(self, issuer: OpIssuer) -> None:
        self._coll = issuer

    def all_reduce(
        self,
        tensor: torch.Tensor,
        op: Any = ReduceOp.SUM,
        *,
        async_op: bool = False,
        timeout: timedelta | None = None,
    ) -> Work | None:
        """In-place reduction of ``tensor`` over all members (SUM, AVG, MIN, MAX, PRODUCT...)."""
        self._coll.tensor(tensor, "tensor")
        # ``op is _SUM`` first: the common case, without a (slow) pybind enum comparison.
        is_sum = op is _SUM or op == ReduceOp.SUM
        finish = None
        if not is_sum and op == ReduceOp.AVG:
            if not tensor.is_floating_point() and not tensor.is_complex():
                raise ValueError(
                    f"all_reduce(op=AVG) needs a floating tensor, got {tensor.dtype}; "
                    "use SUM and divide, or convert the tensor"
                )
            size = self._coll.epoch.size
            op, is_sum = ReduceOp.SUM, True

            def finish() -> None:
                tensor.div_(size)

        if is_sum and timeout is None:
            call: Callable[[Any], Any] = lambda pg: pg.allreduce([tensor])  # noqa: E731
        else:
            opts = self._coll.opts(dist.AllreduceOptions, timeout, reduceOp=op)
            call = lambda pg: pg.allreduce([tensor], opts)  # noqa: E731
        return self._coll.issue("allreduce", call, (tensor,), (tensor,), async_op, timeout, finish)

    def broadcast(
        self,
        tensor: torch.Tensor,
        src: int = 0,
        *,
        async_op: bool = False,
        timeout: timedelta | None = None,
    ) -> Work | None:
        """Copy ``tensor`` of rank ``src`` into ``tensor`` on every member."""
        self._coll.tensor(tensor, "tensor")
        self._coll.rank_arg(src, "src")
        opts = self._coll.opts(dist.BroadcastOptions, timeout, rootRank=src, rootTensor=0)
        return self._coll.issue(
            "broadcast",
            lambda pg: pg.broadcast([tensor], opts),
            (tensor,),
            (tensor,),
            async_op,
            timeout,
            root=src,
        )

    def reduce(
        self,
        tensor: torch.Tensor,
        dst: int = 0,
        op: Any = ReduceOp.SUM,
        *,
        async_op: bool = False,
        timeout: timedelta | None = None,
    ) -> Work | None:
        """Reduce into ``tensor`` of rank ``dst`` (other ranks' tensors are unspecified after)."""
        self._coll.tensor(tensor, "tensor")
        self._coll.rank_arg(dst, "dst")
        finish = None
        if op == ReduceOp.AVG:
            size, is_root = self._coll.epoch.size, self._coll.epoch.rank == dst
            op = ReduceOp.SUM

            def finish() -> None:
                if is_root:
                    tensor.div_(size)

        opts = self._coll.opts(dist.ReduceOptions, timeout, reduceOp=op, rootRank=dst, rootTensor=0)
        return self._coll.issue(
            "reduce",
            lambda pg: pg.reduce([tensor], opts),
            (tensor,),
            (tensor,),
            async_op,
            timeout,
            finish,
            root=dst,
        )

    def all_gather(
        self,
        tensor_list: list[torch.Tensor],
        tensor: torch.Tensor,
        *,
        async_op: bool = False,
        timeout: timedelta | None = None,
    ) -> Work | None:
        """Gather ``tensor`` of every member into ``tensor_list`` (one tensor per rank)."""
        self._coll.tensor(tensor, "tensor")
        if len(tensor_list) != self._coll.epoch.size:
            raise ValueError(
                f"all_gather: tensor_list has {len(tensor_list)} tensors; pass one per rank "
                f"({self._coll.epoch.size})"
            )
        for i, t in enumerate(tensor_list):
            self._coll.tensor(t, f"tensor_list[{i}]")
        opts = self._coll.opts(AllgatherOptions, timeout)
        return self._coll.issue(
            "allgather",
            lambda pg: pg.allgather([tensor_list], [tensor], opts),
            (tensor,),
            tensor_list,
            async_op,
            timeout,
        )

    def all_gather_into_tensor(
        self,
        output_tensor: torch.Tensor,
        input_tensor: torch.Tensor,
        *,
        async_op: bool = False,
        timeout: timedelta | None = None,
    ) -> Work | None:
        """Gather every member's ``input_tensor`` into ``output_tensor`` (concatenated on dim 0)."""
        self._coll.tensor(output_tensor, "output_tensor")
        self._coll.tensor(input_tensor, "input_tensor")
        size = self._coll.epoch.size
        if output_tensor.numel() != input_tensor.numel() * size:
            raise ValueError(
                f"all_gather_into_tensor: output_tensor has {output_tensor.numel()} elements; it "
                f"needs input numel x size = {input_tensor.numel()} x {size}"
            )
        opts = self._coll.opts(AllgatherOptions, timeout)
        return self._coll.issue(
            "allgather",
            lambda pg: allgather_base(pg, output_tensor, input_tensor, opts),
            (input_tensor,),
            (output_tensor,),
            async_op,
            timeout,
        )

    def reduce_scatter(
        self,
        output: torch.Tensor,
        input_list: list[torch.Tensor],
        op: Any = ReduceOp.SUM,
        *,
        async_op: bool = False,
        timeout: timedelta | None = None,
    ) -> Work | None:
        """Reduce ``input_list`` (one tensor per rank) and keep this rank's part in ``output``."""
        self._coll.tensor(output, "output")
        if len(input_list) != self._coll.epoch.size:
            raise ValueError(
                f"reduce_scatter: input_list has {len(input_list)} tensors; pass one per rank "
                f"({self._coll.epoch.size})"
            )
        for i, t in enumerate(input_list):
            self._coll.tensor(t, f"input_list[{i}]")
        op, finish = self._avg_as_sum(op, output, "reduce_scatter")
        opts = self._coll.opts(dist.ReduceScatterOptions, timeout, reduceOp=op)
        return self._coll.issue(
            "reduce_scatter",
            lambda pg: pg.reduce_scatter([output], [input_list], opts),
            input_list,
            (output,),
            async_op,
            timeout,
            finish,
        )

    def reduce_scatter_tensor(
        self,
        output: torch.Tensor,
        input: torch.Tensor,
        op: Any = ReduceOp.SUM,
        *,
        async_op: bool = False,
        timeout: timedelta | None = None,
    ) -> Work | None:
        """Reduce ``input`` (size x output numel) and keep this rank's chunk in ``output``."""
        self._coll.tensor(output, "output")
        self._coll.tensor(input, "input")
        if input.numel() != output.numel() * self._coll.epoch.size:
            raise ValueError(
                f"reduce_scatter_tensor: input has {input.numel()} elements; it needs output "
                f"numel x size = {output.numel()} x {self._coll.epoch.size}"
            )
        op, finish = self._avg_as_sum(op, output, "reduce_scatter_tensor")
        opts = self._coll.opts(dist.ReduceScatterOptions, timeout, reduceOp=op)
        return self._coll.issue(
            "reduce_scatter",
            lambda pg: reduce_scatter_base(pg, output, input, opts),
            (input,),
            (output,),
            async_op,
            timeout,
            finish,
        )

    def _avg_as_sum(
        self, op: Any, output: torch.Tensor, name: str
    ) -> tuple[Any, Callable[[], Any] | None]:
        # Gloo has no AVG: sum, then divide the result (floating dtypes only).
        if op != ReduceOp.AVG:
            return op, None
        if not output.is_floating_point() and not output.is_complex():
            raise ValueError(
                f"{name}(op=AVG) needs a floating tensor, got {output.dtype}; use SUM and divide"
            )
        size = self._coll.epoch.size
        return ReduceOp.SUM, lambda: output.div_(size)

    def all_to_all_single(
        self,
        output: torch.Tensor,
        input: torch.Tensor,
        output_split_sizes: Sequence[int] | None = None,
        input_split_sizes: Sequence[int] | None = None,
        *,
        async_op: bool = False,
        timeout: timedelta | None = None,
    ) -> Work | None:
        """Scatter slices of ``input`` (dim 0, optionally uneven) and gather into ``output``."""
        self._coll.tensor(output, "output")
        self._coll.tensor(input, "input")
        out_splits = list(output_split_sizes or [])
        in_splits = list(input_split_sizes or [])
        for arg, splits, t in (
            ("output_split_sizes", out_splits, output),
            ("input_split_sizes", in_splits, input),
        ):
            if splits and (len(splits) != self._coll.epoch.size or sum(splits) != t.shape[0]):
                raise ValueError(
                    f"all_to_all_single: {arg}={splits} must have one entry per rank "
                    f"({self._coll.epoch.size}) summing to dim 0 of the tensor ({t.shape[0]})"
                )
        opts = self._coll.opts(dist.AllToAllOptions, timeout)
        return self._coll.issue(
            "all_to_all",
            lambda pg: pg.alltoall_base(output, input, out_splits, in_splits, opts),
            (input,),
            (output,),
            async_op,
            timeout,
        )

    def all_to_all(
        self,
        output_tensor_list: list[torch.Tensor],
        input_tensor_list: list[torch.Tensor],
        *,
        async_op: bool = False,
        timeout: timedelta | None = None,
    ) -> Work | None:
        """Send ``input_tensor_list[i]`` to rank i; receive rank i's into ``output_tensor_list[i]``."""
        size = self._coll.epoch.size
        if len(output_tensor_list) != size or len(input_tensor_list) != size:
            raise ValueError(
                f"all_to_all: pass one input and one output tensor per rank ({size}); got "
                f"{len(input_tensor_list)} inputs and {len(output_tensor_list)} outputs"
            )
        ins = [
            self._coll.tensor(t, f"input_tensor_list[{i}]") for i, t in enumerate(input_tensor_list)
        ]
        outs = [
            self._coll.tensor(t, f"output_tensor_list[{i}]")
            for i, t in enumerate(output_tensor_list)
        ]
        dtype = ins[0].dtype
        if any(t.dtype != dtype for t in ins + outs):
            raise ValueError("all_to_all: every input and output tensor must have the same dtype")
        send = torch.cat([t.reshape(-1) for t in ins])
        recv = torch.empty(sum(t.numel() for t in outs), dtype=dtype, device=send.device)
        in_splits = [t.numel() for t in ins]
        out_splits = [t.numel() for t in outs]
        opts = self._coll.opts(dist.AllToAllOptions, timeout)

        def finish() -> None:
            for t, part in zip(outs, recv.split(out_splits), strict=True):
                t.copy_(part.view_as(t))

        return self._coll.issue(
            "all_to_all",
            lambda pg: pg.alltoall_base(recv, send, out_splits, in_splits, opts),
            ins,
            outs,
            async_op,
            timeout,
            finish,
        )

    def gather(
        self,
        tensor: torch.Tensor,
        gather_list: list[torch.Tensor] | None = None,
        dst: int = 0,
        *,
        async_op: bool = False,
        timeout: timedelta | None = None,
    ) -> Work | None:
        """Collect every member's ``tensor`` into ``gather_list`` on rank ``dst``."""
        self._coll.tensor(tensor, "tensor")
        self._coll.rank_arg(dst, "dst")
        is_root = self._coll.epoch.rank == dst
        if is_root:
            if gather_list is None or len(gather_list) != self._coll.epoch.size:
                raise ValueError(
                    f"gather: rank {dst} (dst) must pass gather_list with one tensor per rank "
                    f"({self._coll.epoch.size})"
                )
            outputs = [gather_list]
        else:
            if gather_list:
                raise ValueError("gather: only the dst rank passes gather_list")
            outputs = []
        opts = self._coll.opts(dist.GatherOptions, timeout, rootRank=dst)
        return self._coll.issue(
            "gather",
            lambda pg: pg.gather(outputs, [tensor], opts),
            (tensor,),
            gather_list or [],
            async_op,
            timeout,
            root=dst,
        )

    def scatter(
        self,
        tensor: torch.Tensor,
        scatter_list: list[torch.Tensor] | None = None,
        src: int = 0,
        *,
        async_op: bool = False,
        timeout: timedelta | None = None,
    ) -> Work | None:
        """Rank ``src`` sends ``scatter_list[i]`` to rank i, received into ``tensor``."""
        self._coll.tensor(tensor, "tensor")
        self._coll.rank_arg(src, "src")
        if self._coll.epoch.rank == src:
            if scatter_list is None or len(scatter_list) != self._coll.epoch.size:
                raise ValueError(
                    f"scatter: rank {src} (src) must pass scatter_list with one tensor per rank "
                    f"({self._coll.epoch.size})"
                )
            inputs = [scatter_list]
        else:
            if scatter_list:
                raise ValueError("scatter: only the src rank passes scatter_list")
            inputs = []
        opts = self._coll.opts(dist.ScatterOptions, timeout, rootRank=src)
        return self._coll.issue(
            "scatter",
            lambda pg: pg.scatter([tensor], inputs, opts),
            scatter_list or [],
            (tensor,),
            async_op,
            timeout,
            root=src,
        )

    def barrier(self, *, async_op: bool = False, timeout: timedelta | None = None) -> Work | None:
        """Block until every member reached the barrier."""
        opts = self._coll.opts(dist.BarrierOptions, timeout)
        return self._coll.issue("barrier", lambda pg: pg.barrier(opts), (), (), async_op, timeout)
