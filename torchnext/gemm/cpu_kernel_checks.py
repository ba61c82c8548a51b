"""Operand checks of the C kernels in :mod:`torchnext.gemm.gemv_cpu`: what the C code trusts.

What it is: one function per kernel that reads or writes by raw pointer (``dense512``,
``grouped512``, ``decode8``), raising :class:`~torchnext.errors.GemmInputError` with every
problem it finds, each naming the argument, what it got and what the kernel needs.

When to use: :class:`torchnext.gemm.gemv_cpu.CpuKernels` calls them before every kernel call;
callers that route (``grouped_mm``, ``scaled_mm``, ``linear``) check the user's arguments
with their own rules first, so these catch only a caller's mistake, never a user's.

What not to assume: they check layout, dtype, device and bounds, not values (NaN scales, for
example, are the routes' business).

Shape legend: ``M`` rows, ``N`` columns, ``K`` contraction, ``G`` groups; ``R``, ``C`` the
rows and columns of a decoded matrix.
"""

from __future__ import annotations

import torch

from torchnext.errors import GemmInputError

__all__ = ["check_decode8", "check_dense512", "check_grouped512"]


def check_grouped512(
    a_MK: torch.Tensor,
    b_GKN: torch.Tensor,
    groups: torch.Tensor,
    bias_GN: torch.Tensor | None,
    out_MN: torch.Tensor,
    chunk: int,
) -> bool:
    """What the C code takes on trust (it reads and writes by raw pointers); returns whether
    ``b_GKN`` is stored ``[K, N]`` (else it is a transposed ``[G, N, K]``)."""
    dtype, problems = a_MK.dtype, []
    stored_kn = b_GKN.dim() == 3 and b_GKN.stride(2) == 1
    out_dtypes: tuple[torch.dtype, ...] = (torch.float32,)
    if not stored_kn and dtype != torch.float32:
        out_dtypes = (dtype, torch.float32)
    ops: dict[str, tuple[torch.Tensor, int, tuple[torch.dtype, ...]]] = {
        "a_MK": (a_MK, 2, (dtype,)),
        "b_GKN": (b_GKN, 3, (dtype,)),
    }
    ops["out_MN"] = (out_MN, 2, out_dtypes)
    if bias_GN is not None:
        ops["bias_GN"] = (bias_GN, 2, (dtype,))
    for name, (t, dims, dtypes) in ops.items():
        if name == "b_GKN":
            unit = stored_kn or (t.dim() == 3 and t.stride(1) == 1)
        else:
            unit = t.stride(-1) == 1
        if t.dim() != dims or t.dtype not in dtypes or not unit or not t.is_cpu:
            layout = "stored [K, N] or [N, K]" if name == "b_GKN" else "unit last stride"
            problems.append(
                f"{name} {t.dtype} {list(t.shape)} on {t.device} (expected "
                f"{' or '.join(str(d) for d in dtypes)}, {dims}-D, {layout}, on the CPU)"
            )
    if stored_kn and dtype != torch.float32:
        problems.append(f"b_GKN stored [K, N] in {dtype} (that layout runs float32 only)")
    if not stored_kn and not out_MN.is_contiguous():
        problems.append("out_MN is not contiguous (a transposed b_GKN needs it contiguous)")
    if problems:
        raise GemmInputError("grouped512: " + "; ".join(problems))
    m, k = a_MK.shape
    g, n = b_GKN.shape[0], b_GKN.shape[2]
    if b_GKN.shape[1] != k or tuple(out_MN.shape) != (m, n):
        problems.append(
            f"shapes a_MK {list(a_MK.shape)}, b_GKN {list(b_GKN.shape)}, out_MN "
            f"{list(out_MN.shape)} (expected [M, K], [G, K, N], [M, N])"
        )
    if bias_GN is not None and tuple(bias_GN.shape) != (g, n):
        problems.append(f"bias_GN {list(bias_GN.shape)} (expected [{g}, {n}])")
    if (
        groups.dtype != torch.int64
        or groups.dim() != 2
        or groups.shape[1] != 3
        or not groups.is_cpu
    ):
        problems.append(
            f"groups {groups.dtype} {list(groups.shape)} on {groups.device} "
            "(expected int64 [n, 3] on the CPU)"
        )
    elif len(groups):
        gid, s, e = groups.unbind(1)
        if bool((gid < 0).any() | (gid >= g).any() | (s < 0).any() | (e < s).any() | (e > m).any()):
            problems.append(f"groups hold a group outside [0, {g}) or rows outside [0, {m}]")
        # The kernel keeps running sums in out between blocks of K: rows written by two
        # items, or by two rows of out at once, would race.
        order = torch.argsort(s)
        if len(groups) > 1 and bool((e[order][:-1] > s[order][1:]).any()):
            problems.append("groups whose row ranges overlap (expected disjoint [start, end))")
    if out_MN.dim() == 2 and out_MN.shape[0] > 1 and out_MN.stride(0) < max(n, 1):
        problems.append(f"out_MN row stride {out_MN.stride(0)} (expected >= N = {n})")
    if out_MN.untyped_storage().data_ptr() in {
        t.untyped_storage().data_ptr() for t in (a_MK, b_GKN) if t.numel()
    }:
        problems.append("out_MN shares memory with a_MK or b_GKN (expected a separate output)")
    if chunk <= 0:
        problems.append(f"chunk={chunk} (expected a positive column count)")
    if problems:
        raise GemmInputError("grouped512: " + "; ".join(problems))
    return stored_kn


