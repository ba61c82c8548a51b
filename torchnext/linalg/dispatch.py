"""Route selection and CPU batch splitting for ``torchnext.linalg``.

When to use: every public function asks :func:`choose` which implementation to run
for its (op, device, dtype, n, batch), and runs LAPACK-backed routes through
:func:`run_batch_split`, which cuts a large CPU batch into contiguous chunks and runs
them on a small thread pool. torch's batched CPU linalg loops over the batch on one
thread and MKL cannot parallelise inside a 4x4..32x32 call, so 2 threads give only
0.8-1.3x; LAPACK releases the GIL, so chunks on Python threads scale ~1.7-2x.

What not to assume: the crossovers below were measured on a 2-core AVX2 x86 VM
(batch 16384); on other CPUs the unrolled-Jacobi limits may move by a size or two.
With one thread (``torch.get_num_threads() == 1`` or ``TORCHNEXT_LINALG_THREADS=1``)
nothing is split and the LAPACK route is a direct ``torch.linalg`` call.

Shape legend: ``B`` flattened batch.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Literal, TypeVar

import torch

from torchnext._env import TORCHNEXT_LINALG_THREADS

__all__ = ["Route", "choose", "threads_for", "run_batch_split", "run_batch_split_into", "MIN_CHUNK"]

Route = Literal["unrolled", "jacobi", "triton", "lapack"]
_T = TypeVar("_T")

MIN_CHUNK = 512
"""Smallest chunk worth a thread hand-off (~20 us of pool overhead per chunk)."""

_UNROLL_MIN_BATCH = 2048
"""Below this the unrolled route's fixed ~3 us/op Python cost loses to LAPACK."""

# Largest n for which the unrolled CPU Jacobi beats LAPACK (measured, batch >= 2048).
_UNROLL_MAX_N: dict[tuple[str, torch.dtype], int] = {
    ("eigh", torch.float32): 6,
    ("eigh", torch.float64): 4,
    ("svd", torch.float32): 6,
    ("svd", torch.float64): 4,
}


@dataclass(frozen=True, kw_only=True)
class Problem:
    """What the router needs to know about one call."""

    op: str
    """``"eigh"``, ``"svd"``, ``"qr"`` or ``"cholesky"``."""
    device: torch.device
    """Device of the input."""
    dtype: torch.dtype
    """Dtype of the input."""
    n: int
    """Matrix order (the smaller side for ``svd``)."""
    batch: int
    """Flattened batch size."""

    def __post_init__(self) -> None:
        if self.n < 0 or self.batch < 0:
            raise ValueError(f"Problem: n={self.n} and batch={self.batch} must be >= 0")


def _triton_ok(device: torch.device) -> bool:
    if device.type != "cuda":
        return False
    from torchnext.linalg._triton_jacobi import triton_available

    return triton_available()


def choose(problem: Problem, method: str = "auto") -> Route:
    """The route for ``problem``; ``method`` forces one (``"auto"`` lets us pick).

    ``method`` accepts ``"auto"``, ``"jacobi"`` (vectorised, or the Triton kernel on
    CUDA for n <= 32) and ``"lapack"`` (the vendor library behind ``torch.linalg``).
    """
    if method not in ("auto", "jacobi", "lapack"):
        raise ValueError(
            f"method={method!r} is not one of 'auto', 'jacobi', 'lapack'; "
            "pass 'auto' to let the dispatcher pick"
        )
    op, dev, dt, n, b = problem.op, problem.device, problem.dtype, problem.n, problem.batch
    jacobi_op = op in ("eigh", "svd")
    if method == "lapack" or (method == "auto" and not jacobi_op):
        return "lapack"
    if method == "jacobi":
        if not jacobi_op:
            raise ValueError(f"method='jacobi' is only offered for eigh and svd, not {op}")
        if _triton_ok(dev) and n <= 32 and not dt.is_complex:
            return "triton"
        if dev.type == "cpu" and not dt.is_complex and n <= 8:
            return "unrolled"
        return "jacobi"
    # auto
    if dev.type == "cpu":
        limit = _UNROLL_MAX_N.get((op, dt), 0)
        if n <= limit and b >= _UNROLL_MIN_BATCH:
            return "unrolled"
        return "lapack"
    if dev.type == "cuda" and n <= 32 and b >= 64 and not dt.is_complex and _triton_ok(dev):
        return "triton"
    if dev.type == "mps" and n <= 32 and dt in (torch.float32, torch.complex64):
        return "jacobi"
    return "lapack"


