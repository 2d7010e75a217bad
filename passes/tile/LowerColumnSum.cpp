//===- LowerColumnSum.cpp - sums over leading dims on TensorE -------------===//
//
// A sum over the leading dims of a row-major tensor (a column sum: the bias
// and norm-weight gradients of every training step) reads the source in
// place: tiles of 128 rows on the partitions by a group of columns on the
// free axis, loaded contiguously, and reduced across partitions on TensorE
// as a matmul with a ones vector as the stationary operand
// (out[1, N] = ones[K, 1]^T @ rows[K, N]), each row tile accumulating into
// the same PSUM banks. The products with 1 are exact and PSUM accumulates
// in fp32, so a bf16 input is summed in fp32 and rounded once on eviction.
//
// Why TensorE: per tile of 128 rows by N columns of b-byte elements the
// timing model charges
//   DMA load      128 * N * b / (dma_engines * dma_bytes_per_ns_per_engine)
//   TensorE       N / 512 matmuls of max(512, matmul_min_ii_cycles) cycles
//                 at tensor_clock_ghz (x matmul_fp32_cost_factor for fp32)
//   VectorE adds  N elements per partition at vector_clock_ghz for an
//                 accumulating tensor_tensor (2N for two fp32 operands),
//                 plus a final cross-partition reduction
// On trn2 per 512 bf16 columns: DMA 356 ns, TensorE 213 ns, VectorE 533 ns
// or more: only TensorE keeps up with the DMA for 16-bit inputs; for fp32
// inputs TensorE (853 ns) is 1.2x the DMA (712 ns) and still the fastest
// engine. Rows of a whole free tile per partition (free-tile-bytes) keep the
// DMA descriptors at full rate; a row tile spans up to all PSUM banks, and
// when groups of columns use at most half of them, two sets alternate so
// one set's eviction overlaps the next group's matmuls.
//
//===----------------------------------------------------------------------===//

#include "passes/fuse/FusionPlan.h"
#include "passes/tile/KernelLowering.h"

