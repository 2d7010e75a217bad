//===- LowerRotary.cpp - neuron.rotary: RoPE in one pass over x -----------===//
//
// out = x * cos + rotate_half(x) * sin, rotate_half(x) = concat(-x[..., h:],
// x[..., :h]) along the last dim D. The other dims take three roles:
//  - across (on the partitions, r consecutive indices each): the longest
//    dim cos and sin vary over (the positions of a prefill, the batch of a
//    decode step), or, where that makes fewer and fuller steps, the longest
//    they do not vary over (the heads of a one-sequence decode step: cos
//    and sin then load with a zero partition stride);
//  - shared (beside them on the free dims, a block of indices per tile):
//    the longest other dim cos and sin do not vary over (the heads, which
//    a broadcast gives a zero stride);
//  - looped: the rest, one tile after another.
// A tile [P, shared block, r, D] moves runs of r * D elements where the
// across dim is consecutive in memory (x as [B, H, L, D] and the row-major
// output), so descriptors stay long. cos and sin load once per block of the
// across dim and every shared block reads them through a zero stride on
// chip. Per tile, five instructions on x's tile and two scratch tiles of
// its type:
//   t1 = x * cos                                             VectorE
//   t2[.., :h] = x[.., h:] * sin[.., :h]; t2[.., h:] = x[.., :h] * sin[.., h:]
//                                                            GpSimd
//   out[.., :h] = t1 - t2; out[.., h:] = t1 + t2             VectorE
// Each product rounds to x's type, then the sum, as eager computes the
// expression (the negation is exact).
//
//===----------------------------------------------------------------------===//

#include "passes/tile/KernelLowering.h"
#include "passes/tile/TilePattern.h"

namespace mlir::neuron {

namespace {

/// A tensor's strides by role (zero for a role no dim takes).
struct RotaryStrides {
  SmallVector<int64_t> looped;
  int64_t shared = 0, across = 0, d = 0;
};

/// Indices [first, first + parts * perPartition) of the across dim:
/// `parts` partitions of `perPartition` consecutive indices each.
struct AcrossBlock {
  int64_t first, parts, perPartition;
};

class RotaryLowering {
public:
  RotaryLowering(KernelLowering &k, RotaryOp op)
      : k(k), b(k.b), x(k.windowOf(op.getX())), cos(k.windowOf(op.getCos())),
        sin(k.windowOf(op.getSin())), type(op.getType()) {
    shape.assign(type.getShape().begin(), type.getShape().end());
    int64_t rank = shape.size();
    dim = shape.back();
    half = dim / 2;
    out = {k.resultBuffer(op.getResult()), 0, contiguousStrides(shape)};
    elt = type.getElementType();
    eltBytes = std::max<int64_t>(1, elt.getIntOrFloatBitWidth() / 8);
    auto tablesVary = [&](int64_t d) {
      return cos.strides[d] != 0 || sin.strides[d] != 0;
    };
    // The longest dim of each kind other than `skip`, or -1.
    auto longest = [&](bool varying, int64_t skip) {
      int64_t best = -1;
      for (int64_t d = 0; d + 1 < rank; ++d)
        if (d != skip && tablesVary(d) == varying && shape[d] > 1 &&
            (best < 0 || shape[d] >= shape[best]))
          best = d;
      return best;
    };
    // Across the partitions the longest dim cos and sin vary over, the
    // longest they do not beside it; or, for few of the first (a decode
    // step of one sequence), the second across and the next beside it:
    // whichever takes fewer, fuller steps (a step's ~2 us of latency
    // against its elements per partition at about one per ns).
    int64_t p = k.target.partitions, total = type.getNumElements();
    auto size = [&](int64_t d) { return d < 0 ? 1 : shape[d]; };
    auto costOf = [&](int64_t a, int64_t s) {
      int64_t tileElts = std::max<int64_t>(1, k.tileBytes / eltBytes);
      int64_t steps = total / dim / size(a) / size(s) *
                      ((size(a) + p - 1) / p) *
                      ((size(s) * dim + tileElts - 1) / tileElts);
      return 2000.0 * double(steps) +
             double(total) / double(std::min(size(a), p));
    };
    acrossDim = longest(true, -1);
    sharedDim = longest(false, -1);
    if (int64_t next = longest(false, sharedDim);
        costOf(sharedDim, next) < costOf(acrossDim, sharedDim)) {
      acrossDim = sharedDim;
      sharedDim = next;
    }
    for (int64_t d = 0; d + 1 < rank; ++d)
      if (d != acrossDim && d != sharedDim)
        loopedDims.push_back(d);
    across = size(acrossDim);
    shared = size(sharedDim);
  }

