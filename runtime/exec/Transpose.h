//===- Transpose.h - 16-bit block transposes in registers -------*- C++ -*-===//
//
// Shared by the executor's DMA transposes and the AMX GEMM's packing of the
// stationary operand (whose tiles want each output row's K values in a row).
//
//===----------------------------------------------------------------------===//

#ifndef NEURON_RUNTIME_EXEC_TRANSPOSE_H
#define NEURON_RUNTIME_EXEC_TRANSPOSE_H

#include <cstdint>

#ifdef __AVX512BW__
#include <immintrin.h>

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