namespace mlir::neuron {

namespace {
/// A sum's input window as `rows` rows of `cols` contiguous elements,
/// `rowStride` apart, once per index of the outer kept dims.
struct ColumnLayout {
  int64_t rows = 1, rowStride = 0, cols = 1;
  SmallVector<int64_t> outerSizes, outerStrides, outerOutStrides;
};

/// The layout of a window of `shape` whose trailing `count` dims are
/// reduced, if the kept dims end in a contiguous run and the reduced dims
/// walk rows with one stride.
std::optional<ColumnLayout> columnLayout(ArrayRef<int64_t> shape,
                                         ArrayRef<int64_t> strides,
                                         int64_t count) {
  int64_t keptRank = (int64_t)shape.size() - count;
  SmallVector<std::pair<int64_t, int64_t>> kept, reduced; // (size, stride)
  for (auto [i, d] : llvm::enumerate(shape))
    if (d != 1)
      ((int64_t)i < keptRank ? kept : reduced).push_back({d, strides[i]});
  if (kept.empty() || reduced.empty() || kept.back().second != 1)
    return std::nullopt;
  ColumnLayout l;
  for (size_t i = 0; i + 1 < reduced.size(); ++i)
    if (reduced[i].second != reduced[i + 1].first * reduced[i + 1].second)
      return std::nullopt;
  l.rowStride = reduced.back().second;
  for (auto [d, s] : reduced)
    l.rows *= d;
  size_t inner = kept.size();
  while (inner > 0 && kept[inner - 1].second == l.cols)
    l.cols *= kept[--inner].first;
  int64_t outStride = l.cols;
  for (size_t i = inner; i-- > 0;) {
    l.outerSizes.insert(l.outerSizes.begin(), kept[i].first);
    l.outerStrides.insert(l.outerStrides.begin(), kept[i].second);
    l.outerOutStrides.insert(l.outerOutStrides.begin(), outStride);
    outStride *= kept[i].first;
  }
  return l;
}
} // namespace

bool KernelLowering::lowerColumnSum(ReduceOp op) {
  if (!isTensorESum(op))
    return false;
  auto inType = tensorType(op.getInput());
  Window in = windowOf(op.getInput());
  std::optional<ColumnLayout> layout =
      columnLayout(inType.getShape(), in.strides, op.getCount());
  if (!layout)
    return false;
  const ColumnLayout &l = *layout;
  Type elt = inType.getElementType(), f32 = b.getF32Type();
  int64_t eltBytes = elt.getIntOrFloatBitWidth() / 8;
  int64_t p = target.partitions;
  auto ceilDiv = [](int64_t a, int64_t d) { return (a + d - 1) / d; };

  // Columns per row tile: a free tile's bytes per partition, whole PSUM
  // banks of fp32, at most every bank.
  const int64_t bankCols =
      std::min(target.matmulMaxMovingFree, target.psumBankBytes / 4);
  int64_t groupBanks = std::clamp<int64_t>(
      ceilDiv(tileBytes / eltBytes, bankCols), 1,
      std::min<int64_t>(target.psumBanks, ceilDiv(l.cols, bankCols)));
  int64_t groupCols = std::min(l.cols, groupBanks * bankCols);
  int64_t groups = ceilDiv(l.cols, groupCols);
  int64_t sets = groups > 1 && 2 * groupBanks <= target.psumBanks ? 2 : 1;
  int64_t rowTiles = ceilDiv(l.rows, p);

  double loadNs = double(p * groupCols * eltBytes) /
                  (target.dmaEngines * target.dmaBytesPerNsPerEngine);
  double fp32Factor = elt.isF32() ? target.value("matmul_fp32_cost_factor") : 1;
  double sumNs =
      groupBanks *
      std::max<double>(bankCols, target.value("matmul_min_ii_cycles")) *
      fp32Factor / target.tensorClockGHz;
  int64_t slots = std::min(streamSlots(loadNs, sumNs), rowTiles);

  Value src = in.buffer, out = resultBuffer(op.getResult());
  TileScope scope(*this);
  Value ones = tile(MemorySpace::sbuf, {p, 1}, elt);
  b.create<nisa::MemsetOp>(ones, APFloat(1.0));
  Value moving = tile(MemorySpace::sbuf, {p, slots * groupCols}, elt);
  int64_t accWidth = sets * groupBanks * bankCols;
  Value acc = tile(MemorySpace::psum, {1, accWidth}, f32);
  Value staged = tile(MemorySpace::sbuf, {1, sets * groupCols}, elt);

  // One group of columns of one [rows, cols] block: every row tile summed
  // into the set's banks, then evicted (VectorE and ScalarE alternating)
  // and stored.
  auto group = [&](Value inBase, Value outBase, Value c0, int64_t gc,
                   int64_t set) {
    int64_t banks = ceilDiv(gc, bankCols);
    auto rowsIn = [&](int64_t slot, int64_t rt, int64_t at, int64_t width) {
      return view(moving, index(slot * groupCols + at), {rt, width},
                  {slots * groupCols, 1});
    };
    auto bank = [&](int64_t j, int64_t width) {
      return view(acc, index((set * groupBanks + j) * bankCols), {1, width},
                  {accWidth, 1});
    };
    auto load = [&](Value t, int64_t rt, int64_t slot) {
      Value at = addOffsets(addOffsets(inBase, scale(t, p * l.rowStride)), c0);
      dma(view(src, at, {rt, gc}, {l.rowStride, 1}), rowsIn(slot, rt, 0, gc));
    };
    auto sum = [&](int64_t rt, int64_t slot, bool first) {
      Value stationary = view(ones, index(0), {rt, 1}, {1, 1});
      for (int64_t j = 0; j < banks; ++j) {
        int64_t width = std::min(bankCols, gc - j * bankCols);
        auto mm = b.create<nisa::MatmulOp>(
            stationary, rowsIn(slot, rt, j * bankCols, width), bank(j, width));
        if (!first)
          mm.setAccumulate(true);
      }
    };
    // Row tile t goes to slot t % slots; the first starts the sums, the
    // other full tiles stream with their loads running ahead.
    int64_t full = l.rows / p, rem = l.rows % p;
    if (full > 0) {
      load(index(0), p, 0);
      sum(p, 0, true);
    }
    forEachPipelined(
        std::max<int64_t>(full - 1, 0), slots,
        [&](Value i, int64_t s) { load(addOffset(i, 1), p, (s + 1) % slots); },
        [&](Value, int64_t s) { sum(p, (s + 1) % slots, false); });
    if (rem) {
      load(index(full), rem, full % slots);
      sum(rem, full % slots, full == 0);
    }
    for (int64_t j = 0; j < banks; ++j) {
      int64_t width = std::min(bankCols, gc - j * bankCols);
      b.create<nisa::CopyOp>(bank(j, width),
                             view(staged, index(set * groupCols + j * bankCols),
                                  {1, width}, {sets * groupCols, 1}),
                             j % 2 ? nisa::Engine::scalar
                                   : nisa::Engine::vector);
    }
    // From ScalarE's queue: a store waits for its eviction, and on SyncE's
    // it would hold up the next group's loads.
    b.create<nisa::DmaCopyOp>(
        view(staged, index(set * groupCols), {1, gc}, {sets * groupCols, 1}),
        view(out, addOffsets(outBase, c0), {1, gc}, {gc, 1}),
        nisa::Engine::scalar);
  };
  auto block = [&](Value inBase, Value outBase) {
    int64_t fullGroups = l.cols / groupCols;
    forEachRotating(0, fullGroups, sets, [&](Value g, int64_t set) {
      group(inBase, outBase, scale(g, groupCols), groupCols, set);
    });
    if (int64_t rest = l.cols % groupCols)
      group(inBase, outBase, index(fullGroups * groupCols), rest,
            fullGroups % sets);
  };
  // One loop per outer kept dim (a sum over a middle dim).
  std::function<void(size_t, Value, Value)> outer = [&](size_t d, Value inBase,
                                                        Value outBase) {
    if (d == l.outerSizes.size())
      return block(inBase, outBase);
    forEach(l.outerSizes[d], [&](Value i) {
      outer(d + 1, addOffsets(inBase, scale(i, l.outerStrides[d])),
            addOffsets(outBase, scale(i, l.outerOutStrides[d])));
    });
  };
  outer(0, index(in.offset), index(0));
  return true;
}

} // namespace mlir::neuron
