"""The C source of the AVX-512 dense GEMV (``tn_dense512``), appended to the decode kernels.

What it is: :data:`SOURCE`, C compiled into the same library as
:mod:`torchnext.gemm.gemv_cpu_source` (by :mod:`torchnext.gemm.gemv_cpu`). Its functions carry
``target`` attributes, so the library is still built for AVX2 and these run only where the CPU
reports the instructions at run time (``__builtin_cpu_supports``, which also checks that the
OS saves the AVX-512 registers):

- bfloat16 ``x`` and weight: ``vdpbf16ps`` (AVX-512 BF16) multiplies 32 pairs and adds them
  into 16 float32 sums in one instruction, with no upcast of the weight;
- float32 ``x`` and weight: 16-wide FMA.

Why: torch's own CPU GEMM for 1 to 8 rows (``F.linear`` in a decode step) was measured at 10 to
13 GB/s of weight on an AVX-512 BF16 CPU (1024 x 1024 bfloat16 at 8 rows: 155 us on one
thread, the same on two), where these tiles take 50 to 95 us: four weight rows against four
rows of ``x`` in 16 independent sums, each weight load serving four rows of ``x`` and each
``x`` load four weight rows.

When to use: through :func:`torchnext.gemm.gemv.linear` (route ``cpu-dense-gemv``).

Build: a compiler or assembler without these instructions fails this part alone; the build
then retries with ``-DTN_NO_AVX512``, so the other kernels survive it.

What not to assume: ``vdpbf16ps`` treats subnormal inputs as zero and flushes subnormal
results (round to nearest even otherwise); the sum's order differs from torch's. Machines
without these instructions, compilers too old for them and the portable build get
``tn_avx512_kinds() == 0`` and ``tn_dense512`` returns -1: the caller routes elsewhere.

Shape legend: ``M`` rows of x, ``N`` weight rows, ``K`` reduction.
"""

from __future__ import annotations

__all__ = ["SOURCE"]