  void lower() {
    const int64_t p = k.target.partitions;
    // r indices per partition: runs of up to the DMA's saturating size.
    perPartition = 1;
    while (perPartition * 2 * p <= across &&
           perPartition * 2 * dim * eltBytes <=
               k.target.dmaSaturationBytesPerPartition)
      perPartition *= 2;
    // A shared block: the most indices that divide the dim within a
    // streamed tile.
    sharedPerTile = 1;
    for (int64_t h = 1; h <= shared; ++h)
      if (shared % h == 0 && h * perPartition * dim * eltBytes <= k.tileBytes)
        sharedPerTile = h;
    RotaryStrides xs = byRole(x.strides), cs = byRole(cos.strides),
                  ss = byRole(sin.strides), os = byRole(out.strides);

    SmallVector<AcrossBlock> blocks;
    int64_t step = p * perPartition, full = across / step;
    for (int64_t i = 0; i < full; ++i)
      blocks.push_back({i * step, p, perPartition});
    int64_t done = full * step, rest = across - done;
    if (rest >= p) {
      blocks.push_back({done, p, rest / p});
      done += rest / p * p;
    }
    if (across > done)
      blocks.push_back({done, across - done, 1});

    TileBuilder::TileScope scope(k);
    int64_t width = sharedPerTile * perPartition * dim;
    for (Value *t : {&xTiles, &firstTiles, &secondTiles, &outTiles})
      *t = k.tile(MemorySpace::sbuf, {p, kSlots * width}, elt);
    // Two slots: a block's tables load while the block before computes.
    cosTiles = k.tile(MemorySpace::sbuf, {p, 2 * perPartition * dim}, elt);
    sinTiles = k.tile(MemorySpace::sbuf, {p, 2 * perPartition * dim}, elt);

    int64_t loops = 1;
    for (int64_t d : loopedDims)
      loops *= shape[d];
    int64_t blockIndex = 0;
    for (int64_t l = 0; l < loops; ++l) {
      // Element offsets of looped index l in x, cos, sin and the output.
      int64_t xo = x.offset, co = cos.offset, so = sin.offset, oo = 0;
      for (int64_t i = loopedDims.size(), rem = l; i-- > 0;) {
        int64_t n = shape[loopedDims[i]], at = rem % n;
        rem /= n;
        xo += at * xs.looped[i];
        co += at * cs.looped[i];
        so += at * ss.looped[i];
        oo += at * os.looped[i];
      }
      for (const AcrossBlock &blk : blocks) {
        Where w{blk, xo, oo, xs, os, blockIndex++ % 2};
        loadTable(w, cos, cosTiles, co, cs);
        loadTable(w, sin, sinTiles, so, ss);
        sharedBlocks(w, shared / sharedPerTile);
      }
    }
  }

private:
  using Window = TileBuilder::Window;
  /// x tiles in flight: one loading, one computing, one storing.
  static constexpr int64_t kSlots = 3;

  /// A block of the across dim at one looped index: its element offsets in
  /// x and the output, their strides, and the slot of its cos and sin.
  struct Where {
    AcrossBlock blk;
    int64_t xOffset, outOffset;
    RotaryStrides xs, os;
    int64_t table;
  };

  RotaryStrides byRole(ArrayRef<int64_t> strides) const {
    RotaryStrides s;
    s.d = strides.back();
    s.across = acrossDim < 0 ? 0 : strides[acrossDim];
    s.shared = sharedDim < 0 ? 0 : strides[sharedDim];
    for (int64_t d : loopedDims)
      s.looped.push_back(strides[d]);
    return s;
  }

  /// [parts, shared, r, D] of a tensor from `offset`, at shared block
  /// `chunk` (null: the first index).
  Value hbmView(const Window &t, int64_t offset, const RotaryStrides &s,
                const AcrossBlock &blk, Value chunk, int64_t sharedCount) {
    Value start = k.index(offset + blk.first * s.across);
    if (chunk)
      start = k.addOffsets(start, k.scale(chunk, sharedPerTile * s.shared));
    return k.view(t.buffer, start,
                  {blk.parts, sharedCount, blk.perPartition, dim},
                  {blk.perPartition * s.across, s.shared, s.across, s.d});
  }

  /// Columns [col, col + cols) of each row of D in slot `slot` of `tiles`
  /// as [parts, shared block, r, cols]: a working tile (x, the products,
  /// the output), or cos or sin, read with a zero stride over the block.
  Value slotView(Value tiles, const AcrossBlock &blk, int64_t slot, int64_t col,
                 int64_t cols) {
    bool table = tiles == cosTiles || tiles == sinTiles;
    int64_t rowWidth = (table ? 1 : sharedPerTile) * perPartition * dim;
    int64_t slots = cast<MemRefType>(tiles.getType()).getShape()[1] / rowWidth;
    return k.view(
        tiles, k.index(slot * rowWidth + col),
        {blk.parts, sharedPerTile, blk.perPartition, cols},
        {slots * rowWidth, table ? 0 : blk.perPartition * dim, dim, 1});
  }

  void loadTable(const Where &w, const Window &t, Value tiles, int64_t offset,
                 const RotaryStrides &s) {
    int64_t rowWidth = perPartition * dim;
    k.dma(hbmView(t, offset, s, w.blk, Value(), 1),
          k.view(tiles, k.index(w.table * rowWidth),
                 {w.blk.parts, 1, w.blk.perPartition, dim},
                 {2 * rowWidth, 0, dim, 1}));
  }

