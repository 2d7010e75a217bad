//===- Transpose.h - Block transposes in registers --------------*- C++ -*-===//
//
// Shared by the executor's DMA transposes and the AMX GEMM's packing of the
// stationary operand (whose tiles want each output row's K values in a row).
// They move bits only: NaN payloads and signed zeros survive.
//
//===----------------------------------------------------------------------===//

#ifndef NEURON_RUNTIME_EXEC_TRANSPOSE_H
#define NEURON_RUNTIME_EXEC_TRANSPOSE_H

#include <cstdint>

#ifdef __AVX__
#include <immintrin.h>

namespace neuron::runtime {

/// Transposes an 8 x 8 block of 32-bit elements in registers: element
/// (r, c) at src[r + c * srcCol] moves to dst[r * dstRow + c].
inline void transpose8x8x32(const uint32_t *src, int64_t srcCol, uint32_t *dst,
                            int64_t dstRow) {
  // Shuffles of float vectors move the bits unchanged.
  __m256 v[8];
  for (int c = 0; c < 8; ++c)
    v[c] = _mm256_loadu_ps(reinterpret_cast<const float *>(src + c * srcCol));
  __m256 t[8], u[8];
  for (int i = 0; i < 8; i += 2) {
    t[i] = _mm256_unpacklo_ps(v[i], v[i + 1]);
    t[i + 1] = _mm256_unpackhi_ps(v[i], v[i + 1]);
  }
  for (int i = 0; i < 8; i += 4) {
    u[i] = _mm256_shuffle_ps(t[i], t[i + 2], 0x44);
    u[i + 1] = _mm256_shuffle_ps(t[i], t[i + 2], 0xee);
    u[i + 2] = _mm256_shuffle_ps(t[i + 1], t[i + 3], 0x44);
    u[i + 3] = _mm256_shuffle_ps(t[i + 1], t[i + 3], 0xee);
  }
  for (int r = 0; r < 4; ++r) {
    _mm256_storeu_ps(reinterpret_cast<float *>(dst + r * dstRow),
                     _mm256_permute2f128_ps(u[r], u[r + 4], 0x20));
    _mm256_storeu_ps(reinterpret_cast<float *>(dst + (r + 4) * dstRow),
                     _mm256_permute2f128_ps(u[r], u[r + 4], 0x31));
  }
}

} // namespace neuron::runtime

#endif // __AVX__

#ifdef __AVX512BW__

namespace neuron::runtime {

/// Transposes a 32 x 32 block of 16-bit elements in registers: element
/// (r, c) at src[r + c * srcCol] moves to dst[r * dstRow + c]. Five rounds
/// each swap one bit of the row index with the same bit of the column index.
inline void transpose32x32x16(const uint16_t *src, int64_t srcCol,
                              uint16_t *dst, int64_t dstRow) {
  __m512i v[32];
  for (int c = 0; c < 32; ++c)
    v[c] = _mm512_loadu_si512(src + c * srcCol);
  for (int bit = 1; bit < 32; bit <<= 1) {
    alignas(64) uint16_t low[32], high[32];
    for (int j = 0; j < 32; ++j) {
      bool set = j & bit;
      low[j] = static_cast<uint16_t>(set ? 32 + j - bit : j);
      high[j] = static_cast<uint16_t>(set ? 32 + j : j + bit);
    }
    __m512i lowIndex = _mm512_load_si512(low);
    __m512i highIndex = _mm512_load_si512(high);
    for (int i = 0; i < 32; ++i) {
      if (i & bit)
        continue;
      __m512i a = v[i], b = v[i + bit];
      v[i] = _mm512_permutex2var_epi16(a, lowIndex, b);
      v[i + bit] = _mm512_permutex2var_epi16(a, highIndex, b);
    }
  }
  for (int r = 0; r < 32; ++r)
    _mm512_storeu_si512(dst + r * dstRow, v[r]);
}

} // namespace neuron::runtime

#endif // __AVX512BW__

#endif // NEURON_RUNTIME_EXEC_TRANSPOSE_H
