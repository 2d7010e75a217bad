//===- Executor.cpp - Functional executor of kernel programs --------------===//
//
// Construction flattens the node tree, resolves every view to a buffer index,
// an affine offset over dense loop slots and a collapsed stride pattern, and
// allocates all program-owned memory. run() then walks the flattened tree.
//
// Each compute instruction gathers its strided operands into fp32 scratch
// arrays (widening each dtype exactly), computes on them with Eigen in fixed
// blocks (so no result depends on an array's address), and
// scatters the result with the destination dtype's rounding; matmuls run on
// Gemm.h's kernels, which read bf16 operands in place. DMA copies move bytes
// directly when the dtypes agree and convert through fp32 otherwise. Large
// matmuls, copies and activations are split between the WorkerPool's
// threads, in ways that leave every result's bits unchanged.
//
//===----------------------------------------------------------------------===//

#include "runtime/exec/Executor.h"
#include "runtime/exec/CollectiveHandler.h"
#include "runtime/exec/Gemm.h"
#include "runtime/exec/Numerics.h"
#include "runtime/exec/Philox.h"
#include "runtime/exec/Transpose.h"
#include "runtime/exec/WorkerPool.h"
#include "runtime/target/Target.h"

#include <Eigen/Core>
#include <unsupported/Eigen/SpecialFunctions>

#include <algorithm>
#include <array>
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <limits>
#include <map>
#include <new>
#include <optional>
#include <string>
#include <unordered_set>
#include <utility>

#if defined(__linux__)
#include <sys/mman.h>
#endif

