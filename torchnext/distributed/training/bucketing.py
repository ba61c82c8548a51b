"""Gradient all-reduce in buckets, launched from backward hooks so it overlaps compute.

Use :class:`GradBucketer` (the training :class:`~torchnext.distributed.manager.Manager`
does) to sum gradients over data-parallel members while the backward pass is still
running: parameters are grouped into buckets of about ``bucket_cap_bytes`` in reverse
registration order (roughly the order backward produces their gradients); when every
gradient of a bucket has been accumulated (``register_post_accumulate_grad_hook``),
the bucket is flattened and its all-reduce issued asynchronously, so communication of
late layers hides behind the backward of early ones, as DDP and 2.14's Inductor
overlap do.

Buckets are always *launched in index order* (a ready bucket waits for the ones
before it), so every member issues the same collectives in the same order even if
hook timing differs. Parameters that got no gradient in a step contribute zeros when
:meth:`GradBucketer.finish` flushes the remaining buckets.

A step whose group failed while it computes is cut short: inside
:meth:`GradBucketer.interruptible`, the next gradient hook (or, with ``modules``, the
next module's forward) raises :class:`StepInterrupted`, which the block swallows, and
:meth:`finish` raises the failure. Survivors so reach the recovery a layer after the
failure is known instead of a whole forward and backward later.

What not to assume: the reduction is a SUM (scale the loss so the sum is the mean you
want: see ``ElasticSampler.loss_scale``); gradients are copied back into ``p.grad``
only by :meth:`finish`; after a failure call :meth:`abandon` and redo the step.

Legend: ``flat_F`` is a bucket's flattened gradient buffer of F elements.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, Protocol

import torch

from torchnext.errors import CommError, CommTimeoutError

__all__ = ["GradBucketer", "Work", "AllReduceFn", "StepInterrupted"]


class StepInterrupted(Exception):
    """Raised by a hook inside :meth:`GradBucketer.interruptible` once the group failed."""


class Work(Protocol):
    def wait(self, timeout: timedelta | None = ...) -> Any: ...


AllReduceFn = Callable[[torch.Tensor], Work]
"""Issues an asynchronous in-place SUM all-reduce of one tensor; returns its work handle."""


@dataclass
class _Bucket:
    params: list[torch.nn.Parameter]
    flat_F: torch.Tensor
    ready: set[int] = field(default_factory=set)
    work: Work | None = None
    launched_at: float = 0.0


class GradBucketer:
    """Owns the buckets and hooks of one model's parameters (see the module docstring)."""

    def __init__(
        self,
        params: Sequence[torch.nn.Parameter],
        all_reduce: AllReduceFn,
        *,
        bucket_cap_bytes: int = 25 * 1024 * 1024,
        failed: Callable[[], bool] | None = None,
        modules: Iterable[torch.nn.Module] = (),
    ) -> None:
        """``failed()`` says the step's group failed (checked by the hooks inside
        :meth:`interruptible`); ``modules`` also get a forward check."""
        if bucket_cap_bytes <= 0:
            raise ValueError(f"GradBucketer: bucket_cap_bytes={bucket_cap_bytes} must be positive.")
        trainable = [p for p in params if p.requires_grad]
        if not trainable:
            raise ValueError("GradBucketer: no parameter requires grad; nothing to all-reduce.")
        self.all_reduce = all_reduce
        self.buckets: list[_Bucket] = []
        current: list[torch.nn.Parameter] = []
        size = 0
        for p in reversed(trainable):
            nbytes = p.numel() * p.element_size()
            same_kind = not current or (
                current[0].dtype == p.dtype and current[0].device == p.device
            )
            if current and (size + nbytes > bucket_cap_bytes or not same_kind):
                self._add_bucket(current)
                current, size = [], 0
            current.append(p)
            size += nbytes
        if current:
            self._add_bucket(current)
        self._where: dict[int, tuple[int, int]] = {}
        for b_idx, bucket in enumerate(self.buckets):
            for p_idx, p in enumerate(bucket.params):
                self._where[id(p)] = (b_idx, p_idx)
        self._next_launch = 0
        self.error: BaseException | None = None
        """First error of issuing an all-reduce this step; :meth:`finish` raises it."""
        self.enabled = True
        self.overlap_s = 0.0
        """Seconds between the first launch and :meth:`finish` in the last step (hidden comm)."""
        self.failed = failed
        self._watching = False
        self._handles = [p.register_post_accumulate_grad_hook(self._on_grad) for p in trainable]
        if failed is not None:
            self._handles += [m.register_forward_pre_hook(self._on_forward) for m in modules]

    def _add_bucket(self, params: list[torch.nn.Parameter]) -> None:
        numel = sum(p.numel() for p in params)
        flat = torch.zeros(numel, dtype=params[0].dtype, device=params[0].device)
        self.buckets.append(_Bucket(params=params, flat_F=flat))

    # ------------------------------------------------------------------ hooks

    @contextlib.contextmanager
    def interruptible(self) -> Iterator[None]:
        """The step's compute; cut short (silently) once ``failed()`` (see the module docstring)."""
        self._watching = self.failed is not None
        try:
            yield
        except StepInterrupted:
            pass  # finish() raises the failure recorded in self.error
        finally:
            self._watching = False

    def _check_failed(self) -> None:
        if self._watching and self.failed is not None and self.failed():
            self._watching = False  # once: the rest of this step runs to its end, unwatched
            if self.error is None:
                self.error = CommError("the group failed during this step's compute")
            raise StepInterrupted(str(self.error))

    def _on_forward(self, module: torch.nn.Module, args: Any) -> None:
        self._check_failed()

    def _on_grad(self, p: torch.Tensor) -> None:
        if not self.enabled:
            return
        self._check_failed()
        b_idx, p_idx = self._where[id(p)]
        self.buckets[b_idx].ready.add(p_idx)
        self._launch_ready()

    def _launch_ready(self, *, force: bool = False) -> None:
        while self._next_launch < len(self.buckets):
            bucket = self.buckets[self._next_launch]
            if not force and len(bucket.ready) < len(bucket.params):
                return
            self._launch(bucket)
            self._next_launch += 1

    def _launch(self, bucket: _Bucket) -> None:
        offset = 0
        with torch.no_grad():
            for p in bucket.params:
                n = p.numel()
                view = bucket.flat_F[offset : offset + n]
                if p.grad is None:
                    view.zero_()
                else:
                    view.copy_(p.grad.reshape(-1))
                offset += n
        bucket.launched_at = time.monotonic()
        if self.error is not None:
            return
        try:
            bucket.work = self.all_reduce(bucket.flat_F)
        except Exception as exc:  # noqa: BLE001 - raised from finish(), never inside backward
            self.error = exc

    # ------------------------------------------------------------------ step end

    def finish(self, timeout: timedelta) -> None:
        """Flush unlaunched buckets, wait for every all-reduce, write sums into ``p.grad``."""
        self._launch_ready(force=True)
        if self.error is not None:
            error = self.error
            self._reset()
            raise error
        first = min(
            (b.launched_at for b in self.buckets if b.work is not None), default=time.monotonic()
        )
        self.overlap_s = max(0.0, time.monotonic() - first)
        deadline = time.monotonic() + timeout.total_seconds()
        for bucket in self.buckets:
            left = deadline - time.monotonic()
            if left <= 0:
                raise CommTimeoutError(
                    f"gradient all-reduce did not finish within {timeout}; a member is slow or gone."
                )
            if bucket.work is not None:
                bucket.work.wait(timedelta(seconds=left))
        with torch.no_grad():
            for bucket in self.buckets:
                offset = 0
                for p in bucket.params:
                    n = p.numel()
                    view = bucket.flat_F[offset : offset + n].view_as(p)
                    if p.grad is None:
                        p.grad = view.clone()
                    else:
                        p.grad.copy_(view)
                    offset += n
        self._reset()

    def abandon(self) -> None:
        """Forget this step's launches (after a failure); the step will be redone."""
        self._reset()

    def _reset(self) -> None:
        for bucket in self.buckets:
            bucket.ready.clear()
            bucket.work = None
        self._next_launch = 0
        self.error = None

    def remove(self) -> None:
        """Detach the hooks (the model goes back to plain local gradients)."""
        for handle in self._handles:
            handle.remove()
        self._handles = []
