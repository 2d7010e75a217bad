//===- LowerTopK.cpp - neuron.topk as k rounds of select-the-extreme -----===//
//
// Rows on the partitions (128 at a time), each row's n elements on the free
// axis, in fp32 (a casting DMA loads them). Each of the k rounds picks every
// row's extreme at once:
//
//   m   = reduce max (min) of w                       VectorE  -> values[:, r]
//   eq  = w == m
//   idx = reduce min of (eq ? alive : n)              VectorE  -> indices[:, r]
//   hit = iota == idx
//   w   = hit ? -inf (+inf) : w;  alive = hit ? n : alive
//
// where `alive` is the column number of every element not taken yet (n once
// taken), so the lowest untaken position among equal values wins: ties come
// out in position order, and k = n is a stable sort. Seven passes over the
// row per round: O(k n) per row, against a bitonic network's
// O(n log^2 n) compare-exchange passes, which for the sizes models use
// (top-2 of 8..64 experts, top-8 of 256; argsort of a few dozen) needs more
// instructions than k rounds do. The importer keeps larger sorts eager.
//
//===----------------------------------------------------------------------===//

#include "passes/tile/KernelLowering.h"
#include "passes/tile/TilePattern.h"

#include <limits>

namespace mlir::neuron {

void KernelLowering::lowerTopK(TopKOp op) {
  auto inType = tensorType(op.getInput());
  int64_t n = inType.getShape().back();
  int64_t rows = product(inType.getShape().drop_back());
  int64_t k = op.getK();
  Value outValues = resultBuffer(op.getValues());
  Value outIndices = resultBuffer(op.getIndices());
  if (k == 0 || rows == 0)
    return;
  Value in = bufferOf(op.getInput());
  bool largest = op.getLargest();
  nisa::AluOp extreme = largest ? nisa::AluOp::max : nisa::AluOp::min;
  double taken = largest ? -std::numeric_limits<double>::infinity()
                         : std::numeric_limits<double>::infinity();

  Type f32 = b.getF32Type();
  const int64_t p = target.partitions;
  TileScope scope(*this);
  // Per row: column numbers, "no column" (n) and the value of a taken
  // element.
  auto filled = [&](double value) {
    Value t = tile(MemorySpace::sbuf, {p, n}, f32);
    b.create<nisa::MemsetOp>(t, APFloat(value), nisa::Engine::gpsimd);
    return t;
  };
  Value iota = tile(MemorySpace::sbuf, {p, n}, f32);
  b.create<nisa::IotaOp>(iota, APFloat(0.0), APFloat(0.0),
                         ArrayRef<double>{1.0});
  Value none = filled(double(n));
  Value takenValue = filled(taken);

  // The row tiles' working tiles in sets that the tiles take in turn: the
  // next tile's rows load while this one's rounds run (one set where two
  // would not leave half of SBUF, as for rows of thousands).
  struct Set {
    Value w, alive, eq, candidates, values, indices;
  };
  int64_t perSet = (4 * n + 2 * k) * 4, constants = 3 * n * 4;
  int64_t slots =
      constants + 2 * perSet <= target.sbufBytesPerPartition / 2 ? 2 : 1;
  SmallVector<Set, 2> sets;
  for (int64_t i = 0; i < slots; ++i) {
    auto rowTile = [&](int64_t cols) {
      return tile(MemorySpace::sbuf, {p, cols}, f32);
    };
    sets.push_back({rowTile(n), rowTile(n), rowTile(n), rowTile(n), rowTile(k),
                    rowTile(k)});
  }
  auto rowsOf = [&](Value t, int64_t rt) {
    int64_t cols = cast<MemRefType>(t.getType()).getShape()[1];
    return view(t, index(0), {rt, cols}, {cols, 1});
  };
  auto load = [&](Value r0, int64_t rt, const Set &set) {
    dma(view(in, scale(r0, n), {rt, n}, {n, 1}), rowsOf(set.w, rt));
  };
  auto compute = [&](Value r0, int64_t rt, const Set &set) {
    Value w = rowsOf(set.w, rt), alive = rowsOf(set.alive, rt);
    Value eq = rowsOf(set.eq, rt), candidates = rowsOf(set.candidates, rt);
    b.create<nisa::CopyOp>(rowsOf(iota, rt), alive, nisa::Engine::gpsimd);
    forEach(k, [&](Value r) {
      Value m = view(set.values, r, {rt, 1}, {k, 1});
      Value at = view(set.indices, r, {rt, 1}, {k, 1});
      b.create<nisa::TensorReduceOp>(extreme, w, m);
      b.create<nisa::TensorScalarOp>(nisa::AluOp::eq, w, eq, m, APFloat(0.0),
                                     false);
      b.create<nisa::SelectOp>(eq, alive, rowsOf(none, rt), candidates);
      b.create<nisa::TensorReduceOp>(nisa::AluOp::min, candidates, at);
      b.create<nisa::TensorScalarOp>(nisa::AluOp::eq, rowsOf(iota, rt), eq, at,
                                     APFloat(0.0), false);
      b.create<nisa::SelectOp>(eq, rowsOf(takenValue, rt), w, w);
      // Off the chain of the next round's reduction: GpSimd.
      b.create<nisa::SelectOp>(eq, rowsOf(none, rt), alive, alive,
                               nisa::Engine::gpsimd);
    });
    dma(rowsOf(set.values, rt), view(outValues, scale(r0, k), {rt, k}, {k, 1}));
    dma(rowsOf(set.indices, rt),
        view(outIndices, scale(r0, k), {rt, k}, {k, 1}));
  };
  int64_t full = rows / p, rem = rows % p;
  forEachPipelined(
      full, slots,
      [&](Value t, int64_t slot) { load(scale(t, p), p, sets[slot]); },
      [&](Value t, int64_t slot) { compute(scale(t, p), p, sets[slot]); });
  if (rem) {
    const Set &set = sets[full % slots];
    load(index(full * p), rem, set);
    compute(index(full * p), rem, set);
  }
}

namespace {
struct TopKPattern : OpTilePattern<TopKPattern, TopKOp> {
  LogicalResult lowerOp(TopKOp op, KernelLowering &k) const {
    k.lowerTopK(op);
    return success();
  }
};
} // namespace

void populateTopKPatterns(TilePatternSet &patterns) {
  patterns.push_back(std::make_unique<TopKPattern>());
}

} // namespace mlir::neuron
