"""The C source of the decode GEMV's CPU kernels (``q4_gemv``, ``q4_dequant``, ``dense_gemv``).

What it is: one C11 translation unit, :data:`SOURCE`, with an AVX2+FMA+F16C intrinsics path
(compiled when ``__AVX2__``, ``__FMA__`` and ``__F16C__`` are defined) and a portable C path
with the same layout and results, each run on OpenMP threads where the compiler has OpenMP.
:mod:`torchnext.gemm.gemv_cpu` compiles it, loads it and calls it through ctypes.

When to use: only through :func:`torchnext.gemm.gemv_cpu.kernels`, which builds and loads it;
the text is also the build's cache key, so any edit here rebuilds the library once per machine.

Why C and not Inductor: Inductor's C++ code for ``(x * dequant(w)).sum(-1)`` was measured at
35-120 ms for K = N = 4096 (it keeps bit casts scalar, and split the reduction through a full
``[N, K/2]`` buffer), against about 3 ms here: the AVX2 path decodes with two byte shuffles
(``vpshufb``) into bfloat16 bit patterns, which are float32 values after a 16-bit shift.

``blocked8`` layout of a 4-bit weight ``[N, K]`` (``B = ceil(N/8)`` row blocks, ``G = K/gs``):
codes ``uint8 [B, K/4, 16]``: in block ``b`` and k-quad ``i``, byte ``r`` (0..7) holds row
``8b+r``'s codes of ``k = 4i`` (low nibble) and ``4i+1`` (high), byte ``8+r`` those of ``4i+2``
and ``4i+3``; scales (and zeros) ``[B, G, 8]``, the 8 rows of a group side by side.
``value(n, k) = vals[code] * scale(n, k // gs) + zero(n, k // gs)``.

What not to assume: the functions check nothing (the Python side passes contiguous tensors of
the right shapes); their argument lists must match ``gemv_cpu``'s ctypes signatures.

Shape legend: ``M`` rows of x, ``N`` weight rows, ``K`` reduction, ``B`` row blocks of 8,
``G`` scale groups per row, ``R`` dequantized rows of a chunk.
"""

from __future__ import annotations

__all__ = ["SOURCE"]

