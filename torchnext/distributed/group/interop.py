"""Run existing ``torch.distributed`` code (``dist.all_reduce(group=...)``, DDP) on a
fault-tolerant group.

:func:`as_process_group` returns a :class:`FaultTolerantProcessGroup`, a Python
subclass of ``torch.distributed.ProcessGroup`` whose collectives are the group's own
(revoke-aware, with the group's timeouts): pass it as ``group=`` to any
``torch.distributed`` collective, or as ``process_group=`` to
``DistributedDataParallel``. A revoke fails the pending ops of code written for plain
torch.distributed too: waits raise :class:`~torchnext.errors.CommRevokedError` and
futures (what DDP's reducer waits on) complete with it.

Do not assume one object serves every epoch: a ``ProcessGroup``'s rank and size are
fixed when it is built, so the wrapper belongs to the epoch it was made in and raises
:class:`~torchnext.errors.StaleEpochError` after a shrink or grow. Call
:func:`as_process_group` again (and rebuild DDP) after every membership change, as
you would re-create anything sized by the world.
"""

# c10d declares these methods with pybind overloads; the overrides follow the c10d
# calling convention that torch.distributed uses, which mypy cannot match to overloads.
# mypy: disable-error-code="override"
from __future__ import annotations

from datetime import timedelta
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist
import torch.futures

from torchnext.compat.distributed_internals import C10dWork, c10d_world
from torchnext.errors import StaleEpochError

if TYPE_CHECKING:
    from torchnext.distributed.group.fault_tolerant_group import FaultTolerantGroup
    from torchnext.distributed.group.work import Work

__all__ = ["FaultTolerantProcessGroup", "as_process_group"]

_UNSET_TIMEOUT_MS = 0


class _InteropWork(C10dWork):  # type: ignore[misc]
    """A c10d ``Work`` backed by fault-tolerant ops (all of them must complete)."""

    def __init__(
        self, view: FaultTolerantProcessGroup, works: list[Work], result: list[torch.Tensor]
    ) -> None:
        super().__init__()
        self._view = view
        self._ft_works = works
        self._result = result
        self._future: torch.futures.Future[list[torch.Tensor]] | None = None
        self._error: BaseException | None = None

    def wait(self, timeout: timedelta | None = None) -> bool:
        for work in self._ft_works:
            work.wait(_timeout_or_none(timeout))
        return True

    def is_completed(self) -> bool:
        return all(w.is_completed() for w in self._ft_works)

    def is_success(self) -> bool:
        return all(w.is_success() for w in self._ft_works)

    def exception(self) -> BaseException | None:
        return next((e for e in (w.exception() for w in self._ft_works) if e is not None), None)

    def get_future(self) -> torch.futures.Future[list[torch.Tensor]]:
        """A future completed off the caller's thread when every op ends or the group is
        revoked (DDP waits on it); after a failure its value is undefined: check
        ``group.is_revoked`` (see :meth:`_settle`)."""
        if self._future is not None:
            return self._future
        future: torch.futures.Future[list[torch.Tensor]] = torch.futures.Future()
        self._future = future
        if not self._ft_works:
            future.set_result(self._result)
            return future
        remaining = [len(self._ft_works)]
        errors: list[BaseException] = []

        def done(work: Work, fut: Any) -> None:
            # Runs on the backend's thread as the op completes: never wait() here (the
            # work is only marked complete after its callbacks return).
            try:
                fut.value()
                work.complete_from_callback()
            except BaseException as exc:  # noqa: BLE001 - delivered through the future
                errors.append(work.fail_from_callback(exc))
            remaining[0] -= 1
            if remaining[0] == 0:
                self._settle(errors[0] if errors else None)

        self._view._pending.add(self)
        for work in self._ft_works:
            work.native_future().add_done_callback(lambda fut, w=work: done(w, fut))
        return future

    def _settle(self, error: BaseException | None) -> None:
        future = self._future
        self._view._pending.discard(self)
        if future is None or future.done():
            return
        # A failed op completes its future *normally* (outputs undefined) and the error
        # lives in the group (``is_revoked``/``errored()``): DDP's reducer cannot take
        # a future that completes with an error (the process crashes in backward), so,
        # as in torchft, the training loop checks the group after backward and drops
        # the step. ``wait()`` still raises the typed error.
        self._error = error
        try:
            future.set_result(self._result)
        except RuntimeError:
            pass  # settled concurrently by the other path (completion vs revoke)


