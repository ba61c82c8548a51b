"""The C source of the AVX-512 grouped GEMM for small groups (``tn_grouped512``, ``_nk``).

What it is: :data:`SOURCE`, C compiled into the decode kernels' library (by
:mod:`torchnext.gemm.gemv_cpu`, after :mod:`torchnext.gemm.gemv_avx512_source`, whose target
attributes, run-time CPU check and GEMV tiles it shares). Both functions multiply the groups
of rows of a 2-D x 3-D grouped GEMM, ``out[s:e] = a[s:e] @ b[g] (+ bias[g])``, summed in
float32 and rounded once:

- ``tn_grouped512``: ``b[g]`` stored ``[K, N]`` (unit column stride), as a mixture-of-experts
  layer keeps its weights; float32 (AVX-512F).
- ``tn_grouped512_nk``: ``b`` a transposed ``[G, N, K]`` (``nn.Linear``-style experts passed
  as ``w.transpose(-2, -1)``, and the backward's ``dA``); the decode GEMV's tiles (four weight
  rows against four rows of ``a``), float32 or bfloat16 (AVX-512 BF16), out float32 or the
  inputs' dtype.

Why: a decode step's experts see a few rows each (top-2 of 256 tokens over 64 experts: 8 on
average), so a grouped GEMM there is a stream of weights, one ``[K, N]`` matrix per expert.
torch's CPU ``mm`` at such row counts was measured reading the weight at 7 GB/s (a loop of
``mm`` and ``torch._grouped_mm`` alike); these tiles read each expert's weight once, row after
row, so the hardware prefetchers follow them.

How (``[K, N]``): a tile holds 4 rows of ``a`` against 64 columns (4 vectors) of ``b`` in 16
float32 sums; each ``b`` vector serves 4 rows and each broadcast element of ``a`` serves 4
vectors. The contraction runs in blocks of ``TN_KB`` rows of ``b`` (16 rows x 256 bytes per
column strip, in L1), with the sums kept in the output between blocks, so every row of a group
reuses the block from cache and ``b`` is read from memory once however many rows the group
has. ``b`` is prefetched into L2 256 KiB ahead: measured, that took one thread from 10 to
12-13 GB/s. Work items are (group, column chunk) pairs on OpenMP threads, dynamically
scheduled.

When to use: through :func:`torchnext.gemm.grouped_mm` (:mod:`torchnext.gemm.grouped_cpu`
chooses the groups that go here); :meth:`torchnext.gemm.gemv_cpu.CpuKernels.grouped512` to test
or benchmark it.

What not to assume: where the CPU lacks the instructions for the dtype, both functions return
-1 and write nothing. Sums run in another order than torch's, so results match torch to
float32-accumulation tolerance, not bit for bit. Groups must not overlap (the running sums
live in the output): :func:`torchnext.gemm.cpu_kernel_checks.check_grouped512` refuses them.

Shape legend: ``M`` rows of a group, ``K`` contraction, ``N`` columns, ``G`` groups.
"""

from __future__ import annotations

__all__ = ["SOURCE"]

