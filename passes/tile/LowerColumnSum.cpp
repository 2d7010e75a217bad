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

namespace {
int64_t ceilDiv(int64_t a, int64_t d) { return (a + d - 1) / d; }

/// One column sum: its plan (columns per group, PSUM bank sets, load slots)
/// and a member per loop level: outer kept dim, block, column group, row
/// tile.
class ColumnSumLowering {
public:
  ColumnSumLowering(KernelLowering &k, ReduceOp op, const ColumnLayout &l,
                    Value src, Type elt);
  /// One loop per outer kept dim (a sum over a middle dim), a block in
  /// each.
  void lower(int64_t srcOffset);

private:
  void block(Value inBase, Value outBase);
  /// One group of columns of one [rows, cols] block: every row tile summed
  /// into the set's banks, then evicted and stored.
  void group(Value inBase, Value outBase, Value c0, int64_t gc, int64_t set);
  /// Row tile `t` (`rt` rows) of a group into load slot `slot`.
  void load(Value inBase, Value c0, int64_t gc, Value t, int64_t rt,
            int64_t slot);
  /// The rows in `slot` summed into the set's banks (`first` starts them).
  void sum(int64_t gc, int64_t set, int64_t rt, int64_t slot, bool first);
  /// The set's banks evicted (VectorE and ScalarE alternating) and stored.
  void evict(Value outBase, Value c0, int64_t gc, int64_t set);
  Value rowsIn(int64_t slot, int64_t rt, int64_t at, int64_t width);
  Value bank(int64_t set, int64_t j, int64_t width);

