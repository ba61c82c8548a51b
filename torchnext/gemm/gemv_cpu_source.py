"""The C source of the decode GEMV's CPU kernels (``q4_gemv``, ``q4_dequant``, ``dense_gemv``).

What it is: one C11 translation unit, :data:`SOURCE`, with an AVX2+FMA+F16C intrinsics path
(compiled when ``__AVX2__``, ``__FMA__`` and ``__F16C__`` are defined) and a portable C path
with the same layout and results, each run on OpenMP threads where the compiler has OpenMP.
:mod:`torchnext.gemm.gemv_cpu` compiles it, loads it and calls it through ctypes.

When to use: only through :func:`torchnext.gemm.gemv_cpu.kernels`, which builds and loads it;
the text is also the build's cache key, so any edit here rebuilds the library once per machine.

Why C and not Inductor: Inductor's C++ code for ``(x * dequant(w)).sum(-1)`` was measured at
35-120 ms for K = N = 4096 (it keeps bit casts scalar, and split the reduction through a full
``[N, K/2]`` buffer), against 1.1 to 1.3 ms here (one thread): the AVX2 path decodes with two byte shuffles
(``vpshufb``) into bfloat16 bit patterns, which are float32 values after a 16-bit shift.

``blocked8`` layout of a 4-bit weight ``[N, K]`` (``B = ceil(N/8)`` row blocks, ``G = K/gs``):
codes ``uint8 [B, K/4, 16]``: in block ``b`` and k-quad ``i``, byte ``r`` (0..7) holds row
``8b+r``'s codes of ``k = 4i`` (low nibble) and ``4i+1`` (high), byte ``8+r`` those of ``4i+2``
and ``4i+3``; scales (and zeros) ``[B, G, 8]``, the 8 rows of a group side by side.
``value(n, k) = vals[code] * scale(n, k // gs) + zero(n, k // gs)``.

``tn_q4_gemv`` reads ``x`` as it is (bfloat16, float16 or float32, read like a scale of that
kind) and writes float32 ``[M, N]``: one C call per decode step, because after the weight
has streamed through the caches each extra torch operation on the way costs tens of
microseconds, a tenth of the call at K = N = 4096. It returns -1 when its scratch cannot be
allocated.

What not to assume: the functions check nothing (the Python side passes contiguous tensors of
the right shapes); their argument lists must match ``gemv_cpu``'s ctypes signatures.

Shape legend: ``M`` rows of x, ``N`` weight rows, ``K`` reduction, ``B`` row blocks of 8,
``G`` scale groups per row, ``R`` dequantized rows of a chunk.
"""

from __future__ import annotations

__all__ = ["SOURCE"]

