"""The collective and point-to-point ops of a fault-tolerant group (a mixin).

Every op has the ``torch.distributed`` argument order and results, plus ``async_op``
(returns a :class:`~torchnext.distributed.work.Work`) and a per-op ``timeout``
(default ``GroupConfig.collective_timeout``). Ranks (``src``, ``dst``, ``peer``) are
ranks *in the group's current epoch*. Ops are issued straight to the epoch's backend
group from the caller's thread; the only additions on the fast path are local
argument checks and the revoke-aware wait.

Gloo lacks a few reductions and layouts; they are composed here, with the same
results as ``torch.distributed`` where it supports them: ``ReduceOp.AVG`` (sum, then
divide, floating dtypes only) and ``all_to_all`` with tensor lists (through
``all_to_all_single`` on packed buffers).
"""

from __future__ import annotations

import zlib
from collections.abc import Callable, Sequence
from datetime import timedelta
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist
from torch._C import _distributed_c10d as _c10d

from torchnext.distributed import _hooks
from torchnext.distributed.work import Work
from torchnext.errors import CollectiveMismatchError, MembershipError

if TYPE_CHECKING:
    from torchnext.distributed.group import _Epoch
    from torchnext.distributed.group_config import GroupConfig

__all__ = ["CollectivesMixin", "P2POp"]

ReduceOp = dist.ReduceOp
_SUM = ReduceOp.SUM