def threads_for(device: torch.device, batch: int) -> int:
    """How many chunks to cut a batch of ``batch`` matrices into on ``device``."""
    if device.type != "cpu":
        return 1
    want = TORCHNEXT_LINALG_THREADS.get() or torch.get_num_threads()
    return max(1, min(want, batch // MIN_CHUNK))


_POOL_LOCK = threading.Lock()
_POOL: ThreadPoolExecutor | None = None
_POOL_SIZE = 0
_IN_WORKER = threading.local()


def _pool(workers: int) -> ThreadPoolExecutor:
    global _POOL, _POOL_SIZE
    with _POOL_LOCK:
        if _POOL is None or _POOL_SIZE < workers:
            if _POOL is not None:
                _POOL.shutdown(wait=False)
            _POOL = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="torchnext-linalg")
            _POOL_SIZE = workers
        return _POOL


def _chunked(batch: int, chunks: int, task: Callable[[int, int], _T]) -> list[_T]:
    """``task(lo, hi)`` for each of ``chunks`` contiguous ranges of ``range(batch)``.

    The calling thread runs the last range itself, so ``chunks=2`` needs one pool thread;
    each task runs under ``no_grad`` and marked as a worker (nested splits run serially).
    """

    def run(i: int) -> _T:
        _IN_WORKER.active = True
        try:
            with torch.no_grad():
                return task(batch * i // chunks, batch * (i + 1) // chunks)
        finally:
            _IN_WORKER.active = False

    pool = _pool(chunks - 1)
    futures: list[Future[_T]] = [pool.submit(run, i) for i in range(chunks - 1)]
    last = run(chunks - 1)
    return [f.result() for f in futures] + [last]


def _serial(batch: int, chunks: int) -> bool:
    return chunks <= 1 or batch < 2 or getattr(_IN_WORKER, "active", False)


def run_batch_split(
    fn: Callable[..., Sequence[torch.Tensor]],
    inputs: Sequence[torch.Tensor],
    *,
    chunks: int,
) -> list[torch.Tensor]:
    """``fn(*inputs)`` with every input cut along dim 0 into ``chunks`` pieces.

    ``fn`` returns a sequence of tensors whose dim 0 is the batch; the pieces are
    concatenated back in order. The calling thread runs the last chunk itself, so
    ``chunks=2`` needs one pool thread. Nested calls from a worker run serially.
    Not differentiable: callers use it under ``no_grad`` semantics.
    """
    batch = inputs[0].shape[0]
    if _serial(batch, chunks):
        return list(fn(*inputs))
    results = _chunked(batch, chunks, lambda lo, hi: fn(*(x[lo:hi] for x in inputs)))
    return [torch.cat([r[k] for r in results], dim=0) for k in range(len(results[-1]))]


def run_batch_split_into(
    fn: Callable[..., object],
    inputs: Sequence[torch.Tensor],
    outputs: Sequence[torch.Tensor],
    *,
    chunks: int,
) -> None:
    """``fn(*inputs, out=outputs)`` with inputs and outputs cut along dim 0 into chunks.

    Like :func:`run_batch_split`, but each chunk writes straight into its slice of the
    preallocated ``outputs``, which saves concatenating (copying) the results.
    """
    batch = inputs[0].shape[0]
    if _serial(batch, chunks):
        fn(*inputs, out=tuple(outputs))
        return
    _chunked(
        batch,
        chunks,
        lambda lo, hi: fn(*(x[lo:hi] for x in inputs), out=tuple(o[lo:hi] for o in outputs)),
    )
