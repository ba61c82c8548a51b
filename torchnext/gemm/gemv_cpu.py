"""The CPU kernels of the decode GEMV: C source, built once per machine, called through ctypes.

When to use: through :func:`torchnext.gemm.gemv.linear` (and ``grouped_mm``, ``scaled_mm``);
call :func:`kernels` directly only to test or benchmark them. The kernels:

- ``q4_gemv``: ``out = x @ W.T`` for a 4-bit weight in the ``blocked8`` layout
  (:mod:`torchnext.gemm.gemv_cpu_source`), the dequantization fused into the reduction:
  codes become floats in registers, 32 at a time, and no weight row is ever written out.
  M (rows of ``x``) is 1..8; ``x`` is read in its own 16- or 32-bit dtype, ``out`` is
  float32 ``[M, N]``.
- ``q4_dequant``: the same weight's rows ``8*b0 .. 8*b1`` as float32 ``[K, R]`` (W.T's
  columns), for the GEMM path, which dequantizes one chunk of rows at a time.
- ``dense_gemv``: ``out = x @ W.T`` for a bfloat16 / float16 ``[N, K]`` weight as it is,
  upcast 8 elements at a time in registers (torch's bfloat16 GEMM is slow without native
  bfloat16 instructions).
- ``dense512``: ``out = x @ W.T`` for bfloat16 (AVX-512 BF16) or float32 (AVX-512F) ``x``
  and weight, where the CPU has the instructions (``avx512_dtypes``); see
  :mod:`torchnext.gemm.gemv_avx512_source`.
- ``grouped512``: the small groups of a grouped GEMM (:mod:`torchnext.gemm.grouped_avx512_source`).
- ``decode8``: one-byte codes (float8) to float32 through a table, scaled
  (:mod:`torchnext.gemm.decode8_source`).

Every method checks what its C code trusts (:mod:`torchnext.gemm.cpu_kernel_checks`).

The C source, why C rather than Inductor, and the ``blocked8`` layout it reads are in
:mod:`torchnext.gemm.gemv_cpu_source`.

Build: the source is compiled with the system C compiler (``$CC``, else ``cc``, ``gcc``
or ``clang``) into ``<gemm cache dir>/kernels/gemv-<hash>.so`` on first use, written to a
temporary name and renamed (atomic), so concurrent processes share it safely. That costs
1-2 s once per machine and source version; later processes load it in milliseconds. With
AVX2+FMA+F16C (x86-64 ``torch.backends.cpu.get_cpu_capability()`` AVX2 or better) the
intrinsics path is built, else a portable C path with the same layout and results. OpenMP
threads (``torch.get_num_threads()``) where the compiler has it; torch's own libgomp is the
one loaded, so the kernels share its thread pool.

What not to assume: a machine without a C compiler gets ``kernels() is None`` and the caller's
pure-torch fallback; results equal a float32-accumulated reference to rounding, not bit for
bit (the order of the sum differs from torch's).

Shape legend: ``M`` rows of x, ``N`` weight rows, ``K`` reduction, ``B`` row blocks of 8,
``G`` scale groups per row, ``R`` dequantized rows of a chunk.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import logging
import os
import platform
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

import torch

from torchnext.errors import GemmUnsupportedError
from torchnext.gemm import (
    cpu_kernel_checks,
    decode8_source,
    gemv_avx512_source,
    gemv_cpu_source,
    grouped_avx512_source,
)
from torchnext.gemm.quantized_weight import SCALE_KINDS, QuantizedWeight

__all__ = ["CpuKernels", "build", "compiler", "kernels"]

log = logging.getLogger(__name__)

_SOURCE = (
    gemv_cpu_source.SOURCE
    + gemv_avx512_source.SOURCE
    + grouped_avx512_source.SOURCE
    + decode8_source.SOURCE
)


@dataclass(frozen=True)
class CpuKernels:
    """The loaded library; the methods check their CPU tensors and pass their ``data_ptr()``."""

    path: Path
    simd: bool
    """True for the AVX2 build, False for the portable C one."""
    avx512_dtypes: frozenset[torch.dtype]
    """The dtypes :meth:`dense512` runs on this CPU (empty without AVX-512)."""
    _lib: ctypes.CDLL

    @staticmethod
    def _weight_args(w: QuantizedWeight) -> list[object]:
        zeros = None if w.zeros is None else w.zeros.data_ptr()
        bits = w.value_bits()
        return [w.codes.data_ptr(), w.scale_kind, w.scales.data_ptr(), zeros, bits.data_ptr()]

    def q4_gemv(self, w: QuantizedWeight, x_MK: torch.Tensor, out_MN: torch.Tensor) -> None:
        """``out_MN = x_MK @ W.T`` for a ``blocked8`` weight: ``x_MK`` contiguous bfloat16,
        float16 or float32 (read as it is), ``out_MN`` contiguous float32 ``[M, N]``.

        Raises ``MemoryError`` when the kernel's scratch (``16 M K`` bytes) cannot be allocated.
        """
        m, k = x_MK.shape
        head = [m, w.codes.shape[0], w.out_features, k, w.block_size]
        tail = [w.out_scale, x_MK.data_ptr(), SCALE_KINDS[x_MK.dtype], out_MN.data_ptr()]
        if self._lib.tn_q4_gemv(*head, *self._weight_args(w), *tail, torch.get_num_threads()):
            raise MemoryError(
                f"q4_gemv: no memory for the kernel's scratch of x ({16 * m * k} bytes for "
                f"x_MK of shape {tuple(x_MK.shape)}); free memory or call with fewer rows"
            )

    def q4_dequant(self, w: QuantizedWeight, b0: int, b1: int, w_KR: torch.Tensor) -> None:
        """``w_KR[:, r] = W[8 * b0 + r, :]`` in float32 for the ``R = 8 * (b1 - b0)`` rows."""
        head = [b0, b1, w.in_features, w.block_size]
        tail = [w.out_scale, w_KR.data_ptr(), torch.get_num_threads()]
        self._lib.tn_q4_dequant(*head, *self._weight_args(w), *tail)

    def dense_gemv(self, w_NK: torch.Tensor, x_MK: torch.Tensor, out_MN: torch.Tensor) -> None:
        """``out_MN = x_MK @ w_NK.T`` for a bfloat16/float16 ``w_NK`` with unit last stride."""
        (m, k), kind = x_MK.shape, SCALE_KINDS[w_NK.dtype]
        ptrs = [w_NK.data_ptr(), w_NK.stride(0), kind, x_MK.data_ptr(), out_MN.data_ptr()]
        self._lib.tn_dense_gemv(m, w_NK.shape[0], k, *ptrs, torch.get_num_threads())

    def dense512(
        self,
        w_NK: torch.Tensor,
        x_MK: torch.Tensor,
        bias_N: torch.Tensor | None,
        out_MN: torch.Tensor,
    ) -> None:
        """``out_MN = x_MK @ w_NK.T + bias_N``, summed in float32 and rounded once: ``x_MK``,
        ``w_NK`` and ``bias_N`` of one dtype in :attr:`avx512_dtypes`, ``out_MN`` bfloat16 or
        float32; ``x_MK``, ``bias_N`` and ``out_MN`` contiguous and ``w_NK`` with unit last
        stride; ``bias_N`` may be None."""
        if x_MK.dtype not in self.avx512_dtypes:
            raise GemmUnsupportedError(
                f"dense512: x_MK.dtype={x_MK.dtype}; this CPU runs it for "
                f"{sorted(str(d) for d in self.avx512_dtypes) or 'no dtype (no AVX-512)'}; "
                "call dense_gemv or F.linear instead"
            )
        cpu_kernel_checks.check_dense512(w_NK, x_MK, bias_N, out_MN)
        (m, k), kind = x_MK.shape, SCALE_KINDS[x_MK.dtype]
        bias = None if bias_N is None else bias_N.data_ptr()
        out = [out_MN.data_ptr(), SCALE_KINDS[out_MN.dtype]]
        ptrs = [w_NK.data_ptr(), w_NK.stride(0), x_MK.data_ptr(), k, kind, bias, *out]
        if self._lib.tn_dense512(m, w_NK.shape[0], k, *ptrs, torch.get_num_threads()):
            raise GemmUnsupportedError(
                f"dense512: the kernel found no AVX-512 instructions for {x_MK.dtype} on this "
                "CPU although the library reported them; rebuild with kernels() after "
                "clearing the kernel folder, or use F.linear"
            )

    def grouped512(
        self,
        a_MK: torch.Tensor,
        b_GKN: torch.Tensor,
        groups: torch.Tensor,
        bias_GN: torch.Tensor | None,
        out_MN: torch.Tensor,
        *,
        chunk: int,
    ) -> None:
        """``out_MN[s:e] = a_MK[s:e] @ b_GKN[g] (+ bias_GN[g])`` for each row ``(g, s, e)`` of
        ``groups`` (int64 ``[n, 3]``), summed in float32 and rounded once, on OpenMP threads
        over (group, ``chunk`` columns) items; rows of ``out_MN`` in no listed group are left
        as they are.

        Two layouts of ``b_GKN``: stored ``[K, N]`` (unit last stride; float32 only), or a
        transposed ``[G, N, K]`` (``b_GKN.stride(1) == 1``; the dtypes in
        :attr:`avx512_dtypes`). ``a_MK`` with unit last stride,
        ``out_MN`` contiguous float32 (or bfloat16 for bfloat16 inputs), ``bias_GN`` rows of
        the inputs' dtype or None; see :mod:`torchnext.gemm.grouped_avx512_source`.
        """
        if a_MK.dtype not in self.avx512_dtypes:
            raise GemmUnsupportedError(
                f"grouped512: a_MK.dtype={a_MK.dtype}; this CPU runs it for "
                f"{sorted(str(d) for d in self.avx512_dtypes) or 'no dtype (no AVX-512)'}; "
                "use torchnext.gemm.grouped_mm, which routes elsewhere"
            )
        stored_kn = cpu_kernel_checks.check_grouped512(a_MK, b_GKN, groups, bias_GN, out_MN, chunk)
        g_n, k, n = len(groups), a_MK.shape[1], b_GKN.shape[2]
        gid, starts, ends = (groups[:, i].contiguous() for i in range(3))
        head = [g_n, gid.data_ptr(), starts.data_ptr(), ends.data_ptr(), k, n]
        a = [a_MK.data_ptr(), a_MK.stride(0)]
        bias = [None, 0] if bias_GN is None else [bias_GN.data_ptr(), bias_GN.stride(0)]
        threads = torch.get_num_threads()
        if stored_kn:
            b = [b_GKN.data_ptr(), b_GKN.stride(1), b_GKN.stride(0)]
            tail = [out_MN.data_ptr(), out_MN.stride(0), chunk, threads]
            failed = self._lib.tn_grouped512(*head, *a, *b, *bias, *tail)
        else:
            w = [b_GKN.data_ptr(), b_GKN.stride(2), b_GKN.stride(0), SCALE_KINDS[a_MK.dtype]]
            tail = [out_MN.data_ptr(), SCALE_KINDS[out_MN.dtype], chunk, threads]
            failed = self._lib.tn_grouped512_nk(*head, *a, *w, *bias, *tail)
        if failed:
            raise GemmUnsupportedError(
                f"grouped512: the kernel found no AVX-512 instructions for {a_MK.dtype} on "
                "this CPU although the library reported them; rebuild with kernels() after "
                "clearing the kernel folder"
            )

    def decode8(
        self,
        codes_RC: torch.Tensor,
        table: torch.Tensor,
        out_RC: torch.Tensor,
        *,
        row_scale: torch.Tensor | None = None,
        col_scale: torch.Tensor | None = None,
        scale: float = 1.0,
    ) -> None:
        """``out_RC[r, c] = table[codes_RC[r, c]] * scale``, the scale ``row_scale[r]``,
        ``col_scale[c]`` or ``scale``: one float32 multiply, so the bits of torch's
        ``decoded * scale``. ``codes_RC`` one-byte codes (uint8 or a float8 dtype) with any
        strides, ``table`` float32 ``[256]``, ``out_RC`` contiguous float32 ``[R, C]``; see
        :mod:`torchnext.gemm.decode8_source`."""
        cpu_kernel_checks.check_decode8(codes_RC, table, out_RC, row_scale, col_scale)
        r, c = codes_RC.shape
        rs = None if row_scale is None else row_scale.data_ptr()
        cs = None if col_scale is None else col_scale.data_ptr()
        src = [codes_RC.data_ptr(), r, c, codes_RC.stride(0), codes_RC.stride(1)]
        self._lib.tn_decode8(
            *src, table.data_ptr(), rs, cs, scale, out_RC.data_ptr(), torch.get_num_threads()
        )


def compiler() -> str | None:
    """The C compiler :func:`build` would use (``$CC``, else cc, gcc, clang), or ``None``."""
    for name in (os.environ.get("CC", ""), "cc", "gcc", "clang"):
        found = shutil.which(name) if name else None
        if found:
            return found
    return None


def _simd_flags() -> list[str]:
    if platform.machine().lower() not in ("x86_64", "amd64"):
        return []
    if torch.backends.cpu.get_cpu_capability() not in ("AVX2", "AVX512"):
        return []
    return ["-mavx2", "-mfma", "-mf16c"]


def _kernel_dir() -> Path:
    from torchnext.gemm.autotune import cache_dir

    return cache_dir() / "kernels"


def build(*, portable: bool = False, folder: Path | None = None) -> Path | None:
    """Compile the kernels (once; an existing build is reused) and return the library's path.

    ``portable=True`` builds the plain C path even on an AVX2 machine (the tests compare the
    two). Returns ``None`` when no C compiler works here.
    """
    cc = compiler()
    if cc is None:
        return None
    flags = ["-O3", "-std=c11", "-shared", "-fPIC"] + ([] if portable else _simd_flags())
    key = hashlib.sha256("\0".join([_SOURCE, cc, platform.machine(), *flags]).encode()).hexdigest()[
        :16
    ]
    target_dir = folder if folder is not None else _kernel_dir()
    try:
        target_dir.mkdir(parents=True, exist_ok=True)
    except OSError:
        target_dir = Path(tempfile.gettempdir()) / f"torchnext-kernels-{os.getuid()}"
        target_dir.mkdir(parents=True, exist_ok=True)
    target = target_dir / f"gemv-{key}.so"
    if target.exists():
        return target
    with tempfile.TemporaryDirectory(dir=target_dir) as tmp:
        src = Path(tmp) / "gemv.c"
        src.write_text(_SOURCE)
        out = Path(tmp) / "gemv.so"
        # OpenMP when the compiler has it (clang on macOS often lacks it): then one thread;
        # without the AVX-512 tiles when the compiler or assembler cannot build them.
        attempts: list[list[str]] = [
            ["-fopenmp"],
            [],
            ["-fopenmp", "-DTN_NO_AVX512"],
            ["-DTN_NO_AVX512"],
        ]
        for extra in attempts:
            proc = subprocess.run(
                [cc, *flags, *extra, str(src), "-o", str(out)],
                capture_output=True,
                text=True,
                timeout=300,
                check=False,
            )
            if proc.returncode == 0:
                break
            log.debug("building the GEMV kernels with %s failed:\n%s", extra, proc.stderr)
        else:
            log.warning("no working C compiler for the GEMV kernels: %s", proc.stderr[-2000:])
            return None
        os.replace(out, target)  # atomic: a concurrent builder's file is replaced whole
    return target


def _load(path: Path) -> CpuKernels:
    lib = ctypes.CDLL(str(path))
    i64, ptr, c_int, c_float = ctypes.c_int64, ctypes.c_void_p, ctypes.c_int, ctypes.c_float
    lib.tn_simd.argtypes, lib.tn_simd.restype = [], c_int
    lib.tn_q4_gemv.argtypes = [
        *(i64, i64, i64, i64, i64, ptr, c_int, ptr, ptr, ptr, c_float, ptr, c_int, ptr, c_int)
    ]
    lib.tn_q4_dequant.argtypes = [
        *(i64, i64, i64, i64, ptr, c_int, ptr, ptr, ptr, c_float, ptr, c_int)
    ]
    lib.tn_dense_gemv.argtypes = [i64, i64, i64, ptr, i64, c_int, ptr, ptr, c_int]
    lib.tn_avx512_kinds.argtypes, lib.tn_avx512_kinds.restype = [], c_int
    lib.tn_dense512.argtypes = [i64, i64, i64, ptr, i64, ptr, i64, c_int, ptr, ptr, c_int, c_int]
    lib.tn_dense512.restype = c_int
    lib.tn_grouped512.argtypes = [i64, ptr, ptr, ptr, i64, i64, ptr, i64, ptr, i64, i64]
    lib.tn_grouped512.argtypes += [ptr, i64, ptr, i64, i64, c_int]
    lib.tn_grouped512.restype = c_int
    lib.tn_grouped512_nk.argtypes = [i64, ptr, ptr, ptr, i64, i64, ptr, i64, ptr, i64, i64]
    lib.tn_grouped512_nk.argtypes += [c_int, ptr, i64, ptr, c_int, i64, c_int]
    lib.tn_grouped512_nk.restype = c_int
    lib.tn_decode8.argtypes = [ptr, i64, i64, i64, i64, ptr, ptr, ptr, c_float, ptr, c_int]
    lib.tn_decode8.restype = None
    lib.tn_q4_gemv.restype = c_int
    for fn in (lib.tn_q4_dequant, lib.tn_dense_gemv):
        fn.restype = None
    kinds = lib.tn_avx512_kinds()
    avx512 = frozenset(
        dtype for bit, dtype in ((1, torch.float32), (2, torch.bfloat16)) if kinds & bit
    )
    return CpuKernels(path, bool(lib.tn_simd()), avx512, lib)


@functools.cache
def kernels(*, portable: bool = False) -> CpuKernels | None:
    """The CPU kernels, built and loaded on first call (1-2 s once per machine), else ``None``.

    ``None`` when no C compiler works here; callers then take their pure-torch path.
    """
    try:
        path = build(portable=portable)
        return None if path is None else _load(path)
    except (OSError, subprocess.SubprocessError, AttributeError) as exc:
        log.warning("the GEMV kernels could not be built or loaded: %s", exc)
        return None
