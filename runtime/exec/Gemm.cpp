//===- Gemm.cpp - TensorE matrix multiply on the host ---------------------===//
//
// fp32 operands go to Eigen's GEMM. bf16 operands, nearly every matmul of a
// real model, use AVX512-BF16 dot products where the build has them: they
// multiply pairs of bf16 values exactly and accumulate in fp32 at twice the
// rate of fp32 FMAs. No library on Debian 12 and 13 offers a bf16 GEMM
// (Eigen 3.4 has none, Debian's OpenBLAS is built without sbgemm), so the
// packing and the 8 x 32 register tile are written here.
//
//===----------------------------------------------------------------------===//

#include "runtime/exec/Gemm.h"

// Eigen evaluates products with m + n + k below this threshold coefficient
// by coefficient, vectorized from the first 64-byte-aligned output element:
// the sum order (and FMA use) would then depend on the output's address.
// Every product goes through the packed GEMM (or GEMV) kernels instead, whose
// results depend on the shape alone.
#define EIGEN_GEMM_TO_COEFFBASED_THRESHOLD 0
#include <Eigen/Core>

#include <algorithm>
#include <cstring>
#include <vector>

#if defined(__AVX512BF16__) && defined(__AVX512BW__) && defined(__AVX512VL__)
#include <immintrin.h>
#define NEURON_HAS_BF16_DOT 1
#else
#define NEURON_HAS_BF16_DOT 0
#endif

namespace neuron::runtime {

namespace {

using RowMatrix =
    Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
using OutMap = Eigen::Map<RowMatrix, 0, Eigen::OuterStride<>>;

#if NEURON_HAS_BF16_DOT

constexpr int64_t kMr = 8;  // output rows per register tile
constexpr int64_t kNr = 32; // output columns per register tile (2 vectors)

/// Packs pairs of consecutive rows of a contiguous bf16 run into dwords,
/// out[lane] = row1[lane] << 16 | row0[lane] for the first `count` of
/// `lanes` lanes (the others zero; row1 null is a zero row).
void packRowPair(const uint16_t *row0, const uint16_t *row1, int64_t count,
                 int64_t lanes, uint32_t *out) {
  for (int64_t c = 0; c < lanes; c += 16) {
    auto valid = static_cast<unsigned>(std::clamp<int64_t>(count - c, 0, 16));
    auto stored = static_cast<unsigned>(std::min<int64_t>(lanes - c, 16));
    auto loadMask = static_cast<__mmask16>((1u << valid) - 1u);
    __m256i lo = _mm256_maskz_loadu_epi16(loadMask, row0 + c);
    __m256i hi = row1 ? _mm256_maskz_loadu_epi16(loadMask, row1 + c)
                      : _mm256_setzero_si256();
    __m512i pair =
        _mm512_or_si512(_mm512_cvtepu16_epi32(lo),
                        _mm512_slli_epi32(_mm512_cvtepu16_epi32(hi), 16));
    _mm512_mask_storeu_epi32(out + c,
                             static_cast<__mmask16>((1u << stored) - 1u), pair);
  }
}

/// Packs a[k, i] (rows k, columns i in [begin, begin + width)) as pairs of
/// consecutive k, for `lanes` columns per panel:
/// packed[panel][k / 2][lane] = a[k + 1, i] << 16 | a[k, i], zero-padded.
void packPairs(const StridedMatrix<uint16_t> &a, int64_t begin, int64_t width,
               int64_t lanes, std::vector<uint32_t> &packed,
               std::vector<uint16_t> &gathered) {
  int64_t pairs = (a.rows + 1) / 2;
  int64_t panels = (width + lanes - 1) / lanes;
  packed.resize(static_cast<size_t>(panels * pairs * lanes));
  gathered.resize(static_cast<size_t>(2 * width));
  // Row pairs outermost: each source row is read once, front to back.
  for (int64_t p = 0; p < pairs; ++p) {
    const uint16_t *rows[2] = {nullptr, nullptr};
    for (int64_t r = 0; r < 2 && 2 * p + r < a.rows; ++r) {
      rows[r] = a.data + (2 * p + r) * a.rowStride + begin * a.colStride;
      if (a.colStride != 1) { // Gather the strided row first.
        uint16_t *run = gathered.data() + r * width;
        for (int64_t c = 0; c < width; ++c)
          run[c] = rows[r][c * a.colStride];
        rows[r] = run;
      }
    }
    for (int64_t panel = 0; panel < panels; ++panel) {
      int64_t first = panel * lanes;
      packRowPair(rows[0] + first, rows[1] ? rows[1] + first : nullptr,
                  std::min(lanes, width - first), lanes,
                  packed.data() + (panel * pairs + p) * lanes);
    }
  }
}

/// out[rows, cols] (+)= the kMr x kNr tile of packed a and b.
void tile(int64_t pairs, const uint32_t *a, const uint32_t *b, float *out,
          int64_t ldOut, int64_t rows, int64_t cols, bool accumulate) {
  __m512 acc[kMr][2];
  for (auto &row : acc)
    row[0] = row[1] = _mm512_setzero_ps();
  for (int64_t p = 0; p < pairs; ++p) {
    __m512bh b0 = (__m512bh)_mm512_loadu_si512(b + p * kNr);
    __m512bh b1 = (__m512bh)_mm512_loadu_si512(b + p * kNr + 16);
    for (int64_t i = 0; i < kMr; ++i) {
      __m512bh ai =
          (__m512bh)_mm512_set1_epi32(static_cast<int>(a[p * kMr + i]));
      acc[i][0] = _mm512_dpbf16_ps(acc[i][0], ai, b0);
      acc[i][1] = _mm512_dpbf16_ps(acc[i][1], ai, b1);
    }
  }
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t half = 0; half < 2; ++half) {
      int64_t lanes = std::clamp<int64_t>(cols - half * 16, 0, 16);
      __mmask16 mask = static_cast<__mmask16>((1u << lanes) - 1u);
      float *o = out + i * ldOut + half * 16;
      __m512 v = acc[i][half];
      if (accumulate)
        v = _mm512_add_ps(_mm512_maskz_loadu_ps(mask, o), v);
      _mm512_mask_storeu_ps(o, mask, v);
    }
}

void matmulBf16Dot(const StridedMatrix<uint16_t> &a,
                   const StridedMatrix<uint16_t> &b, float *out, int64_t ldOut,
                   bool accumulate, int64_t begin, int64_t end) {
  thread_local std::vector<uint32_t> packedA, packedB;
  thread_local std::vector<uint16_t> gathered;
  packPairs(a, 0, a.cols, kMr, packedA, gathered);
  packPairs(b, begin, end - begin, kNr, packedB, gathered);
  int64_t pairs = (a.rows + 1) / 2, m = a.cols, width = end - begin;
  for (int64_t j = 0; j < width; j += kNr)
    for (int64_t i = 0; i < m; i += kMr)
      tile(pairs, packedA.data() + (i / kMr) * pairs * kMr,
           packedB.data() + (j / kNr) * pairs * kNr,
           out + i * ldOut + begin + j, ldOut, std::min(kMr, m - i),
           std::min(kNr, width - j), accumulate);
}

#else

/// Widens columns [begin, end) of a bf16 matrix into a dense fp32 one.
void widen(const StridedMatrix<uint16_t> &x, int64_t begin, int64_t end,
           std::vector<float> &out) {
  int64_t cols = end - begin;
  out.resize(static_cast<size_t>(x.rows * cols));
  for (int64_t r = 0; r < x.rows; ++r)
    for (int64_t c = 0; c < cols; ++c) {
      uint32_t bits = x.data[r * x.rowStride + (begin + c) * x.colStride];
      bits <<= 16;
      std::memcpy(&out[r * cols + c], &bits, sizeof(float));
    }
}

#endif // NEURON_HAS_BF16_DOT

} // namespace