namespace neuron::runtime {

namespace {

//===----------------------------------------------------------------------===//
// Compiled views and strided iteration
//===----------------------------------------------------------------------===//

/// A stride pattern with unit dims dropped and contiguous dims merged, so the
/// innermost run is as long as possible. Rank 0 means a single element.
struct Pattern {
  int rank = 0;
  std::array<int64_t, kMaxViewRank> shape{};
  std::array<int64_t, kMaxViewRank> strides{};
};

/// The same for two views walked in lockstep (same logical shape).
struct PairPattern {
  int rank = 0;
  std::array<int64_t, kMaxViewRank> shape{};
  std::array<int64_t, kMaxViewRank> stridesA{};
  std::array<int64_t, kMaxViewRank> stridesB{};
};

Pattern collapse(const std::vector<int64_t> &shape,
                 const std::vector<int64_t> &strides) {
  Pattern out;
  for (size_t d = 0; d < shape.size(); ++d) {
    if (shape[d] == 1)
      continue;
    if (out.rank > 0 && out.strides[out.rank - 1] == strides[d] * shape[d]) {
      out.shape[out.rank - 1] *= shape[d];
      out.strides[out.rank - 1] = strides[d];
      continue;
    }
    out.shape[out.rank] = shape[d];
    out.strides[out.rank] = strides[d];
    ++out.rank;
  }
  return out;
}

PairPattern collapsePair(const std::vector<int64_t> &shape,
                         const std::vector<int64_t> &stridesA,
                         const std::vector<int64_t> &stridesB) {
  PairPattern out;
  for (size_t d = 0; d < shape.size(); ++d) {
    if (shape[d] == 1)
      continue;
    if (out.rank > 0 && out.stridesA[out.rank - 1] == stridesA[d] * shape[d] &&
        out.stridesB[out.rank - 1] == stridesB[d] * shape[d]) {
      out.shape[out.rank - 1] *= shape[d];
      out.stridesA[out.rank - 1] = stridesA[d];
      out.stridesB[out.rank - 1] = stridesB[d];
      continue;
    }
    out.shape[out.rank] = shape[d];
    out.stridesA[out.rank] = stridesA[d];
    out.stridesB[out.rank] = stridesB[d];
    ++out.rank;
  }
  return out;
}

/// For a copy whose innermost run is strided on the source (a transpose),
/// moves a dim that is contiguous on the source, else one contiguous on the
/// destination, next to the innermost: copyRuns then moves the two as one
/// 2-D block. Only for copies whose element order does not matter.
void moveContiguousDimInward(PairPattern &pattern) {
  int inner = pattern.rank - 1;
  if (inner < 1 || pattern.stridesA[inner] == 1)
    return;
  for (const auto *strides : {&pattern.stridesA, &pattern.stridesB}) {
    for (int d = inner - 1; d >= 0; --d) {
      if ((*strides)[d] != 1)
        continue;
      std::swap(pattern.shape[d], pattern.shape[inner - 1]);
      std::swap(pattern.stridesA[d], pattern.stridesA[inner - 1]);
      std::swap(pattern.stridesB[d], pattern.stridesB[inner - 1]);
      return;
    }
  }
}

/// True when no two indices of the view address the same element (checked
/// conservatively: each dim, by increasing stride, steps past the span of the
/// dims below it).
bool isInjective(const std::vector<int64_t> &shape,
                 const std::vector<int64_t> &strides) {
  std::vector<std::pair<int64_t, int64_t>> dims; // (|stride|, extent)
  for (size_t d = 0; d < shape.size(); ++d)
    if (shape[d] > 1)
      dims.emplace_back(std::abs(strides[d]), shape[d]);
  std::sort(dims.begin(), dims.end());
  int64_t span = 0; // largest offset reached by the dims so far
  for (const auto &[stride, extent] : dims) {
    if (stride <= span)
      return false;
    span += stride * (extent - 1);
  }
  return true;
}

bool sameView(const View &a, const View &b) {
  return a.buffer == b.buffer && a.offset.constant == b.offset.constant &&
         a.offset.terms == b.offset.terms && a.shape == b.shape &&
         a.strides == b.strides;
}

/// True when an instruction computing each row of its outputs from the same
/// row of its inputs may run its rows in any order: every output is
/// injective, in a buffer of its own, and each input either lives elsewhere
/// or is that very output (in place).
bool rowsIndependent(
    std::initializer_list<const std::optional<View> *> reads,
    std::initializer_list<const std::optional<View> *> writes) {
  std::vector<const View *> outputs;
  for (const std::optional<View> *w : writes) {
    if (!*w)
      continue;
    if ((*w)->shape.empty() || !isInjective((*w)->shape, (*w)->strides))
      return false;
    for (const View *other : outputs)
      if (other->buffer == (*w)->buffer)
        return false;
    outputs.push_back(&**w);
  }
  for (const std::optional<View> *r : reads) {
    if (!*r)
      continue;
    if ((*r)->shape.empty())
      return false;
    for (const View *w : outputs)
      if (w->buffer == (*r)->buffer && !sameView(*w, **r))
        return false;
  }
  return true;
}

/// Calls fn(elementOffset, innerStride, innerCount, linearIndex) for each
/// innermost run of `pattern`, in row-major order.
template <typename Fn>
void forEachRun(const Pattern &pattern, int64_t start, Fn &&fn) {
  if (pattern.rank == 0) {
    fn(start, int64_t(1), int64_t(1), int64_t(0));
    return;
  }
  int inner = pattern.rank - 1;
  int64_t innerCount = pattern.shape[inner];
  int64_t innerStride = pattern.strides[inner];
  std::array<int64_t, kMaxViewRank> index{};
  int64_t offset = start;
  int64_t linear = 0;
  while (true) {
    fn(offset, innerStride, innerCount, linear);
    linear += innerCount;
    int d = inner - 1;
    for (; d >= 0; --d) {
      offset += pattern.strides[d];
      if (++index[d] < pattern.shape[d])
        break;
      offset -= pattern.strides[d] * pattern.shape[d];
      index[d] = 0;
    }
    if (d < 0)
      return;
  }
}

/// Lockstep version: fn(offsetA, strideA, offsetB, strideB, innerCount).
template <typename Fn>
void forEachRunPair(const PairPattern &pattern, int64_t startA, int64_t startB,
                    Fn &&fn) {
  if (pattern.rank == 0) {
    fn(startA, int64_t(1), startB, int64_t(1), int64_t(1));
    return;
  }
  int inner = pattern.rank - 1;
  std::array<int64_t, kMaxViewRank> index{};
  int64_t offsetA = startA, offsetB = startB;
  while (true) {
    fn(offsetA, pattern.stridesA[inner], offsetB, pattern.stridesB[inner],
       pattern.shape[inner]);
    int d = inner - 1;
    for (; d >= 0; --d) {
      offsetA += pattern.stridesA[d];
      offsetB += pattern.stridesB[d];
      if (++index[d] < pattern.shape[d])
        break;
      offsetA -= pattern.stridesA[d] * pattern.shape[d];
      offsetB -= pattern.stridesB[d] * pattern.shape[d];
      index[d] = 0;
    }
    if (d < 0)
      return;
  }
}

//===----------------------------------------------------------------------===//
// Element runs: widening loads, rounding stores, copies
//===----------------------------------------------------------------------===//

template <DType D>
void loadRun(const uint8_t *p, int64_t stride, int64_t n, float *out) {
  using Traits = DTypeTraits<D>;
  using Storage = typename Traits::Storage;
  constexpr int64_t size = sizeof(Storage);
  if (D == DType::F32 && stride == 1) {
    std::memcpy(out, p, n * size);
    return;
  }
  if (stride == 0) {
    Storage v;
    std::memcpy(&v, p, size);
    std::fill(out, out + n, Traits::load(v));
    return;
  }
  for (int64_t i = 0; i < n; ++i) {
    Storage v;
    std::memcpy(&v, p + i * stride * size, size);
    out[i] = Traits::load(v);
  }
}

template <DType D>
void storeRun(const float *in, uint8_t *p, int64_t stride, int64_t n) {
  using Traits = DTypeTraits<D>;
  using Storage = typename Traits::Storage;
  constexpr int64_t size = sizeof(Storage);
  if (D == DType::F32 && stride == 1) {
    std::memcpy(p, in, n * size);
    return;
  }
  if (stride == 0) { // Every element lands on one address: the last wins.
    Storage v = Traits::store(in[n - 1]);
    std::memcpy(p, &v, size);
    return;
  }
  for (int64_t i = 0; i < n; ++i) {
    Storage v = Traits::store(in[i]);
    std::memcpy(p + i * stride * size, &v, size);
  }
}

void loadView(DType dtype, const Pattern &pattern, const uint8_t *base,
              int64_t start, float *out) {
  dispatchDType(dtype, [&](auto tag) {
    constexpr DType D = decltype(tag)::value;
    constexpr int64_t size = sizeof(typename DTypeTraits<D>::Storage);
    forEachRun(pattern, start,
               [&](int64_t offset, int64_t stride, int64_t n, int64_t linear) {
                 loadRun<D>(base + offset * size, stride, n, out + linear);
               });
  });
}

void storeView(DType dtype, const Pattern &pattern, uint8_t *base,
               int64_t start, const float *in) {
  dispatchDType(dtype, [&](auto tag) {
    constexpr DType D = decltype(tag)::value;
    constexpr int64_t size = sizeof(typename DTypeTraits<D>::Storage);
    forEachRun(pattern, start,
               [&](int64_t offset, int64_t stride, int64_t n, int64_t linear) {
                 storeRun<D>(in + linear, base + offset * size, stride, n);
               });
  });
}

/// Integer view (gather indices) read exactly, without the fp32 detour.
void loadIndices(DType dtype, const Pattern &pattern, const uint8_t *base,
                 int64_t start, int64_t *out) {
  dispatchDType(dtype, [&](auto tag) {
    constexpr DType D = decltype(tag)::value;
    using Storage = typename DTypeTraits<D>::Storage;
    constexpr int64_t size = sizeof(Storage);
    forEachRun(pattern, start,
               [&](int64_t offset, int64_t stride, int64_t n, int64_t linear) {
                 for (int64_t i = 0; i < n; ++i) {
                   Storage v;
                   std::memcpy(&v, base + (offset + i * stride) * size, size);
                   if constexpr (std::is_integral_v<Storage> &&
                                 D != DType::Bool)
                     out[linear + i] = static_cast<int64_t>(v);
                   else
                     out[linear + i] = 0; // Verifier admits integers only.
                 }
               });
  });
}

/// Dispatches on an element size of 1, 2, 4 or 8 bytes to fn(T{}) with T an
/// unsigned integer of that size, so strided copies move whole elements
/// without a call per element.
template <typename Fn> void dispatchSize(int64_t size, Fn &&fn) {
  switch (size) {
  case 1:
    return fn(uint8_t{});
  case 2:
    return fn(uint16_t{});
  case 4:
    return fn(uint32_t{});
  default:
    return fn(uint64_t{});
  }
}

/// Copies n elements of one dtype between strided runs, bit-exactly.
void copyRunBytes(const uint8_t *src, int64_t srcStride, uint8_t *dst,
                  int64_t dstStride, int64_t n, int64_t size) {
  if (srcStride == 1 && dstStride == 1) {
    std::memmove(dst, src, n * size);
    return;
  }
  if (dstStride == 0) { // Only the last element survives.
    std::memmove(dst, src + (n - 1) * srcStride * size, size);
    return;
  }
  dispatchSize(size, [&](auto tag) {
    using T = decltype(tag);
    for (int64_t i = 0; i < n; ++i) {
      T v;
      std::memcpy(&v, src + i * srcStride * size, sizeof(T));
      std::memcpy(dst + i * dstStride * size, &v, sizeof(T));
    }
  });
}

/// Copies a rows x cols block whose rows are contiguous on one side and
/// whose columns on the other (a DMA transpose). Goes through an L1-resident
/// tile, so that both sides move whole cache lines: walking either side
/// element by element misses the cache on every element, as the power-of-two
/// row strides map the lines to one cache set. Whole 32 x 32 blocks of
/// 16-bit elements read along rows and written along columns are transposed
/// in registers.
void transposeBlock(const uint8_t *src, int64_t srcRow, int64_t srcCol,
                    uint8_t *dst, int64_t dstRow, int64_t dstCol, int64_t rows,
                    int64_t cols, int64_t size) {
  constexpr int64_t kTile = 32;
  dispatchSize(size, [&](auto tag) {
    using T = decltype(tag);
    auto at = [](auto *base, int64_t index) {
      return base + index * sizeof(T);
    };
    T tile[kTile][kTile]; // [col][row]
    // Bands of kBand rows, each walked by 32 columns and then by rows: the 32
    // lines a block reads along columns are read on along rows by the next
    // blocks, instead of each band of 32 rows sweeping every column (on a
    // transposing load from a weight, each line from another page).
    constexpr int64_t kBand = 256;
    for (int64_t band = 0; band < rows; band += kBand)
      for (int64_t c0 = 0; c0 < cols; c0 += kTile)
        for (int64_t r0 = band; r0 < std::min(rows, band + kBand);
             r0 += kTile) {
          int64_t nr = std::min(kTile, rows - r0);
          int64_t nc = std::min(kTile, cols - c0);
#ifdef __AVX512BW__
          if constexpr (sizeof(T) == 2) {
            if (nr == kTile && nc == kTile && srcRow == 1 && dstCol == 1) {
              transpose32x32x16(
                  reinterpret_cast<const uint16_t *>(at(src, r0 + c0 * srcCol)),
                  srcCol,
                  reinterpret_cast<uint16_t *>(at(dst, r0 * dstRow + c0)),
                  dstRow);
              continue;
            }
          }
#endif
#ifdef __AVX__
          if constexpr (sizeof(T) == 4) {
            // fp32 weights loaded transposed: 8 x 8 blocks in registers.
            if (nr == kTile && nc == kTile && srcRow == 1 && dstCol == 1) {
              for (int64_t c = 0; c < kTile; c += 8)
                for (int64_t r = 0; r < kTile; r += 8)
                  transpose8x8x32(reinterpret_cast<const uint32_t *>(
                                      at(src, r0 + r + (c0 + c) * srcCol)),
                                  srcCol,
                                  reinterpret_cast<uint32_t *>(
                                      at(dst, (r0 + r) * dstRow + c0 + c)),
                                  dstRow);
              continue;
            }
          }
#endif
          for (int64_t c = 0; c < nc; ++c)
            for (int64_t r = 0; r < nr; ++r)
              std::memcpy(&tile[c][r],
                          at(src, (r0 + r) * srcRow + (c0 + c) * srcCol),
                          sizeof(T));
          for (int64_t r = 0; r < nr; ++r)
            for (int64_t c = 0; c < nc; ++c)
              std::memcpy(at(dst, (r0 + r) * dstRow + (c0 + c) * dstCol),
                          &tile[c][r], sizeof(T));
        }
  });
}

/// Copies n elements between strided runs of different dtypes, through fp32
/// in small chunks.
void convertRun(DType srcType, const uint8_t *src, int64_t srcStride,
                DType dstType, uint8_t *dst, int64_t dstStride, int64_t n) {
  constexpr int64_t kChunk = 512;
  float buffer[kChunk];
  int64_t srcSize = dtypeSize(srcType), dstSize = dtypeSize(dstType);
  dispatchDType(srcType, [&](auto srcTag) {
    dispatchDType(dstType, [&](auto dstTag) {
      for (int64_t done = 0; done < n; done += kChunk) {
        int64_t count = std::min(kChunk, n - done);
        loadRun<decltype(srcTag)::value>(src + done * srcStride * srcSize,
                                         srcStride, count, buffer);
        storeRun<decltype(dstTag)::value>(
            buffer, dst + done * dstStride * dstSize, dstStride, count);
      }
    });
  });
}

/// Stores doubles (iota) with storeFromF64's rule, dispatched once per run.
template <DType D>
void storeRunF64(const double *in, uint8_t *p, int64_t stride, int64_t n) {
  using Storage = typename DTypeTraits<D>::Storage;
  constexpr int64_t size = sizeof(Storage);
  for (int64_t i = 0; i < n; ++i)
    storeFromF64(in[i], p + i * stride * size, D);
}

/// Fills n strided elements with one encoded element.
void fillRun(uint8_t *p, int64_t stride, int64_t n, const uint8_t *element,
             int64_t size) {
  if (stride == 1 && size == 1) {
    std::memset(p, element[0], n);
    return;
  }
  if (stride == 0)
    n = 1;
  for (int64_t i = 0; i < n; ++i)
    std::memcpy(p + i * stride * size, element, size);
}

//===----------------------------------------------------------------------===//
// Eigen kernels, independent of addresses
//===----------------------------------------------------------------------===//
//
// Eigen's loops over a dynamic-size array start their vector iterations at
// its first 64-byte-aligned element and handle the elements before it (and
// after the last whole vector) with its scalar functors, which round
// differently from its vector ones (std::exp against its polynomial exp,
// 1 / std::sqrt against rsqrt14 and a Newton step, ...); its reductions also
// begin their vector partial sums at that element. The results would then
// depend on where the scratch arrays happen to live and on where a thread's
// chunk starts. These kernels instead walk every array in fixed-size blocks
// from its first element, the last block zero-padded, and fold reductions in
// an order fixed by the element count: every element of an array takes the
// same code path whatever its address.

constexpr int64_t kLanes = 16; // one AVX-512 vector of floats (two AVX ones)
using Block = Eigen::Array<float, kLanes, 1>;
using BlockMap = Eigen::Map<Block>; // unaligned: loads anywhere
/// max and min that return NaN when either operand is NaN (as torch.maximum
/// does).
using MaxOp = Eigen::internal::scalar_max_op<float, float, Eigen::PropagateNaN>;
using MinOp = Eigen::internal::scalar_min_op<float, float, Eigen::PropagateNaN>;
using ConstBlockMap = Eigen::Map<const Block>;

/// An elementwise operand: n floats ...
struct Values {
  const float *data;
  /// Block [i, i + count); a partial block is copied into `pad`, zero-filled.
  ConstBlockMap block(int64_t i, int64_t count, float *pad) const {
    if (count == kLanes)
      return ConstBlockMap(data + i);
    std::fill(pad, pad + kLanes, 0.0f);
    std::copy(data + i, data + i + count, pad);
    return ConstBlockMap(pad);
  }
};

/// ... or one value for every element.
struct Splat {
  float value;
  auto block(int64_t, int64_t, float *) const { return Block::Constant(value); }
};

/// Calls fn(BlockMap out, operand blocks...) for each block of n elements;
/// the last, partial block goes through the same call on padded copies.
template <typename Fn, typename... Operands, size_t... Index>
void blockwise(std::index_sequence<Index...>, int64_t n, float *out, Fn &&fn,
               const Operands &...operands) {
  alignas(64) float padOut[kLanes];
  alignas(64) float pads[sizeof...(Operands)][kLanes];
  for (int64_t i = 0; i < n; i += kLanes) {
    int64_t count = std::min(kLanes, n - i);
    float *dst = count == kLanes ? out + i : padOut;
    fn(BlockMap(dst), operands.block(i, count, pads[Index])...);
    if (count < kLanes)
      std::copy(padOut, padOut + count, out + i);
  }
}

template <typename Fn, typename... Operands>
void blockwise(int64_t n, float *out, Fn &&fn, const Operands &...operands) {
  blockwise(std::index_sequence_for<Operands...>(), n, out,
            std::forward<Fn>(fn), operands...);
}

/// out = lhs op rhs, elementwise over n elements; lhs and rhs are Values or
/// Splat, each op one vectorized expression per block. out may be lhs or
/// rhs.
template <typename Lhs, typename Rhs>
void applyAlu(AluOp op, int64_t n, const Lhs &lhs, const Rhs &rhs, float *out) {
  auto each = [&](auto &&fn) { blockwise(n, out, fn, lhs, rhs); };
  auto truth = [](const auto &mask) { return mask.template cast<float>(); };
  switch (op) {
  case AluOp::Add:
    return each([](BlockMap o, const auto &a, const auto &b) { o = a + b; });
  case AluOp::Subtract:
    return each([](BlockMap o, const auto &a, const auto &b) { o = a - b; });
  case AluOp::Multiply:
    return each([](BlockMap o, const auto &a, const auto &b) { o = a * b; });
  case AluOp::Divide:
    return each([](BlockMap o, const auto &a, const auto &b) { o = a / b; });
  case AluOp::Max: // NaN-propagating, like torch.maximum.
    return each([](BlockMap o, const auto &a, const auto &b) {
      o = a.binaryExpr(b, MaxOp());
    });
  case AluOp::Min:
    return each([](BlockMap o, const auto &a, const auto &b) {
      o = a.binaryExpr(b, MinOp());
    });
  case AluOp::Pow:
    return each([](BlockMap o, const auto &a, const auto &b) {
      o = a.binaryExpr(b, [](float x, float y) { return std::pow(x, y); });
    });
  case AluOp::Mod:
    return each([](BlockMap o, const auto &a, const auto &b) {
      o = a.binaryExpr(b, [](float x, float y) { return std::fmod(x, y); });
    });
  case AluOp::Remainder: // Python %: the result takes the divisor's sign.
    return each([](BlockMap o, const auto &a, const auto &b) {
      o = a.binaryExpr(b, [](float x, float y) {
        float r = std::fmod(x, y);
        if (r != 0.0f && ((r < 0.0f) != (y < 0.0f)))
          r += y;
        return r;
      });
    });
  case AluOp::Eq:
    return each(
        [&](BlockMap o, const auto &a, const auto &b) { o = truth(a == b); });
  case AluOp::Ne:
    return each(
        [&](BlockMap o, const auto &a, const auto &b) { o = truth(a != b); });
  case AluOp::Lt:
    return each(
        [&](BlockMap o, const auto &a, const auto &b) { o = truth(a < b); });
  case AluOp::Le:
    return each(
        [&](BlockMap o, const auto &a, const auto &b) { o = truth(a <= b); });
  case AluOp::Gt:
    return each(
        [&](BlockMap o, const auto &a, const auto &b) { o = truth(a > b); });
  case AluOp::Ge:
    return each(
        [&](BlockMap o, const auto &a, const auto &b) { o = truth(a >= b); });
  case AluOp::LogicalAnd:
    return each([&](BlockMap o, const auto &a, const auto &b) {
      o = truth((a != 0.0f) && (b != 0.0f));
    });
  case AluOp::LogicalOr:
    return each([&](BlockMap o, const auto &a, const auto &b) {
      o = truth((a != 0.0f) || (b != 0.0f));
    });
  case AluOp::LogicalXor:
    return each([&](BlockMap o, const auto &a, const auto &b) {
      o = truth((a != 0.0f) != (b != 0.0f));
    });
  case AluOp::Bypass:
    return each([](BlockMap o, const auto &a, const auto &) { o = a; });
  }
}

constexpr float kSqrt1_2 = 0.70710678118654752f;
constexpr float kSqrt2OverPi = 0.79788456080286536f;
constexpr float kInf = std::numeric_limits<float>::infinity();

/// The logistic function 1 / (1 + e^-x) from e = e^-|x|, which cannot
/// overflow: 1 / (1 + e) for x >= 0, e / (1 + e) below. As accurate as exp:
/// Eigen's logistic() is off by up to 7e-4 relatively for x in [-10, -5].
Block sigmoidOf(const Block &x) {
  Block e = (x.abs() == kInf).select(0.0f, (-x.abs()).exp());
  Block s = (1.0f + e).inverse();
  return (x >= 0.0f).select(s, e * s);
}

/// erf within [-1, 1]: Eigen's overshoots 1 by two ulps near |x| = 4, where
/// 1 - erf and x (1 + erf) (erfc, gelu) would change sign.
Block erfOf(const Block &x) {
  Block e = x.erf();
  return (e > 1.0f).select(1.0f, (e < -1.0f).select(-1.0f, e));
}

/// x = func(x) in place, over n elements.
void applyActivation(ActFunc func, int64_t n, float *data) {
  auto each = [&](auto &&fn) { blockwise(n, data, fn, Values{data}); };
  switch (func) {
  case ActFunc::Identity:
    return;
  case ActFunc::Neg:
    return each([](BlockMap o, const auto &x) { o = -x; });
  case ActFunc::Abs:
    return each([](BlockMap o, const auto &x) { o = x.abs(); });
  case ActFunc::Exp: // Eigen's vectorized exp leaves a denormal at -inf.
    return each([](BlockMap o, const auto &x) {
      o = (x == -kInf).select(0.0f, x.exp());
    });
  case ActFunc::Log:
    return each([](BlockMap o, const auto &x) { o = x.log(); });
  case ActFunc::Sqrt: // ... and its vectorized sqrt a NaN at +inf.
    return each([](BlockMap o, const auto &x) {
      o = (x == kInf).select(kInf, x.sqrt());
    });
  case ActFunc::Rsqrt:
    return each([](BlockMap o, const auto &x) { o = x.rsqrt(); });
  case ActFunc::Reciprocal:
    return each([](BlockMap o, const auto &x) { o = x.inverse(); });
  case ActFunc::Tanh:
    return each([](BlockMap o, const auto &x) { o = x.tanh(); });
  case ActFunc::Sigmoid:
    return each([](BlockMap o, const auto &x) { o = sigmoidOf(x); });
  case ActFunc::Relu: // NaN stays NaN (a comparison with NaN is false).
    return each(
        [](BlockMap o, const auto &x) { o = (x < 0.0f).select(0.0f, x); });
  case ActFunc::Gelu:
    return each([](BlockMap o, const auto &x) {
      o = 0.5f * x * (1.0f + erfOf(x * kSqrt1_2));
    });
  case ActFunc::GeluTanh:
    return each([](BlockMap o, const auto &x) {
      o = 0.5f * x *
          (1.0f + (kSqrt2OverPi * (x + 0.044715f * x.cube())).tanh());
    });
  case ActFunc::Silu:
    return each([](BlockMap o, const auto &x) { o = x * sigmoidOf(x); });
  case ActFunc::Erf:
    return each([](BlockMap o, const auto &x) { o = erfOf(x); });
  case ActFunc::Sin:
    return each([](BlockMap o, const auto &x) { o = x.sin(); });
  case ActFunc::Cos:
    return each([](BlockMap o, const auto &x) { o = x.cos(); });
  case ActFunc::Sign: // sign(NaN) is 0, as in PyTorch.
    return each(
        [](BlockMap o, const auto &x) { o = (x != x).select(0.0f, x.sign()); });
  case ActFunc::Square:
    return each([](BlockMap o, const auto &x) { o = x.square(); });
  case ActFunc::Floor:
    return each([](BlockMap o, const auto &x) { o = x.floor(); });
  case ActFunc::Ceil:
    return each([](BlockMap o, const auto &x) { o = x.ceil(); });
  case ActFunc::Round: // Half to even, like torch.round.
    return each([](BlockMap o, const auto &x) { o = x.rint(); });
  case ActFunc::Trunc:
    return each([](BlockMap o, const auto &x) {
      o = x.unaryExpr([](float v) { return std::trunc(v); });
    });
  case ActFunc::Log1p:
    return each([](BlockMap o, const auto &x) { o = x.log1p(); });
  case ActFunc::Expm1:
    return each([](BlockMap o, const auto &x) { o = x.expm1(); });
  case ActFunc::LogicalNot:
    return each([](BlockMap o, const auto &x) {
      o = (x == 0.0f).template cast<float>();
    });
  }
}

/// Folds x[0, n) (n >= 1) with op in an order fixed by n alone: whole
/// blocks from x[0] into two interleaved vector partial results, their lanes
/// combined in a fixed tree, then the remaining elements one by one.
/// blockOp(Block, ConstBlockMap) -> Block and scalarOp(float, float) -> float
/// are the same operation.
template <typename BlockOp, typename ScalarOp>
float foldRun(const float *x, int64_t n, BlockOp &&blockOp,
              ScalarOp &&scalarOp) {
  int64_t whole = n / kLanes * kLanes;
  if (whole == 0) {
    float result = x[0];
    for (int64_t i = 1; i < n; ++i)
      result = scalarOp(result, x[i]);
    return result;
  }
  Block acc = ConstBlockMap(x);
  if (whole >= 2 * kLanes) {
    Block acc1 = ConstBlockMap(x + kLanes);
    int64_t i = 2 * kLanes;
    for (; i + 2 * kLanes <= whole; i += 2 * kLanes) {
      acc = blockOp(acc, ConstBlockMap(x + i));
      acc1 = blockOp(acc1, ConstBlockMap(x + i + kLanes));
    }
    acc = blockOp(acc, ConstBlockMap(acc1.data()));
    if (i < whole)
      acc = blockOp(acc, ConstBlockMap(x + i));
  }
  for (int64_t half = kLanes / 2; half > 0; half /= 2)
    for (int64_t lane = 0; lane < half; ++lane)
      acc[lane] = scalarOp(acc[lane], acc[lane + half]);
  float result = acc[0];
  for (int64_t i = whole; i < n; ++i)
    result = scalarOp(result, x[i]);
  return result;
}

/// out[r] = the fold of row r of x [rows, cols] (row-major) with op.
void reduceRows(AluOp op, const float *x, int64_t rows, int64_t cols,
                float *out) {
  auto each = [&](auto &&blockOp, auto &&scalarOp) {
    for (int64_t r = 0; r < rows; ++r)
      out[r] = foldRun(x + r * cols, cols, blockOp, scalarOp);
  };
  switch (op) {
  case AluOp::Add:
    return each([](const Block &a, const auto &b) -> Block { return a + b; },
                [](float a, float b) { return a + b; });
  case AluOp::Multiply:
    return each([](const Block &a, const auto &b) -> Block { return a * b; },
                [](float a, float b) { return a * b; });
  case AluOp::Max:
    return each([](const Block &a,
                   const auto &b) -> Block { return a.binaryExpr(b, MaxOp()); },
                MaxOp());
  case AluOp::Min:
    return each([](const Block &a,
                   const auto &b) -> Block { return a.binaryExpr(b, MinOp()); },
                MinOp());
  default:
    break;
  }
}

//===----------------------------------------------------------------------===//
// Compiled program
//===----------------------------------------------------------------------===//

enum Role {
  RoleDst,
  RoleSrc,
  RoleTable,
  RoleIndices,
  RoleStationary,
  RoleMoving,
  RoleStationaryScale,
  RoleMovingScale,
  RoleA,
  RoleB,
  RoleBias,
  RoleScalar,
  RolePred,
  RoleOnTrue,
  RoleOnFalse,
  RoleScaleCol,
  RoleReduceRes,
  RoleSeed,
  NumRoles
};

struct CompiledView {
  bool present = false;
  int32_t buffer = 0; // index into Impl::bases
  DType dtype = DType::F32;
  int64_t elementSize = 4;
  int64_t constant = 0;
  std::vector<std::pair<int32_t, int64_t>> terms; // (loop slot, coeff)
  std::vector<int64_t> shape;
  std::vector<int64_t> strides;
  Pattern pattern;
  int64_t numElements = 1;
  int64_t rows = 1; // shape[0]: partitions (or K / M for matmul)
  int64_t cols = 1; // numElements / rows
};

struct CompiledInst {
  Instruction attrs; // op, engine and attributes; operands live in `views`
  std::array<CompiledView, NumRoles> views;
  PairPattern copyPattern; // dma_copy / copy: src (A) and dst (B) in lockstep
  // dma_copy / copy between two buffers into distinct elements: the order in
  // which elements move does not matter.
  bool orderFree = false;
  // activation: its rows can be computed in any order (outputs are written
  // in place or to buffers it does not read, into distinct elements).
  bool rowSplittable = false;
  // iota, rand: its offset over loop slots (zero without one).
  int64_t offsetConstant = 0;
  std::vector<std::pair<int32_t, int64_t>> offsetTerms;
  std::string name; // "instruction #N (op at loc)" for errors
};

/// Zeroed host memory for one program buffer. Buffers from 128 KiB are
/// mapped (as malloc would), so their pages are zero until touched and large
/// HBM temporaries cost nothing until written; those from 2 MiB on huge-page
/// boundaries, marked for transparent huge pages: an SBUF operand's
/// partitions lie a partition's bytes apart, each on its own 4 KiB page, and
/// the TLB misses of reading them took a quarter of a bf16 decoder layer's
/// host wall. Smaller ones start on a cache line.
class HostBlock {
public:
  HostBlock() = default;
  explicit HostBlock(size_t size) {
#if defined(__linux__)
    if (size >= kMapped) {
      // A huge mapping is whole huge pages, with a huge page of slack to
      // start on a boundary (mmap itself aligns to pages).
      bool huge = size >= kHugePage;
      size_t mapped =
          huge ? (size + kHugePage - 1) / kHugePage * kHugePage : size;
      size_t slack = huge ? kHugePage : 0;
      void *p = mmap(nullptr, mapped + slack, PROT_READ | PROT_WRITE,
                     MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
      if (p == MAP_FAILED)
        throw std::bad_alloc();
      // Keep the aligned part of the mapping, return the slack around it.
      auto *raw = static_cast<uint8_t *>(p);
      auto address = reinterpret_cast<uintptr_t>(raw);
      size_t head = huge ? (kHugePage - address % kHugePage) % kHugePage : 0;
      if (head)
        munmap(raw, head);
      if (slack - head)
        munmap(raw + head + mapped, slack - head);
      data = raw + head;
      bytes = mapped;
      if (huge)
        madvise(data, bytes, MADV_HUGEPAGE); // advice: failure is harmless
      return;
    }
#endif
    size_t padded = (std::max<size_t>(size, 1) + kLine - 1) / kLine * kLine;
    data = static_cast<uint8_t *>(std::aligned_alloc(kLine, padded));
    if (!data)
      throw std::bad_alloc();
    std::memset(data, 0, padded);
  }
  HostBlock(HostBlock &&other) noexcept
      : data(std::exchange(other.data, nullptr)),
        bytes(std::exchange(other.bytes, 0)) {}
  HostBlock &operator=(HostBlock &&other) noexcept {
    std::swap(data, other.data);
    std::swap(bytes, other.bytes);
    return *this;
  }
  HostBlock(const HostBlock &) = delete;
  HostBlock &operator=(const HostBlock &) = delete;
  ~HostBlock() {
#if defined(__linux__)
    if (bytes) {
      munmap(data, bytes);
      return;
    }
#endif
    std::free(data);
  }
  uint8_t *get() const { return data; }

private:
  static constexpr size_t kLine = 64, kMapped = size_t{128} << 10,
                          kHugePage = size_t{2} << 20;
  uint8_t *data = nullptr;
  size_t bytes = 0; // mapped bytes; 0: from aligned_alloc
};

struct ExecNode {
  bool isLoop = false;
  int32_t slot = 0;  // loop: iv slot
  int64_t count = 0; // loop: trip count
  size_t end = 0;    // loop: index one past its body
  int32_t inst = 0;  // instruction: index into Impl::insts
};

} // namespace

struct Executor::Impl {
  // Per buffer (program order).
  std::vector<DType> dtypes;
  std::vector<std::vector<int64_t>> shapes;
  std::vector<std::string> names;
  std::vector<uint8_t *> bases;
  std::vector<HostBlock> storage;
  std::vector<int32_t> inputBuffers, outputBuffers;

