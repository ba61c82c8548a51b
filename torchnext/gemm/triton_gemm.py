"""The Triton GEMM template with the epilogue fused in registers: the GPU route of ``gemm``.

Use it through :func:`torchnext.gemm.gemm`, whose autotuner times it beside cuBLAS with the
steps in eager (route ``triton``); call :func:`triton_gemm` directly only to pin the route.
The kernel is the Triton matmul tutorial's (grouped tile order for L2 reuse, tile
configurations autotuned per power-of-two bucket of M, N, K and epilogue, a float32
accumulator) with the epilogue applied to the accumulator tile before its one store: bias,
then each step in order, the amax as a per-tile max and one atomic max, and the output cast
at the store. The kernel is specialised on the epilogue's ops and operand kinds
(``tl.constexpr``), so each distinct epilogue compiles once and the untaken branches cost
nothing.

Semantics, as equivalent Python (``Epilogue.apply`` computes the same, see
:mod:`torchnext.gemm.epilogue`)::

    def triton_gemm(a_MK, b_KN, bias_N=None, epilogue=None, out_dtype=None, *, allow_tf32=False):
        acc_MN = a_MK.float() @ b_KN.float()          # float32 accumulation; tf32 only if asked
        if bias_N is not None:
            acc_MN = acc_MN + bias_N.float()
        for step in epilogue.steps:                   # at most 4
            acc_MN = step.apply(acc_MN)               # operands read in float32
        if epilogue.amax_into is not None:
            epilogue.amax_into.copy_(acc_MN.abs().amax())   # overwritten, not max-ed into
        return acc_MN.to(out_dtype or a_MK.dtype)

What not to assume: CUDA tensors only (CPU tensors run only under ``TRITON_INTERPRET=1``,
which is how the tests run it); no autograd; float16/bfloat16/float32 inputs; any strides
(no copy is made, but a transposed ``a_MK`` loads slower); the activations are computed
from ``exp``/``erf`` in float32 (tanh has no Triton primitive), so they match torch's within
a few float32 ulps, not bit for bit; the first call of each new epilogue, dtype and shape
class compiles and times its candidate tiles (seconds). Triton is imported on the first
call, never at import of this module (the argument checks,
:mod:`torchnext.gemm.triton_gemm_checks`, run before it): the kernels are built by a cached
function-level builder, :func:`_kernels`.

Shape legend: M output rows, N output columns, K the contracted dimension; ``a_MK``,
``b_KN``, ``bias_N``, ``out_MN``; an epilogue operand is a row ``[N]``, a column ``[M, 1]``
or full ``[M, N]``.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.util
from typing import Any, no_type_check

import torch

from torchnext.gemm.epilogue import Epilogue
from torchnext.gemm.triton_gemm_checks import MAX_STEPS, check_triton_gemm_args, interpreting

__all__ = ["MAX_STEPS", "triton_available", "triton_gemm"]

# Offsets past this need 64-bit index arithmetic in the kernel (a constexpr switch).
_INT32_LIMIT = 2**31 - 1
_EMPTY = Epilogue()

# Triton's DSL modules, bound by _kernels() on first use. Triton 3.3 and older resolve the
# names a kernel uses through its module's globals only (not closures), so the builder binds
# the DSL and the helper kernels as globals of this module rather than as its locals.
triton: Any = None
tl: Any = None


@functools.cache
def _triton_importable() -> bool:
    return importlib.util.find_spec("triton") is not None


def triton_available() -> bool:
    """Whether the template can run here: Triton importable and a CUDA device (or Triton's
    CPU interpreter, ``TRITON_INTERPRET=1``). Does not import Triton."""
    return _triton_importable() and (interpreting() or torch.cuda.is_available())


def _configs() -> list[Any]:
    """The tutorial's autotune space plus Hopper-sized tiles; one small tile when interpreted
    (each configuration would be run, slowly, by the interpreter's timing)."""
    if interpreting():
        return [triton.Config({"BLOCK_M": 16, "BLOCK_N": 16, "BLOCK_K": 16, "GROUP_M": 2})]
    shapes = (
        # BLOCK_M, BLOCK_N, BLOCK_K, num_stages, num_warps
        (128, 256, 64, 3, 8),
        (256, 128, 64, 3, 8),
        (128, 128, 64, 4, 4),
        (128, 128, 64, 3, 8),
        (64, 256, 32, 4, 4),
        (128, 64, 32, 4, 4),
        (64, 128, 32, 4, 4),
        (64, 64, 32, 4, 4),
        (32, 64, 32, 5, 2),
        (16, 64, 64, 4, 4),
    )
    return [
        triton.Config(
            {"BLOCK_M": m, "BLOCK_N": n, "BLOCK_K": k, "GROUP_M": 8},
            num_stages=stages,
            num_warps=warps,
        )
        for m, n, k, stages, warps in shapes
    ]


def _prune(configs: list[Any], named_args: dict[str, Any], **kwargs: Any) -> list[Any]:
    """The configurations worth timing for this call (each one costs a compile on first use).

    Tiles much larger than the output only compute padding: keep those within the output
    (rounded up to powers of two), or the smallest one. Without tf32, float32 tiles run on
    FMA units, not tensor cores: keep the small ones there (a 128x256 float32 tile took over
    30 s to compile and runs slower)."""
    m_cap = max(16, int(named_args["M_BUCKET"]))
    n_cap = max(16, 1 << max(0, (int(named_args["N"]) - 1).bit_length()))
    kept = [c for c in configs if c.kwargs["BLOCK_M"] <= m_cap and c.kwargs["BLOCK_N"] <= n_cap]
    if kwargs.get("PRECISION") == "ieee" and named_args["a_ptr"].dtype == torch.float32:
        kept = [
            c for c in kept if c.kwargs["BLOCK_M"] * c.kwargs["BLOCK_N"] <= 128 * 64
            and c.kwargs["BLOCK_K"] <= 32
        ]  # fmt: skip
    return kept or [min(configs, key=lambda c: c.kwargs["BLOCK_M"] * c.kwargs["BLOCK_N"])]


# Tuned once per power-of-two bucket of M (as the package's autotuner buckets), exact N and K,
# and epilogue: decode batches of every size would otherwise each re-run the tuning.
_KEY = ["M_BUCKET", "N", "K", "HAS_BIAS", "HAS_AMAX", "OP0", "KIND0", "OP1", "KIND1"]
_KEY += ["OP2", "KIND2", "OP3", "KIND3", "PRECISION"]


@functools.cache
@no_type_check  # Triton's DSL is not expressible in mypy's types
def _kernels() -> Any:
    """Import Triton and build the autotuned kernel (once per process)."""
    global triton, tl, _tanh, _operand, _step
    import triton
    import triton.language as tl

    @triton.jit
    def _tanh(x):
        # No tanh primitive in tl: a short odd series near 0 (where 1 - exp(-2|x|) cancels),
        # else (1 - t) / (1 + t) with t = exp(-2|x|) <= 1, which cannot overflow.
        ax = tl.abs(x)
        t = tl.exp(-2.0 * ax)
        big = (1.0 - t) / (1.0 + t)
        x2 = x * x
        small = x * (1.0 + x2 * (-0.3333333333333333 + x2 * (0.13333333333 + x2 * -0.053968254)))
        return tl.where(ax < 0.125, small, tl.where(x < 0.0, -big, big))

    @triton.jit
    def _operand(KIND: tl.constexpr, e_ptr, e_sm, e_sn, offs_m, offs_n, mask_m, mask_n):
        if KIND == "row":
            v = tl.load(e_ptr + offs_n * e_sn, mask=mask_n, other=0.0).to(tl.float32)[None, :]
        elif KIND == "column":
            v = tl.load(e_ptr + offs_m * e_sm, mask=mask_m, other=0.0).to(tl.float32)[:, None]
        else:
            ptrs = e_ptr + offs_m[:, None] * e_sm + offs_n[None, :] * e_sn
            v = tl.load(ptrs, mask=mask_m[:, None] & mask_n[None, :], other=0.0).to(tl.float32)
        return v

    @triton.jit
    def _step(acc, OP: tl.constexpr, KIND: tl.constexpr, e_ptr, e_sm, e_sn, e_val,
              offs_m, offs_n, mask_m, mask_n):  # fmt: skip
        if OP == "relu":
            acc = tl.where(acc < 0.0, 0.0, acc)  # keeps NaN, as torch.relu does
        elif OP == "gelu":
            acc = 0.5 * acc * (1.0 + tl.erf(acc * 0.7071067811865476))
        elif OP == "gelu_tanh":
            acc = 0.5 * acc * (1.0 + _tanh(0.7978845608028654 * (acc + 0.044715 * acc * acc * acc)))
        elif OP == "silu":
            acc = acc / (1.0 + tl.exp(-acc))
        elif OP == "tanh":
            acc = _tanh(acc)
        elif OP == "sigmoid":
            acc = 1.0 / (1.0 + tl.exp(-acc))
        elif OP == "scale":
            acc = acc * e_val
        elif OP == "add":
            acc = acc + _operand(KIND, e_ptr, e_sm, e_sn, offs_m, offs_n, mask_m, mask_n)
        elif OP == "mul":
            acc = acc * _operand(KIND, e_ptr, e_sm, e_sn, offs_m, offs_n, mask_m, mask_n)
        return acc

    @triton.jit
    def gemm_kernel(
        a_ptr, b_ptr, c_ptr, bias_ptr, amax_ptr,
        e0_ptr, e0_sm, e0_sn, e0_val, e1_ptr, e1_sm, e1_sn, e1_val,
        e2_ptr, e2_sm, e2_sn, e2_val, e3_ptr, e3_sm, e3_sn, e3_val,
        M, N, K, M_BUCKET, stride_am, stride_ak, stride_bk, stride_bn, stride_cm, stride_cn, stride_bias,
        HAS_BIAS: tl.constexpr, HAS_AMAX: tl.constexpr,
        OP0: tl.constexpr, KIND0: tl.constexpr, OP1: tl.constexpr, KIND1: tl.constexpr,
        OP2: tl.constexpr, KIND2: tl.constexpr, OP3: tl.constexpr, KIND3: tl.constexpr,
        PRECISION: tl.constexpr, INDEX_64: tl.constexpr, DOT_F32: tl.constexpr,
        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
        GROUP_M: tl.constexpr,
    ):  # fmt: skip
        # Grouped ordering: GROUP_M row-tiles share each column tile while it is in L2.
        pid = tl.program_id(0)
        num_pid_m = tl.cdiv(M, BLOCK_M)
        num_pid_n = tl.cdiv(N, BLOCK_N)
        num_pid_in_group = GROUP_M * num_pid_n
        first_pid_m = (pid // num_pid_in_group) * GROUP_M
        group_size_m = tl.minimum(num_pid_m - first_pid_m, GROUP_M)
        pid_m = first_pid_m + ((pid % num_pid_in_group) % group_size_m)
        pid_n = (pid % num_pid_in_group) // group_size_m

        offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
        offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        if INDEX_64:
            offs_m = offs_m.to(tl.int64)
            offs_n = offs_n.to(tl.int64)
        offs_k = tl.arange(0, BLOCK_K)
        # Rows and columns past the edge wrap onto valid ones (the tutorial's trick): their
        # loads need no mask, and the masked store drops them.
        a_ptrs = a_ptr + (offs_m % M)[:, None] * stride_am + offs_k[None, :] * stride_ak
        b_ptrs = b_ptr + offs_k[:, None] * stride_bk + (offs_n % N)[None, :] * stride_bn
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for k in range(0, tl.cdiv(K, BLOCK_K)):
            k_left = K - k * BLOCK_K
            a = tl.load(a_ptrs, mask=offs_k[None, :] < k_left, other=0.0)
            b = tl.load(b_ptrs, mask=offs_k[:, None] < k_left, other=0.0)
            if DOT_F32:  # only under the interpreter (see triton_gemm)
                a = a.to(tl.float32)
                b = b.to(tl.float32)
            acc = tl.dot(a, b, acc, input_precision=PRECISION)
            a_ptrs += BLOCK_K * stride_ak
            b_ptrs += BLOCK_K * stride_bk

        # The epilogue, on the float32 tile in registers.
        mask_m = offs_m < M
        mask_n = offs_n < N
        if HAS_BIAS:
            bias = tl.load(bias_ptr + offs_n * stride_bias, mask=mask_n, other=0.0)
            acc = acc + bias.to(tl.float32)[None, :]
        acc = _step(acc, OP0, KIND0, e0_ptr, e0_sm, e0_sn, e0_val, offs_m, offs_n, mask_m, mask_n)
        acc = _step(acc, OP1, KIND1, e1_ptr, e1_sm, e1_sn, e1_val, offs_m, offs_n, mask_m, mask_n)
        acc = _step(acc, OP2, KIND2, e2_ptr, e2_sm, e2_sn, e2_val, offs_m, offs_n, mask_m, mask_n)
        acc = _step(acc, OP3, KIND3, e3_ptr, e3_sm, e3_sn, e3_val, offs_m, offs_n, mask_m, mask_n)
        mask = mask_m[:, None] & mask_n[None, :]
        if HAS_AMAX:
            # |acc| >= 0, so its float bits order as int32 (NaN above inf, so NaN wins as in
            # torch's amax); an int max needs no float atomics and never drops a NaN.
            bits = tl.where(mask, tl.abs(acc), 0.0).to(tl.int32, bitcast=True)
            tl.atomic_max(amax_ptr, tl.max(tl.max(bits, axis=1), axis=0))
        c_ptrs = c_ptr + offs_m[:, None] * stride_cm + offs_n[None, :] * stride_cn
        tl.store(c_ptrs, acc.to(c_ptr.dtype.element_ty), mask=mask)

    return triton.autotune(
        configs=_configs(), key=_KEY, prune_configs_by={"early_config_prune": _prune}
    )(gemm_kernel)


# Helper kernels, bound as module globals by _kernels() (see the comment on ``triton``).
_tanh: Any = None
_operand: Any = None
_step: Any = None


def triton_gemm(
    a_MK: torch.Tensor,
    b_KN: torch.Tensor,
    bias_N: torch.Tensor | None = None,
    epilogue: Epilogue | None = None,
    out_dtype: torch.dtype | None = None,
    *,
    allow_tf32: bool = False,
) -> torch.Tensor:
    """``epilogue(a_MK @ b_KN + bias_N)`` cast to ``out_dtype``, in one Triton kernel.

    Args:
        a_MK: ``[M, K]`` float16, bfloat16 or float32 on CUDA; any strides.
        b_KN: ``[K, N]``, the dtype and device of ``a_MK``; any strides.
        bias_N: ``[N]`` (any floating dtype, read as float32) or None.
        epilogue: at most :data:`MAX_STEPS` steps; operands may have any strides.
        out_dtype: float16, bfloat16, float32 or float64 (default ``a_MK.dtype``).
        allow_tf32: let float32 inputs use tf32 tensor cores (off: float32 products).

    Returns:
        A new contiguous ``[M, N]`` tensor of ``out_dtype``.

    Raises:
        GemmInputError: shapes that do not contract, a misshapen bias or operand, tensors on
            different devices.
        GemmUnsupportedError: another dtype, a non-CUDA device, more than 4 steps, or inputs
            that require grad.
    """
    epilogue = _EMPTY if epilogue is None else epilogue
    out_dtype = check_triton_gemm_args(a_MK, b_KN, bias_N, epilogue, out_dtype)
    m, k = a_MK.shape
    n = b_KN.shape[1]
    out_MN = torch.empty((m, n), dtype=out_dtype, device=a_MK.device)
    amax = epilogue.amax_into
    # int32 view: the kernel takes the max of the float bits as integers (see the kernel).
    amax_bits = None if amax is None else amax.view(1).view(torch.int32)
    if amax_bits is not None:
        amax_bits.zero_()  # amax_into is overwritten, as Epilogue.apply does
    if m == 0 or n == 0:
        return out_MN

    slots: list[tuple[torch.Tensor, int, int, float, str, str]] = []
    for step in epilogue.steps:
        t = step.operand
        if isinstance(t, torch.Tensor):
            kind = step.kind(m, n)
            sm = t.stride(0) if kind in ("column", "full") else 0
            slots.append((t, sm, t.stride(-1) if kind != "column" else 0, 0.0, step.op, kind))
        else:
            value = 0.0 if t is None else float(t)
            slots.append((out_MN, 0, 0, value, step.op, "scalar" if t is not None else "none"))
    slots += [(out_MN, 0, 0, 0.0, "none", "none")] * (MAX_STEPS - len(slots))

    sam, sak = a_MK.stride()
    sbk, sbn = b_KN.stride()
    s_bias = 0 if bias_N is None else bias_N.stride(0)
    # The largest element offset the kernel computes, per tensor (row operands have sm = 0,
    # columns sn = 0): past int32, the kernel indexes in int64.
    largest = max(
        (m - 1) * sam + (k - 1) * sak,
        (k - 1) * sbk + (n - 1) * sbn,
        m * n,
        (n - 1) * s_bias,
        *[(m - 1) * s[1] + (n - 1) * s[2] for s in slots],
    )
    index_64 = largest > _INT32_LIMIT

    if k == 0:  # nothing is loaded, but an empty tensor's pointer may be null: Triton refuses it
        a_MK = b_KN = torch.zeros(1, 1, dtype=a_MK.dtype, device=a_MK.device)
    kernel = _kernels()
    precision = "tf32" if allow_tf32 and a_MK.dtype == torch.float32 else "ieee"
    # Triton's CPU interpreter keeps bfloat16 as its raw uint16 bits and its dot multiplies
    # those integers; there (only) the tiles go to float32 first, which is exact for
    # bfloat16 products and keeps the float32 accumulation.
    dot_f32 = a_MK.dtype == torch.bfloat16 and interpreting()

    def grid(meta: dict[str, Any]) -> tuple[int]:
        return (triton.cdiv(m, meta["BLOCK_M"]) * triton.cdiv(n, meta["BLOCK_N"]),)

    # Triton launches on the current device: switch only when the inputs live elsewhere.
    elsewhere = a_MK.is_cuda and a_MK.device.index != torch.cuda.current_device()
    with torch.cuda.device(a_MK.device) if elsewhere else contextlib.nullcontext():
        kernel[grid](
            a_MK, b_KN, out_MN,
            out_MN if bias_N is None else bias_N,
            out_MN if amax_bits is None else amax_bits,
            *[arg for s in slots for arg in s[:4]],
            m, n, k, 1 << max(0, (m - 1).bit_length()), sam, sak, sbk, sbn, n, 1, s_bias,
            HAS_BIAS=bias_N is not None, HAS_AMAX=amax_bits is not None,
            OP0=slots[0][4], KIND0=slots[0][5], OP1=slots[1][4], KIND1=slots[1][5],
            OP2=slots[2][4], KIND2=slots[2][5], OP3=slots[3][4], KIND3=slots[3][5],
            PRECISION=precision, INDEX_64=index_64, DOT_F32=dot_f32,
            enable_fp_fusion=True,  # a*b+c as one FMA (asked for: Triton warns when unset)
        )  # fmt: skip
    return out_MN