SOURCE = r"""
#if defined(__AVX2__) && defined(__x86_64__) && !defined(TN_NO_AVX512) && \
    ((defined(__clang__) && __clang_major__ >= 11) || (!defined(__clang__) && __GNUC__ >= 11))
/* Rows of b per contraction block: the block's column strip (16 x 256 bytes) stays in L1 while
   every row of the group uses it. */
#define TN_KB 16
/* Rows of a per tile: 4 x 4 vectors of sums; 5 or 6 rows measured no faster. */
#define TN_MR 4
/* How far ahead b is prefetched into L2, in bytes of the rows being read (1/4 of L2's 1 MiB
   on the CPUs measured): the hardware prefetchers alone left one thread at 10 GB/s, about
   half of what it streams sequentially, because each row of b is its own stream. */
#define TN_PF_BYTES 262144

/* MB (<= 4) rows of x against NV (<= 4) vectors of 16 columns of b from n0 (lanes masked by
   mk), over b's rows k0 .. k0 + kb - 1; the sums start from bias (or zero) on the first block
   and from out after it, and go back to out. */
TN_T512 static inline __attribute__((always_inline)) void tn_kn_tile(
    const int MB, const int NV, const float* x, int64_t ldx, const float* b, int64_t ldb,
    int64_t k0, int64_t kb, float* out, int64_t ldo, int64_t n0, const __mmask16* mk,
    int first, const float* bias, int64_t pfk) {
  __m512 acc[4][4];
  for (int i = 0; i < MB; i++)
    for (int v = 0; v < NV; v++)
      acc[i][v] = !first ? _mm512_maskz_loadu_ps(mk[v], out + i * ldo + n0 + 16 * v)
                  : bias ? _mm512_maskz_loadu_ps(mk[v], bias + n0 + 16 * v)
                         : _mm512_setzero_ps();
  for (int64_t k = k0; k < k0 + kb; k++) {
    __m512 bv[4];
    for (int v = 0; v < NV; v++) bv[v] = _mm512_maskz_loadu_ps(mk[v], b + k * ldb + n0 + 16 * v);
    if (pfk)  /* past the end of b is harmless: a prefetch never faults */
      for (int v = 0; v < NV; v++)
        _mm_prefetch((const char*)(b + (k + pfk) * ldb + n0 + 16 * v), _MM_HINT_T2);
    for (int i = 0; i < MB; i++) {
      const __m512 xs = _mm512_set1_ps(x[i * ldx + k]);
      for (int v = 0; v < NV; v++) acc[i][v] = _mm512_fmadd_ps(bv[v], xs, acc[i][v]);
    }
  }
  for (int i = 0; i < MB; i++)
    for (int v = 0; v < NV; v++) _mm512_mask_storeu_ps(out + i * ldo + n0 + 16 * v, mk[v], acc[i][v]);
}

/* out[0:M, c0:c1] = x[0:M] @ b[:, c0:c1] (+ bias[c0:c1]) for one group. */
TN_T512 static void tn_kn_block(int64_t M, int64_t K, const float* x, int64_t ldx,
                                const float* b, int64_t ldb, float* out, int64_t ldo,
                                int64_t c0, int64_t c1, const float* bias) {
  if (K == 0) {  /* an empty contraction: the bias, or zeros */
    for (int64_t m = 0; m < M; m++)
      for (int64_t n = c0; n < c1; n++) out[m * ldo + n] = bias ? bias[n] : 0.0f;
    return;
  }
  int64_t pfk = TN_PF_BYTES / (4 * (c1 - c0));  /* rows ahead */
  pfk = pfk < TN_KB ? TN_KB : pfk > 1024 ? 1024 : pfk;
  for (int64_t k0 = 0; k0 < K; k0 += TN_KB) {
    const int64_t kb = K - k0 < TN_KB ? K - k0 : TN_KB;
    for (int64_t m0 = 0; m0 < M; m0 += TN_MR) {
      const int mb = M - m0 < TN_MR ? (int)(M - m0) : TN_MR;
      const float* xm = x + m0 * ldx;
      float* om = out + m0 * ldo;
      for (int64_t n0 = c0; n0 < c1; n0 += 64) {
        const int64_t cols = c1 - n0 < 64 ? c1 - n0 : 64;
        const int nv = (int)((cols + 15) / 16);
        __mmask16 mk[4];
        for (int v = 0; v < 4; v++) {
          const int64_t left = cols - 16 * v;
          mk[v] = left >= 16 ? (__mmask16)0xFFFF : left > 0 ? (__mmask16)((1u << left) - 1) : 0;
        }
        switch (mb * 10 + nv) {
#define TN_KN(MB_, NV_) case MB_ * 10 + NV_: \
  tn_kn_tile(MB_, NV_, xm, ldx, b, ldb, k0, kb, om, ldo, n0, mk, k0 == 0, bias, pfk); break;
          TN_KN(1, 1) TN_KN(1, 2) TN_KN(1, 3) TN_KN(1, 4)
          TN_KN(2, 1) TN_KN(2, 2) TN_KN(2, 3) TN_KN(2, 4)
          TN_KN(3, 1) TN_KN(3, 2) TN_KN(3, 3) TN_KN(3, 4)
          TN_KN(4, 1) TN_KN(4, 2) TN_KN(4, 3) TN_KN(4, 4)
#undef TN_KN
          default: break;
        }
      }
    }
  }
}

/* For each listed group i: out[starts[i]:ends[i], :] = a[starts[i]:ends[i], :] @ b[gid[i]]
   (+ bias[gid[i]]), float32; a, out row strides lda, ldo; b[g] at b + g * gsb with row stride
   ldb; bias[g] at bias + g * gsbias (bias may be NULL). Items are (group, chunk of columns).
   Returns -1 (and writes nothing) where this CPU lacks AVX-512F. */
int tn_grouped512(int64_t G, const int64_t* gid, const int64_t* starts, const int64_t* ends,
                  int64_t K, int64_t N, const float* a, int64_t lda, const float* b,
                  int64_t ldb, int64_t gsb, const float* bias, int64_t gsbias, float* out,
                  int64_t ldo, int64_t chunk, int nthreads) {
  static int have = -1;
  if (have < 0) have = tn_avx512_kinds();
  if (!(have & 1) || chunk <= 0) return -1;
  const int64_t chunks = (N + chunk - 1) / chunk;
  #pragma omp parallel num_threads(nthreads) if (nthreads > 1)
  {
    _Pragma("omp for schedule(dynamic, 1)") for (int64_t t = 0; t < G * chunks; t++) {
      const int64_t i = t / chunks, c0 = (t % chunks) * chunk;
      const int64_t c1 = c0 + chunk < N ? c0 + chunk : N, g = gid[i];
      tn_kn_block(ends[i] - starts[i], K, a + starts[i] * lda, lda, b + g * gsb, ldb,
                  out + starts[i] * ldo, ldo, c0, c1, bias ? bias + g * gsbias : NULL);
    }
  }
  return 0;
}
/* The same for weights stored [N, K] (b[g] a transposed view, as nn.Linear-style experts
   [G, N, K] go in): w[g] at w + g * gsw with row stride ldw, read by the decode GEMV's tiles
   (four weight rows against four rows of a), bfloat16 (kind 2) or float32 (kind 4); out of
   okind 2 or 4 with row stride N; bias of the inputs' kind. Items are (group, chunk of N). */
int tn_grouped512_nk(int64_t G, const int64_t* gid, const int64_t* starts, const int64_t* ends,
                     int64_t K, int64_t N, const void* a, int64_t lda, const void* w,
                     int64_t ldw, int64_t gsw, int kind, const void* bias, int64_t gsbias,
                     void* out, int okind, int64_t chunk, int nthreads) {
  static int have = -1;
  if (have < 0) have = tn_avx512_kinds();
  if (!(kind == 2 ? have & 2 : kind == 4 ? have & 1 : 0) || chunk <= 0) return -1;
  if (okind != 2 && okind != 4) return -1;
  const int64_t chunks = (N + chunk - 1) / chunk, isz = kind, osz = okind;
  #pragma omp parallel num_threads(nthreads) if (nthreads > 1)
  {
    _Pragma("omp for schedule(dynamic, 1)") for (int64_t t = 0; t < G * chunks; t++) {
      const int64_t i = t / chunks, c0 = (t % chunks) * chunk;
      const int64_t c1 = c0 + chunk < N ? c0 + chunk : N, g = gid[i], M = ends[i] - starts[i];
      const char* bias_g = bias ? (const char*)bias + g * gsbias * isz : NULL;
      const TnOut o = {(char*)out + starts[i] * N * osz, okind, bias_g, kind, N};
      const char* x = (const char*)a + starts[i] * lda * isz;
      const char* wg = (const char*)w + g * gsw * isz;
      for (int64_t n = c0; n < c1;) {
        const int nb = c1 - n >= 4 ? 4 : 1;
        if (kind == 2)
          tn_rows_bf16(nb, M, (const uint16_t*)wg, ldw, (const uint16_t*)x, lda, K, n, &o);
        else
          tn_rows_f32(nb, M, (const float*)wg, ldw, (const float*)x, lda, K, n, &o);
        n += nb;
      }
    }
  }
  return 0;
}
#else
int tn_grouped512(int64_t G, const int64_t* gid, const int64_t* starts, const int64_t* ends,
                  int64_t K, int64_t N, const float* a, int64_t lda, const float* b,
                  int64_t ldb, int64_t gsb, const float* bias, int64_t gsbias, float* out,
                  int64_t ldo, int64_t chunk, int nthreads) {
  (void)G; (void)gid; (void)starts; (void)ends; (void)K; (void)N; (void)a; (void)lda; (void)b;
  (void)ldb; (void)gsb; (void)bias; (void)gsbias; (void)out; (void)ldo; (void)chunk;
  (void)nthreads;
  return -1;
}
int tn_grouped512_nk(int64_t G, const int64_t* gid, const int64_t* starts, const int64_t* ends,
                     int64_t K, int64_t N, const void* a, int64_t lda, const void* w,
                     int64_t ldw, int64_t gsw, int kind, const void* bias, int64_t gsbias,
                     void* out, int okind, int64_t chunk, int nthreads) {
  (void)G; (void)gid; (void)starts; (void)ends; (void)K; (void)N; (void)a; (void)lda; (void)w;
  (void)ldw; (void)gsw; (void)kind; (void)bias; (void)gsbias; (void)out; (void)okind;
  (void)chunk; (void)nthreads;
  return -1;
}
#endif
"""
"""Appended to the decode kernels' source after :mod:`torchnext.gemm.gemv_avx512_source`."""