  std::vector<CompiledInst> insts;
  std::vector<ExecNode> nodes;
  std::vector<int64_t> ivs; // current value of each loop slot
  /// The rows disjoint scatters wrote in this run (their first bytes): the
  /// program promised each is written once.
  std::unordered_set<const uint8_t *> disjointRows;

  // fp32 scratch, sized once for the largest instruction.
  std::array<std::vector<float>, 4> scratch;
  std::vector<int64_t> indexScratch;
  std::vector<double> doubleScratch;

  uint64_t executed = 0;
  WorkerPool *pool = nullptr; // splits large instructions between threads

  // The last matmul that read its moving operand in place: when it ran
  // (`executed`) and what it read and wrote, and the key under which its
  // moving operand was packed.
  struct LastMatmul {
    uint64_t executed = ~uint64_t{0} - 1; // none in this run
    const void *moving = nullptr;
    int64_t elementBytes = 0, rows = 0, cols = 0, rowStride = 0, colStride = 0;
    int32_t dstBuffer = -1;
    uint64_t key = 0;
  } lastMatmul;
  template <typename T>
  uint64_t movingKey(const StridedMatrix<T> &moving, int32_t movBuffer,
                     int32_t dstBuffer);

  // Collective instructions: the groups by index, and the handler of the
  // current run().
  std::vector<CollectiveGroup> groups;
  int64_t collectiveCount = 0;
  const CollectiveHandler *collectives = nullptr;

