"""The C source of the table decode of 8-bit codes (``tn_decode8``), built with the decode kernels.

What it is: :data:`SOURCE`, portable C compiled into the library of
:mod:`torchnext.gemm.gemv_cpu`. ``tn_decode8`` turns a matrix of one-byte codes (float8 values)
into float32 through a 256-entry table, multiplies each value by its row's, its column's or
one scale, and writes the result row-major, whatever the codes' strides.

Why: torch's CPU ``F.scaled_mm`` (TensorWise and RowWise, the recipes 2.13 runs) converts both
float8 operands with ``.to(torch.float32)``, which was measured at 5 ns per element (83 ms
for a 4096 x 4096 weight, most of a 139 ms call), after copying a column-major ``mat_b`` to
row-major. A table lookup does the conversion, the copy and the scaling in one pass.

Exactness: the table is built by torch (``codes.view(float8).float()``), so every value,
NaN included, has the bits of torch's conversion; the scale is one IEEE float32 multiply, as
torch's ``mul`` (the file is compiled without fast-math, so no contraction or reassociation
changes it). :func:`torchnext.gemm.scaled.scaled_mm` then runs the same GEMM on the same
row-major float32 operands, so its TensorWise/RowWise result equals torch's bit for bit.

Shape legend: ``R`` rows, ``C`` columns of the decoded matrix.
"""

from __future__ import annotations

__all__ = ["SOURCE"]

SOURCE = r"""
/* dst[r * C + c] = table[src[r * srs + c * scs]] * scale, scale = rs[r] (rs given), cs[c] (cs
   given) or s: one float32 multiply, in tiles of 64 x 64. Where the codes are stored by
   columns (srs == 1, a transposed mat_b), a tile is first read column after column into a
   local buffer, then written row after row: reading a 4 KiB-strided column of the tile per
   row of it missed the cache on every access (measured 4.4x slower than by rows). */
void tn_decode8(const uint8_t* restrict src, int64_t R, int64_t C, int64_t srs, int64_t scs,
                const float* restrict table, const float* restrict rs,
                const float* restrict cs, float s, float* restrict dst, int nthreads) {
  const int64_t rb = (R + 63) / 64, cb = (C + 63) / 64;
  const int by_columns = srs == 1 && scs != 1;
  #pragma omp parallel for num_threads(nthreads) schedule(static) if (nthreads > 1 && R * C >= 65536)
  for (int64_t t = 0; t < rb * cb; t++) {
    const int64_t r0 = (t / cb) * 64, c0 = (t % cb) * 64;
    const int64_t r1 = r0 + 64 < R ? r0 + 64 : R, c1 = c0 + 64 < C ? c0 + 64 : C;
    float buf[64][64];
    if (by_columns)
      for (int64_t c = c0; c < c1; c++) {
        const uint8_t* p = src + c * scs;
        for (int64_t r = r0; r < r1; r++) buf[r - r0][c - c0] = table[p[r]];
      }
    for (int64_t r = r0; r < r1; r++) {
      const float sr = rs ? rs[r] : s;
      const uint8_t* p = src + r * srs;
      float* d = dst + r * C;
      const float* b = buf[r - r0];
      if (by_columns && cs)
        for (int64_t c = c0; c < c1; c++) d[c] = b[c - c0] * cs[c];
      else if (by_columns)
        for (int64_t c = c0; c < c1; c++) d[c] = b[c - c0] * sr;
      else if (cs)
        for (int64_t c = c0; c < c1; c++) d[c] = table[p[c * scs]] * cs[c];
      else
        for (int64_t c = c0; c < c1; c++) d[c] = table[p[c * scs]] * sr;
    }
  }
}
"""
"""Appended to the decode kernels' source (portable C: every build has it)."""