  KernelLowering &k;
  const ColumnLayout &l;
  Value src, out;
  Type elt;
  int64_t p, bankCols, groupBanks, groupCols, sets, slots, accWidth;
  Value ones, moving, acc, staged;
};

ColumnSumLowering::ColumnSumLowering(KernelLowering &k, ReduceOp op,
                                     const ColumnLayout &l, Value src, Type elt)
    : k(k), l(l), src(src), elt(elt) {
  const auto &target = k.target;
  int64_t eltBytes = elt.getIntOrFloatBitWidth() / 8;
  p = target.partitions;
  // Columns per row tile: a free tile's bytes per partition, whole PSUM
  // banks of fp32, at most every bank.
  bankCols = std::min(target.matmulMaxMovingFree, target.psumBankBytes / 4);
  groupBanks = std::clamp<int64_t>(
      ceilDiv(k.tileBytes / eltBytes, bankCols), 1,
      std::min<int64_t>(target.psumBanks, ceilDiv(l.cols, bankCols)));
  groupCols = std::min(l.cols, groupBanks * bankCols);
  int64_t groups = ceilDiv(l.cols, groupCols);
  sets = groups > 1 && 2 * groupBanks <= target.psumBanks ? 2 : 1;
  int64_t rowTiles = ceilDiv(l.rows, p);

  double loadNs = double(p * groupCols * eltBytes) /
                  (target.dmaEngines * target.dmaBytesPerNsPerEngine);
  double fp32Factor = elt.isF32() ? target.value("matmul_fp32_cost_factor") : 1;
  double sumNs =
      groupBanks *
      std::max<double>(bankCols, target.value("matmul_min_ii_cycles")) *
      fp32Factor / target.tensorClockGHz;
  slots = std::min(k.streamSlots(loadNs, sumNs), rowTiles);
  accWidth = sets * groupBanks * bankCols;
  out = k.resultBuffer(op.getResult());
}

void ColumnSumLowering::lower(int64_t srcOffset) {
  TileBuilder::TileScope scope(k);
  ones = k.tile(MemorySpace::sbuf, {p, 1}, elt);
  k.b.create<nisa::MemsetOp>(ones, APFloat(1.0));
  moving = k.tile(MemorySpace::sbuf, {p, slots * groupCols}, elt);
  acc = k.tile(MemorySpace::psum, {1, accWidth}, k.b.getF32Type());
  staged = k.tile(MemorySpace::sbuf, {1, sets * groupCols}, elt);
  std::function<void(size_t, Value, Value)> outer = [&](size_t d, Value inBase,
                                                        Value outBase) {
    if (d == l.outerSizes.size())
      return block(inBase, outBase);
    k.forEach(l.outerSizes[d], [&](Value i) {
      outer(d + 1, k.addOffsets(inBase, k.scale(i, l.outerStrides[d])),
            k.addOffsets(outBase, k.scale(i, l.outerOutStrides[d])));
    });
  };
  outer(0, k.index(srcOffset), k.index(0));
}

void ColumnSumLowering::block(Value inBase, Value outBase) {
  int64_t fullGroups = l.cols / groupCols;
  k.forEachRotating(0, fullGroups, sets, [&](Value g, int64_t set) {
    group(inBase, outBase, k.scale(g, groupCols), groupCols, set);
  });
  if (int64_t rest = l.cols % groupCols)
    group(inBase, outBase, k.index(fullGroups * groupCols), rest,
          fullGroups % sets);
}

Value ColumnSumLowering::rowsIn(int64_t slot, int64_t rt, int64_t at,
                                int64_t width) {
  return k.view(moving, k.index(slot * groupCols + at), {rt, width},
                {slots * groupCols, 1});
}

Value ColumnSumLowering::bank(int64_t set, int64_t j, int64_t width) {
  return k.view(acc, k.index((set * groupBanks + j) * bankCols), {1, width},
                {accWidth, 1});
}

void ColumnSumLowering::load(Value inBase, Value c0, int64_t gc, Value t,
                             int64_t rt, int64_t slot) {
  Value at =
      k.addOffsets(k.addOffsets(inBase, k.scale(t, p * l.rowStride)), c0);
  k.dma(k.view(src, at, {rt, gc}, {l.rowStride, 1}), rowsIn(slot, rt, 0, gc));
}

void ColumnSumLowering::sum(int64_t gc, int64_t set, int64_t rt, int64_t slot,
                            bool first) {
  int64_t banks = ceilDiv(gc, bankCols);
  Value stationary = k.view(ones, k.index(0), {rt, 1}, {1, 1});
  for (int64_t j = 0; j < banks; ++j) {
    int64_t width = std::min(bankCols, gc - j * bankCols);
    auto mm = k.b.create<nisa::MatmulOp>(
        stationary, rowsIn(slot, rt, j * bankCols, width), bank(set, j, width));
    if (!first)
      mm.setAccumulate(true);
  }
}

void ColumnSumLowering::group(Value inBase, Value outBase, Value c0, int64_t gc,
                              int64_t set) {
  // Row tile t goes to slot t % slots; the first starts the sums, the
  // other full tiles stream with their loads running ahead.
  int64_t full = l.rows / p, rem = l.rows % p;
  if (full > 0) {
    load(inBase, c0, gc, k.index(0), p, 0);
    sum(gc, set, p, 0, true);
  }
  k.forEachPipelined(
      std::max<int64_t>(full - 1, 0), slots,
      [&](Value i, int64_t s) {
        load(inBase, c0, gc, k.addOffset(i, 1), p, (s + 1) % slots);
      },
      [&](Value, int64_t s) { sum(gc, set, p, (s + 1) % slots, false); });
  if (rem) {
    load(inBase, c0, gc, k.index(full), rem, full % slots);
    sum(gc, set, rem, full % slots, full == 0);
  }
  evict(outBase, c0, gc, set);
}

void ColumnSumLowering::evict(Value outBase, Value c0, int64_t gc,
                              int64_t set) {
  int64_t banks = ceilDiv(gc, bankCols);
  for (int64_t j = 0; j < banks; ++j) {
    int64_t width = std::min(bankCols, gc - j * bankCols);
    k.b.create<nisa::CopyOp>(
        bank(set, j, width),
        k.view(staged, k.index(set * groupCols + j * bankCols), {1, width},
               {sets * groupCols, 1}),
        j % 2 ? nisa::Engine::scalar : nisa::Engine::vector);
  }
  // From ScalarE's queue: a store waits for its eviction, and on SyncE's
  // it would hold up the next group's loads.
  k.b.create<nisa::DmaCopyOp>(
      k.view(staged, k.index(set * groupCols), {1, gc}, {sets * groupCols, 1}),
      k.view(out, k.addOffsets(outBase, c0), {1, gc}, {gc, 1}),
      nisa::Engine::scalar);
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
  ColumnSumLowering(*this, op, *layout, in.buffer, inType.getElementType())
      .lower(in.offset);
  return true;
}

} // namespace mlir::neuron
