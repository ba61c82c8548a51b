"""The CPU routes of :func:`torchnext.gemm.grouped_mm` (and its loop on GPUs without a kernel).

What it is: the routes every grouped GEMM with offsets takes on the CPU, and on a GPU where
neither torch's kernel nor Triton runs. A grouped GEMM streams each used expert's weight once
and does 2 rows K N flops per group.

- Small groups of 2-D x 3-D (up to 8 to 64 rows by layout and dtype, ``_KERNEL_MAX_ROWS``):
  float32 with ``b[g]`` stored ``[K, N]``, or float32 / bfloat16 with ``b`` a transposed
  ``[G, N, K]``, go to the AVX-512 kernels (:mod:`torchnext.gemm.grouped_avx512_source`) where the CPU has
  AVX-512F: torch's ``mm`` at a few rows reads the weight far below memory bandwidth. The
  larger groups of the same call then run inline on torch's own threads.
- Otherwise torch's C++ loop of ``mm`` (``torch._grouped_mm``) where it takes the call
  (float32, no bias, its layouts). Where it does not, with more threads, the groups (cut by
  rows where one is large) are split into one balanced run per thread, each on a worker
  thread that calls torch single-threaded: one hand-off per call instead of a barrier per
  group; on one thread, a loop of ``mm``.
- 16-bit inputs are widened to float32 per group on CPUs without bfloat16 instructions
  (:func:`cpu_upcasts`).

When to use: through :func:`torchnext.gemm.grouped_mm`, which checks the arguments and builds
the :class:`GroupedProblem`; these functions check nothing themselves.

What not to assume: the worker pool is used only under OpenMP (where a worker's thread count
is its own), and is rebuilt after a fork; a group may be split between threads, so results
match a float64 reference to float32-accumulation tolerance, not bit for bit (the kernel's
sums run in another order than torch's, too).

Shape legend: M rows, K contraction, N columns; ``a_mk``/``b_kn``/``out_mn``/``bias_n`` one
group's (or one run's) slices of ``mat_a``, ``mat_b``, the output and the bias.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from functools import cache
from typing import NamedTuple

import torch
from torch import Tensor

from torchnext.compat import gemm_internals as _gi
from torchnext.gemm import gemv_cpu

__all__ = [
    "GroupedProblem",
    "cpu_upcasts",
    "grouped_mm_looped",
    "small_group_kernel",
    "threads_are_per_worker",
    "zero_tail",
]

_HALF = (torch.bfloat16, torch.float16)
# Below this many multiply-adds a CPU call stays on the calling thread: handing work to the
# pool costs tens of microseconds.
_THREADED_MIN_MACS = 1 << 22
# Groups of at most this many rows go to the AVX-512 kernel where it runs, by weight layout and
# dtype. Measured against torch's mm at K = N = 512 and 1024, 1 and 2 threads: stored [K, N],
# float32: 2-3x at 4 to 8 rows, 1.1-1.4x at 64, level at 128; a transposed [G, N, K]: float32
# 1.2-2.3x at 8 to 32 rows, 0.97-1.4x at 64; bfloat16 (torch's own runs AVX-512 BF16 too)
# 1.6x at one row, 1.0-1.2x at 8, behind from 32.
_KERNEL_MAX_ROWS = {"kn": 64, "nk float32": 32, "nk bfloat16": 8}
# A group costs about its rows plus this many rows' worth of streaming its weight once
# (memory bandwidth against FMA rate on the CPUs measured); used to balance threads.
_WEIGHT_ROWS = 8


def zero_tail(out: Tensor, mode: str, ends: list[int]) -> Tensor:
    """Zero what torch's op leaves uninitialised; also drop its 16-byte row padding.

    ``out`` is a grouped GEMM's result of form ``mode`` and ``ends`` its groups' checked end
    offsets (non-empty); the rows (2-D x 3-D) or columns (3-D x 2-D) past the last are zeroed.
    """
    out = out.contiguous()
    if mode == "2d3d" and ends[-1] < out.shape[0]:
        out[ends[-1] :] = 0
    elif mode == "3d2d" and ends[-1] < out.shape[1]:
        out[:, ends[-1] :] = 0
    return out


_Item = tuple[Tensor, Tensor, Tensor, "Tensor | None"]  # a_mk, b_kn, out_mn, bias_n


class GroupedProblem(NamedTuple):
    """One checked grouped GEMM with offsets: its form, output and group ends."""

    mode: str  # "2d3d", "3d3d", "2d2d" or "3d2d"
    shape: tuple[int, ...]  # of the output
    dtype: torch.dtype  # of the output
    ends: list[int]  # offs, checked


def grouped_mm_looped(
    a: Tensor, b: Tensor, offs: Tensor, bias: Tensor | None, p: GroupedProblem
) -> Tensor:
    """One ``mm`` per non-empty group: inline, on the worker threads, or torch's C++ loop.

    ``a``, ``b``, ``offs`` and ``bias`` are checked and detached (see ``grouped_mm``); ``p``
    is their problem. Runs on any device; the worker threads are used on the CPU only.
    """
    mode, shape, dtype, ends = p
    cpu = a.device.type == "cpu"
    wide = cpu and a.dtype in _HALF and cpu_upcasts(a.dtype)
    threads = torch.get_num_threads() if cpu and threads_are_per_worker() else 1
    used = ends[-1] if ends else 0
    # Multiply-adds: the used extent of the jagged dimension times the two others.
    if mode == "2d2d":
        macs = used * shape[1] * shape[2]
    else:
        macs = used * a.shape[-1] * (shape[1] if mode == "2d3d" else shape[0])
    threaded = threads > 1 and macs >= _THREADED_MIN_MACS
    small = _small_groups(a, b, bias, p)
    native = _gi.native_grouped_mm()
    if (
        native is not None
        and not small
        and cpu
        and ends
        and bias is None
        and a.dtype == dtype == torch.float32
        and _gi.native_grouped_mm_accepts_layout(a)
        and _gi.native_grouped_mm_accepts_layout(b)
    ):
        # torch's C++ loop is this loop without Python's per-group cost; its one flaw, the
        # uninitialised tail, is fixed here. At 2 threads it was also measured ahead of the
        # worker threads on an AVX-512 CPU (prefill 64 x 4096 x 512: 0.87-0.94x for the
        # workers in four runs of six), so the workers serve what it cannot take.
        return zero_tail(native(a, b, offs=offs.contiguous()), mode, ends)
    out = torch.empty(shape, dtype=dtype, device=a.device)
    if small:
        _run_small(a, b, bias, out, small)
    done = {g for g, _, _ in small}
    items: list[_Item] = []
    start = 0
    for g, end in enumerate(ends):
        x = None if bias is None else (bias[start:end] if mode == "3d2d" else bias[g])
        if mode == "2d3d" and end > start and g not in done:
            items.append((a[start:end], b[g], out[start:end], x))
        elif mode == "3d2d" and end > start:
            items.append((a[g], b[:, start:end], out[:, start:end], x))
        elif mode == "2d2d":  # every group writes its (M, N) block, zero when K is empty
            items.append((a[:, start:end], b[start:end], out[g], x))
        start = end
    if ends:
        zero_tail(out, mode, ends)
    else:
        out.zero_()
    # Beside the kernel, the large groups run inline on torch's own threads: measured at 2
    # threads, torch's loop scaled better than the worker threads on such groups (0.87x).
    if threaded and len(items) > 1 and not small:
        pool = _pool()
        for f in [pool.submit(_run, c, wide) for c in _balance(items, threads)]:
            f.result()
    else:
        _run(items, wide)
    return out


def _small_groups(
    a: Tensor, b: Tensor, bias: Tensor | None, p: GroupedProblem
) -> list[tuple[int, int, int]]:
    """The groups ``(g, start, end)`` the AVX-512 kernel takes, where they hold half the rows
    or more: 2-D x 3-D groups of 1 to
    ``_KERNEL_MAX_ROWS[layout]`` rows, float32 with ``b[g]`` stored ``[K, N]``, or any dtype the CPU
    runs (float32; bfloat16 with AVX-512 BF16) with ``b`` a transposed ``[G, N, K]``; a bias
    in the inputs' dtype; none where the CPU or the build lacks the kernel."""
    mode, _, dtype, ends = p
    if mode != "2d3d" or a.device.type != "cpu" or a.stride(1) != 1 or b.shape[2] == 0:
        return []
    if b.stride(2) == 1:  # stored [K, N]
        runs, limit = a.dtype == dtype == torch.float32, _KERNEL_MAX_ROWS["kn"]
    else:  # nn.Linear-style [G, N, K] experts, transposed
        runs = b.stride(1) == 1 and dtype in (a.dtype, torch.float32)
        limit = _KERNEL_MAX_ROWS.get(f"nk {str(a.dtype).removeprefix('torch.')}", 0)
    if not runs or (bias is not None and (bias.dtype != a.dtype or bias.stride(1) != 1)):
        return []
    kern = gemv_cpu.kernels()
    if kern is None or a.dtype not in kern.avx512_dtypes:
        return []
    starts = [0, *ends[:-1]] if ends else []
    spans = enumerate(zip(starts, ends, strict=True))
    small = [(g, s, e) for g, (s, e) in spans if 0 < e - s <= limit]
    # Only where small groups hold most rows (a decode step): in a prefill the large groups
    # dominate, and torch's loop over all of them (one C++ call) was measured faster than
    # the kernel beside Python's loop over the rest (0.93x).
    return small if small and 2 * sum(e - s for _, s, e in small) >= ends[-1] else []


