//===- LowerTopK.cpp - neuron.topk as k rounds of select-the-extreme -----===//
//
// Rows on the partitions (128 at a time), each row's n elements on the free
// axis, in fp32 (a casting DMA loads them). Each of the k rounds picks every
// row's extreme at once:
//
//   m   = reduce max (min) of w                       VectorE  -> values[:, r]
//   eq  = w == m
//   idx = reduce min of (eq ? alive : 2n)             VectorE  -> indices[:, r]
//   hit = alive == idx
//   w   = hit ? -inf (+inf) : w;  alive = hit ? 2n : alive
//
// where `alive` is the column number of every element not taken yet (2n once
// taken), so the lowest untaken position among equal values wins: ties come
// out in position order, and k = n is a stable sort. NaN is the largest
// value, as in PyTorch: loaded, it becomes +inf and its column number is
// moved past the others' (n + j for the smallest, j - n for the largest), so
// of equal values a NaN is taken last (first); a number picked outside
// [0, n) is a NaN's, put back (its column, and NaN for the value) after the
// rounds. Seven passes over the
// row per round: O(k n) per row, against a bitonic network's
// O(n log^2 n) compare-exchange passes, which for the sizes models use
// (top-2 of 8..64 experts, top-8 of 256; argsort of a few dozen) needs more
// instructions than k rounds do. The importer keeps larger sorts eager.
//
// Short rows fold several to a partition ([P, R, n] tiles, R * n <= 512):
// each instruction then serves R rows where it served one, and paid its
// fixed cost for a few elements (a Mixtral router's top-2 of 8 over 2048
// tokens took 224 instructions of 8 elements each). The reductions along n
// are then trees of log2(n) tensor_tensor ops on strided views (the
// engines' tensor_reduce folds every free axis), and m and idx are read
// broadcast along n (stride 0).
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
  TopKConstants c;
  c.iota = tile(MemorySpace::sbuf, {p, n}, f32);
  b.create<nisa::IotaOp>(c.iota, APFloat(0.0), APFloat(0.0),
                         ArrayRef<double>{1.0});
  c.none = filled(double(2 * n));
  c.taken = filled(taken);
  c.inf = largest ? filled(std::numeric_limits<double>::infinity()) : c.taken;
  c.nan = tile(MemorySpace::sbuf, {p, n}, f32);
  b.create<nisa::TensorTensorOp>(nisa::AluOp::subtract, c.inf, c.inf, c.nan);
  c.nanShift = double(largest ? -n : n);
  int64_t first = lowerFoldedTopK(op, c);
  if (first == rows)
    return;

  // The row tiles' working tiles in sets that the tiles take in turn: the
  // next tile's rows load while this one's rounds run (one set where two
  // would not leave half of SBUF, as for rows of thousands).
  struct Set {
    Value w, alive, eq, candidates, values, indices;
  };
  int64_t perSet = (4 * n + 2 * k) * 4, constants = 5 * n * 4;
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
    loadNaNsAsInf(c, w, eq, alive, rowsOf(c.inf, rt), rowsOf(c.iota, rt));
    forEach(k, [&](Value r) {
      Value m = view(set.values, r, {rt, 1}, {k, 1});
      Value at = view(set.indices, r, {rt, 1}, {k, 1});
      b.create<nisa::TensorReduceOp>(extreme, w, m);
      b.create<nisa::TensorScalarOp>(nisa::AluOp::eq, w, eq, m, APFloat(0.0),
                                     false);
      b.create<nisa::SelectOp>(eq, alive, rowsOf(c.none, rt), candidates);
      b.create<nisa::TensorReduceOp>(nisa::AluOp::min, candidates, at);
      b.create<nisa::TensorScalarOp>(nisa::AluOp::eq, alive, eq, at,
                                     APFloat(0.0), false);
      b.create<nisa::SelectOp>(eq, rowsOf(c.taken, rt), w, w);
      // Off the chain of the next round's reduction: GpSimd.
      b.create<nisa::SelectOp>(eq, rowsOf(c.none, rt), alive, alive,
                               nisa::Engine::gpsimd);
    });
    auto kCols = [&](Value t, int64_t stride) {
      return view(t, index(0), {rt, k}, {stride, 1});
    };
    restoreNaNs(c, n, kCols(set.values, k), kCols(set.indices, k),
                kCols(set.candidates, n), kCols(c.nan, n));
    dma(rowsOf(set.values, rt), view(outValues, scale(r0, k), {rt, k}, {k, 1}));
    dma(rowsOf(set.indices, rt),
        view(outIndices, scale(r0, k), {rt, k}, {k, 1}));
  };
  int64_t left = rows - first, full = left / p, rem = left % p;
  forEachPipelined(
      full, slots,
      [&](Value t, int64_t slot) {
        load(addOffset(scale(t, p), first), p, sets[slot]);
      },
      [&](Value t, int64_t slot) {
        compute(addOffset(scale(t, p), first), p, sets[slot]);
      });
  if (rem) {
    const Set &set = sets[full % slots];
    load(index(first + full * p), rem, set);
    compute(index(first + full * p), rem, set);
  }
}

void KernelLowering::loadNaNsAsInf(const TopKConstants &c, Value w,
                                   Value scratch, Value alive, Value inf,
                                   Value iota) {
  b.create<nisa::TensorTensorOp>(nisa::AluOp::ne, w, w, scratch);
  b.create<nisa::SelectOp>(scratch, inf, w, w);
  b.create<nisa::ScalarTensorTensorOp>(
      nisa::AluOp::multiply, nisa::AluOp::add, scratch, iota, alive, Value(),
      APFloat(c.nanShift), nisa::Engine::gpsimd);
}