def _timeout_or_none(timeout: Any) -> timedelta | None:
    if timeout is None:
        return None
    if isinstance(timeout, timedelta):
        return None if timeout <= timedelta(0) else timeout
    return None


class FaultTolerantProcessGroup(dist.ProcessGroup):  # type: ignore[misc]
    """``torch.distributed.ProcessGroup`` view of one epoch of a fault-tolerant group."""

    def __init__(self, group: FaultTolerantGroup) -> None:
        super().__init__(group.rank, group.size)  # type: ignore[call-arg]
        self._group = group
        self._epoch = group.epoch
        self._rank = group.rank
        self._size = group.size
        self._pending: set[_InteropWork] = set()
        group.add_revoke_callback(self._on_revoke)

    def _on_revoke(self, error: BaseException) -> None:
        for work in list(self._pending):
            work._settle(error)

    # --- identity
    def rank(self) -> int:
        return self._rank

    def size(self) -> int:
        return self._size

    def getBackendName(self) -> str:  # noqa: N802 - c10d's name
        return "torchnext"

    def name(self) -> str:
        return "torchnext"

    @property
    def group_name(self) -> str:
        return f"torchnext:{self._group.name}:e{self._epoch}"

    # --- plumbing
    def _g(self) -> FaultTolerantGroup:
        if self._group.epoch != self._epoch:
            raise StaleEpochError(
                f"this torch.distributed view belongs to epoch {self._epoch} of group "
                f"{self._group.name!r}, which is now in epoch {self._group.epoch}; call "
                "as_process_group(group) again (and rebuild DDP) after shrink/grow"
            )
        return self._group

    @staticmethod
    def _timeout(opts: Any) -> timedelta | None:
        return _timeout_or_none(getattr(opts, "timeout", None))

    def _wrap(
        self, work: Work | list[Work | None] | None, result: list[torch.Tensor]
    ) -> _InteropWork:
        works = work if isinstance(work, list) else [work]
        return _InteropWork(self, [w for w in works if w is not None], result)

    # --- collectives (c10d signatures)
    def allreduce(self, tensors: list[torch.Tensor], opts: Any = None) -> _InteropWork:
        op = getattr(opts, "reduceOp", dist.ReduceOp.SUM)
        works = [
            self._g().all_reduce(t, op, async_op=True, timeout=self._timeout(opts)) for t in tensors
        ]
        return self._wrap(works, tensors)

    def broadcast(self, tensors: list[torch.Tensor], opts: Any = None) -> _InteropWork:
        src = int(getattr(opts, "rootRank", 0))
        works = [
            self._g().broadcast(t, src, async_op=True, timeout=self._timeout(opts)) for t in tensors
        ]
        return self._wrap(works, tensors)

    def reduce(self, tensors: list[torch.Tensor], opts: Any = None) -> _InteropWork:
        dst = int(getattr(opts, "rootRank", 0))
        op = getattr(opts, "reduceOp", dist.ReduceOp.SUM)
        work = self._g().reduce(tensors[0], dst, op, async_op=True, timeout=self._timeout(opts))
        return self._wrap(work, tensors)

    def allgather(
        self,
        output_tensors: list[list[torch.Tensor]],
        input_tensors: list[torch.Tensor],
        opts: Any = None,
    ) -> _InteropWork:
        work = self._g().all_gather(
            output_tensors[0], input_tensors[0], async_op=True, timeout=self._timeout(opts)
        )
        return self._wrap(work, output_tensors[0])

    def _allgather_base(
        self, output: torch.Tensor, input: torch.Tensor, opts: Any = None
    ) -> _InteropWork:
        work = self._g().all_gather_into_tensor(
            output, input, async_op=True, timeout=self._timeout(opts)
        )
        return self._wrap(work, [output])

    def reduce_scatter(
        self,
        output_tensors: list[torch.Tensor],
        input_tensors: list[list[torch.Tensor]],
        opts: Any = None,
    ) -> _InteropWork:
        op = getattr(opts, "reduceOp", dist.ReduceOp.SUM)
        work = self._g().reduce_scatter(
            output_tensors[0], input_tensors[0], op, async_op=True, timeout=self._timeout(opts)
        )
        return self._wrap(work, output_tensors)

    def _reduce_scatter_base(
        self, output: torch.Tensor, input: torch.Tensor, opts: Any = None
    ) -> _InteropWork:
        op = getattr(opts, "reduceOp", dist.ReduceOp.SUM)
        work = self._g().reduce_scatter_tensor(
            output, input, op, async_op=True, timeout=self._timeout(opts)
        )
        return self._wrap(work, [output])

    def alltoall_base(
        self,
        output: torch.Tensor,
        input: torch.Tensor,
        output_split_sizes: list[int],
        input_split_sizes: list[int],
        opts: Any = None,
    ) -> _InteropWork:
        work = self._g().all_to_all_single(
            output,
            input,
            output_split_sizes or None,
            input_split_sizes or None,
            async_op=True,
            timeout=self._timeout(opts),
        )
        return self._wrap(work, [output])

    def gather(
        self,
        output_tensors: list[list[torch.Tensor]],
        input_tensors: list[torch.Tensor],
        opts: Any = None,
    ) -> _InteropWork:
        dst = int(getattr(opts, "rootRank", 0))
        gather_list = output_tensors[0] if output_tensors else None
        work = self._g().gather(
            input_tensors[0], gather_list, dst, async_op=True, timeout=self._timeout(opts)
        )
        return self._wrap(work, gather_list or [])

    def scatter(
        self,
        output_tensors: list[torch.Tensor],
        input_tensors: list[list[torch.Tensor]],
        opts: Any = None,
    ) -> _InteropWork:
        src = int(getattr(opts, "rootRank", 0))
        scatter_list = input_tensors[0] if input_tensors else None
        work = self._g().scatter(
            output_tensors[0], scatter_list, src, async_op=True, timeout=self._timeout(opts)
        )
        return self._wrap(work, output_tensors)

    def barrier(self, opts: Any = None) -> _InteropWork:
        return self._wrap(self._g().barrier(async_op=True, timeout=self._timeout(opts)), [])

    def send(self, tensors: list[torch.Tensor], dst: int, tag: int = 0) -> _InteropWork:
        return self._wrap(self._g().send(tensors[0], dst, tag, async_op=True), tensors)

    def recv(self, tensors: list[torch.Tensor], src: int, tag: int = 0) -> _InteropWork:
        return self._wrap(self._g().recv(tensors[0], src, tag, async_op=True), tensors)


def as_process_group(group: FaultTolerantGroup) -> FaultTolerantProcessGroup:
    """A ``torch.distributed.ProcessGroup`` for ``group``'s current epoch (see module doc).

    Ranks passed to ``torch.distributed`` functions with this group are group ranks:
    use ``group_src=``/``group_dst=`` where those functions take global ranks, or the
    same number (the view has no separate global numbering).
    """
    view = FaultTolerantProcessGroup(group)
    # Let torch.distributed helpers that look a group up (get_process_group_ranks,
    # get_global_rank, the src= of broadcast) treat group ranks as global ranks.
    world = c10d_world()
    world.pg_group_ranks[view] = {r: r for r in range(group.size)}
    world.pg_names[view] = view.group_name  # type: ignore[assignment]
    return view