  void compile(const Program &program);
  void compileNodes(const std::vector<Node> &nodes,
                    std::map<int64_t, int32_t> &slots,
                    const std::map<int64_t, int32_t> &bufferIndex,
                    const std::vector<std::string> &locations);
  void allocate(const Program &program);

  void execRange(size_t begin, size_t end);
  void exec(const CompiledInst &inst);

  int64_t offsetOf(const CompiledView &view) const {
    int64_t offset = view.constant;
    for (const auto &[slot, coeff] : view.terms)
      offset += coeff * ivs[slot];
    return offset;
  }
  void load(const CompiledView &view, float *out) {
    loadView(view.dtype, view.pattern, bases[view.buffer], offsetOf(view), out);
  }
  void store(const CompiledView &view, const float *in) {
    storeView(view.dtype, view.pattern, bases[view.buffer], offsetOf(view), in);
  }
  /// load / store of rows [r0, r1) of a view (dim 0: its rows).
  void loadRows(const CompiledView &view, int64_t r0, int64_t r1, float *out) {
    if (r0 == 0 && r1 == view.rows)
      return load(view, out);
    loadView(view.dtype, rowPattern(view, r1 - r0), bases[view.buffer],
             offsetOf(view) + r0 * view.strides[0], out);
  }
  void storeRows(const CompiledView &view, int64_t r0, int64_t r1,
                 const float *in) {
    if (r0 == 0 && r1 == view.rows)
      return store(view, in);
    storeView(view.dtype, rowPattern(view, r1 - r0), bases[view.buffer],
              offsetOf(view) + r0 * view.strides[0], in);
  }
  static Pattern rowPattern(const CompiledView &view, int64_t rows) {
    std::vector<int64_t> shape = view.shape;
    shape[0] = rows;
    return collapse(shape, view.strides);
  }