  void load(const Where &w, Value chunk, int64_t slot) {
    k.dma(hbmView(x, w.xOffset, w.xs, w.blk, chunk, sharedPerTile),
          slotView(xTiles, w.blk, slot, 0, dim));
  }

  /// The shared blocks of one across block, software-pipelined: step i
  /// loads block i + 2, takes block i's products and block i - 1's sums, so
  /// each engine's queue holds work that does not wait for the other's
  /// latest (VectorE's sums wait for GpSimd's products).
  void sharedBlocks(const Where &w, int64_t count) {
    auto stepAt = [&](Value i, int64_t slot, bool loads, bool sums) {
      if (loads)
        load(w, k.addOffset(i, 2), (slot + 2) % kSlots);
      products(w, slot);
      if (sums)
        sumAndStore(w, k.addOffset(i, -1), (slot + kSlots - 1) % kSlots);
    };
    for (int64_t i = 0; i < std::min<int64_t>(2, count); ++i)
      load(w, k.index(i), i);
    stepAt(k.index(0), 0, count > 2, false);
    int64_t steady = std::max<int64_t>(0, count - 3);
    k.forEachRotating(1, steady, kSlots, [&](Value i, int64_t slot) {
      stepAt(i, slot, true, true);
    });
    for (int64_t i = 1 + steady; i < count; ++i)
      stepAt(k.index(i), i % kSlots, i + 2 < count, true);
    sumAndStore(w, k.index(count - 1), (count - 1) % kSlots);
  }

  void products(const Where &w, int64_t slot) {
    using nisa::AluOp;
    const AcrossBlock &blk = w.blk;
    b.create<nisa::TensorTensorOp>(
        AluOp::multiply, slotView(xTiles, blk, slot, 0, dim),
        slotView(cosTiles, blk, w.table, 0, dim),
        slotView(firstTiles, blk, slot, 0, dim), nisa::Engine::vector);
    b.create<nisa::TensorTensorOp>(
        AluOp::multiply, slotView(xTiles, blk, slot, half, half),
        slotView(sinTiles, blk, w.table, 0, half),
        slotView(secondTiles, blk, slot, 0, half), nisa::Engine::gpsimd);
    b.create<nisa::TensorTensorOp>(
        AluOp::multiply, slotView(xTiles, blk, slot, 0, half),
        slotView(sinTiles, blk, w.table, half, half),
        slotView(secondTiles, blk, slot, half, half), nisa::Engine::gpsimd);
  }

  void sumAndStore(const Where &w, Value chunk, int64_t slot) {
    using nisa::AluOp;
    const AcrossBlock &blk = w.blk;
    b.create<nisa::TensorTensorOp>(
        AluOp::subtract, slotView(firstTiles, blk, slot, 0, half),
        slotView(secondTiles, blk, slot, 0, half),
        slotView(outTiles, blk, slot, 0, half), nisa::Engine::vector);
    // VectorE streams 16-bit tensor_tensor at one element per cycle,
    // GpSimd at half a cycle's rate of its faster clock: one slot's second
    // sum on GpSimd balances them (VectorE 1.83 passes over x, GpSimd 1.17).
    b.create<nisa::TensorTensorOp>(
        AluOp::add, slotView(firstTiles, blk, slot, half, half),
        slotView(secondTiles, blk, slot, half, half),
        slotView(outTiles, blk, slot, half, half),
        slot == kSlots - 1 ? nisa::Engine::gpsimd : nisa::Engine::vector);
    // From ScalarE's queue: SyncE's carries the loads ahead.
    b.create<nisa::DmaCopyOp>(
        slotView(outTiles, blk, slot, 0, dim),
        hbmView(out, w.outOffset, w.os, blk, chunk, sharedPerTile),
        nisa::Engine::scalar);
  }

  KernelLowering &k;
  ImplicitLocOpBuilder &b;
  Window x, cos, sin, out;
  RankedTensorType type;
  SmallVector<int64_t> shape;
  Type elt;
  int64_t eltBytes, dim, half;
  /// The dims by role (-1: none) and the roles' sizes.
  int64_t acrossDim = -1, sharedDim = -1;
  SmallVector<int64_t> loopedDims;
  int64_t across = 1, shared = 1;
  int64_t perPartition = 1, sharedPerTile = 1;
  Value xTiles, firstTiles, secondTiles, outTiles, cosTiles, sinTiles;
};

struct RotaryPattern : OpTilePattern<RotaryPattern, RotaryOp> {
  LogicalResult lowerOp(RotaryOp op, KernelLowering &k) const {
    for (Value v : {op.getX(), op.getCos(), op.getSin()})
      if (k.windowOf(v).hasDynamicStrides())
        return op.emitOpError("operands with strides known at run time");
    if (op.getType().getShape().back() > kMaxRotaryDim)
      return op.emitOpError("rotates dims of up to ")
             << kMaxRotaryDim << " elements";
    RotaryLowering(k, op).lower();
    return success();
  }
};

} // namespace

void populateRotaryPatterns(TilePatternSet &patterns) {
  patterns.push_back(std::make_unique<RotaryPattern>());
}

} // namespace mlir::neuron