def check_dense512(
    w_NK: torch.Tensor, x_MK: torch.Tensor, bias_N: torch.Tensor | None, out_MN: torch.Tensor
) -> None:
    """What the C code takes on trust: it reads and writes by raw pointers."""
    m, k = x_MK.shape
    n = w_NK.shape[0]
    problems = []
    if w_NK.dim() != 2 or w_NK.shape[1] != k or w_NK.dtype != x_MK.dtype or w_NK.stride(-1) != 1:
        problems.append(
            f"w_NK {w_NK.dtype} {list(w_NK.shape)} (expected {x_MK.dtype} [N, {k}], unit last stride)"
        )
    if not x_MK.is_contiguous():
        problems.append("x_MK is not contiguous")
    if bias_N is not None and (
        tuple(bias_N.shape) != (n,) or bias_N.dtype != x_MK.dtype or not bias_N.is_contiguous()
    ):
        problems.append(
            f"bias_N {bias_N.dtype} {list(bias_N.shape)} (expected contiguous {x_MK.dtype} [{n}])"
        )
    if (
        tuple(out_MN.shape) != (m, n)
        or out_MN.dtype not in (torch.bfloat16, torch.float32)
        or not out_MN.is_contiguous()
    ):
        problems.append(
            f"out_MN {out_MN.dtype} {list(out_MN.shape)} (expected contiguous bfloat16 or float32 [{m}, {n}])"
        )
    if any(not t.is_cpu for t in (w_NK, x_MK, out_MN)):
        problems.append("an operand is not on the CPU")
    if problems:
        raise GemmInputError("dense512: " + "; ".join(problems))


def check_decode8(
    codes_RC: torch.Tensor,
    table: torch.Tensor,
    out_RC: torch.Tensor,
    row_scale: torch.Tensor | None,
    col_scale: torch.Tensor | None,
) -> None:
    """What ``tn_decode8`` takes on trust (see ``CpuKernels.decode8``)."""
    if codes_RC.dim() != 2 or codes_RC.element_size() != 1 or not codes_RC.is_cpu:
        raise GemmInputError(
            f"decode8: codes_RC {codes_RC.dtype} {list(codes_RC.shape)} on {codes_RC.device} "
            "(expected 2-D one-byte codes on the CPU)"
        )
    r, c = codes_RC.shape
    problems = []
    if (
        table.dtype != torch.float32
        or tuple(table.shape) != (256,)
        or not table.is_contiguous()
        or not table.is_cpu
    ):
        problems.append(
            f"table {table.dtype} {list(table.shape)} on {table.device} "
            "(expected contiguous float32 [256] on the CPU)"
        )
    if (
        out_RC.dtype != torch.float32
        or tuple(out_RC.shape) != (r, c)
        or not out_RC.is_contiguous()
        or not out_RC.is_cpu
    ):
        problems.append(
            f"out_RC {out_RC.dtype} {list(out_RC.shape)} on {out_RC.device} "
            f"(expected contiguous float32 [{r}, {c}] on the CPU)"
        )
    for name, t, n in (("row_scale", row_scale, r), ("col_scale", col_scale, c)):
        if t is not None and (
            t.dtype != torch.float32 or t.numel() != n or not t.is_contiguous() or not t.is_cpu
        ):
            problems.append(
                f"{name} {t.dtype} {list(t.shape)} on {t.device} "
                f"(expected {n} contiguous float32 on the CPU)"
            )
    if row_scale is not None and col_scale is not None:
        problems.append("both row_scale and col_scale (expected one scale per value)")
    if problems:
        raise GemmInputError("decode8: " + "; ".join(problems))