class P2POp:
    """One send or receive for :meth:`CollectivesMixin.batch_isend_irecv`.

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


class CollectivesMixin:
    """Collectives of :class:`~torchnext.distributed.FaultTolerantGroup`."""

    # Provided by the group.
    _epoch: _Epoch
    config: GroupConfig
    name: str
    member_id: str
    _device: torch.device
    _on_cpu: bool
    _coll_seq: int
    _p2p_seq: int
    _parent: Any

    def _check_usable(self, allow_revoked: bool = False) -> None: ...

    def _on_op_failure(self, epoch: _Epoch, reason: str, exc: BaseException | None) -> Any: ...

    # ------------------------------------------------------------------ machinery

    def _tensor(self, t: Any, arg: str) -> torch.Tensor:
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{arg} must be a torch.Tensor, got {type(t).__name__}")
        if self._on_cpu and t.is_cpu:  # one attribute read: this runs on every op
            return t
        if t.device.type != self._device.type:
            raise ValueError(
                f"{arg} is on {t.device}, but group {self.name!r} communicates on "
                f"{self._device.type} ({'gloo' if self._device.type == 'cpu' else 'nccl'}); "
                f"move it with .to({self._device.type!r}) or create the group with the matching backend"
            )
        return t

    def _rank_arg(self, value: int, arg: str) -> int:
        size = self._epoch.size
        if not isinstance(value, int) or not 0 <= value < size:
            raise MembershipError(
                f"{arg}={value!r} is not a rank of group {self.name!r} in epoch "
                f"{self._epoch.number} (ranks 0..{size - 1}); ranks are renumbered after "
                "every shrink/grow: read group.rank/group.members"
            )
        return value

    def _issue(
        self,
        op: str,
        call: Callable[[Any], Any],
        inputs: Sequence[torch.Tensor],
        outputs: Sequence[torch.Tensor],
        async_op: bool,
        timeout: timedelta | None,
        finish: Callable[[], Any] | None = None,
        is_p2p: bool = False,
        root: int = -1,
    ) -> Work | None:
        self._check_usable()
        epoch = self._epoch
        cfg = self.config
        if is_p2p:
            self._p2p_seq += 1
            seq = self._p2p_seq
        else:
            self._coll_seq += 1
            seq = self._coll_seq
            if cfg.validate:
                self._validate(epoch, op, inputs, outputs, root, timeout)
        op_timeout = timeout if timeout is not None else cfg.collective_timeout
        tokens = None
        if _hooks._observers:
            in_sizes, in_dtypes = _hooks.describe(list(inputs))
            out_sizes, out_dtypes = _hooks.describe(list(outputs))
            tokens = _hooks.op_started(
                _hooks.OpInfo(
                    group_name=f"{self.name}{epoch.sub}",
                    epoch=epoch.number,
                    seq=seq,
                    op=op,
                    rank=epoch.rank,
                    ranks=tuple(range(epoch.size)),
                    input_sizes=in_sizes,
                    input_dtypes=in_dtypes,
                    output_sizes=out_sizes,
                    output_dtypes=out_dtypes,
                    is_p2p=is_p2p,
                    timeout_ms=int(op_timeout.total_seconds() * 1000),
                )
            )
        try:
            work = call(epoch.pg)
        except RuntimeError as exc:
            err = self._on_op_failure(epoch, f"{op} could not be issued: {exc}", exc)
            _hooks.op_finished(tokens, "failed")
            raise err from exc
        if not async_op and tokens is None and epoch.revoked is None:
            # Fast path for a blocking op nobody observes: one bounded slice of waiting,
            # no handle. Anything but a clean finish (a slice that runs out, a backend
            # error) goes on through the full handle below, which sorts it out.
            # Tracked while it may block, like any op, so a retired epoch's backend group
            # is never released under it.
            epoch.pending.add(work)
            try:
                work.wait(cfg.wait_slice)
            except RuntimeError:
                pass
            else:
                epoch.pending.discard(work)
                if finish is not None:
                    finish()
                return None
        handle = Work(
            epoch, work, op, tokens, op_timeout, cfg.wait_slice, self._on_op_failure, finish
        )
        if async_op:
            return handle
        handle.wait()
        return None

    def _opts(self, cls: Any, timeout: timedelta | None, **fields: Any) -> Any:
        opts = cls()
        for k, v in fields.items():
            setattr(opts, k, v)
        if timeout is not None:
            opts.timeout = timeout
        return opts

    def _validate(
        self,
        epoch: _Epoch,
        op: str,
        inputs: Sequence[torch.Tensor],
        outputs: Sequence[torch.Tensor],
        root: int,
        timeout: timedelta | None,
    ) -> None:
        # Only the parts every rank must agree on: op, root, dtype, and the input shapes
        # for ops whose inputs must match (all but the rooted/irregular ones).
        shaped = op in ("allreduce", "broadcast", "reduce", "allgather", "reduce_scatter")
        text = f"{op}|root={root}|" + ",".join(
            f"{str(t.dtype).removeprefix('torch.')}{list(t.shape) if shaped else ''}"
            for t in list(inputs)[:1]
        )
        mine = torch.tensor([zlib.crc32(text.encode()), epoch.rank], dtype=torch.int64)
        table = [torch.zeros(2, dtype=torch.int64) for _ in range(epoch.size)]
        work = epoch.pg.allgather([table], [mine])
        Work(
            epoch,
            work,
            "validate",
            None,
            timeout or self.config.collective_timeout,
            self.config.wait_slice,
            self._on_op_failure,
        ).wait()
        codes = [int(t[0]) for t in table]
        if len(set(codes)) != 1:
            differing = [r for r, c in enumerate(codes) if c != codes[0]]
            raise CollectiveMismatchError(
                f"group {self.name!r} epoch {epoch.number}: members called different "
                f"collectives (this rank {epoch.rank}: {text}); ranks {differing} differ from "
                "rank 0 in op, root, dtype or shape. Make every member issue the same op with "
                "the same shapes and dtypes"
            )

    # ------------------------------------------------------------------ collectives

    def all_reduce(
        self,
        tensor: torch.Tensor,
        op: Any = ReduceOp.SUM,
        *,
        async_op: bool = False,
        timeout: timedelta | None = None,
    ) -> Work | None:
        """In-place reduction of ``tensor`` over all members (SUM, AVG, MIN, MAX, PRODUCT...)."""
        self._tensor(tensor, "tensor")
        # ``op is _SUM`` first: the common case, without a (slow) pybind enum comparison.
        is_sum = op is _SUM or op == ReduceOp.SUM
        finish = None
        if not is_sum and op == ReduceOp.AVG:
            if not tensor.is_floating_point() and not tensor.is_complex():
                raise ValueError(
                    f"all_reduce(op=AVG) needs a floating tensor, got {tensor.dtype}; "
                    "use SUM and divide, or convert the tensor"
                )
            size = self._epoch.size
            op, is_sum = ReduceOp.SUM, True

            def finish() -> None:
                tensor.div_(size)

        if is_sum and timeout is None:
            call: Callable[[Any], Any] = lambda pg: pg.allreduce([tensor])  # noqa: E731
        else:
            opts = self._opts(dist.AllreduceOptions, timeout, reduceOp=op)
            call = lambda pg: pg.allreduce([tensor], opts)  # noqa: E731
        return self._issue("allreduce", call, (tensor,), (tensor,), async_op, timeout, finish)

    def broadcast(
        self,
        tensor: torch.Tensor,
        src: int = 0,
        *,
        async_op: bool = False,
        timeout: timedelta | None = None,
    ) -> Work | None:
        """Copy ``tensor`` of rank ``src`` into ``tensor`` on every member."""
        self._tensor(tensor, "tensor")
        self._rank_arg(src, "src")
        opts = self._opts(dist.BroadcastOptions, timeout, rootRank=src, rootTensor=0)
        return self._issue(
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
        self._tensor(tensor, "tensor")
        self._rank_arg(dst, "dst")
        finish = None
        if op == ReduceOp.AVG:
            size, is_root = self._epoch.size, self._epoch.rank == dst
            op = ReduceOp.SUM

            def finish() -> None:
                if is_root:
                    tensor.div_(size)

        opts = self._opts(dist.ReduceOptions, timeout, reduceOp=op, rootRank=dst, rootTensor=0)
        return self._issue(
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
        self._tensor(tensor, "tensor")
        if len(tensor_list) != self._epoch.size:
            raise ValueError(
                f"all_gather: tensor_list has {len(tensor_list)} tensors; pass one per rank "
                f"({self._epoch.size})"
            )
        for i, t in enumerate(tensor_list):
            self._tensor(t, f"tensor_list[{i}]")
        opts = self._opts(_c10d.AllgatherOptions, timeout)
        return self._issue(
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
        self._tensor(output_tensor, "output_tensor")
        self._tensor(input_tensor, "input_tensor")
        size = self._epoch.size
        if output_tensor.numel() != input_tensor.numel() * size:
            raise ValueError(
                f"all_gather_into_tensor: output_tensor has {output_tensor.numel()} elements; it "
                f"needs input numel x size = {input_tensor.numel()} x {size}"
            )
        opts = self._opts(_c10d.AllgatherOptions, timeout)
        return self._issue(
            "allgather",
            lambda pg: pg._allgather_base(output_tensor, input_tensor, opts),
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
        self._tensor(output, "output")
        if len(input_list) != self._epoch.size:
            raise ValueError(
                f"reduce_scatter: input_list has {len(input_list)} tensors; pass one per rank "
                f"({self._epoch.size})"
            )
        for i, t in enumerate(input_list):
            self._tensor(t, f"input_list[{i}]")
        op, finish = self._avg_as_sum(op, output, "reduce_scatter")
        opts = self._opts(dist.ReduceScatterOptions, timeout, reduceOp=op)
        return self._issue(
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
        self._tensor(output, "output")
        self._tensor(input, "input")
        if input.numel() != output.numel() * self._epoch.size:
            raise ValueError(
                f"reduce_scatter_tensor: input has {input.numel()} elements; it needs output "
                f"numel x size = {output.numel()} x {self._epoch.size}"
            )
        op, finish = self._avg_as_sum(op, output, "reduce_scatter_tensor")
        opts = self._opts(dist.ReduceScatterOptions, timeout, reduceOp=op)
        return self._issue(
            "reduce_scatter",
            lambda pg: pg._reduce_scatter_base(output, input, opts),
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
        size = self._epoch.size
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
        self._tensor(output, "output")
        self._tensor(input, "input")
        out_splits = list(output_split_sizes or [])
        in_splits = list(input_split_sizes or [])
        for arg, splits, t in (
            ("output_split_sizes", out_splits, output),
            ("input_split_sizes", in_splits, input),
        ):
            if splits and (len(splits) != self._epoch.size or sum(splits) != t.shape[0]):
                raise ValueError(
                    f"all_to_all_single: {arg}={splits} must have one entry per rank "
                    f"({self._epoch.size}) summing to dim 0 of the tensor ({t.shape[0]})"
                )
        opts = self._opts(dist.AllToAllOptions, timeout)
        return self._issue(
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
        size = self._epoch.size
        if len(output_tensor_list) != size or len(input_tensor_list) != size:
            raise ValueError(
                f"all_to_all: pass one input and one output tensor per rank ({size}); got "
                f"{len(input_tensor_list)} inputs and {len(output_tensor_list)} outputs"
            )
        ins = [self._tensor(t, f"input_tensor_list[{i}]") for i, t in enumerate(input_tensor_list)]
        outs = [
            self._tensor(t, f"output_tensor_list[{i}]") for i, t in enumerate(output_tensor_list)
        ]
        dtype = ins[0].dtype
        if any(t.dtype != dtype for t in ins + outs):
            raise ValueError("all_to_all: every input and output tensor must have the same dtype")
        send = torch.cat([t.reshape(-1) for t in ins])
        recv = torch.empty(sum(t.numel() for t in outs), dtype=dtype, device=send.device)
        in_splits = [t.numel() for t in ins]
        out_splits = [t.numel() for t in outs]
        opts = self._opts(dist.AllToAllOptions, timeout)

        def finish() -> None:
            for t, part in zip(outs, recv.split(out_splits)):
                t.copy_(part.view_as(t))

        return self._issue(
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
        self._tensor(tensor, "tensor")
        self._rank_arg(dst, "dst")
        is_root = self._epoch.rank == dst
        if is_root:
            if gather_list is None or len(gather_list) != self._epoch.size:
                raise ValueError(
                    f"gather: rank {dst} (dst) must pass gather_list with one tensor per rank "
                    f"({self._epoch.size})"
                )
            outputs = [gather_list]
        else:
            if gather_list:
                raise ValueError("gather: only the dst rank passes gather_list")
            outputs = []
        opts = self._opts(dist.GatherOptions, timeout, rootRank=dst)
        return self._issue(
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
        self._tensor(tensor, "tensor")
        self._rank_arg(src, "src")
        if self._epoch.rank == src:
            if scatter_list is None or len(scatter_list) != self._epoch.size:
                raise ValueError(
                    f"scatter: rank {src} (src) must pass scatter_list with one tensor per rank "
                    f"({self._epoch.size})"
                )
            inputs = [scatter_list]
        else:
            if scatter_list:
                raise ValueError("scatter: only the src rank passes scatter_list")
            inputs = []
        opts = self._opts(dist.ScatterOptions, timeout, rootRank=src)
        return self._issue(
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
        opts = self._opts(dist.BarrierOptions, timeout)
        return self._issue("barrier", lambda pg: pg.barrier(opts), (), (), async_op, timeout)

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
        self._tensor(tensor, "tensor")
        self._peer(dst, "dst")
        return self._issue(
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
        self._tensor(tensor, "tensor")
        self._peer(src, "src")
        return self._issue(
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

    def _peer(self, peer: int, arg: str) -> None:
        self._rank_arg(peer, arg)
        if peer == self._epoch.rank:
            raise MembershipError(f"{arg}={peer} is this rank; point-to-point needs another rank")