SOURCE = r"""
#include <stdint.h>
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

/* [a.lo + a.hi | b.lo + b.hi]: rows 0-3 from a, rows 4-7 from b. */
static inline __m256 rows8(__m256 a, __m256 b) {
  return _mm256_add_ps(_mm256_permute2f128_ps(a, b, 0x20), _mm256_permute2f128_ps(a, b, 0x31));
}

/* One row block: tot[m] = the 8 rows' dot products with x row m (xx: x with each pair of
   elements spread to [x0 x0 x0 x0 x1 x1 x1 x1]). */
static inline __attribute__((always_inline)) void q4_block(
    const int M, int64_t K, int64_t gs, const uint8_t* q, int kind, const void* s,
    const void* z, int64_t s0, const float* xx, const float* xg, __m256i T2, __m256i T3,
    __m256* tot) {
  const int64_t G = K / gs, nq = gs / 4;
  const __m128i mask = _mm_set1_epi8(0x0F);
  const __m256i zz = _mm256_setzero_si256();
  __m256 fb[256];
  for (int m = 0; m < M; m++) tot[m] = _mm256_setzero_ps();
  for (int64_t g = 0; g < G; g++) {
    const uint8_t* qg = q + g * nq * 16;
    __m256 sums[8];
    if (M <= 2) {
      __m256 a[2][4];
      for (int m = 0; m < M; m++) for (int j = 0; j < 4; j++) a[m][j] = _mm256_setzero_ps();
      for (int64_t i = 0; i < nq; i++) {
        TN_DECODE(qg + 16 * i)
        for (int m = 0; m < M; m++) {
          const float* xk = xx + m * K * 4 + (g * gs + 4 * i) * 4;
          const __m256 x01 = _mm256_loadu_ps(xk), x23 = _mm256_loadu_ps(xk + 8);
          a[m][0] = _mm256_fmadd_ps(f0, x01, a[m][0]);
          a[m][1] = _mm256_fmadd_ps(f1, x01, a[m][1]);
          a[m][2] = _mm256_fmadd_ps(f2, x23, a[m][2]);
          a[m][3] = _mm256_fmadd_ps(f3, x23, a[m][3]);
        }
      }
      for (int m = 0; m < M; m++)
        sums[m] = rows8(_mm256_add_ps(a[m][0], a[m][2]), _mm256_add_ps(a[m][1], a[m][3]));
    } else {
      /* Decode the group once into L1, then one pass per row of x. */
      for (int64_t i = 0; i < nq; i++) {
        TN_DECODE(qg + 16 * i)
        fb[4 * i] = f0; fb[4 * i + 1] = f1; fb[4 * i + 2] = f2; fb[4 * i + 3] = f3;
      }
      for (int m = 0; m < M; m++) {
        __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
        const float* xk = xx + m * K * 4 + g * gs * 4;
        for (int64_t i = 0; i < nq; i++) {
          const __m256 x01 = _mm256_loadu_ps(xk + 16 * i), x23 = _mm256_loadu_ps(xk + 16 * i + 8);
          a0 = _mm256_fmadd_ps(fb[4 * i], x01, a0);
          a1 = _mm256_fmadd_ps(fb[4 * i + 1], x01, a1);
          a2 = _mm256_fmadd_ps(fb[4 * i + 2], x23, a2);
          a3 = _mm256_fmadd_ps(fb[4 * i + 3], x23, a3);
        }
        sums[m] = rows8(_mm256_add_ps(a0, a2), _mm256_add_ps(a1, a3));
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
    q4_block(MM, K, gs, q + b * 4 * K, kind, s, z, b * G * 8, xx, xg, T2, T3, tot);        \
    for (int m = 0; m < MM; m++) _mm256_storeu_ps(out + m * B * 8 + b * 8, _mm256_mul_ps(tot[m], osc)); \
  }                                                                                        \
  break;

void tn_q4_gemv(int64_t M, int64_t B, int64_t K, int64_t gs, const uint8_t* q, int kind,
                const void* s, const void* z, const uint16_t* vals, float out_scale,
                const float* x, const float* xx, const float* xg, float* out, int nthreads) {
  const int64_t G = K / gs;
  uint8_t lo8[16], hi8[16];
  for (int i = 0; i < 16; i++) { lo8[i] = vals[i] & 0xFF; hi8[i] = vals[i] >> 8; }
  const __m256i T2 = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i*)lo8));
  const __m256i T3 = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i*)hi8));
  const __m256 osc = _mm256_set1_ps(out_scale);
  (void)x;
  #pragma omp parallel num_threads(nthreads) if (nthreads > 1)
  {
    switch (M) {
      case 1: TN_Q4_ROWS(1) case 2: TN_Q4_ROWS(2) case 3: TN_Q4_ROWS(3) case 4: TN_Q4_ROWS(4)
      case 5: TN_Q4_ROWS(5) case 6: TN_Q4_ROWS(6) case 7: TN_Q4_ROWS(7) default: TN_Q4_ROWS(8)
    }
  }
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

void tn_dense_gemv(int64_t M, int64_t N, int64_t K, const uint16_t* w, int64_t ldw, int kind,
                   const float* x, float* out, int nthreads) {
  #pragma omp parallel num_threads(nthreads) if (nthreads > 1)
  {
    const int64_t K32 = K / 32 * 32, K8 = K / 8 * 8;
    TN_FOR for (int64_t n = 0; n < N; n++) {
      const uint16_t* wr = w + n * ldw;
      if (M == 1) {
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
      } else {
        __m256 a[8];
        for (int m = 0; m < M; m++) a[m] = _mm256_setzero_ps();
        int64_t k = 0;
        for (; k < K8; k += 8) {
          const __m256 wv = load8_16(wr + k, kind);
          for (int m = 0; m < M; m++) a[m] = _mm256_fmadd_ps(wv, _mm256_loadu_ps(x + m * K + k), a[m]);
        }
        for (int m = 0; m < M; m++) {
          float acc = hsum(a[m]);
          for (int64_t kk = k; kk < K; kk++) acc += scale_at(kind, wr, kk) * x[m * K + kk];
          out[m * N + n] = acc;
        }
      }
    }
  }
}

#else  /* portable C: the same layout and arithmetic, one element at a time */
int tn_simd(void) { return 0; }

static float value_at(const uint16_t* vals, int64_t code) { return bits_f32((uint32_t)vals[code] << 16); }

void tn_q4_gemv(int64_t M, int64_t B, int64_t K, int64_t gs, const uint8_t* q, int kind,
                const void* s, const void* z, const uint16_t* vals, float out_scale,
                const float* x, const float* xx, const float* xg, float* out, int nthreads) {
  const int64_t G = K / gs;
  (void)xx;
  #pragma omp parallel num_threads(nthreads) if (nthreads > 1)
  {
    TN_FOR for (int64_t n = 0; n < B * 8; n++)
      for (int64_t m = 0; m < M; m++) {
        float tot = 0.f;
        for (int64_t g = 0; g < G; g++) {
          float acc = 0.f;
          for (int64_t k = g * gs; k < (g + 1) * gs; k++) acc += value_at(vals, code_at(q, K, n, k)) * x[m * K + k];
          const int64_t si = (n / 8) * G * 8 + g * 8 + n % 8;
          tot += acc * scale_at(kind, s, si);
          if (z) tot += scale_at(kind, z, si) * xg[m * G + g];
        }
        out[m * B * 8 + n] = tot * out_scale;
      }
  }
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