void KernelLowering::restoreNaNs(const TopKConstants &c, int64_t n,
                                 Value values, Value indices, Value scratch,
                                 Value nan) {
  // A NaN's shifted column is outside [0, n): below 0 (largest first), or
  // n and above.
  bool below = c.nanShift < 0;
  b.create<nisa::TensorScalarOp>(below ? nisa::AluOp::lt : nisa::AluOp::ge,
                                 indices, scratch, Value(),
                                 APFloat(below ? 0.0 : double(n)), false);
  b.create<nisa::ScalarTensorTensorOp>(
      nisa::AluOp::multiply, nisa::AluOp::add, scratch, indices, indices,
      Value(), APFloat(-c.nanShift), nisa::Engine::gpsimd);
  b.create<nisa::SelectOp>(scratch, nan, values, values);
}

int64_t KernelLowering::lowerFoldedTopK(TopKOp op, const TopKConstants &c) {
  auto inType = tensorType(op.getInput());
  int64_t n = inType.getShape().back();
  int64_t rows = product(inType.getShape().drop_back());
  int64_t k = op.getK();
  const int64_t p = target.partitions;
  int64_t fold = std::min(rows / p, kFoldedTopKElements / n);
  if (n < 2 || fold < 2)
    return 0;
  int64_t block = p * fold, blocks = rows / block;
  Value in = bufferOf(op.getInput());
  Value outValues = resultBuffer(op.getValues());
  Value outIndices = resultBuffer(op.getIndices());
  nisa::AluOp extreme = op.getLargest() ? nisa::AluOp::max : nisa::AluOp::min;

  Type f32 = b.getF32Type();
  TileScope scope(*this);
  int64_t half = (n + 1) / 2;
  auto folded = [&](int64_t cols) {
    return tile(MemorySpace::sbuf, {p, fold * cols}, f32);
  };
  Value w = folded(n), alive = folded(n), eq = folded(n);
  Value candidates = folded(n), values = folded(k), indices = folded(k);
  Value tree = tile(MemorySpace::sbuf, {p, 2 * fold * half}, f32);
  // [P, fold, width] views: `width` elements from `at` of each of a
  // partition's rows, `stride` apart.
  auto rowsOf = [&](Value t, int64_t partitionStride, int64_t at, int64_t width,
                    int64_t stride) {
    return view(t, index(at), {p, fold, width}, {partitionStride, stride, 1});
  };
  auto whole = [&](Value t) { return rowsOf(t, fold * n, 0, n, n); };
  // A [P, n] constant read again for every row; a round's column of values
  // or indices read along n.
  auto everyRow = [&](Value t) {
    return view(t, index(0), {p, fold, n}, {n, 0, 1});
  };
  auto alongRow = [&](Value t, Value r) {
    return view(t, r, {p, fold, n}, {fold * k, k, 0});
  };
  // Column r of values or indices = op over n of `src` (a folded tile),
  // halving the width each level (an odd middle element meets itself: max
  // and min are idempotent) between the two halves of `tree`.
  auto reduceRows = [&](nisa::AluOp alu, Value src, Value columns, Value r) {
    Value from = src;
    int64_t partitionStride = fold * n, base = 0, stride = n, width = n;
    for (int64_t side = 0;; side ^= 1) {
      int64_t h = (width + 1) / 2;
      Value lo = rowsOf(from, partitionStride, base, h, stride);
      Value hi = rowsOf(from, partitionStride, base + width - h, h, stride);
      if (h == 1) {
        b.create<nisa::TensorTensorOp>(
            alu, lo, hi, view(columns, r, {p, fold, 1}, {fold * k, k, 1}));
        return;
      }
      from = tree;
      partitionStride = 2 * fold * half;
      base = side * fold * half;
      stride = half;
      width = h;
      b.create<nisa::TensorTensorOp>(
          alu, lo, hi, rowsOf(tree, partitionStride, base, h, stride));
    }
  };
  forEach(blocks, [&](Value blockIndex) {
    Value r0 = scale(blockIndex, block);
    dma(view(in, scale(r0, n), {p, fold * n}, {fold * n, 1}), w);
    loadNaNsAsInf(c, whole(w), whole(eq), whole(alive), everyRow(c.inf),
                  everyRow(c.iota));
    forEach(k, [&](Value r) {
      reduceRows(extreme, w, values, r);
      b.create<nisa::TensorTensorOp>(nisa::AluOp::eq, whole(w),
                                     alongRow(values, r), whole(eq));
      b.create<nisa::SelectOp>(whole(eq), whole(alive), everyRow(c.none),
                               whole(candidates));
      reduceRows(nisa::AluOp::min, candidates, indices, r);
      b.create<nisa::TensorTensorOp>(nisa::AluOp::eq, whole(alive),
                                     alongRow(indices, r), whole(eq));
      b.create<nisa::SelectOp>(whole(eq), everyRow(c.taken), whole(w),
                               whole(w));
      // Off the chain of the next round's reduction: GpSimd.
      b.create<nisa::SelectOp>(whole(eq), everyRow(c.none), whole(alive),
                               whole(alive), nisa::Engine::gpsimd);
    });
    auto kCols = [&](Value t, int64_t stride) {
      return rowsOf(t, fold * stride, 0, k, stride);
    };
    restoreNaNs(c, n, kCols(values, k), kCols(indices, k), kCols(candidates, n),
                view(c.nan, index(0), {p, fold, k}, {n, 0, 1}));
    dma(values, view(outValues, scale(r0, k), {p, fold * k}, {fold * k, 1}));
    dma(indices, view(outIndices, scale(r0, k), {p, fold * k}, {fold * k, 1}));
  });
  return blocks * block;
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
