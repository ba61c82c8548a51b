"""Issuing one op of a fault-tolerant group: checks, sequence numbers, hooks, the wait.

:class:`OpIssuer` is the seam between the ops (:mod:`.collectives`, :mod:`.p2p`) and
the group that owns them (:mod:`.fault_tolerant_group`). The group creates one
issuer, keeps :attr:`OpIssuer.epoch` pointing at its current epoch, and hands it to
both op families; they never see the group. An op goes: argument checks
(:meth:`OpIssuer.tensor`, :meth:`OpIssuer.rank_arg`, :meth:`OpIssuer.peer`), then
:meth:`OpIssuer.issue`, which numbers it, tells the observers
(:mod:`.hooks`), calls the backend from the caller's thread and waits on it in
revocable slices (:class:`~torchnext.distributed.group.work.Work`).

What not to assume: the issuer is not thread-safe (neither is a ``torch.distributed``
group: ops of one group must be issued in the same order on every member, so from one
thread); ``epoch`` may change between two ops (after a shrink or grow).
"""

from __future__ import annotations

import zlib
from collections.abc import Callable, Sequence
from datetime import timedelta
from typing import Any

import torch

from torchnext.distributed.group import hooks
from torchnext.distributed.group.config import GroupConfig
from torchnext.distributed.group.epoch import Epoch
from torchnext.distributed.group.wire import WireCounters
from torchnext.distributed.group.work import Work
from torchnext.errors import CollectiveMismatchError, CommRevokedError, MembershipError

__all__ = ["OnOpFailure", "OpIssuer"]

OnOpFailure = Callable[[Epoch, str, "BaseException | None"], CommRevokedError]
"""Revoke ``epoch`` because an op failed locally (reason, backend error); the revoke."""


class OpIssuer:
    """Checks and issues the ops of one group; see the module docstring.

    ``check_usable()`` raises when the group is shut down, evicted or (unless the op
    allows it) revoked; ``on_failure`` revokes an epoch after a local op failure.
    """

    __slots__ = (
        "name",
        "config",
        "device",
        "on_cpu",
        "epoch",
        "coll_seq",
        "p2p_seq",
        "check_usable",
        "on_failure",
        "wire",
    )

    def __init__(
        self,
        *,
        name: str,
        config: GroupConfig,
        device: torch.device,
        check_usable: Callable[[], None],
        on_failure: OnOpFailure,
        wire: WireCounters | None = None,
    ) -> None:
        self.name = name
        """The group's name, for messages and the observers."""
        self.config = config
        self.device = device
        """Where the group communicates (``cpu`` for gloo, the CUDA device for NCCL)."""
        self.on_cpu = device.type == "cpu"
        self.epoch: Epoch | Any = None
        """The epoch ops run in; the group sets it whenever it opens one."""
        self.coll_seq = 0
        """Collectives issued so far (the observers' sequence number)."""
        self.p2p_seq = 0
        self.check_usable = check_usable
        self.on_failure = on_failure
        self.wire = wire if wire is not None else WireCounters()
        """Bytes this member's ops put on the wire (:mod:`.wire`); shared with split children."""

    # ------------------------------------------------------------------ checks

    def tensor(self, t: Any, arg: str) -> torch.Tensor:
        """``t`` if it is a tensor on the group's device; else a clear error naming ``arg``."""
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{arg} must be a torch.Tensor, got {type(t).__name__}")
        if self.on_cpu and t.is_cpu:  # one attribute read: this runs on every op
            return t
        if t.device.type != self.device.type:
            kind = self.device.type
            raise ValueError(
                f"{arg} is on {t.device}, but group {self.name!r} communicates on "
                f"{kind} ({'gloo' if kind == 'cpu' else 'nccl'}); move it with "
                f".to({kind!r}) or create the group with the matching backend"
            )
        return t

    def rank_arg(self, value: int, arg: str) -> int:
        """``value`` if it is a rank of the current epoch."""
        size = self.epoch.size
        if not isinstance(value, int) or not 0 <= value < size:
            raise MembershipError(
                f"{arg}={value!r} is not a rank of group {self.name!r} in epoch "
                f"{self.epoch.number} (ranks 0..{size - 1}); ranks are renumbered after "
                "every shrink/grow: read group.rank/group.members"
            )
        return value

    def peer(self, peer: int, arg: str) -> None:
        """Raise unless ``peer`` is another rank of the current epoch."""
        self.rank_arg(peer, arg)
        if peer == self.epoch.rank:
            raise MembershipError(f"{arg}={peer} is this rank; point-to-point needs another rank")

    @staticmethod
    def opts(cls: Any, timeout: timedelta | None, **fields: Any) -> Any:
        """A backend options object of type ``cls`` with ``fields`` and ``timeout`` set."""
        opts = cls()
        for k, v in fields.items():
            setattr(opts, k, v)
        if timeout is not None:
            opts.timeout = timeout
        return opts

    # ------------------------------------------------------------------ issue

    def issue(
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
        """Run ``call(native_group)`` as op ``op``; a :class:`Work` if ``async_op``.

        ``finish`` runs once the op completed (e.g. the division of a composed AVG).
        """
        self.check_usable()
        epoch = self.epoch
        cfg = self.config
        self.wire.count(op, size=epoch.size, rank=epoch.rank, root=root, inputs=inputs)
        if is_p2p:
            self.p2p_seq += 1
            seq = self.p2p_seq
        else:
            self.coll_seq += 1
            seq = self.coll_seq
            if cfg.validate:
                self.validate(epoch, op, inputs, root, timeout)
        op_timeout = timeout if timeout is not None else cfg.collective_timeout
        tokens = None
        if hooks.observers:
            in_sizes, in_dtypes = hooks.describe(list(inputs))
            out_sizes, out_dtypes = hooks.describe(list(outputs))
            tokens = hooks.op_started(
                hooks.OpInfo(
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
            err = self.on_failure(epoch, f"{op} could not be issued: {exc}", exc)
            hooks.op_finished(tokens, "failed")
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
        handle = Work(epoch, work, op, tokens, op_timeout, cfg.wait_slice, self.on_failure, finish)
        if async_op:
            return handle
        handle.wait()
        return None

    def validate(
        self,
        epoch: Epoch,
        op: str,
        inputs: Sequence[torch.Tensor],
        root: int,
        timeout: timedelta | None,
    ) -> None:
        """``GroupConfig.validate``: raise unless every member issues the same op now."""
        # Only the parts every rank must agree on: op, root, dtype, and the input shapes
        # for ops whose inputs must match (all but the rooted/irregular ones).
        shaped = op in ("allreduce", "broadcast", "reduce", "allgather", "reduce_scatter")
        text = f"{op}|root={root}|" + ",".join(
            f"{str(t.dtype).removeprefix('torch.')}{list(t.shape) if shaped else ''}"
            for t in list(inputs)[:1]
        )
        mine = torch.tensor([zlib.crc32(text.encode()), epoch.rank], dtype=torch.int64)
        table = [torch.zeros(2, dtype=torch.int64) for _ in range(epoch.size)]
        self.wire.add("validate", size=epoch.size, rank=epoch.rank, root=-1, in_bytes=0)
        work = epoch.pg.allgather([table], [mine])
        Work(
            epoch,
            work,
            "validate",
            None,
            timeout or self.config.collective_timeout,
            self.config.wait_slice,
            self.on_failure,
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