SOURCE = r"""
#if defined(__AVX2__) && defined(__x86_64__) && !defined(TN_NO_AVX512) && \
    ((defined(__clang__) && __clang_major__ >= 11) || (!defined(__clang__) && __GNUC__ >= 11))
/* The float32 tiles need AVX-512F/BW only (Skylake-X, Ice Lake); the bfloat16 ones BF16 too. */
#define TN_T512 __attribute__((target("avx512f,avx512bw")))
#define TN_T512BF __attribute__((target("avx512f,avx512bw,avx512bf16")))

/* bit 0: AVX-512F (the float32 tiles), bit 1: AVX-512 BF16 (the bfloat16 tiles). */
int tn_avx512_kinds(void) {
  __builtin_cpu_init();
  if (!__builtin_cpu_supports("avx512f") || !__builtin_cpu_supports("avx512bw")) return 0;
  return 1 | (__builtin_cpu_supports("avx512bf16") ? 2 : 0);
}

/* Where results go: out[m * N + n] in float32 (okind 4) or bfloat16 (okind 2), plus bias[n]
   of the operands' kind (bkind) when given. */
typedef struct { void* out; int okind; const void* bias; int bkind; int64_t N; } TnOut;

/* float32 -> bfloat16, round to nearest even (as torch's .to(torch.bfloat16)); NaN stays NaN. */
static inline uint16_t tn_f32_bf16(float f) {
  uint32_t b; memcpy(&b, &f, 4);
  if ((b & 0x7FFFFFFFu) > 0x7F800000u) return (uint16_t)((b >> 16) | 0x40);
  return (uint16_t)((b + 0x7FFFu + ((b >> 16) & 1u)) >> 16);
}

static inline __attribute__((always_inline)) void tn_put(const TnOut* o, int64_t m, int64_t n, float v) {
  if (o->bias)
    v += o->bkind == 2 ? bits_f32((uint32_t)((const uint16_t*)o->bias)[n] << 16)
                        : ((const float*)o->bias)[n];
  if (o->okind == 2) ((uint16_t*)o->out)[m * o->N + n] = tn_f32_bf16(v);
  else ((float*)o->out)[m * o->N + n] = v;
}

/* 32 bfloat16 elements from p; past the end of the row (left < 32) zeros, which add nothing. */
TN_T512BF static inline __m512i tn_ld16(const uint16_t* p, int64_t left) {
  if (left >= 32) return _mm512_loadu_si512((const void*)p);
  return _mm512_maskz_loadu_epi16((__mmask32)((1ull << left) - 1), p);
}

TN_T512 static inline __m512 tn_ld32(const float* p, int64_t left) {
  if (left >= 16) return _mm512_loadu_ps(p);
  return _mm512_maskz_loadu_ps((__mmask16)((1u << left) - 1), p);
}

TN_T512BF static inline __m512 tn_mac16(__m512 acc, __m512i w, __m512i x) {
  return _mm512_dpbf16_ps(acc, (__m512bh)w, (__m512bh)x);  /* 32 products, pairwise summed */
}

TN_T512 static inline __m512 tn_mac32(__m512 acc, __m512 w, __m512 x) {
  return _mm512_fmadd_ps(w, x, acc);
}

/* NB weight rows from n0 against MB rows of x from m0, over all of K: NB * MB <= 16 sums,
   STEP elements of K (one 64-byte vector V, loaded by LOAD, multiplied in by MAC) a time. */
#define TN_TILE(TARGET, NAME, T, V, STEP, LOAD, MAC)                                            \
  TARGET static inline __attribute__((always_inline)) void NAME(                               \
      const int NB, const int MB, const T* w, int64_t ldw, const T* x, int64_t ldx, int64_t K,  \
      int64_t n0, int64_t m0, const TnOut* o) {                                                 \
    __m512 acc[4][4];                                                                           \
    for (int j = 0; j < NB; j++) for (int i = 0; i < MB; i++) acc[j][i] = _mm512_setzero_ps();  \
    for (int64_t k = 0; k < K; k += STEP) {                                                     \
      V wv[4];                                                                                  \
      for (int j = 0; j < NB; j++) wv[j] = LOAD(w + (n0 + j) * ldw + k, K - k);                 \
      for (int i = 0; i < MB; i++) {                                                            \
        const V xv = LOAD(x + (m0 + i) * ldx + k, K - k);                                       \
        for (int j = 0; j < NB; j++) acc[j][i] = MAC(acc[j][i], wv[j], xv);                     \
      }                                                                                         \
    }                                                                                           \
    /* All sums reduced before any store: storing as they reduce spilled them (measured). */    \
    float r[4][4];                                                                              \
    for (int j = 0; j < NB; j++)                                                                \
      for (int i = 0; i < MB; i++) r[j][i] = _mm512_reduce_add_ps(acc[j][i]);                   \
    for (int j = 0; j < NB; j++)                                                                \
      for (int i = 0; i < MB; i++) tn_put(o, m0 + i, n0 + j, r[j][i]);                          \
  }
TN_TILE(TN_T512BF, tn_tile_bf16, uint16_t, __m512i, 32, tn_ld16, tn_mac16)
TN_TILE(TN_T512, tn_tile_f32, float, __m512, 16, tn_ld32, tn_mac32)

/* Weight rows n0 .. n0 + NB - 1 (NB 4 or 1) for every row of x, four rows of x at a time
   (eight at a time spilled the sums out of registers: measured 4x slower). */
#define TN_ROWS(TARGET, NAME, TILE, T)                                                          \
  TARGET static void NAME(int NB, int64_t M, const T* w, int64_t ldw, const T* x,              \
                           int64_t ldx, int64_t K, int64_t n0, const TnOut* o) {                \
    for (int64_t m0 = 0; m0 < M; m0 += 4) {                                                     \
      const int mb = M - m0 < 4 ? (int)(M - m0) : 4;                                            \
      switch (NB * 10 + mb) {                                                                   \
        case 41: TILE(4, 1, w, ldw, x, ldx, K, n0, m0, o); break;                           \
        case 42: TILE(4, 2, w, ldw, x, ldx, K, n0, m0, o); break;                           \
        case 43: TILE(4, 3, w, ldw, x, ldx, K, n0, m0, o); break;                           \
        case 44: TILE(4, 4, w, ldw, x, ldx, K, n0, m0, o); break;                           \
        case 11: TILE(1, 1, w, ldw, x, ldx, K, n0, m0, o); break;                           \
        case 12: TILE(1, 2, w, ldw, x, ldx, K, n0, m0, o); break;                           \
        case 13: TILE(1, 3, w, ldw, x, ldx, K, n0, m0, o); break;                           \
        default: TILE(1, 4, w, ldw, x, ldx, K, n0, m0, o); break;                           \
      }                                                                                         \
    }                                                                                           \
  }
TN_ROWS(TN_T512BF, tn_rows_bf16, tn_tile_bf16, uint16_t)
TN_ROWS(TN_T512, tn_rows_f32, tn_tile_f32, float)

/* out[M, N] (row stride N) = x[M, K] @ w[N, K].T + bias[N]: x, w and bias of kind 2
   (bfloat16) or 4 (float32), out of okind 2 or 4, the sums in float32 and rounded once; bias
   may be NULL. Returns -1 (and writes nothing) where this CPU lacks the instructions. */
int tn_dense512(int64_t M, int64_t N, int64_t K, const void* w, int64_t ldw, const void* x,
                int64_t ldx, int kind, const void* bias, void* out, int okind, int nthreads) {
  static int have = -1;
  if (have < 0) have = tn_avx512_kinds();
  if (!(kind == 2 ? have & 2 : kind == 4 ? have & 1 : 0)) return -1;
  if (okind != 2 && okind != 4) return -1;
  const TnOut o = {out, okind, bias, kind, N};
  const int64_t tiles = N / 4;
  #pragma omp parallel num_threads(nthreads) if (nthreads > 1)
  {
    TN_FOR for (int64_t t = 0; t <= tiles; t++) {
      const int nb = t < tiles ? 4 : 1;
      for (int64_t n = t * 4; n < (t < tiles ? t * 4 + 4 : N); n += nb) {
        if (kind == 2)
          tn_rows_bf16(nb, M, (const uint16_t*)w, ldw, (const uint16_t*)x, ldx, K, n, &o);
        else
          tn_rows_f32(nb, M, (const float*)w, ldw, (const float*)x, ldx, K, n, &o);
      }
    }
  }
  return 0;
}
#else
int tn_avx512_kinds(void) { return 0; }
int tn_dense512(int64_t M, int64_t N, int64_t K, const void* w, int64_t ldw, const void* x,
                int64_t ldx, int kind, const void* bias, void* out, int okind, int nthreads) {
  (void)M; (void)N; (void)K; (void)w; (void)ldw; (void)x; (void)ldx; (void)kind; (void)bias;
  (void)out; (void)okind; (void)nthreads;
  return -1;
}
#endif
"""
"""Appended to :data:`torchnext.gemm.gemv_cpu_source.SOURCE` by the build."""