  void execCopy(const CompiledInst &inst);
  void copyRuns(const CompiledInst &inst, const PairPattern &pattern,
                int64_t srcStart, int64_t dstStart);
  const int64_t *loadTableIndices(const CompiledInst &inst, int64_t rows);
  void execGather(const CompiledInst &inst);
  void execScatter(const CompiledInst &inst);
  void execMatmul(const CompiledInst &inst);
  void execActivation(const CompiledInst &inst);
  void activationRows(const CompiledInst &inst, int64_t r0, int64_t r1);
  void execTensorTensor(const CompiledInst &inst);
  void execScalarTensorTensor(const CompiledInst &inst);
  void execTensorScalar(const CompiledInst &inst);
  void execTensorReduce(const CompiledInst &inst);
  void execBnStats(const CompiledInst &inst);
  void execBnAggr(const CompiledInst &inst);
  void execSelect(const CompiledInst &inst);
  void execIota(const CompiledInst &inst);
  void execMemset(const CompiledInst &inst);
  void execRand(const CompiledInst &inst);
  void execNGather(const CompiledInst &inst);
  void execCollective(const CompiledInst &inst);
};

namespace {

std::string shapeString(const std::vector<int64_t> &shape) {
  std::string out = "[";
  for (size_t i = 0; i < shape.size(); ++i)
    out += (i ? ", " : "") + std::to_string(shape[i]);
  return out + "]";
}

} // namespace

void Executor::Impl::compile(const Program &program) {
  std::map<int64_t, int32_t> bufferIndex;
  for (size_t i = 0; i < program.buffers.size(); ++i) {
    const Buffer &buffer = program.buffers[i];
    bufferIndex[buffer.id] = static_cast<int32_t>(i);
    dtypes.push_back(buffer.dtype);
    shapes.push_back(buffer.shape);
    names.push_back(buffer.name);
  }
  for (int64_t id : program.inputs)
    inputBuffers.push_back(bufferIndex.at(id));
  for (int64_t id : program.outputs)
    outputBuffers.push_back(bufferIndex.at(id));

  groups = program.groups;
  std::map<int64_t, int32_t> slots;
  compileNodes(program.body, slots, bufferIndex, program.locations);
  ivs.assign(slots.size(), 0);
  allocate(program);
}

void Executor::Impl::compileNodes(const std::vector<Node> &body,
                                  std::map<int64_t, int32_t> &slots,
                                  const std::map<int64_t, int32_t> &bufferIndex,
                                  const std::vector<std::string> &locations) {
  for (const Node &node : body) {
    if (node.isLoop()) {
      // Loop ids are unique per program (verified), so one slot each.
      int32_t slot = static_cast<int32_t>(slots.size());
      slots[node.loopId] = slot;
      size_t index = nodes.size();
      nodes.push_back(ExecNode{true, slot, node.count, 0, 0});
      compileNodes(node.body, slots, bufferIndex, locations);
      nodes[index].end = nodes.size();
      continue;
    }

    const Instruction &inst = node.inst;
    CompiledInst compiled;
    compiled.attrs = inst;
    const std::optional<View> *operands[NumRoles] = {&inst.dst,
                                                     &inst.src,
                                                     &inst.table,
                                                     &inst.indices,
                                                     &inst.stationary,
                                                     &inst.moving,
                                                     &inst.stationaryScale,
                                                     &inst.movingScale,
                                                     &inst.a,
                                                     &inst.b,
                                                     &inst.bias,
                                                     &inst.scalar,
                                                     &inst.pred,
                                                     &inst.onTrue,
                                                     &inst.onFalse,
                                                     &inst.scaleCol,
                                                     &inst.reduceRes,
                                                     &inst.seed};
    for (int role = 0; role < NumRoles; ++role) {
      const std::optional<View> &view = *operands[role];
      if (!view)
        continue;
      CompiledView &out = compiled.views[role];
      out.present = true;
      out.buffer = bufferIndex.at(view->buffer);
      out.dtype = dtypes[out.buffer];
      out.elementSize = dtypeSize(out.dtype);
      out.constant = view->offset.constant;
      for (const auto &[iv, coeff] : view->offset.terms)
        out.terms.emplace_back(slots.at(iv), coeff);
      out.shape = view->shape;
      out.strides = view->strides;
      out.pattern = collapse(view->shape, view->strides);
      out.numElements = view->numElements();
      out.rows = view->shape.empty() ? 1 : view->shape[0];
      out.cols = out.numElements / out.rows;
    }
    // Operands now live in `views`; drop the duplicate copies.
    for (const OperandField &field : kOperandFields)
      (compiled.attrs.*field.member).reset();
    if ((inst.op == Opcode::Iota || inst.op == Opcode::Rand) && inst.offset) {
      compiled.offsetConstant = inst.offset->constant;
      for (const auto &[iv, coeff] : inst.offset->terms)
        compiled.offsetTerms.emplace_back(slots.at(iv), coeff);
    }

    if (inst.op == Opcode::DmaCopy || inst.op == Opcode::Copy) {
      compiled.copyPattern =
          collapsePair(inst.src->shape, inst.src->strides, inst.dst->strides);
      compiled.orderFree = inst.src->buffer != inst.dst->buffer &&
                           isInjective(inst.dst->shape, inst.dst->strides);
      if (compiled.orderFree)
        moveContiguousDimInward(compiled.copyPattern);
    }
    if (inst.op == Opcode::Activation)
      compiled.rowSplittable =
          rowsIndependent({&inst.src, &inst.bias, &inst.scaleCol},
                          {&inst.dst, &inst.reduceRes});

    if (inst.op == Opcode::Collective)
      ++collectiveCount;
    compiled.name = "instruction #" + std::to_string(insts.size() + 1) + " (" +
                    opcodeName(inst.op);
    if (inst.loc >= 0 && inst.loc < static_cast<int64_t>(locations.size()))
      compiled.name += " at " + locations[inst.loc];
    compiled.name += ")";

    nodes.push_back(
        ExecNode{false, 0, 0, 0, static_cast<int32_t>(insts.size())});
    insts.push_back(std::move(compiled));
  }
}

void Executor::Impl::allocate(const Program &program) {
  bases.assign(program.buffers.size(), nullptr);
  storage.resize(program.buffers.size());

  // Scratch sizes: the largest operand each slot ever holds.
  std::array<int64_t, 4> need{};
  int64_t indexNeed = 0, doubleNeed = 0;
  for (const CompiledInst &inst : insts) {
    const auto &v = inst.views;
    auto grow = [&](int slot, int64_t n) {
      need[slot] = std::max(need[slot], n);
    };
    switch (inst.attrs.op) {
    case Opcode::Matmul:
      grow(0, v[RoleStationary].numElements);
      grow(1, v[RoleMoving].numElements);
      grow(2, v[RoleDst].numElements);
      grow(3,
           v[RoleStationaryScale].numElements + v[RoleMovingScale].numElements);
      break;
    case Opcode::Activation:
      grow(0, v[RoleSrc].numElements);
      grow(1, v[RoleSrc].rows); // bias
      grow(2, v[RoleSrc].rows); // scale column
      grow(3, v[RoleSrc].rows); // row sums
      break;
    case Opcode::TensorTensor:
      grow(0, v[RoleA].numElements);
      grow(1, v[RoleB].numElements);
      break;
    case Opcode::ScalarTensorTensor:
      grow(0, v[RoleA].numElements);
      grow(1, v[RoleB].numElements);
      grow(2, v[RoleA].rows);
      break;
    case Opcode::TensorScalar:
      grow(0, v[RoleSrc].numElements);
      grow(1, v[RoleSrc].rows);
      break;
    case Opcode::TensorReduce:
      grow(0, v[RoleSrc].numElements);
      grow(1, v[RoleSrc].rows);
      break;
    case Opcode::BnStats:
    case Opcode::BnAggr:
      grow(0, v[RoleSrc].numElements);
      grow(1, v[RoleDst].numElements);
      break;
    case Opcode::Select:
      grow(0, v[RoleDst].numElements);
      grow(1, v[RoleDst].numElements);
      grow(2, v[RoleDst].numElements);
      break;
    case Opcode::Iota:
      doubleNeed = std::max(doubleNeed, v[RoleDst].numElements);
      break;
    case Opcode::Rand:
      grow(0, v[RoleDst].numElements);
      indexNeed = std::max(indexNeed, v[RoleSeed].numElements);
      break;
    case Opcode::DmaGather:
    case Opcode::DmaScatter:
    case Opcode::NGather:
      indexNeed = std::max(indexNeed, v[RoleIndices].numElements);
      break;
    case Opcode::DmaCopy:
    case Opcode::Copy:
    case Opcode::Memset:
    case Opcode::Collective:
      break; // no scratch
    }
  }

  try {
    for (size_t i = 0; i < program.buffers.size(); ++i) {
      const Buffer &buffer = program.buffers[i];
      if (buffer.kind == BufferKind::Input || buffer.kind == BufferKind::Output)
        continue; // Host memory, bound per run().
      size_t size = static_cast<size_t>(buffer.numElements()) *
                    static_cast<size_t>(dtypeSize(buffer.dtype));
      // Zeroed so a program that reads before writing is deterministic.
      storage[i] = HostBlock(size);
      bases[i] = storage[i].get();
      if (buffer.kind != BufferKind::Constant)
        continue;
      if (buffer.splat) {
        uint8_t element[8];
        storeFromF64(*buffer.splat, element, buffer.dtype);
        fillRun(bases[i], 1, buffer.numElements(), element,
                dtypeSize(buffer.dtype));
      } else {
        std::memcpy(bases[i], buffer.data.data(), buffer.data.size());
      }
    }
    for (int slot = 0; slot < 4; ++slot)
      scratch[slot].resize(need[slot]);
    indexScratch.resize(indexNeed);
    doubleScratch.resize(doubleNeed);
  } catch (const std::bad_alloc &) {
    throw Error("program '" + program.name +
                "': not enough host memory for its buffers and scratch");
  }
}

void Executor::Impl::execRange(size_t begin, size_t end) {
  for (size_t i = begin; i < end;) {
    const ExecNode &node = nodes[i];
    if (!node.isLoop) {
      exec(insts[node.inst]);
      ++executed;
      ++i;
      continue;
    }
    for (int64_t iv = 0; iv < node.count; ++iv) {
      ivs[node.slot] = iv;
      execRange(i + 1, node.end);
    }
    i = node.end;
  }
}

void Executor::Impl::exec(const CompiledInst &inst) {
  switch (inst.attrs.op) {
  case Opcode::DmaCopy:
  case Opcode::Copy:
    return execCopy(inst);
  case Opcode::DmaGather:
    return execGather(inst);
  case Opcode::DmaScatter:
    return execScatter(inst);
  case Opcode::Matmul:
    return execMatmul(inst);
  case Opcode::Activation:
    return execActivation(inst);
  case Opcode::TensorTensor:
    return execTensorTensor(inst);
  case Opcode::ScalarTensorTensor:
    return execScalarTensorTensor(inst);
  case Opcode::TensorScalar:
    return execTensorScalar(inst);
  case Opcode::TensorReduce:
    return execTensorReduce(inst);
  case Opcode::BnStats:
    return execBnStats(inst);
  case Opcode::BnAggr:
    return execBnAggr(inst);
  case Opcode::Select:
    return execSelect(inst);
  case Opcode::Iota:
    return execIota(inst);
  case Opcode::Memset:
    return execMemset(inst);
  case Opcode::Rand:
    return execRand(inst);
  case Opcode::NGather:
    return execNGather(inst);
  case Opcode::Collective:
    return execCollective(inst);
  }
}

// dst = the collective of every rank's src (CollectiveHandler.h). Verified
// views are contiguous at a fixed offset.
void Executor::Impl::execCollective(const CompiledInst &inst) {
  const CompiledView &src = inst.views[RoleSrc], &dst = inst.views[RoleDst];
  const CollectiveGroup &group = groups[static_cast<size_t>(inst.attrs.group)];
  CollectiveCall call;
  call.kind = inst.attrs.collective;
  call.reduce = inst.attrs.aluOp;
  call.group = group.name.c_str();
  call.groupSize = static_cast<int64_t>(group.ranks.size());
  call.dtype = src.dtype;
  call.src = bases[src.buffer] + offsetOf(src) * src.elementSize;
  call.srcElements = src.numElements;
  call.dst = bases[dst.buffer] + offsetOf(dst) * dst.elementSize;
  call.dstElements = dst.numElements;
  char error[512] = "";
  int status =
      collectives->run(collectives->context, &call, error, sizeof error);
  error[sizeof error - 1] = 0;
  if (status != 0)
    throw Error(inst.name + ": " + collectiveName(call.kind) + " in group '" +
                group.name + "' failed: " + error);
}

// dst = src.
void Executor::Impl::execCopy(const CompiledInst &inst) {
  const CompiledView &src = inst.views[RoleSrc];
  const CompiledView &dst = inst.views[RoleDst];
  const PairPattern &pattern = inst.copyPattern;
  int64_t srcStart = offsetOf(src), dstStart = offsetOf(dst);
  constexpr int64_t kMinSplitBytes = 64 << 10;
  if (!inst.orderFree || pattern.rank == 0 ||
      src.numElements * src.elementSize < kMinSplitBytes) {
    copyRuns(inst, pattern, srcStart, dstStart);
    return;
  }
  // Large copies are split along their outermost dim between the threads.
  int64_t rows = pattern.shape[0];
  int64_t chunks = std::min<int64_t>(pool->threads(), rows);
  int64_t per = (rows + chunks - 1) / chunks;
  pool->run(chunks, [&](int64_t chunk) {
    int64_t begin = chunk * per;
    if (begin >= rows)
      return;
    PairPattern part = pattern;
    part.shape[0] = std::min(rows, begin + per) - begin;
    copyRuns(inst, part, srcStart + begin * pattern.stridesA[0],
             dstStart + begin * pattern.stridesB[0]);
  });
}

// The elements of `pattern` from srcStart to dstStart. Same dtype: a
// bit-exact byte copy (so integers of any width and NaN payloads survive);
// otherwise through fp32 with the store rounding.
void Executor::Impl::copyRuns(const CompiledInst &inst,
                              const PairPattern &pattern, int64_t srcStart,
                              int64_t dstStart) {
  const CompiledView &src = inst.views[RoleSrc];
  const CompiledView &dst = inst.views[RoleDst];
  const uint8_t *srcBase = bases[src.buffer];
  uint8_t *dstBase = bases[dst.buffer];
  int64_t srcSize = src.elementSize, dstSize = dst.elementSize;
  bool same = src.dtype == dst.dtype;
  int inner = pattern.rank - 1;
  if (same && inst.orderFree && pattern.rank >= 2 &&
      (pattern.stridesA[inner - 1] == 1 || pattern.stridesB[inner - 1] == 1) &&
      pattern.stridesA[inner] != 1) {
    // A transpose: walk the outer dims, and the last two as one block.
    PairPattern outer = pattern;
    outer.rank = inner;
    int64_t cols = pattern.shape[inner];
    forEachRunPair(outer, srcStart, dstStart,
                   [&](int64_t srcOff, int64_t srcRow, int64_t dstOff,
                       int64_t dstRow, int64_t rows) {
                     transposeBlock(
                         srcBase + srcOff * srcSize, srcRow,
                         pattern.stridesA[inner], dstBase + dstOff * dstSize,
                         dstRow, pattern.stridesB[inner], rows, cols, srcSize);
                   });
    return;
  }
  forEachRunPair(
      pattern, srcStart, dstStart,
      [&](int64_t srcOff, int64_t srcStride, int64_t dstOff, int64_t dstStride,
          int64_t n) {
        if (same)
          copyRunBytes(srcBase + srcOff * srcSize, srcStride,
                       dstBase + dstOff * dstSize, dstStride, n, srcSize);
        else
          convertRun(src.dtype, srcBase + srcOff * srcSize, srcStride,
                     dst.dtype, dstBase + dstOff * dstSize, dstStride, n);
      });
}

/// An indirect DMA's indices, loaded into indexScratch and checked against
/// the `rows` of its table.
const int64_t *Executor::Impl::loadTableIndices(const CompiledInst &inst,
                                                int64_t rows) {
  const CompiledView &indices = inst.views[RoleIndices];
  int64_t *index = indexScratch.data();
  loadIndices(indices.dtype, indices.pattern, bases[indices.buffer],
              offsetOf(indices), index);
  for (int64_t p = 0; p < indices.rows; ++p) {
    if (index[p] < 0 || index[p] >= rows)
      throw IndexError(inst.name + ": index " + std::to_string(index[p]) +
                       " at partition " + std::to_string(p) +
                       " is out of range [0, " + std::to_string(rows) + ")");
  }
  return index;
}

/// Copies one row of `width` elements between views (casting if needed).
static void copyRow(const CompiledView &from, const uint8_t *src,
                    const CompiledView &to, uint8_t *dst, int64_t width) {
  if (from.dtype == to.dtype)
    copyRunBytes(src, from.strides[1], dst, to.strides[1], width,
                 to.elementSize);
  else
    convertRun(from.dtype, src, from.strides[1], to.dtype, dst, to.strides[1],
               width);
}

// dst[p, :] = table[indices[p], :].
void Executor::Impl::execGather(const CompiledInst &inst) {
  const CompiledView &table = inst.views[RoleTable];
  const CompiledView &dst = inst.views[RoleDst];
  const int64_t *index = loadTableIndices(inst, table.shape[0]);
  int64_t tableOff = offsetOf(table), dstOff = offsetOf(dst);
  const uint8_t *tableBase = bases[table.buffer];
  uint8_t *dstBase = bases[dst.buffer];
  for (int64_t p = 0; p < inst.views[RoleIndices].rows; ++p)
    copyRow(table,
            tableBase +
                (tableOff + index[p] * table.strides[0]) * table.elementSize,
            dst, dstBase + (dstOff + p * dst.strides[0]) * dst.elementSize,
            table.shape[1]);
}

// dst[indices[p], :] = src[p, :], or += with accumulate (DMA compute's
// read-add-write: the sum in fp32, rounded to dst's dtype per row). Rows go
// in partition order, so of repeated indices the last write wins (PyTorch
// leaves that case undefined without accumulate) and sums are sequential.
void Executor::Impl::execScatter(const CompiledInst &inst) {
  const CompiledView &src = inst.views[RoleSrc];
  const CompiledView &dst = inst.views[RoleDst];
  const int64_t *index = loadTableIndices(inst, dst.shape[0]);
  int64_t width = dst.shape[1];
  int64_t srcOff = offsetOf(src), dstOff = offsetOf(dst);
  const uint8_t *srcBase = bases[src.buffer];
  uint8_t *dstBase = bases[dst.buffer];
  std::vector<float> sum, addend;
  if (inst.attrs.accumulate) {
    sum.resize(width);
    addend.resize(width);
  }
  for (int64_t p = 0; p < inst.views[RoleIndices].rows; ++p) {
    const uint8_t *from =
        srcBase + (srcOff + p * src.strides[0]) * src.elementSize;
    uint8_t *to =
        dstBase + (dstOff + index[p] * dst.strides[0]) * dst.elementSize;
    if (inst.attrs.disjoint && !disjointRows.insert(to).second)
      throw Error(inst.name + ": row " + std::to_string(index[p]) +
                  " written twice, though the disjoint scatters' indices "
                  "were promised to be a permutation");
    if (!inst.attrs.accumulate) {
      copyRow(src, from, dst, to, width);
      continue;
    }
    dispatchDType(src.dtype, [&](auto tag) {
      loadRun<decltype(tag)::value>(from, src.strides[1], width, addend.data());
    });
    dispatchDType(dst.dtype, [&](auto tag) {
      loadRun<decltype(tag)::value>(to, dst.strides[1], width, sum.data());
      for (int64_t i = 0; i < width; ++i)
        sum[i] += addend[i];
      storeRun<decltype(tag)::value>(sum.data(), to, dst.strides[1], width);
    });
  }
}

/// Element offsets (from the partition's first) of a view's free elements in
/// row-major order.
static std::vector<int64_t> freeOffsets(const CompiledView &view) {
  std::vector<int64_t> out(static_cast<size_t>(view.cols));
  std::vector<int64_t> at(view.shape.size(), 0);
  for (int64_t j = 0, offset = 0; j < view.cols; ++j) {
    out[j] = offset;
    for (size_t d = view.shape.size(); d-- > 1;) {
      offset += view.strides[d];
      if (++at[d] < view.shape[d])
        break;
      offset -= at[d] * view.strides[d];
      at[d] = 0;
    }
  }
  return out;
}

// dst[p, j] = src[p, indices[p, j]]: each partition gathers from its own
// free elements (NKI's nc_n_gather), src's and dst's free dims flattened
// row-major.
void Executor::Impl::execNGather(const CompiledInst &inst) {
  const CompiledView &src = inst.views[RoleSrc], &dst = inst.views[RoleDst];
  const CompiledView &indices = inst.views[RoleIndices];
  int64_t *index = indexScratch.data();
  loadIndices(indices.dtype, indices.pattern, bases[indices.buffer],
              offsetOf(indices), index);
  std::vector<int64_t> from = freeOffsets(src), to = freeOffsets(dst);
  int64_t srcOff = offsetOf(src), dstOff = offsetOf(dst);
  dispatchSize(src.elementSize, [&](auto tag) {
    using T = decltype(tag);
    const T *srcBase = reinterpret_cast<const T *>(bases[src.buffer]);
    T *dstBase = reinterpret_cast<T *>(bases[dst.buffer]);
    for (int64_t p = 0; p < dst.rows; ++p) {
      const T *row = srcBase + srcOff + p * src.strides[0];
      T *out = dstBase + dstOff + p * dst.strides[0];
      const int64_t *picks = index + p * dst.cols;
      for (int64_t j = 0; j < dst.cols; ++j) {
        int64_t i = picks[j];
        if (i < 0 || i >= src.cols)
          throw IndexError(inst.name + ": index " + std::to_string(i) +
                           " at partition " + std::to_string(p) +
                           " is out of range [0, " + std::to_string(src.cols) +
                           ")");
        out[to[j]] = row[from[i]];
      }
    }
  });
}

/// A key no executor in the process has used (Gemm.h's movingKey).
static uint64_t newMovingKey() {
  static std::atomic<uint64_t> next{1};
  return next.fetch_add(1, std::memory_order_relaxed);
}

// The moving operand is unchanged when the instruction just before was a
// matmul reading the same elements (it wrote only its own dst): the kernels
// may keep it packed under the same key.
template <typename T>
uint64_t Executor::Impl::movingKey(const StridedMatrix<T> &moving,
                                   int32_t movBuffer, int32_t dstBuffer) {
  bool same =
      executed == lastMatmul.executed + 1 && lastMatmul.moving == moving.data &&
      lastMatmul.elementBytes == int64_t{sizeof(T)} &&
      lastMatmul.rows == moving.rows && lastMatmul.cols == moving.cols &&
      lastMatmul.rowStride == moving.rowStride &&
      lastMatmul.colStride == moving.colStride &&
      lastMatmul.dstBuffer != movBuffer;
  if (!same)
    lastMatmul.key = newMovingKey();
  lastMatmul.executed = executed;
  lastMatmul.moving = moving.data;
  lastMatmul.elementBytes = sizeof(T);
  lastMatmul.rows = moving.rows;
  lastMatmul.cols = moving.cols;
  lastMatmul.rowStride = moving.rowStride;
  lastMatmul.colStride = moving.colStride;
  lastMatmul.dstBuffer = dstBuffer;
  return lastMatmul.key;
}

/// A 2-D view as a strided matrix, when its free dims walk one stride.
template <typename T>
std::optional<StridedMatrix<T>> matrixOf(const CompiledView &view,
                                         const uint8_t *base, int64_t offset) {
  if (view.shape.empty())
    return std::nullopt;
  Pattern free = collapse({view.shape.begin() + 1, view.shape.end()},
                          {view.strides.begin() + 1, view.strides.end()});
  if (free.rank > 1)
    return std::nullopt;
  return StridedMatrix<T>{reinterpret_cast<const T *>(base) + offset, view.rows,
                          view.cols, view.strides[0],
                          free.rank ? free.strides[0] : 1};
}

// dst[M, N] = (accumulate ? dst : 0) + stationary[K, M]^T @ moving[K, N]
// (double_row: [K, R, M] and [K, R, N], the K x R rows contracted; MX: the
// same with each value times 2^(scale - 127), its E8M0 scale that of its
// group of 8 partitions, and NaN for the scale 255).
// Operands hold fp8/bf16/f16/f32 values widened exactly; products of 8- and
// 16-bit inputs are exact in fp32 and the sums accumulate in fp32. Large
// matmuls are split by output columns between the host threads, without
// changing any output's bits.
void Executor::Impl::execMatmul(const CompiledInst &inst) {
  const CompiledView &stat = inst.views[RoleStationary];
  const CompiledView &mov = inst.views[RoleMoving];
  const CompiledView &dst = inst.views[RoleDst];
  int64_t k = stat.rows, m = stat.cols, n = mov.cols;
  bool mx = inst.views[RoleStationaryScale].present;
  if (inst.attrs.doubleRow || mx) {
    // Loaded row-major, [K, R, M] is the [K * R, M] matrix (row k * R + r),
    // and the moving operand's rows pair with the same (k, r).
    k *= stat.shape[1];
    m /= stat.shape[1];
    n /= mov.shape[1];
  }
  if (inst.attrs.isTranspose) {
    // The engine moves the values: dst[i, j] = stationary[j, i], bit for bit.
    float *s = scratch[0].data(), *t = scratch[2].data();
    load(stat, s);
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j < k; ++j)
        t[i * k + j] = s[j * m + i];
    store(dst, t);
    return;
  }
  bool accumulate = inst.attrs.accumulate;
  // PSUM holds fp32 rows: multiply into them in place.
  bool inPlace = dst.dtype == DType::F32 && dst.shape.size() == 2 &&
                 dst.strides[1] == 1 && dst.strides[0] >= n;
  float *out = scratch[2].data();
  int64_t ldOut = n;
  if (inPlace) {
    out = reinterpret_cast<float *>(bases[dst.buffer]) + offsetOf(dst);
    ldOut = dst.strides[0];
  } else if (accumulate) {
    load(dst, out);
  }