def small_group_kernel() -> bool:
    """Whether the AVX-512 kernel for small float32 groups runs here (builds it on first use)."""
    kern = gemv_cpu.kernels()
    return kern is not None and torch.float32 in kern.avx512_dtypes


def _run_small(
    a: Tensor, b: Tensor, bias: Tensor | None, out: Tensor, small: list[tuple[int, int, int]]
) -> None:
    """The small groups on the AVX-512 kernel, its OpenMP threads over (group, column chunk)."""
    kern = gemv_cpu.kernels()
    if kern is None:  # _small_groups found it; kernels() is cached
        raise RuntimeError("grouped_mm: the CPU kernels vanished between two calls")
    n, threads = out.shape[1], torch.get_num_threads()
    # Whole rows of b per item while there are groups enough to keep every thread busy;
    # otherwise each group's columns are split between the threads.
    chunk = n if len(small) >= 4 * threads else max(64, -(-n // threads // 64) * 64)
    groups = torch.tensor(small, dtype=torch.int64)
    with torch.no_grad():
        kern.grouped512(a, b, groups, bias, out, chunk=chunk)


def _run(items: Sequence[_Item], wide: bool) -> None:
    # no_grad: worker threads do not inherit the op's autograd exclusion, and out= refuses
    # inputs that require grad.
    with torch.no_grad():
        for a, b, out, bias in items:
            if wide or out.dtype != a.dtype:
                # 16-bit in, float32 accumulate: exact products, one rounding at the end.
                r = torch.mm(a.float(), b.float())
                out.copy_(r if bias is None else r + bias.float())
            elif bias is None:
                torch.mm(a, b, out=out)
            else:
                torch.addmm(bias, a, b, out=out)


def _balance(items: Sequence[_Item], parts: int) -> list[list[_Item]]:
    """Split ``items`` into ``parts`` runs of about equal cost, cutting groups by rows."""

    def cost(rows: int, it: _Item) -> float:
        return (rows + _WEIGHT_ROWS) * it[0].shape[1] * it[1].shape[1]

    total = sum(cost(it[0].shape[0], it) for it in items)
    chunks: list[list[_Item]] = [[] for _ in range(parts)]
    spent, part = 0.0, 0
    for it in items:
        a, b, out, x = it
        row = 0
        while row < a.shape[0]:
            room = total * (part + 1) / parts - spent
            rows_left = a.shape[0] - row
            if part == parts - 1 or cost(rows_left, it) <= room * 1.05:
                take = rows_left
            else:
                take = int(room / (a.shape[1] * b.shape[1])) - _WEIGHT_ROWS
                if take < 8:  # not worth a second read of this weight: next thread
                    part += 1
                    continue
            chunks[part].append((a[row : row + take], b, out[row : row + take], x))
            spent += cost(take, it)
            row += take
            if row < a.shape[0]:
                part += 1
    return [c for c in chunks if c]


# --------------------------------------------------------------------------- CPU facts


@cache
def threads_are_per_worker() -> bool:
    """Whether ``torch.set_num_threads`` in a worker thread leaves the caller's alone.

    True under OpenMP (the thread count is a per-thread setting); the pool is used only then.
    """
    return "OpenMP" in torch.__config__.parallel_info().split("parallel backend:")[-1]


_POOL: ThreadPoolExecutor | None = None
_POOL_PID = -1
_POOL_LOCK = threading.Lock()


def _pool() -> ThreadPoolExecutor:
    """Worker threads that each run torch single-threaded (one group at a time per core)."""
    global _POOL, _POOL_PID
    with _POOL_LOCK:
        if _POOL is None or _POOL_PID != os.getpid():  # a forked child needs its own threads
            _POOL = ThreadPoolExecutor(
                max_workers=os.cpu_count() or 1,
                thread_name_prefix="torchnext-grouped-mm",
                initializer=torch.set_num_threads,
                initargs=(1,),
            )
            _POOL_PID = os.getpid()
        return _POOL


@cache
def cpu_upcasts(dtype: torch.dtype = torch.bfloat16) -> bool:
    """Whether float32 GEMM beats ``dtype`` (bfloat16 or float16) GEMM on this CPU: true
    where the CPU has no instructions for ``dtype``.

    Measured once per dtype: on AVX2 CPUs bfloat16 ``mm`` is emulated and 10-20x slower than
    converting to float32, which also accumulates in float32 (the same numerics); an AVX-512
    CPU with BF16 runs bfloat16 faster than float32, and float16 still emulated.
    """
    import time

    a_MK = torch.ones(64, 256, dtype=dtype)  # not randn: leave the user's RNG alone
    b_KN = torch.ones(256, 256, dtype=dtype)

    def best(fn: object) -> float:
        times = []
        for _ in range(3):
            t0 = time.perf_counter()
            fn()  # type: ignore[operator]
            times.append(time.perf_counter() - t0)
        return min(times)

    return best(lambda: a_MK.float() @ b_KN.float()) < best(lambda: a_MK @ b_KN)