void matmulF32(const StridedMatrix<float> &a, const StridedMatrix<float> &b,
               float *out, int64_t ldOut, bool accumulate, int64_t begin,
               int64_t end) {
  OutMap result(out + begin, a.cols, end - begin, Eigen::OuterStride<>(ldOut));
  auto multiply = [&](const auto &lhs, const auto &rhs) {
    if (accumulate)
      result.noalias() += lhs.transpose() * rhs;
    else
      result.noalias() = lhs.transpose() * rhs;
  };
  const float *bData = b.data + begin * b.colStride;
  if (a.colStride == 1 && b.colStride == 1) { // Eigen's GEMM reads in place.
    using Map = Eigen::Map<const RowMatrix, 0, Eigen::OuterStride<>>;
    multiply(
        Map(a.data, a.rows, a.cols, Eigen::OuterStride<>(a.rowStride)),
        Map(bData, b.rows, end - begin, Eigen::OuterStride<>(b.rowStride)));
    return;
  }
  using Stride = Eigen::Stride<Eigen::Dynamic, Eigen::Dynamic>;
  using Map = Eigen::Map<const RowMatrix, 0, Stride>;
  multiply(Map(a.data, a.rows, a.cols, Stride(a.rowStride, a.colStride)),
           Map(bData, b.rows, end - begin, Stride(b.rowStride, b.colStride)));
}

bool matmulBf16ColumnsIndependent() { return NEURON_HAS_BF16_DOT; }

void matmulBf16(const StridedMatrix<uint16_t> &a,
                const StridedMatrix<uint16_t> &b, float *out, int64_t ldOut,
                bool accumulate, int64_t begin, int64_t end) {
#if NEURON_HAS_BF16_DOT
  matmulBf16Dot(a, b, out, ldOut, accumulate, begin, end);
#else
  thread_local std::vector<float> wideA, wideB;
  widen(a, 0, a.cols, wideA);
  widen(b, begin, end, wideB);
  int64_t width = end - begin;
  matmulF32({wideA.data(), a.rows, a.cols, a.cols, 1},
            {wideB.data(), b.rows, width, width, 1}, out + begin, ldOut,
            accumulate, 0, width);
#endif
}

} // namespace neuron::runtime