SOURCE = r"""
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#endif

static float bits_f32(uint32_t b) { float f; memcpy(&f, &b, 4); return f; }

/* float16 bits -> float, exact (subnormals: m * 2^-24). */
static float half_f32(uint16_t h) {
  uint32_t sign = (uint32_t)(h & 0x8000) << 16, e = (h >> 10) & 0x1F, m = h & 0x3FF;
  if (e == 0) { float v = (float)m * (1.0f / 16777216.0f); return sign ? -v : v; }
  if (e == 31) return bits_f32(sign | 0x7F800000u | (m << 13));
  return bits_f32(sign | ((e + 112) << 23) | (m << 13));
}

/* Scale i as float. e4m3 is re-read as float16 bits (exact), i.e. value * 2^-8. */
static float scale_at(int kind, const void* s, int64_t i) {
  switch (kind) {
    case 0: { uint8_t b = ((const uint8_t*)s)[i];
      return half_f32((uint16_t)(((b & 0x7F) << 7) | ((b & 0x80) << 8))); }
    case 1: { uint8_t b = ((const uint8_t*)s)[i]; return bits_f32(b ? (uint32_t)b << 23 : 0x400000u); }
    case 2: return bits_f32((uint32_t)((const uint16_t*)s)[i] << 16);
    case 3: return half_f32(((const uint16_t*)s)[i]);
    default: return ((const float*)s)[i];
  }
}

/* Work is handed out in chunks as threads free up (dynamic schedule), so one thread slowed by
   another process does not hold the others back. */
#define TN_FOR _Pragma("omp for schedule(dynamic, 4)")

static int64_t code_at(const uint8_t* q, int64_t K, int64_t n, int64_t k) {
  uint8_t byte = q[(n / 8) * 4 * K + (k / 4) * 16 + ((k % 4) / 2) * 8 + n % 8];
  return (k % 2) ? byte >> 4 : byte & 15;
}

/* x (kind 2, 3 or 4: bfloat16, float16, float32) read once into float32 scratch: xx holds each
   8 of a row's elements x0..x7 as [x0 x0 x0 x0 x4 x4 x4 x4], then the same for x1/x5, x2/x6
   and x3/x7 (the SIMD kernel's lanes hold four weight rows for each of two columns four
   apart), xg each group's sum (zero points only). K is a multiple of 16. One allocation,
   freed by the caller; NULL when out of memory. */
static float* spread_x(int64_t M, int64_t K, int64_t gs, const void* x, int xkind, int sums) {
  const int64_t G = K / gs;
  float* buf = (float*)malloc(sizeof(float) * (size_t)(M * K * 4 + (sums ? M * G : 0)));
  if (!buf) return NULL;
  float* xg = buf + M * K * 4;
  for (int64_t m = 0; m < M; m++)
    for (int64_t g = 0; g < G; g++) {
      float acc = 0.f;
      for (int64_t k = g * gs; k < (g + 1) * gs; k++) {
        const float v = scale_at(xkind, x, m * K + k);
        float* d = buf + m * K * 4 + (k / 8) * 32 + (k % 4) * 8 + ((k % 8) / 4) * 4;
        d[0] = v; d[1] = v; d[2] = v; d[3] = v;
        acc += v;
      }
      if (sums) xg[m * G + g] = acc;
    }
  return buf;
}

/* Rows 8b .. 8b+7 of out (M rows of N floats); the rows past N (padding) are not written. */
static inline void store_rows(float* out, int64_t N, int64_t m, int64_t b, const float* v) {
  const int64_t n0 = 8 * b, n = N - n0 < 8 ? N - n0 : 8;
  memcpy(out + m * N + n0, v, sizeof(float) * (size_t)n);
}

#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#include <immintrin.h>
int tn_simd(void) { return 1; }

static inline __m256 scale8(int kind, const void* s, int64_t i) {
  switch (kind) {
    case 0: {
      __m128i b = _mm_cvtepu8_epi16(_mm_loadl_epi64((const __m128i*)((const uint8_t*)s + i)));
      __m128i h = _mm_or_si128(_mm_slli_epi16(_mm_and_si128(b, _mm_set1_epi16(0x7F)), 7),
                               _mm_slli_epi16(_mm_and_si128(b, _mm_set1_epi16(0x80)), 8));
      return _mm256_cvtph_ps(h); }
    case 1: {
      __m256i e = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i*)((const uint8_t*)s + i)));
      __m256i zero = _mm256_cmpeq_epi32(e, _mm256_setzero_si256());
      return _mm256_castsi256_ps(_mm256_blendv_epi8(_mm256_slli_epi32(e, 23),
                                                    _mm256_set1_epi32(0x400000), zero)); }
    case 2: return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(
        _mm_loadu_si128((const __m128i*)((const uint16_t*)s + i))), 16));
    case 3: return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)((const uint16_t*)s + i)));
    default: return _mm256_loadu_ps((const float*)s + i);
  }
}

#ifndef TN_PF_BYTES
#define TN_PF_BYTES 2048
#endif

/* 16 bytes of codes -> f0 = [k0 rows 0-3 | k1 rows 0-3], f1 = [k0 rows 4-7 | k1 rows 4-7],
   f2, f3 the same for k2, k3. T2/T3 hold the low/high bytes of the 16 values' bfloat16 bits. */
#define TN_DECODE(qp)                                                                       \
  const __m128i qb_ = _mm_loadu_si128((const __m128i*)(qp));                               \
  const __m128i lo_ = _mm_and_si128(qb_, mask), hi_ = _mm_and_si128(_mm_srli_epi16(qb_, 4), mask); \
  const __m256i c_ = _mm256_set_m128i(hi_, lo_);                                            \
  const __m256i b2_ = _mm256_shuffle_epi8(T2, c_), b3_ = _mm256_shuffle_epi8(T3, c_);       \
  const __m256i wl_ = _mm256_unpacklo_epi8(b2_, b3_), wh_ = _mm256_unpackhi_epi8(b2_, b3_); \
  const __m256 f0 = _mm256_castsi256_ps(_mm256_unpacklo_epi16(zz, wl_));                    \
  const __m256 f1 = _mm256_castsi256_ps(_mm256_unpackhi_epi16(zz, wl_));                    \
  const __m256 f2 = _mm256_castsi256_ps(_mm256_unpacklo_epi16(zz, wh_));                    \
  const __m256 f3 = _mm256_castsi256_ps(_mm256_unpackhi_epi16(zz, wh_));

/* 32 bytes of codes (k-quads i and i+1: k = 0..7 from the quad's start) -> e0a = [k0 rows 0-3 |
   k4 rows 0-3], e0b = [k0 rows 4-7 | k4 rows 4-7], e1a/e1b the same for k1 and k5, e2 for
   k2/k6, e3 for k3/k7: two quads per load take 20 instructions where one quad at a time
   takes 26. */
#define TN_DECODE2(qp)                                                                      \
  const __m256i qb_ = _mm256_loadu_si256((const __m256i*)(qp));                            \
  const __m256i lo_ = _mm256_and_si256(qb_, mask2);                                        \
  const __m256i hi_ = _mm256_and_si256(_mm256_srli_epi16(qb_, 4), mask2);                  \
  const __m256i l2_ = _mm256_shuffle_epi8(T2, lo_), l3_ = _mm256_shuffle_epi8(T3, lo_);    \
  const __m256i h2_ = _mm256_shuffle_epi8(T2, hi_), h3_ = _mm256_shuffle_epi8(T3, hi_);    \
  const __m256i w0_ = _mm256_unpacklo_epi8(l2_, l3_), w2_ = _mm256_unpackhi_epi8(l2_, l3_); \
  const __m256i w1_ = _mm256_unpacklo_epi8(h2_, h3_), w3_ = _mm256_unpackhi_epi8(h2_, h3_); \
  const __m256 e0a = _mm256_castsi256_ps(_mm256_unpacklo_epi16(zz, w0_));                  \
  const __m256 e0b = _mm256_castsi256_ps(_mm256_unpackhi_epi16(zz, w0_));                  \
  const __m256 e1a = _mm256_castsi256_ps(_mm256_unpacklo_epi16(zz, w1_));                  \
  const __m256 e1b = _mm256_castsi256_ps(_mm256_unpackhi_epi16(zz, w1_));                  \
  const __m256 e2a = _mm256_castsi256_ps(_mm256_unpacklo_epi16(zz, w2_));                  \
  const __m256 e2b = _mm256_castsi256_ps(_mm256_unpackhi_epi16(zz, w2_));                  \
  const __m256 e3a = _mm256_castsi256_ps(_mm256_unpacklo_epi16(zz, w3_));                  \
  const __m256 e3b = _mm256_castsi256_ps(_mm256_unpackhi_epi16(zz, w3_));

/* [a.lo + a.hi | b.lo + b.hi]: rows 0-3 from a, rows 4-7 from b. */
static inline __m256 rows8(__m256 a, __m256 b) {
  return _mm256_add_ps(_mm256_permute2f128_ps(a, b, 0x20), _mm256_permute2f128_ps(a, b, 0x31));
}

/* One row block: tot[m] = the 8 rows' dot products with x row m (xx: x as spread_x lays it
   out). Per group: a0/a1 sum rows 0-3 (lanes [k | k + 4]), a2/a3 rows 4-7. */
static inline __attribute__((always_inline)) void q4_block(
    const int M, int64_t K, int64_t gs, const uint8_t* q, int kind, const void* s,
    const void* z, int64_t s0, const float* xx, const float* xg, __m256i T2, __m256i T3,
    __m256* tot) {
  const int64_t G = K / gs, nq = gs / 4, np = gs / 8;
  const __m256i mask2 = _mm256_set1_epi8(0x0F);
  const __m256i zz = _mm256_setzero_si256();
  __m256 fb[256];
  const int64_t ssize = kind < 2 ? 1 : kind < 4 ? 2 : 4;
  for (int m = 0; m < M; m++) tot[m] = _mm256_setzero_ps();
  for (int64_t g = 0; g < G; g++) {
    const uint8_t* qg = q + g * nq * 16;
    __m256 sums[8];
    /* Ask for the weight TN_PF_BYTES ahead: the hardware prefetcher alone left the cores
       waiting on memory once other work had evicted the weight from the caches. */
    for (int64_t l = 0; l < nq * 16; l += 64) _mm_prefetch((const char*)(qg + l + TN_PF_BYTES), _MM_HINT_T0);
    _mm_prefetch((const char*)s + (s0 + g * 8) * ssize + TN_PF_BYTES / 8, _MM_HINT_T0);
    if (M <= 2) {
      __m256 a[2][4];
      for (int m = 0; m < M; m++) for (int j = 0; j < 4; j++) a[m][j] = _mm256_setzero_ps();
      for (int64_t i = 0; i < np; i++) {
        TN_DECODE2(qg + 32 * i)
        for (int m = 0; m < M; m++) {
          const float* xk = xx + m * K * 4 + (g * gs + 8 * i) * 4;
          const __m256 x0 = _mm256_loadu_ps(xk), x1 = _mm256_loadu_ps(xk + 8);
          const __m256 x2 = _mm256_loadu_ps(xk + 16), x3 = _mm256_loadu_ps(xk + 24);
          a[m][0] = _mm256_fmadd_ps(e2a, x2, _mm256_fmadd_ps(e0a, x0, a[m][0]));
          a[m][1] = _mm256_fmadd_ps(e3a, x3, _mm256_fmadd_ps(e1a, x1, a[m][1]));
          a[m][2] = _mm256_fmadd_ps(e2b, x2, _mm256_fmadd_ps(e0b, x0, a[m][2]));
          a[m][3] = _mm256_fmadd_ps(e3b, x3, _mm256_fmadd_ps(e1b, x1, a[m][3]));
        }
      }
      for (int m = 0; m < M; m++)
        sums[m] = rows8(_mm256_add_ps(a[m][0], a[m][1]), _mm256_add_ps(a[m][2], a[m][3]));
    } else {
      /* Decode the group once into L1, then one pass per row of x. */
      for (int64_t i = 0; i < np; i++) {
        TN_DECODE2(qg + 32 * i)
        __m256* f = fb + 8 * i;
        f[0] = e0a; f[1] = e0b; f[2] = e1a; f[3] = e1b; f[4] = e2a; f[5] = e2b; f[6] = e3a; f[7] = e3b;
      }
      for (int m = 0; m < M; m++) {
        __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
        const float* xk = xx + m * K * 4 + g * gs * 4;
        for (int64_t i = 0; i < np; i++) {
          const __m256* f = fb + 8 * i;
          const float* xi = xk + 32 * i;
          const __m256 x0 = _mm256_loadu_ps(xi), x1 = _mm256_loadu_ps(xi + 8);
          const __m256 x2 = _mm256_loadu_ps(xi + 16), x3 = _mm256_loadu_ps(xi + 24);
          a0 = _mm256_fmadd_ps(f[4], x2, _mm256_fmadd_ps(f[0], x0, a0));
          a1 = _mm256_fmadd_ps(f[6], x3, _mm256_fmadd_ps(f[2], x1, a1));
          a2 = _mm256_fmadd_ps(f[5], x2, _mm256_fmadd_ps(f[1], x0, a2));
          a3 = _mm256_fmadd_ps(f[7], x3, _mm256_fmadd_ps(f[3], x1, a3));
        }
        sums[m] = rows8(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3));
      }
    }
    const __m256 sv = scale8(kind, s, s0 + g * 8);
    for (int m = 0; m < M; m++) tot[m] = _mm256_fmadd_ps(sums[m], sv, tot[m]);
    if (z) {
      const __m256 zv = scale8(kind, z, s0 + g * 8);
      for (int m = 0; m < M; m++)
        tot[m] = _mm256_fmadd_ps(zv, _mm256_broadcast_ss(xg + m * G + g), tot[m]);
    }
  }
}

#define TN_Q4_ROWS(MM)                                                                     \
  TN_FOR for (int64_t b = 0; b < B; b++) {                                                \
    __m256 tot[8];                                                                         \
    float v[8];                                                                            \
    q4_block(MM, K, gs, q + b * 4 * K, kind, s, z, b * G * 8, xx, xg, T2, T3, tot);        \
    for (int m = 0; m < MM; m++) {                                                         \
      if (8 * b + 8 <= N) { _mm256_storeu_ps(out + m * N + 8 * b, _mm256_mul_ps(tot[m], osc)); continue; } \
      _mm256_storeu_ps(v, _mm256_mul_ps(tot[m], osc));                                     \
      store_rows(out, N, m, b, v);                                                         \
    }                                                                                      \
  }                                                                                        \
  break;

int tn_q4_gemv(int64_t M, int64_t B, int64_t N, int64_t K, int64_t gs, const uint8_t* q, int kind,
               const void* s, const void* z, const uint16_t* vals, float out_scale,
               const void* x, int xkind, float* out, int nthreads) {
  const int64_t G = K / gs;
  float* const xx = spread_x(M, K, gs, x, xkind, z != NULL);
  if (!xx) return -1;
  const float* const xg = xx + M * K * 4;
  uint8_t lo8[16], hi8[16];
  for (int i = 0; i < 16; i++) { lo8[i] = vals[i] & 0xFF; hi8[i] = vals[i] >> 8; }
  const __m256i T2 = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i*)lo8));
  const __m256i T3 = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i*)hi8));
  const __m256 osc = _mm256_set1_ps(out_scale);
  #pragma omp parallel num_threads(nthreads) if (nthreads > 1)
  {
    switch (M) {
      case 1: TN_Q4_ROWS(1) case 2: TN_Q4_ROWS(2) case 3: TN_Q4_ROWS(3) case 4: TN_Q4_ROWS(4)
      case 5: TN_Q4_ROWS(5) case 6: TN_Q4_ROWS(6) case 7: TN_Q4_ROWS(7) default: TN_Q4_ROWS(8)
    }
  }
  free(xx);
  return 0;
}

void tn_q4_dequant(int64_t b0, int64_t b1, int64_t K, int64_t gs, const uint8_t* q, int kind,
                   const void* s, const void* z, const uint16_t* vals, float out_scale,
                   float* w, int nthreads) {
  const int64_t G = K / gs, nq = gs / 4, R = (b1 - b0) * 8;
  uint8_t lo8[16], hi8[16];
  for (int i = 0; i < 16; i++) { lo8[i] = vals[i] & 0xFF; hi8[i] = vals[i] >> 8; }
  const __m256i T2 = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i*)lo8));
  const __m256i T3 = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i*)hi8));
  const __m128i mask = _mm_set1_epi8(0x0F);
  const __m256i zz = _mm256_setzero_si256();
  const __m256 osc = _mm256_set1_ps(out_scale);
  #pragma omp parallel num_threads(nthreads) if (nthreads > 1)
  {
    TN_FOR for (int64_t b = b0; b < b1; b++) {
      float* col = w + (b - b0) * 8;
      for (int64_t g = 0; g < G; g++) {
        /* (s * out_scale) first: for NVFP4 that is torchao's float(scale) * per_tensor_scale */
        const __m256 sv = _mm256_mul_ps(scale8(kind, s, b * G * 8 + g * 8), osc);
        const __m256 zv = z ? scale8(kind, z, b * G * 8 + g * 8) : _mm256_setzero_ps();
        for (int64_t i = 0; i < nq; i++) {
          TN_DECODE(q + b * 4 * K + (g * nq + i) * 16)
          const int64_t k = g * gs + 4 * i;
          _mm256_storeu_ps(col + (k + 0) * R, _mm256_fmadd_ps(_mm256_permute2f128_ps(f0, f1, 0x20), sv, zv));
          _mm256_storeu_ps(col + (k + 1) * R, _mm256_fmadd_ps(_mm256_permute2f128_ps(f0, f1, 0x31), sv, zv));
          _mm256_storeu_ps(col + (k + 2) * R, _mm256_fmadd_ps(_mm256_permute2f128_ps(f2, f3, 0x20), sv, zv));
          _mm256_storeu_ps(col + (k + 3) * R, _mm256_fmadd_ps(_mm256_permute2f128_ps(f2, f3, 0x31), sv, zv));
        }
      }
    }
  }
}

static inline __m256 load8_16(const uint16_t* p, int kind) {
  const __m128i h = _mm_loadu_si128((const __m128i*)p);
  return kind == 2 ? _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16))
                   : _mm256_cvtph_ps(h);
}

static inline float hsum(__m256 v) {
  __m128 r = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  r = _mm_add_ps(r, _mm_movehl_ps(r, r));
  return _mm_cvtss_f32(_mm_add_ss(r, _mm_movehdup_ps(r)));
}

/* NB weight rows against MB rows of x over k0 <= k < k1: each weight load serves MB rows of x
   and each x load NB weight rows, in NB * MB <= 8 independent sums (one sum per row of x, as
   a plain loop keeps them, waits on the FMA latency: that measured half of torch's speed at
   M = 2 to 8; this is within 0.8 to 1.4 times torch's, so linear() routes only M = 1 here).
   A call with k0 > 0 adds to out, k0 = 0 writes it. */
static inline __attribute__((always_inline)) void dense_tile(
    const int NB, const int MB, const uint16_t* w, int64_t ldw, int kind, const float* x,
    int64_t K, int64_t N, int64_t n0, int64_t m0, int64_t k0, int64_t k1, float* out) {
  __m256 acc[4][4];
  for (int j = 0; j < NB; j++) for (int i = 0; i < MB; i++) acc[j][i] = _mm256_setzero_ps();
  const int64_t K8 = k0 + (k1 - k0) / 8 * 8;
  for (int64_t k = k0; k < K8; k += 8) {
    __m256 wv[4];
    for (int j = 0; j < NB; j++) wv[j] = load8_16(w + (n0 + j) * ldw + k, kind);
    for (int i = 0; i < MB; i++) {
      const __m256 xv = _mm256_loadu_ps(x + (m0 + i) * K + k);
      for (int j = 0; j < NB; j++) acc[j][i] = _mm256_fmadd_ps(wv[j], xv, acc[j][i]);
    }
  }
  for (int j = 0; j < NB; j++)
    for (int i = 0; i < MB; i++) {
      float r = hsum(acc[j][i]);
      for (int64_t k = K8; k < k1; k++) r += scale_at(kind, w + (n0 + j) * ldw, k) * x[(m0 + i) * K + k];
      float* o = out + (m0 + i) * N + n0 + j;
      *o = k0 ? *o + r : r;
    }
}

/* Rows n0 .. n0+NB-1 of out for every row of x, MB <= 4 rows of x at a time. */
static void dense_rows(int NB, int64_t M, const uint16_t* w, int64_t ldw, int kind,
                       const float* x, int64_t K, int64_t N, int64_t n0, int64_t k0, int64_t k1,
                       float* out) {
  for (int64_t m0 = 0; m0 < M; m0 += 4) {
    const int64_t mb = M - m0 < 4 ? M - m0 : 4;
    switch (NB * 10 + (int)mb) {
      case 42: dense_tile(4, 2, w, ldw, kind, x, K, N, n0, m0, k0, k1, out); break;
      case 21: dense_tile(2, 1, w, ldw, kind, x, K, N, n0, m0, k0, k1, out); break;
      case 22: dense_tile(2, 2, w, ldw, kind, x, K, N, n0, m0, k0, k1, out); break;
      case 23: dense_tile(2, 3, w, ldw, kind, x, K, N, n0, m0, k0, k1, out); break;
      case 24: dense_tile(2, 4, w, ldw, kind, x, K, N, n0, m0, k0, k1, out); break;
      case 11: dense_tile(1, 1, w, ldw, kind, x, K, N, n0, m0, k0, k1, out); break;
      case 12: dense_tile(1, 2, w, ldw, kind, x, K, N, n0, m0, k0, k1, out); break;
      case 13: dense_tile(1, 3, w, ldw, kind, x, K, N, n0, m0, k0, k1, out); break;
      default: dense_tile(1, 4, w, ldw, kind, x, K, N, n0, m0, k0, k1, out); break;
    }
  }
}

void tn_dense_gemv(int64_t M, int64_t N, int64_t K, const uint16_t* w, int64_t ldw, int kind,
                   const float* x, float* out, int nthreads) {
  /* M = 2 takes 4 weight rows per tile, more rows of x take 2 (at most 8 sums in registers). */
  const int NB = M == 2 ? 4 : 2;
  const int64_t tiles = N / NB;
  #pragma omp parallel num_threads(nthreads) if (nthreads > 1)
  {
    const int64_t K32 = K / 32 * 32, K8 = K / 8 * 8;
    if (M == 1) {
      TN_FOR for (int64_t n = 0; n < N; n++) {
        const uint16_t* wr = w + n * ldw;
        __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
        int64_t k = 0;
        for (; k < K32; k += 32) {
          a0 = _mm256_fmadd_ps(load8_16(wr + k, kind), _mm256_loadu_ps(x + k), a0);
          a1 = _mm256_fmadd_ps(load8_16(wr + k + 8, kind), _mm256_loadu_ps(x + k + 8), a1);
          a2 = _mm256_fmadd_ps(load8_16(wr + k + 16, kind), _mm256_loadu_ps(x + k + 16), a2);
          a3 = _mm256_fmadd_ps(load8_16(wr + k + 24, kind), _mm256_loadu_ps(x + k + 24), a3);
        }
        for (; k < K8; k += 8) a0 = _mm256_fmadd_ps(load8_16(wr + k, kind), _mm256_loadu_ps(x + k), a0);
        float acc = hsum(_mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)));
        for (; k < K; k++) acc += scale_at(kind, wr, k) * x[k];
        out[n] = acc;
      }
    } else {
      /* One pass over K: cutting K into chunks whose x rows stay in L1 measured slower (the
         weight rows are then read in strided pieces). */
      TN_FOR for (int64_t t = 0; t <= tiles; t++) {
        if (t < tiles) dense_rows(NB, M, w, ldw, kind, x, K, N, t * NB, 0, K, out);
        else for (int64_t n = tiles * NB; n < N; n++) dense_rows(1, M, w, ldw, kind, x, K, N, n, 0, K, out);
      }
    }
  }
}

#else  /* portable C: the same layout and arithmetic, one element at a time */
int tn_simd(void) { return 0; }

static float value_at(const uint16_t* vals, int64_t code) { return bits_f32((uint32_t)vals[code] << 16); }

int tn_q4_gemv(int64_t M, int64_t B, int64_t N, int64_t K, int64_t gs, const uint8_t* q, int kind,
               const void* s, const void* z, const uint16_t* vals, float out_scale,
               const void* x, int xkind, float* out, int nthreads) {
  const int64_t G = K / gs;
  float* const xx = spread_x(M, K, gs, x, xkind, z != NULL);
  if (!xx) return -1;
  const float* const xg = xx + M * K * 4;
  (void)B;
  #pragma omp parallel num_threads(nthreads) if (nthreads > 1)
  {
    TN_FOR for (int64_t n = 0; n < N; n++)
      for (int64_t m = 0; m < M; m++) {
        float tot = 0.f;
        for (int64_t g = 0; g < G; g++) {
          float acc = 0.f;
          for (int64_t k = g * gs; k < (g + 1) * gs; k++)
            acc += value_at(vals, code_at(q, K, n, k)) * scale_at(xkind, x, m * K + k);
          const int64_t si = (n / 8) * G * 8 + g * 8 + n % 8;
          tot += acc * scale_at(kind, s, si);
          if (z) tot += scale_at(kind, z, si) * xg[m * G + g];
        }
        out[m * N + n] = tot * out_scale;
      }
  }
  free(xx);
  return 0;
}

void tn_q4_dequant(int64_t b0, int64_t b1, int64_t K, int64_t gs, const uint8_t* q, int kind,
                   const void* s, const void* z, const uint16_t* vals, float out_scale,
                   float* w, int nthreads) {
  const int64_t G = K / gs, R = (b1 - b0) * 8;
  #pragma omp parallel num_threads(nthreads) if (nthreads > 1)
  {
    TN_FOR for (int64_t r = 0; r < R; r++) {
      const int64_t n = b0 * 8 + r;
      for (int64_t k = 0; k < K; k++) {
        const int64_t si = (n / 8) * G * 8 + (k / gs) * 8 + n % 8;
        const float sv = scale_at(kind, s, si) * out_scale, zv = z ? scale_at(kind, z, si) : 0.f;
        w[k * R + r] = value_at(vals, code_at(q, K, n, k)) * sv + zv;
      }
    }
  }
}

void tn_dense_gemv(int64_t M, int64_t N, int64_t K, const uint16_t* w, int64_t ldw, int kind,
                   const float* x, float* out, int nthreads) {
  #pragma omp parallel num_threads(nthreads) if (nthreads > 1)
  {
    TN_FOR for (int64_t n = 0; n < N; n++)
      for (int64_t m = 0; m < M; m++) {
        float acc = 0.f;
        for (int64_t k = 0; k < K; k++) acc += scale_at(kind, w + n * ldw, k) * x[m * K + k];
        out[m * N + n] = acc;
      }
  }
}
#endif
"""
"""The kernels' C source; compiled by :func:`torchnext.gemm.gemv_cpu.build`."""
