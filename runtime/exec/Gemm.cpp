//===- Gemm.cpp - TensorE matrix multiply on the host ---------------------===//
//
// fp32 operands go to an FMA kernel on AVX2 or AVX-512 registers (Eigen's
// GEMM in a portable build). bf16 operands, nearly every matmul of a real
// model, use the CPU's AMX tiles where the build and the CPU have them (a
// 16 x 16 x 32 bf16 product per instruction, several times the AVX-512
// rate), else AVX512-BF16 dot products (twice the rate of fp32 FMAs), else
// the fp32 kernel on widened values. All of them multiply bf16 values exactly
// and accumulate in fp32. A TensorE instruction is small (K, M <= 128, N <=
// 512) and its operands sit in SBUF in the chip's layout, so each kernel packs
// them itself rather than paying a library GEMM's per-call setup and packing
// on every instruction (Debian's oneDNN, the packaged library with an AMX
// bf16 GEMM, also runs its own OpenMP threads beside the WorkerPool's).
//
//===----------------------------------------------------------------------===//

#include "runtime/exec/Gemm.h"
#include "runtime/program/Error.h"

// Eigen evaluates products with m + n + k below this threshold coefficient
// by coefficient, vectorized from the first 64-byte-aligned output element:
// the sum order (and FMA use) would then depend on the output's address.
// Every product goes through the packed GEMM (or GEMV) kernels instead, whose
// results depend on the shape alone.
#define EIGEN_GEMM_TO_COEFFBASED_THRESHOLD 0
#include <Eigen/Core>

#include <algorithm>
#include <array>
#include <cstring>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#if defined(__AVX512F__) || (defined(__AVX2__) && defined(__FMA__))
#include <immintrin.h>
#define NEURON_HAS_F32_TILES 1
#else
#define NEURON_HAS_F32_TILES 0
#endif

#if defined(__AVX512BF16__) && defined(__AVX512BW__) && defined(__AVX512VL__)
#define NEURON_HAS_BF16_DOT 1
#else
#define NEURON_HAS_BF16_DOT 0
#endif

// The AMX kernel packs with the AVX-512 code above.
#if NEURON_HAS_BF16_DOT && defined(__AMX_TILE__) && defined(__AMX_BF16__) &&   \
    defined(__linux__)
#include "runtime/exec/Transpose.h"
#include <cpuid.h>
#include <sys/syscall.h>
#include <unistd.h>
#define NEURON_HAS_AMX 1
#else
#define NEURON_HAS_AMX 0
#endif