  std::function<void(int64_t, int64_t)> columns;
  auto statBf16 =
      stat.dtype == DType::BF16
          ? matrixOf<uint16_t>(stat, bases[stat.buffer], offsetOf(stat))
          : std::nullopt;
  auto movBf16 = mov.dtype == DType::BF16
                     ? matrixOf<uint16_t>(mov, bases[mov.buffer], offsetOf(mov))
                     : std::nullopt;
  if (statBf16 && movBf16) {
    uint64_t key = movingKey(*movBf16, mov.buffer, dst.buffer);
    columns = [&, key](int64_t begin, int64_t end) {
      matmulBf16(*statBf16, *movBf16, out, ldOut, accumulate, begin, end, key);
    };
  } else {
    float *s = scratch[0].data(), *mv = scratch[1].data();
    // fp32 operands with contiguous rows are read in place (loaded on the
    // caller's thread they left the others idle): each chunk packs them.
    std::optional<StridedMatrix<float>> statRows, movRows;
    if (stat.dtype == DType::F32 && !inst.attrs.doubleRow)
      statRows = matrixOf<float>(stat, bases[stat.buffer], offsetOf(stat));
    if (mov.dtype == DType::F32 && !inst.attrs.doubleRow)
      movRows = matrixOf<float>(mov, bases[mov.buffer], offsetOf(mov));
    if (statRows && statRows->colStride != 1)
      statRows.reset();
    if (movRows && movRows->colStride != 1)
      movRows.reset();
    if (!statRows)
      load(stat, s);
    if (!movRows)
      load(mov, mv);
    if (mx) {
      // Scaled by a power of two, an fp8 value stays exact in fp32 (short of
      // fp32's range), so the products are those of the dequantized values.
      // Row p * R + r is value p * R + r of K: its scale is row / kMxBlock.
      static const std::array<float, 256> powers = [] {
        std::array<float, 256> table{};
        for (int e = 0; e < 255; ++e)
          table[e] = std::ldexp(1.0f, e - 127);
        table[255] = std::numeric_limits<float>::quiet_NaN();
        return table;
      }();
      auto scaleRows = [&](const CompiledView &scaleView, float *values,
                           int64_t cols, float *scales) {
        load(scaleView, scales);
        for (int64_t row = 0; row < k; ++row) {
          const float *exps = scales + row / neuron::target::kMxBlock * cols;
          float *line = values + row * cols;
          for (int64_t c = 0; c < cols; ++c)
            line[c] *= powers[static_cast<uint8_t>(exps[c])];
        }
      };
      float *scales = scratch[3].data();
      scaleRows(inst.views[RoleStationaryScale], s, m, scales);
      scaleRows(inst.views[RoleMovingScale], mv, n, scales);
    }
    // movRows by value: this block ends before the chunks run.
    StridedMatrix<float> stationary =
        statRows ? *statRows : StridedMatrix<float>{s, k, m, m, 1};
    StridedMatrix<float> moving =
        movRows ? *movRows : StridedMatrix<float>{mv, k, n, n, 1};
    // A moving operand loaded into scratch is new on every instruction.
    uint64_t key = movRows ? movingKey(*movRows, mov.buffer, dst.buffer) : 0;
    columns = [&, stationary, moving, key](int64_t begin, int64_t end) {
      matmulF32(stationary, moving, out, ldOut, accumulate, begin, end, key);
    };
  }
  // Chunks of whole register tiles; small matmuls stay on the caller's
  // thread, where the hand-off would cost more than it saves. The vector
  // kernels compute a column the same way whatever chunk it is in: one chunk
  // per thread. Eigen's fp32 GEMM (a portable build's) blocks each call by
  // its width (and turns a one-column call into a GEMV), so that a column's
  // sums would change with the number of threads: there the chunks depend on
  // the shape alone.
  constexpr int64_t kMinSplitMacs = 1 << 21, kColumnAlign = 32;
  constexpr int64_t kShapeChunks = 8, kMinShapeChunkWidth = 128;
  bool anyChunks = statBf16 && movBf16 ? matmulBf16ColumnsIndependent()
                                       : matmulF32ColumnsIndependent();
  int64_t width = n;
  if (k * m * n >= kMinSplitMacs) {
    int64_t chunks = anyChunks ? pool->threads() : kShapeChunks;
    width = (n + chunks - 1) / chunks;
    if (!anyChunks)
      width = std::max(width, kMinShapeChunkWidth);
    width = (width + kColumnAlign - 1) / kColumnAlign * kColumnAlign;
  }
  pool->run((n + width - 1) / width, [&](int64_t chunk) {
    columns(chunk * width, std::min(n, (chunk + 1) * width));
  });
  if (!inPlace)
    store(dst, out);
}

// dst = func(src * scale + bias), scale = scale_col[p] (if given) * scale,
// bias = bias[p] (if given) + bias_imm; reduce_res[p] = the fp32 sum of
// partition p's results, taken before they are rounded to dst's dtype.
void Executor::Impl::execActivation(const CompiledInst &inst) {
  const CompiledView &src = inst.views[RoleSrc];
  constexpr int64_t kMinSplitElements = 64 << 10;
  if (!inst.rowSplittable || src.numElements < kMinSplitElements) {
    activationRows(inst, 0, src.rows);
    return;
  }
  // Every row is computed on its own: the rows are split between threads.
  int64_t chunks = std::min<int64_t>(pool->threads(), src.rows);
  int64_t per = (src.rows + chunks - 1) / chunks;
  pool->run(chunks, [&](int64_t chunk) {
    int64_t r0 = chunk * per;
    if (r0 < src.rows)
      activationRows(inst, r0, std::min(src.rows, r0 + per));
  });
}

// Rows [r0, r1) of an activation; each row uses its own slice of scratch.
void Executor::Impl::activationRows(const CompiledInst &inst, int64_t r0,
                                    int64_t r1) {
  const CompiledView &src = inst.views[RoleSrc];
  const CompiledView &bias = inst.views[RoleBias];
  const CompiledView &scaleCol = inst.views[RoleScaleCol];
  const CompiledView &reduceRes = inst.views[RoleReduceRes];
  int64_t rows = r1 - r0, cols = src.cols;
  float *x = scratch[0].data() + r0 * cols;
  loadRows(src, r0, r1, x);
  float scale = static_cast<float>(inst.attrs.scale);
  float biasImm = static_cast<float>(inst.attrs.biasImm);
  float *scales = scratch[2].data() + r0, *biases = scratch[1].data() + r0;
  if (scaleCol.present)
    loadRows(scaleCol, r0, r1, scales);
  if (bias.present)
    loadRows(bias, r0, r1, biases);
  // x * (scale_col[p] * scale) + (bias[p] + bias_imm), rounded after the
  // product and after the sum (the build does not contract them into FMAs);
  // steps that cannot change x are skipped.
  bool add = bias.present || biasImm != 0.0f;
  for (int64_t r = 0; r < rows; ++r) {
    float *row = x + r * cols;
    float rowScale = scaleCol.present ? scales[r] * scale : scale;
    if (add) {
      float rowBias = bias.present ? biases[r] + biasImm : biasImm;
      blockwise(
          cols, row,
          [](BlockMap o, const auto &v, const auto &k, const auto &c) {
            o = v * k + c;
          },
          Values{row}, Splat{rowScale}, Splat{rowBias});
    } else if (rowScale != 1.0f) {
      blockwise(
          cols, row,
          [](BlockMap o, const auto &v, const auto &k) { o = v * k; },
          Values{row}, Splat{rowScale});
    }
  }
  applyActivation(inst.attrs.func, rows * cols, x);
  storeRows(inst.views[RoleDst], r0, r1, x);
  if (reduceRes.present) {
    float *sums = scratch[3].data() + r0;
    reduceRows(AluOp::Add, x, rows, cols, sums);
    storeRows(reduceRes, r0, r1, sums);
  }
}

void Executor::Impl::execTensorTensor(const CompiledInst &inst) {
  const CompiledView &a = inst.views[RoleA];
  float *x = scratch[0].data(), *y = scratch[1].data();
  load(a, x);
  load(inst.views[RoleB], y);
  applyAlu(inst.attrs.aluOp, a.numElements, Values{x}, Values{y}, x);
  store(inst.views[RoleDst], x);
}

// dst = (a op0 s) op1 b, s = scalar[p] if given, else imm; the intermediate
// stays in fp32 and only dst is rounded.
void Executor::Impl::execScalarTensorTensor(const CompiledInst &inst) {
  const CompiledView &a = inst.views[RoleA];
  const CompiledView &scalarView = inst.views[RoleScalar];
  float *x = scratch[0].data(), *y = scratch[1].data();
  load(a, x);
  load(inst.views[RoleB], y);
  AluOp op0 = inst.attrs.aluOp;
  if (scalarView.present) {
    float *s = scratch[2].data();
    load(scalarView, s);
    for (int64_t p = 0; p < a.rows; ++p) {
      float *row = x + p * a.cols;
      applyAlu(op0, a.cols, Values{row}, Splat{s[p]}, row);
    }
  } else {
    float imm = static_cast<float>(inst.attrs.imm.value_or(0));
    applyAlu(op0, a.numElements, Values{x}, Splat{imm}, x);
  }
  applyAlu(inst.attrs.aluOp1, a.numElements, Values{x}, Values{y}, x);
  store(inst.views[RoleDst], x);
}

// dst = src op s (or s op src), s = scalar[p] if given, else imm.
void Executor::Impl::execTensorScalar(const CompiledInst &inst) {
  const CompiledView &src = inst.views[RoleSrc];
  const CompiledView &scalarView = inst.views[RoleScalar];
  float *x = scratch[0].data();
  load(src, x);
  AluOp op = inst.attrs.aluOp;
  bool reverse = inst.attrs.reverse;
  auto apply = [&](float *row, int64_t n, float s) {
    if (reverse)
      applyAlu(op, n, Splat{s}, Values{row}, row);
    else
      applyAlu(op, n, Values{row}, Splat{s}, row);
  };
  if (scalarView.present) {
    float *s = scratch[1].data();
    load(scalarView, s);
    for (int64_t p = 0; p < src.rows; ++p)
      apply(x + p * src.cols, src.cols, s[p]);
  } else {
    apply(x, src.numElements, static_cast<float>(inst.attrs.imm.value_or(0)));
  }
  store(inst.views[RoleDst], x);
}

// dst[p] = reduce(src[p, ...]) in fp32.
void Executor::Impl::execTensorReduce(const CompiledInst &inst) {
  const CompiledView &src = inst.views[RoleSrc];
  float *x = scratch[0].data(), *out = scratch[1].data();
  AluOp op = inst.attrs.aluOp;
  if (op != AluOp::Add && op != AluOp::Multiply && op != AluOp::Max &&
      op != AluOp::Min)
    throw Error(inst.name + ": not a reduction");
  load(src, x);
  reduceRows(op, x, src.rows, src.cols, out);
  store(inst.views[RoleDst], out);
}

// dst[p] = (count, mean, count * variance) of the even-indexed free
// elements of src[p], then of the odd-indexed ones: NKI's bn_stats, in fp32
// (the mean first, then the squared deviations from it, each summed in
// element order).
void Executor::Impl::execBnStats(const CompiledInst &inst) {
  const CompiledView &src = inst.views[RoleSrc];
  float *x = scratch[0].data(), *out = scratch[1].data();
  load(src, x);
  int64_t cols = src.cols;
  for (int64_t r = 0; r < src.rows; ++r) {
    const float *row = x + r * cols;
    for (int64_t half = 0; half < 2; ++half) {
      float *stats = out + r * 6 + half * 3;
      int64_t count = (cols - half + 1) / 2;
      float sum = 0.0f;
      for (int64_t i = half; i < cols; i += 2)
        sum += row[i];
      float mean = count ? sum / static_cast<float>(count) : 0.0f;
      float m2 = 0.0f;
      for (int64_t i = half; i < cols; i += 2)
        m2 += (row[i] - mean) * (row[i] - mean);
      stats[0] = static_cast<float>(count);
      stats[1] = mean;
      stats[2] = m2;
    }
  }
  store(inst.views[RoleDst], out);
}

// dst[p] = (mean, variance) of the elements whose (count, mean,
// count * variance) triples src[p] holds: NKI's bn_aggr, combining the
// triples in order by Chan's parallel formula in fp32. The variance is the
// population one (divided by the count), as layer and batch norms use it.
void Executor::Impl::execBnAggr(const CompiledInst &inst) {
  const CompiledView &src = inst.views[RoleSrc];
  float *x = scratch[0].data(), *out = scratch[1].data();
  load(src, x);
  int64_t cols = src.cols;
  for (int64_t r = 0; r < src.rows; ++r) {
    const float *row = x + r * cols;
    float n = 0.0f, mean = 0.0f, m2 = 0.0f;
    for (int64_t i = 0; i + 2 < cols; i += 3) {
      float nb = row[i], meanB = row[i + 1], m2B = row[i + 2];
      if (nb == 0.0f)
        continue;
      float total = n + nb;
      float delta = meanB - mean;
      mean += delta * (nb / total);
      m2 += m2B + delta * delta * (n * nb / total);
      n = total;
    }
    out[r * 2] = mean;
    out[r * 2 + 1] = n > 0.0f ? m2 / n : 0.0f;
  }
  store(inst.views[RoleDst], out);
}

void Executor::Impl::execSelect(const CompiledInst &inst) {
  const CompiledView &dst = inst.views[RoleDst];
  int64_t n = dst.numElements;
  float *pred = scratch[0].data(), *onTrue = scratch[1].data(),
        *onFalse = scratch[2].data();
  load(inst.views[RolePred], pred);
  load(inst.views[RoleOnTrue], onTrue);
  load(inst.views[RoleOnFalse], onFalse);
  blockwise(
      n, pred,
      [](BlockMap o, const auto &p, const auto &t, const auto &f) {
        o = (p != 0.0f).select(t, f);
      },
      Values{pred}, Values{onTrue}, Values{onFalse});
  store(dst, pred);
}

// dst[p, i...] = base + offset + p * channel_multiplier +
// sum(i_k * multipliers[k]), in double so integer destinations are exact;
// offset is evaluated at the current loop ivs.
void Executor::Impl::execIota(const CompiledInst &inst) {
  const CompiledView &dst = inst.views[RoleDst];
  const Instruction &attrs = inst.attrs;
  double *values = doubleScratch.data();
  size_t freeRank = dst.shape.size() - 1;
  std::array<int64_t, kMaxViewRank> index{};
  int64_t linear = 0;
  // Verified to stay within int64 on every iteration.
  int64_t offset = inst.offsetConstant;
  for (const auto &[slot, coeff] : inst.offsetTerms)
    offset += coeff * ivs[slot];
  double base = attrs.base + static_cast<double>(offset);
  for (int64_t p = 0; p < dst.rows; ++p) {
    double rowBase = base + static_cast<double>(p) * attrs.channelMultiplier;
    std::fill(index.begin(), index.end(), 0);
    for (int64_t e = 0; e < dst.cols; ++e) {
      double value = rowBase;
      for (size_t k = 0; k < freeRank; ++k)
        value += static_cast<double>(index[k]) * attrs.multipliers[k];
      values[linear++] = value;
      for (size_t k = freeRank; k-- > 0;) {
        if (++index[k] < dst.shape[k + 1])
          break;
        index[k] = 0;
      }
    }
  }
  dispatchDType(dst.dtype, [&](auto tag) {
    constexpr DType D = decltype(tag)::value;
    uint8_t *base = bases[dst.buffer];
    forEachRun(dst.pattern, offsetOf(dst),
               [&](int64_t offset, int64_t stride, int64_t n, int64_t at) {
                 storeRunF64<D>(values + at, base + offset * dst.elementSize,
                                stride, n);
               });
  });
}

// dst[p, i...] = Philox4x32-10 uniform of counter offset + p *
// channel_multiplier + sum(i_k * multipliers[k]) (Philox.h) under the key
// seed[p, :], stored with the destination's rounding.
void Executor::Impl::execRand(const CompiledInst &inst) {
  const CompiledView &dst = inst.views[RoleDst];
  const CompiledView &seed = inst.views[RoleSeed];
  const Instruction &attrs = inst.attrs;
  int64_t *key = indexScratch.data();
  loadIndices(seed.dtype, seed.pattern, bases[seed.buffer], offsetOf(seed),
              key);
  float *values = scratch[0].data();
  size_t freeRank = dst.shape.size() - 1;
  std::array<int64_t, kMaxViewRank> index{};
  int64_t offset = inst.offsetConstant;
  for (const auto &[slot, coeff] : inst.offsetTerms)
    offset += coeff * ivs[slot];
  auto stream = static_cast<uint32_t>(attrs.stream);
  int64_t linear = 0;
  for (int64_t p = 0; p < dst.rows; ++p) {
    auto lo = static_cast<uint32_t>(key[2 * p]);
    auto hi = static_cast<uint32_t>(key[2 * p + 1]);
    int64_t rowBase =
        offset + p * static_cast<int64_t>(attrs.channelMultiplier);
    std::fill(index.begin(), index.end(), 0);
    for (int64_t e = 0; e < dst.cols; ++e) {
      int64_t counter = rowBase;
      for (size_t k = 0; k < freeRank; ++k)
        counter += index[k] * static_cast<int64_t>(attrs.multipliers[k]);
      values[linear++] =
          philoxUniform(lo, hi, static_cast<uint64_t>(counter), stream);
      for (size_t k = freeRank; k-- > 0;) {
        if (++index[k] < dst.shape[k + 1])
          break;
        index[k] = 0;
      }
    }
  }
  store(dst, values);
}

void Executor::Impl::execMemset(const CompiledInst &inst) {
  const CompiledView &dst = inst.views[RoleDst];
  uint8_t element[8];
  storeFromF64(inst.attrs.value, element, dst.dtype);
  uint8_t *base = bases[dst.buffer];
  forEachRun(dst.pattern, offsetOf(dst),
             [&](int64_t offset, int64_t stride, int64_t n, int64_t) {
               fillRun(base + offset * dst.elementSize, stride, n, element,
                       dst.elementSize);
             });
}

//===----------------------------------------------------------------------===//
// Executor
//===----------------------------------------------------------------------===//

Executor::Executor(const Program &program, const neuron::target::Target &target)
    : Executor(program, target, WorkerPool::shared()) {}

Executor::Executor(const Program &program, const neuron::target::Target &target,
                   WorkerPool &pool)
    : impl(std::make_unique<Impl>()) {
  program.verify(target);
  impl->pool = &pool;
  impl->compile(program);
}

Executor::~Executor() = default;
Executor::Executor(Executor &&) noexcept = default;
Executor &Executor::operator=(Executor &&) noexcept = default;

uint64_t Executor::instructionsExecuted() const { return impl->executed; }

void Executor::run(const std::vector<HostTensor> &inputs,
                   const std::vector<HostTensor> &outputs,
                   const CollectiveHandler *collectives) {
  Impl &state = *impl;
  if (state.collectiveCount > 0) {
    if (!collectives || !collectives->run)
      throw Error("run: the program has " +
                  std::to_string(state.collectiveCount) +
                  " collective instruction(s) and no collective handler was "
                  "given (run it with one, e.g. from torchneuron)");
    if (collectives->version != CollectiveHandler::kVersion)
      throw Error("run: collective handler of another build (version " +
                  std::to_string(collectives->version) + ")");
  }
  state.collectives = collectives;
  auto bind = [&](const std::vector<HostTensor> &tensors,
                  const std::vector<int32_t> &buffers, const char *what) {
    if (tensors.size() != buffers.size())
      throw Error(std::string("run: expected ") +
                  std::to_string(buffers.size()) + " " + what + ", got " +
                  std::to_string(tensors.size()));
    for (size_t i = 0; i < tensors.size(); ++i) {
      const HostTensor &tensor = tensors[i];
      int32_t buffer = buffers[i];
      std::string where = std::string("run: ") + what + "[" +
                          std::to_string(i) + "] ('" + state.names[buffer] +
                          "')";
      if (tensor.dtype != state.dtypes[buffer])
        throw Error(where + ": dtype " + dtypeName(tensor.dtype) +
                    ", expected " + dtypeName(state.dtypes[buffer]));
      if (tensor.shape != state.shapes[buffer])
        throw Error(where + ": shape " + shapeString(tensor.shape) +
                    ", expected " + shapeString(state.shapes[buffer]));
      if (!tensor.data && shapeElements(tensor.shape).value_or(0) > 0)
        throw Error(where + ": null data pointer");
      state.bases[buffer] = static_cast<uint8_t *>(tensor.data);
    }
  };
  bind(inputs, state.inputBuffers, "inputs");
  bind(outputs, state.outputBuffers, "outputs");
  state.executed = 0;
  state.lastMatmul = {};
  state.disjointRows.clear();
  state.execRange(0, state.nodes.size());
}

} // namespace neuron::runtime
