"""Route selection and CPU batch splitting for ``torchnext.linalg``.

When to use: every public function asks :func:`choose` which implementation to run
for its (op, device, dtype, n, batch), and runs LAPACK-backed routes through
:func:`run_batch_split`, which cuts a large CPU batch into contiguous chunks and runs
them on a small thread pool. torch's batched CPU linalg loops over the batch on one
thread and MKL cannot parallelise inside a 4x4..32x32 call, so 2 threads give only
0.8-1.3x; LAPACK releases the GIL, so chunks on Python threads scale ~1.7-2x.

The split pays only while each chunk's LAPACK call runs on one core. From order
:data:`LAPACK_DC_MIN_N` on, eigh and svd switch to divide and conquer, which MKL threads
inside every call; there the chunks' OpenMP teams oversubscribe the cores and the split
loses to one thread, so :func:`lapack_plan` runs those orders as one call at one
intra-op thread (torch's own 2-thread kernel is slower still there).

What not to assume: the crossovers below were measured on a 2-core AVX2 x86 VM
(batch 16384); on other CPUs the unrolled-Jacobi limits may move by a size or two.
With one thread (``torch.get_num_threads() == 1`` or ``TORCHNEXT_LINALG_THREADS=1``)
nothing is split and the LAPACK route is a direct ``torch.linalg`` call.

Shape legend: ``B`` flattened batch.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Literal, TypeVar

import torch

from torchnext._env import TORCHNEXT_LINALG_THREADS

__all__ = [
    "Route",
    "choose",
    "threads_for",
    "LapackPlan",
    "lapack_plan",
    "intra_op_threads",
    "run_batch_split",
    "run_batch_split_into",
    "run_matmul_split",
    "MIN_CHUNK",
    "LAPACK_DC_MIN_N",
    "LAPACK_DC_MAX_N",
]

Route = Literal["unrolled", "jacobi", "triton", "lapack"]
_T = TypeVar("_T")

MIN_CHUNK = 512
"""Smallest chunk worth a thread hand-off (~20 us of pool overhead per chunk)."""

_UNROLL_MIN_BATCH = 2048
"""Below this the unrolled route's fixed ~3 us/op Python cost loses to LAPACK."""

LAPACK_DC_MIN_N = 26
"""Smallest order at which LAPACK's eigh (xSTEDC) and svd (xBDSDC) leave their direct
solver for divide and conquer (LAPACK's SMLSIZ = 25), the stage MKL threads inside each
call. On small matrices that OpenMP team only costs: measured (2-core VM, float32,
batch 2048-16384, n = 28, 32, 48, 64) torch at 2 threads took 3.7-7.5x its 1-thread
time, and the 2-way batch split (each chunk's call starting its own team: four threads
on two cores) 1.0-1.9x the 1-thread time. At n = 16 and 24 both tie or win: 2 threads
equal 1 thread and the split is 1.8-2.2x faster."""

LAPACK_DC_MAX_N = 64
"""Largest order for which one intra-op thread was measured to beat both the split and
torch's own threading; above it the split is kept (not measured to lose there)."""

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


@dataclass(frozen=True, kw_only=True)
class LapackPlan:
    """How a LAPACK-route call runs on its batch."""

    chunks: int
    """Contiguous chunks run on the thread pool (1: one call on the calling thread)."""
    intra_op_threads: int | None
    """torch's intra-op thread count for the call(s); ``None`` keeps the caller's."""


def lapack_plan(problem: Problem) -> LapackPlan:
    """How to run ``problem`` on the LAPACK route: split, or one call at one thread.

    eigh/svd orders in ``[LAPACK_DC_MIN_N, LAPACK_DC_MAX_N]`` on a multi-threaded CPU run
    as one call at one intra-op thread: splitting them, or leaving MKL its threads, was
    measured slower than that (see :data:`LAPACK_DC_MIN_N`). Everything else keeps
    :func:`threads_for`'s split, where every chunk's call is GIL-free single-core work.
    """
    dc = problem.op in ("eigh", "svd") and LAPACK_DC_MIN_N <= problem.n <= LAPACK_DC_MAX_N
    if problem.device.type == "cpu" and dc:
        return LapackPlan(chunks=1, intra_op_threads=1 if torch.get_num_threads() > 1 else None)
    return LapackPlan(chunks=threads_for(problem.device, problem.batch), intra_op_threads=None)


_THREADS_LOCK = threading.Lock()
_THREADS_HOLDERS = 0
_THREADS_BEFORE = 0


@contextmanager
def intra_op_threads(count: int | None) -> Iterator[None]:
    """Run the block with torch's intra-op thread count at ``count`` (``None``: as is).

    torch's setting is process-wide, so overlapping blocks from several threads share
    one change: the first to enter records the caller's count and the last to leave
    restores it (restoring per block could leave the process at ``count`` for good).
    """
    global _THREADS_HOLDERS, _THREADS_BEFORE
    if count is None:
        yield
        return
    if count < 1:
        raise ValueError(f"intra_op_threads: count={count} must be >= 1 or None")
    with _THREADS_LOCK:
        if _THREADS_HOLDERS == 0:
            _THREADS_BEFORE = torch.get_num_threads()
            if _THREADS_BEFORE != count:
                torch.set_num_threads(count)
        _THREADS_HOLDERS += 1
    try:
        yield
    finally:
        with _THREADS_LOCK:
            _THREADS_HOLDERS -= 1
            if _THREADS_HOLDERS == 0 and torch.get_num_threads() != _THREADS_BEFORE:
                torch.set_num_threads(_THREADS_BEFORE)


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


def run_matmul_split(
    fn: Callable[..., Sequence[torch.Tensor]], inputs: Sequence[torch.Tensor]
) -> list[torch.Tensor]:
    """``fn(*inputs)`` for a matmul iteration (Newton-Schulz, QDWH), split on the CPU.

    Each chunk runs at one intra-op thread on its own Python thread. torch's own
    threading of a batched GEMM of 8x8..64x64 matrices gains only 1.2-1.6x from 2
    threads, while two chunks at one thread each gain 1.5-2x: every GEMM of a large
    batch releases the GIL for far longer than its Python dispatch holds it, and no
    OpenMP team oversubscribes the cores. Off the CPU, or at one thread, it is a
    plain call. Every matrix's iteration is independent, so results do not depend on
    the split.
    """
    chunks = threads_for(inputs[0].device, inputs[0].shape[0])
    if _serial(inputs[0].shape[0], chunks):
        return list(fn(*inputs))
    with intra_op_threads(1):
        return run_batch_split(fn, inputs, chunks=chunks)
