# mypy: ignore-errors
"""Triton device code for :mod:`torchnext.linalg._triton_jacobi` (imported lazily).

Kept apart so that ``import torchnext.linalg`` never imports Triton, and because
Triton's DSL is not expressible in mypy's type system (hence the file-level ignore).
One program per matrix; see the caller's docstring for the algorithm.
"""

import triton
import triton.language as tl


@triton.jit
def _rot(d, apq, tiny):
    # Scalar float arguments arrive as float32, where float64's `tiny` is 0: guard the
    # 0/0 case (d = apq = 0, nothing to rotate) with a select instead of adding tiny.
    den = tl.abs(d) + tl.sqrt(d * d + 4.0 * apq * apq)
    den = tl.where(den == 0, 1.0, den)
    t = 2.0 * apq / tl.where(d < 0, -den, den)
    t = tl.minimum(tl.maximum(t, -1.0), 1.0)
    c = 1.0 / tl.sqrt(1.0 + t * t)
    return c, t * c


@triton.jit
def eigh_kernel(
    a_ptr,
    v_ptr,
    sweeps_ptr,
    off_ptr,
    part_ptr,
    n,
    rounds,
    tol,
    tiny,
    P: tl.constexpr,
    MAX_SWEEPS: tl.constexpr,
):
    pid = tl.program_id(0)
    i = tl.arange(0, P)
    ok_i = i < n
    ok_ij = ok_i[:, None] & ok_i[None, :]
    a_base = a_ptr + pid * n * n
    v_base = v_ptr + pid * n * n
    blk = tl.load(a_base + i[:, None] * n + i[None, :], mask=ok_ij, other=0.0)
    norm2 = tl.sum(tl.sum(blk * blk, axis=1), axis=0)
    offd = tl.where(i[:, None] == i[None, :], 0.0, blk)
    off2 = tl.sum(tl.sum(offd * offd, axis=1), axis=0)
    thr2 = tol * tol * norm2
    sweep = 0
    while (sweep < MAX_SWEEPS) & (off2 > thr2):
        for r in range(rounds):
            part = tl.load(part_ptr + r * P + i)
            ok_p = part < n
            idle = (part == i) | (~ok_p) | (~ok_i)
            d_i = tl.load(a_base + i * n + i, mask=ok_i, other=0.0)
            d_p = tl.load(a_base + part * n + part, mask=ok_p & ok_i, other=0.0)
            a_ip = tl.load(a_base + i * n + part, mask=ok_p & ok_i, other=0.0)
            is_p = i < part
            d = tl.where(is_p, d_p - d_i, d_i - d_p)
            c, s = _rot(d, a_ip, tiny)
            c = tl.where(idle, 1.0, c)
            sg = tl.where(idle, 0.0, tl.where(is_p, -s, s))
            pr = tl.where(ok_p, part, i)
            x00 = tl.load(a_base + i[:, None] * n + i[None, :], mask=ok_ij, other=0.0)
            x01 = tl.load(a_base + i[:, None] * n + pr[None, :], mask=ok_ij, other=0.0)
            x10 = tl.load(a_base + pr[:, None] * n + i[None, :], mask=ok_ij, other=0.0)
            x11 = tl.load(a_base + pr[:, None] * n + pr[None, :], mask=ok_ij, other=0.0)
            v0 = tl.load(v_base + i[:, None] * n + i[None, :], mask=ok_ij, other=0.0)
            v1 = tl.load(v_base + i[:, None] * n + pr[None, :], mask=ok_ij, other=0.0)
            ci, si = c[:, None], sg[:, None]
            cj, sj = c[None, :], sg[None, :]
            new = ci * cj * x00 + ci * sj * x01 + si * cj * x10 + si * sj * x11
            pivot = (i[None, :] == pr[:, None]) & (~idle[:, None])
            new = tl.where(pivot, 0.0, new)
            newv = cj * v0 + sj * v1
            tl.debug_barrier()
            tl.store(a_base + i[:, None] * n + i[None, :], new, mask=ok_ij)
            tl.store(v_base + i[:, None] * n + i[None, :], newv, mask=ok_ij)
            tl.debug_barrier()
        blk = tl.load(a_base + i[:, None] * n + i[None, :], mask=ok_ij, other=0.0)
        offd = tl.where(i[:, None] == i[None, :], 0.0, blk)
        off2 = tl.sum(tl.sum(offd * offd, axis=1), axis=0)
        sweep += 1
    tl.store(sweeps_ptr + pid, sweep)
    tl.store(off_ptr + pid, tl.sqrt(off2 / tl.where(norm2 == 0, 1.0, norm2)))


@triton.jit
def svd_kernel(
    a_ptr,
    v_ptr,
    sweeps_ptr,
    cos_ptr,
    part_ptr,
    m,
    n,
    rounds,
    tol,
    tiny,
    PM: tl.constexpr,
    P: tl.constexpr,
    MAX_SWEEPS: tl.constexpr,
):
    pid = tl.program_id(0)
    rows = tl.arange(0, PM)
    j = tl.arange(0, P)
    ok_r = rows < m
    ok_j = j < n
    a_base = a_ptr + pid * m * n
    v_base = v_ptr + pid * n * n
    # Loop-carried values must keep one dtype: derive them from the matrix dtype
    # (float arguments such as `tol` are float32 even for float64 matrices).
    zero = tl.max(tl.zeros([P], dtype=a_ptr.dtype.element_ty), axis=0)
    worst = zero + (tol + 1.0)
    sweep = 0
    while (sweep < MAX_SWEEPS) & (worst > tol):
        worst = zero
        for r in range(rounds):
            part = tl.load(part_ptr + r * P + j)
            ok_p = part < n
            idle = (part == j) | (~ok_p) | (~ok_j)
            pr = tl.where(ok_p, part, j)
            mask_a = ok_r[:, None] & ok_j[None, :]
            x0 = tl.load(a_base + rows[:, None] * n + j[None, :], mask=mask_a, other=0.0)
            x1 = tl.load(a_base + rows[:, None] * n + pr[None, :], mask=mask_a, other=0.0)
            alpha = tl.sum(x0 * x0, axis=0)
            beta = tl.sum(x1 * x1, axis=0)
            gamma = tl.sum(x0 * x1, axis=0)
            root = tl.sqrt(alpha * beta)
            cosv = tl.abs(gamma) / tl.where(root == 0, 1.0, root)
            worst = tl.maximum(worst, tl.max(tl.where(idle, 0.0, cosv), axis=0))
            is_p = j < part
            d = tl.where(is_p, beta - alpha, alpha - beta)
            c, s = _rot(d, gamma, tiny)
            c = tl.where(idle, 1.0, c)
            sg = tl.where(idle, 0.0, tl.where(is_p, -s, s))
            mask_v = ok_j[:, None] & ok_j[None, :]
            v0 = tl.load(v_base + j[:, None] * n + j[None, :], mask=mask_v, other=0.0)
            v1 = tl.load(v_base + j[:, None] * n + pr[None, :], mask=mask_v, other=0.0)
            tl.debug_barrier()
            tl.store(
                a_base + rows[:, None] * n + j[None, :],
                c[None, :] * x0 + sg[None, :] * x1,
                mask=mask_a,
            )
            tl.store(
                v_base + j[:, None] * n + j[None, :],
                c[None, :] * v0 + sg[None, :] * v1,
                mask=mask_v,
            )
            tl.debug_barrier()
        sweep += 1
    tl.store(sweeps_ptr + pid, sweep)
    tl.store(cos_ptr + pid, worst)