namespace neuron::runtime {

namespace {

/// A packed operand: the layout a kernel reads, in whole vectors. Eigen's
/// allocator aligns to the widest vector the build uses, so no vector load
/// straddles two cache lines (with malloc's 16-byte alignment a bf16 decoder
/// layer on one host thread took 3.1-3.3 s, aligned 3.05-3.1 s).
template <typename T>
using PackedVector = std::vector<T, Eigen::aligned_allocator<T>>;

using RowMatrix =
    Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
using OutMap = Eigen::Map<RowMatrix, 0, Eigen::OuterStride<>>;

/// This thread's packed copies of moving operands. Consecutive instructions
/// often share the moving operand (one weight tile against several
/// stationary ones): it is packed once. Two column ranges are kept, so that a
/// thread that runs every chunk of an instruction (its peers busy elsewhere)
/// keeps them all.
template <typename Packed> class MovingCache {
public:
  /// Columns [begin, end) of b as `pack` packs them: this thread's copy
  /// packed under the same nonzero key (Gemm.h's movingKey), else packed now.
  template <typename T, typename Pack>
  const PackedVector<Packed> &get(uint64_t key, const StridedMatrix<T> &b,
                                  int64_t begin, int64_t end, Pack pack) {
    Source source{key,         b.data,      b.rows, b.cols,
                  b.rowStride, b.colStride, begin,  end};
    size_t slot = key == 0                    ? 2
                  : slots[0].source == source ? 0
                  : slots[1].source == source ? 1
                                              : 2;
    if (slot == 2) { // Pack into the slot used longer ago.
      slot = 1 - lastUsed;
      pack(slots[slot].data);
      slots[slot].source = source;
    }
    lastUsed = slot;
    return slots[slot].data;
  }

private:
  struct Source {
    uint64_t key = 0;
    const void *data = nullptr;
    int64_t rows = 0, cols = 0, rowStride = 0, colStride = 0;
    int64_t begin = 0, end = 0;
    bool operator==(const Source &o) const {
      return key == o.key && data == o.data && rows == o.rows &&
             cols == o.cols && rowStride == o.rowStride &&
             colStride == o.colStride && begin == o.begin && end == o.end;
    }
  };
  struct Slot {
    PackedVector<Packed> data;
    Source source;
  };
  std::array<Slot, 2> slots;
  size_t lastUsed = 0;
};

#if NEURON_HAS_F32_TILES

// The fp32 kernel: an output tile of kF32Mr rows x two vectors of columns
// in registers, each sum formed by FMAs in K order from zero and then added
// to out. Every output's arithmetic is the same whatever tile or column
// range it falls in, so callers may split the columns between threads.
#if defined(__AVX512F__)
using F32Vec = __m512;
constexpr int64_t kF32Lanes = 16, kF32Mr = 8; // 16 of 32 registers sum
inline F32Vec vzero() { return _mm512_setzero_ps(); }
inline F32Vec vsplat(float v) { return _mm512_set1_ps(v); }
inline F32Vec vload(const float *p) { return _mm512_loadu_ps(p); }
inline void vstore(float *p, F32Vec v) { _mm512_storeu_ps(p, v); }
inline F32Vec vadd(F32Vec a, F32Vec b) { return _mm512_add_ps(a, b); }
inline F32Vec vfma(F32Vec a, F32Vec b, F32Vec c) {
  return _mm512_fmadd_ps(a, b, c);
}
#else
using F32Vec = __m256;
constexpr int64_t kF32Lanes = 8, kF32Mr = 6; // 12 of 16 registers sum
inline F32Vec vzero() { return _mm256_setzero_ps(); }
inline F32Vec vsplat(float v) { return _mm256_set1_ps(v); }
inline F32Vec vload(const float *p) { return _mm256_loadu_ps(p); }
inline void vstore(float *p, F32Vec v) { _mm256_storeu_ps(p, v); }
inline F32Vec vadd(F32Vec a, F32Vec b) { return _mm256_add_ps(a, b); }
inline F32Vec vfma(F32Vec a, F32Vec b, F32Vec c) {
  return _mm256_fmadd_ps(a, b, c);
}
#endif
constexpr int64_t kF32Nr = 2 * kF32Lanes;

/// Columns [begin, end) of x as fp32 rows with unit column step: x itself
/// when it has them, else converted into `dense`.
template <typename T, typename ToFloat>
StridedMatrix<float> denseRows(const StridedMatrix<T> &x, int64_t begin,
                               int64_t end, ToFloat toFloat,
                               std::vector<float> &dense) {
  if constexpr (std::is_same_v<T, float>)
    if (x.colStride == 1)
      return {x.data + begin, x.rows, end - begin, x.rowStride, 1};
  int64_t cols = end - begin;
  dense.resize(static_cast<size_t>(x.rows * cols));
  for (int64_t r = 0; r < x.rows; ++r) {
    const T *row = x.data + r * x.rowStride + begin * x.colStride;
    for (int64_t c = 0; c < cols; ++c)
      dense[r * cols + c] = toFloat(row[c * x.colStride]);
  }
  return {dense.data(), x.rows, cols, cols, 1};
}

/// Packs dense rows x[K, cols] as panels of `Lanes` columns read front to
/// back by a tile, packed[panel][k][lane] = x[k, panel * Lanes + lane], zero
/// beyond cols. (In place, a tile's K rows of one panel, a power-of-two
/// stride apart, would fall in a few L1 sets and evict each other.)
template <int64_t Lanes>
void packPanels(const StridedMatrix<float> &x, PackedVector<float> &packed) {
  int64_t k = x.rows, cols = x.cols, full = cols / Lanes;
  int64_t panels = (cols + Lanes - 1) / Lanes;
  packed.resize(static_cast<size_t>(panels * k * Lanes));
  for (int64_t p = 0; p < k; ++p) {
    const float *row = x.data + p * x.rowStride;
    for (int64_t panel = 0; panel < full; ++panel) // A constant size: inlined.
      std::memcpy(packed.data() + (panel * k + p) * Lanes, row + panel * Lanes,
                  Lanes * sizeof(float));
    if (full < panels) {
      float *dst = packed.data() + (full * k + p) * Lanes;
      int64_t rest = cols - full * Lanes;
      std::copy_n(row + full * Lanes, rest, dst);
      std::fill(dst + rest, dst + Lanes, 0.0f);
    }
  }
}

/// out[Rows, cols] (+)= one tile of packed a (kF32Mr lanes) and b (kF32Nr).
template <int64_t Rows>
void f32Tile(int64_t k, const float *a, const float *b, float *out,
             int64_t ldOut, int64_t cols, bool accumulate) {
  F32Vec acc[Rows][2];
  for (auto &row : acc)
    row[0] = row[1] = vzero();
  for (int64_t p = 0; p < k; ++p) {
    F32Vec b0 = vload(b + p * kF32Nr), b1 = vload(b + p * kF32Nr + kF32Lanes);
    for (int64_t i = 0; i < Rows; ++i) {
      F32Vec ai = vsplat(a[p * kF32Mr + i]);
      acc[i][0] = vfma(ai, b0, acc[i][0]);
      acc[i][1] = vfma(ai, b1, acc[i][1]);
    }
  }
  for (int64_t i = 0; i < Rows; ++i) {
    float *o = out + i * ldOut;
    if (cols == kF32Nr) {
      for (int64_t half = 0; half < 2; ++half) {
        F32Vec v = acc[i][half];
        if (accumulate)
          v = vadd(vload(o + half * kF32Lanes), v);
        vstore(o + half * kF32Lanes, v);
      }
      continue;
    }
    float sums[kF32Nr];
    vstore(sums, acc[i][0]);
    vstore(sums + kF32Lanes, acc[i][1]);
    for (int64_t c = 0; c < cols; ++c)
      o[c] = accumulate ? o[c] + sums[c] : sums[c];
  }
}

using F32TileFn = void (*)(int64_t, const float *, const float *, float *,
                           int64_t, int64_t, bool);

template <size_t... Rows>
constexpr std::array<F32TileFn, sizeof...(Rows)>
f32Tiles(std::index_sequence<Rows...>) {
  return {&f32Tile<static_cast<int64_t>(Rows) + 1>...};
}

/// matmulF32's contract on operands of any element type `toFloat` widens.
template <typename T, typename ToFloat>
void matmulTiles(const StridedMatrix<T> &a, const StridedMatrix<T> &b,
                 ToFloat toFloat, float *out, int64_t ldOut, bool accumulate,
                 int64_t begin, int64_t end, uint64_t movingKey) {
  static constexpr auto tiles =
      f32Tiles(std::make_index_sequence<static_cast<size_t>(kF32Mr)>());
  thread_local std::vector<float> dense;
  thread_local PackedVector<float> packedA;
  thread_local MovingCache<float> cache;
  packPanels<kF32Mr>(denseRows(a, 0, a.cols, toFloat, dense), packedA);
  const PackedVector<float> &packedB =
      cache.get(movingKey, b, begin, end, [&](PackedVector<float> &packed) {
        packPanels<kF32Nr>(denseRows(b, begin, end, toFloat, dense), packed);
      });
  int64_t k = a.rows, m = a.cols, width = end - begin;
  // A panel of b stays in L1 while every row panel of a streams past it.
  for (int64_t j = 0; j < width; j += kF32Nr)
    for (int64_t i = 0; i < m; i += kF32Mr)
      tiles[std::min(kF32Mr, m - i) - 1](
          k, packedA.data() + i * k, packedB.data() + j * k,
          out + i * ldOut + begin + j, ldOut, std::min(kF32Nr, width - j),
          accumulate);
}

#endif // NEURON_HAS_F32_TILES

#if NEURON_HAS_BF16_DOT

constexpr int64_t kMr = 8;  // output rows per register tile
constexpr int64_t kNr = 32; // output columns per register tile (2 vectors)

/// The pairs of 16 consecutive columns of two rows as dwords,
/// row1[c] << 16 | row0[c], zero beyond `count` columns (row1 null is a zero
/// row).
inline __m512i rowPair16(const uint16_t *row0, const uint16_t *row1,
                         int64_t count) {
  __m256i lo, hi = _mm256_setzero_si256();
  if (count >= 16) {
    lo = _mm256_loadu_si256(reinterpret_cast<const __m256i *>(row0));
    if (row1)
      hi = _mm256_loadu_si256(reinterpret_cast<const __m256i *>(row1));
  } else {
    auto mask =
        static_cast<__mmask16>((1u << std::max<int64_t>(count, 0)) - 1u);
    lo = _mm256_maskz_loadu_epi16(mask, row0);
    if (row1)
      hi = _mm256_maskz_loadu_epi16(mask, row1);
  }
  return _mm512_or_si512(_mm512_cvtepu16_epi32(lo),
                         _mm512_slli_epi32(_mm512_cvtepu16_epi32(hi), 16));
}

/// Packs a[k, i] (rows k, columns i in [begin, begin + width)) as pairs of
/// consecutive k, for `lanes` (8 or a multiple of 16) columns per panel:
/// packed[panel][k / 2][lane] = a[k + 1, i] << 16 | a[k, i], zero-padded
/// (to `paddedPairs` pairs per panel, if more than the rows need).
void packPairs(const StridedMatrix<uint16_t> &a, int64_t begin, int64_t width,
               int64_t lanes, PackedVector<uint32_t> &packed,
               std::vector<uint16_t> &gathered, int64_t paddedPairs = 0) {
  int64_t pairs = (a.rows + 1) / 2;
  int64_t stride = std::max(pairs, paddedPairs); // pairs per panel
  int64_t panels = (width + lanes - 1) / lanes;
  packed.resize(static_cast<size_t>(panels * stride * lanes));
  gathered.resize(static_cast<size_t>(2 * width));
  // Plain pointers: inlined into a kernel, the vectors are its thread-locals,
  // and each store through them looked the thread-local storage up again.
  uint32_t *out = packed.data();
  uint16_t *runs = gathered.data();
  // Row pairs outermost: each source row is read once, front to back, 16
  // columns at a time (two panels' worth when a panel is 8 wide).
  for (int64_t p = 0; p < pairs; ++p) {
    const uint16_t *rows[2] = {nullptr, nullptr};
    for (int64_t r = 0; r < 2 && 2 * p + r < a.rows; ++r) {
      rows[r] = a.data + (2 * p + r) * a.rowStride + begin * a.colStride;
      if (a.colStride != 1) { // Gather the strided row first.
        uint16_t *run = runs + r * width;
        for (int64_t c = 0; c < width; ++c)
          run[c] = rows[r][c * a.colStride];
        rows[r] = run;
      }
    }
    for (int64_t c = 0; c < panels * lanes; c += 16) {
      __m512i pair =
          rowPair16(rows[0] + c, rows[1] ? rows[1] + c : nullptr, width - c);
      uint32_t *dst = out + ((c / lanes) * stride + p) * lanes + c % lanes;
      if (lanes % 16 == 0) {
        _mm512_storeu_si512(dst, pair);
        continue;
      }
      _mm256_storeu_si256(reinterpret_cast<__m256i *>(dst),
                          _mm512_castsi512_si256(pair));
      if (c + 8 < panels * lanes) // the next panel's first 8 columns
        _mm256_storeu_si256(reinterpret_cast<__m256i *>(dst + stride * lanes),
                            _mm512_extracti64x4_epi64(pair, 1));
    }
  }
  for (int64_t panel = 0; panel < panels && stride > pairs; ++panel)
    std::fill_n(out + (panel * stride + pairs) * lanes,
                (stride - pairs) * lanes, 0u);
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
  thread_local PackedVector<uint32_t> packedA, packedB;
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

#if NEURON_HAS_AMX

// AMX: eight tile registers of 16 rows x 64 bytes. Tiles 0-3 accumulate a
// 32 x 32 block of fp32 outputs, 4-5 hold 32 output rows' K values (A: 16
// rows x 32 bf16), 6-7 the K values of 32 output columns as pairs (B: 16
// pairs of K x 16 columns). One TDPBF16PS multiplies 16 x 16 x 32.
constexpr int64_t kTileRows = 16; // output rows or columns per tile
constexpr int64_t kTileK = 32;    // K values per tile product

struct alignas(64) TileConfig {
  uint8_t palette = 1;
  uint8_t startRow = 0;
  uint8_t reserved[14] = {};
  uint16_t colBytes[16] = {};
  uint8_t rows[16] = {};
};

/// True when the CPU has AMX-TILE and AMX-BF16 and Linux lets this process
/// use the tile state (it is off until a process asks, and a kernel older
/// than 5.16 cannot grant it).
bool amxUsable() {
  static const bool usable = [] {
    unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
    if (!__get_cpuid_count(7, 0, &eax, &ebx, &ecx, &edx))
      return false;
    constexpr unsigned kAmxBf16 = 1u << 22, kAmxTile = 1u << 24;
    if ((edx & kAmxBf16) == 0 || (edx & kAmxTile) == 0)
      return false;
    constexpr long kReqXcompPerm = 0x1023, kXtileData = 18;
    return syscall(SYS_arch_prctl, kReqXcompPerm, kXtileData) == 0;
  }();
  return usable;
}

/// Packs a[k, i] for AMX A tiles: packed[kb][i][c] = a[kb * 32 + c, i] for
/// mPad rows i, zero beyond a's rows and columns. Tile (i0, kb) then starts
/// at packed[kb][i0] with a 64-byte row pitch.
void packStationaryAmx(const StridedMatrix<uint16_t> &a, int64_t kBlocks,
                       int64_t mPad, PackedVector<uint16_t> &packed) {
  packed.resize(static_cast<size_t>(kBlocks * mPad * kTileK));
  for (int64_t kb = 0; kb < kBlocks; ++kb) {
    int64_t k0 = kb * kTileK;
    uint16_t *block = packed.data() + kb * mPad * kTileK;
    for (int64_t i0 = 0; i0 < mPad; i0 += kTileK) {
      if (a.colStride == 1 && k0 + kTileK <= a.rows && i0 + kTileK <= a.cols) {
        // Element (i, k) at a[k * rowStride + i] -> block[i * 32 + k].
        transpose32x32x16(a.data + k0 * a.rowStride + i0, a.rowStride,
                          block + i0 * kTileK, kTileK);
        continue;
      }
      for (int64_t i = i0; i < std::min(mPad, i0 + kTileK); ++i)
        for (int64_t c = 0; c < kTileK; ++c) {
          int64_t k = k0 + c;
          block[i * kTileK + c] =
              k < a.rows && i < a.cols
                  ? a.data[k * a.rowStride + i * a.colStride]
                  : uint16_t{0};
        }
    }
  }
}

/// out[rows, cols] (+)= an accumulator tile stored at `tile` (16 x 16).
void addTile(const float *tile, float *out, int64_t ldOut, int64_t rows,
             int64_t cols, bool accumulate) {
  __mmask16 mask = static_cast<__mmask16>((1u << cols) - 1u);
  for (int64_t r = 0; r < rows; ++r) {
    __m512 v = _mm512_load_ps(tile + r * kTileRows);
    float *o = out + r * ldOut;
    if (accumulate)
      v = _mm512_add_ps(_mm512_maskz_loadu_ps(mask, o), v);
    _mm512_mask_storeu_ps(o, mask, v);
  }
}

void matmulBf16Amx(const StridedMatrix<uint16_t> &a,
                   const StridedMatrix<uint16_t> &b, float *out, int64_t ldOut,
                   bool accumulate, int64_t begin, int64_t end,
                   uint64_t movingKey) {
  thread_local PackedVector<uint16_t> packedA;
  thread_local std::vector<uint16_t> gathered;
  thread_local MovingCache<uint32_t> cache;
  int64_t m = a.cols, width = end - begin;
  int64_t kBlocks = (a.rows + kTileK - 1) / kTileK;
  int64_t mPad = (m + kTileRows - 1) / kTileRows * kTileRows;
  int64_t pairs = kBlocks * kTileK / 2; // per B panel, zero-padded
  packStationaryAmx(a, kBlocks, mPad, packedA);
  const PackedVector<uint32_t> &moving =
      cache.get(movingKey, b, begin, end, [&](PackedVector<uint32_t> &packed) {
        packPairs(b, begin, width, kTileRows, packed, gathered, pairs);
      });

  // Loaded on every call: other code on this thread (oneDNN in PyTorch's
  // CPU kernels) configures the tiles its own way.
  TileConfig config;
  for (int t = 0; t < 8; ++t) {
    config.rows[t] = kTileRows;
    config.colBytes[t] = 64;
  }
  _tile_loadconfig(&config);
  alignas(64) float tile[kTileRows * kTileRows];
  constexpr int64_t kBlock = 2 * kTileRows; // outputs per side of a block
  for (int64_t j = 0; j < width; j += kBlock) {
    int64_t cols = std::min(kBlock, width - j);
    bool twoCols = cols > kTileRows;
    const uint32_t *b0 = moving.data() + j / kTileRows * pairs * kTileRows;
    const uint32_t *b1 = b0 + pairs * kTileRows;
    for (int64_t i = 0; i < m; i += kBlock) {
      bool twoRows = m - i > kTileRows;
      _tile_zero(0);
      _tile_zero(1);
      _tile_zero(2);
      _tile_zero(3);
      for (int64_t kb = 0; kb < kBlocks; ++kb) {
        const uint16_t *a0 = packedA.data() + (kb * mPad + i) * kTileK;
        int64_t bOffset = kb * kTileK / 2 * kTileRows;
        _tile_loadd(4, a0, 64);
        _tile_loadd(6, b0 + bOffset, 64);
        _tile_dpbf16ps(0, 4, 6);
        if (twoCols) {
          _tile_loadd(7, b1 + bOffset, 64);
          _tile_dpbf16ps(1, 4, 7);
        }
        if (twoRows) {
          _tile_loadd(5, a0 + kTileRows * kTileK, 64);
          _tile_dpbf16ps(2, 5, 6);
          if (twoCols)
            _tile_dpbf16ps(3, 5, 7);
        }
      }
      // Each instruction's sums are added to out as a whole, as the PE
      // array adds its column sums into PSUM.
      float *o = out + i * ldOut + begin + j;
      int64_t rows0 = std::min(kTileRows, m - i), rows1 = m - i - rows0;
      int64_t cols0 = std::min(kTileRows, cols), cols1 = cols - cols0;
      _tile_stored(0, tile, 64);
      addTile(tile, o, ldOut, rows0, cols0, accumulate);
      if (twoCols) {
        _tile_stored(1, tile, 64);
        addTile(tile, o + kTileRows, ldOut, rows0, cols1, accumulate);
      }
      if (twoRows) {
        int64_t rows = std::min(kTileRows, rows1);
        _tile_stored(2, tile, 64);
        addTile(tile, o + kTileRows * ldOut, ldOut, rows, cols0, accumulate);
        if (twoCols) {
          _tile_stored(3, tile, 64);
          addTile(tile, o + kTileRows * ldOut + kTileRows, ldOut, rows, cols1,
                  accumulate);
        }
      }
    }
  }
  _tile_release();
}

#endif // NEURON_HAS_AMX

#endif // NEURON_HAS_BF16_DOT

#if !NEURON_HAS_F32_TILES
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
#endif

} // namespace

void matmulF32(const StridedMatrix<float> &a, const StridedMatrix<float> &b,
               float *out, int64_t ldOut, bool accumulate, int64_t begin,
               int64_t end, uint64_t movingKey) {
#if NEURON_HAS_F32_TILES
  matmulTiles(
      a, b, [](float v) { return v; }, out, ldOut, accumulate, begin, end,
      movingKey);
#else
  (void)movingKey; // Eigen packs on every call.
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
#endif
}

const char *bf16KernelName(Bf16Kernel kernel) {
  switch (kernel) {
  case Bf16Kernel::Amx:
    return "amx-bf16";
  case Bf16Kernel::Dot:
    return "avx512-bf16";
  case Bf16Kernel::Widened:
    return "fp32";
  }
  return "?";
}

const std::vector<Bf16Kernel> &bf16Kernels() {
  static const std::vector<Bf16Kernel> kernels = [] {
    std::vector<Bf16Kernel> out;
#if NEURON_HAS_AMX
    if (amxUsable())
      out.push_back(Bf16Kernel::Amx);
#endif
#if NEURON_HAS_BF16_DOT
    out.push_back(Bf16Kernel::Dot);
#endif
    out.push_back(Bf16Kernel::Widened);
    return out;
  }();
  return kernels;
}

bool matmulF32ColumnsIndependent() { return NEURON_HAS_F32_TILES; }

bool matmulBf16ColumnsIndependent() {
  return bf16Kernels().front() != Bf16Kernel::Widened ||
         matmulF32ColumnsIndependent();
}

void matmulBf16(Bf16Kernel kernel, const StridedMatrix<uint16_t> &a,
                const StridedMatrix<uint16_t> &b, float *out, int64_t ldOut,
                bool accumulate, int64_t begin, int64_t end,
                uint64_t movingKey) {
  switch (kernel) {
  case Bf16Kernel::Amx:
#if NEURON_HAS_AMX
    if (amxUsable())
      return matmulBf16Amx(a, b, out, ldOut, accumulate, begin, end, movingKey);
#endif
    break;
  case Bf16Kernel::Dot:
#if NEURON_HAS_BF16_DOT
    return matmulBf16Dot(a, b, out, ldOut, accumulate, begin, end);
#endif
    break;
  case Bf16Kernel::Widened: {
#if NEURON_HAS_F32_TILES
    auto widen = [](uint16_t bits) {
      uint32_t wide = static_cast<uint32_t>(bits) << 16;
      float value;
      std::memcpy(&value, &wide, sizeof(value));
      return value;
    };
    return matmulTiles(a, b, widen, out, ldOut, accumulate, begin, end,
                       movingKey);
#else
    thread_local std::vector<float> wideA, wideB;
    widen(a, 0, a.cols, wideA);
    widen(b, begin, end, wideB);
    int64_t width = end - begin;
    return matmulF32({wideA.data(), a.rows, a.cols, a.cols, 1},
                     {wideB.data(), b.rows, width, width, 1}, out + begin,
                     ldOut, accumulate, 0, width);
#endif
  }
  }
  throw Error(std::string("the host cannot run the ") + bf16KernelName(kernel) +
              " matmul kernel");
}

void matmulBf16(const StridedMatrix<uint16_t> &a,
                const StridedMatrix<uint16_t> &b, float *out, int64_t ldOut,
                bool accumulate, int64_t begin, int64_t end,
                uint64_t movingKey) {
  matmulBf16(bf16Kernels().front(), a, b, out, ldOut, accumulate, begin, end,
             movingKey);
}

} // namespace neuron::runtime
