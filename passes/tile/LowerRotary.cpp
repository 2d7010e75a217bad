//===- LowerRotary.cpp - neuron.rotary: RoPE in one pass over x -----------===//
//
// out = x * cos + rotate_half(x) * sin over x [A..., H, L, D] (heads,
// positions and the rotated dim last; missing dims count as size one),
// rotate_half(x) = concat(-x[..., h:], x[..., :h]). Positions go on the
// partitions, r consecutive ones each, beside a block of heads: a tile
// [P, heads, r, D] whose DMAs move runs of r * D elements per head where
// positions are consecutive in memory (x as [B, H, L, D], and the row-major
// output), so descriptors stay long. cos and sin (broadcasts over the heads:
// a zero stride) load once per block of positions, and every block of heads
// reads them through a zero stride on chip. Per tile, five instructions on
// x's tile and two scratch tiles of its type:
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

/// A tensor's strides for [lead..., H, L, D] (zero for a missing dim).
struct RotaryStrides {
  SmallVector<int64_t> lead;
  int64_t head = 0, pos = 0, d = 0;
};

RotaryStrides rotaryStrides(ArrayRef<int64_t> strides) {
  int64_t rank = strides.size();
  RotaryStrides s;
  s.d = strides[rank - 1];
  s.pos = rank >= 2 ? strides[rank - 2] : 0;
  s.head = rank >= 3 ? strides[rank - 3] : 0;
  s.lead.assign(strides.begin(),
                strides.begin() + std::max<int64_t>(0, rank - 3));
  return s;
}

/// Positions [first, first + parts * perPartition) of a block: `parts`
/// partitions of `perPartition` consecutive positions each.
struct PositionBlock {
  int64_t first, parts, perPartition;
};

class RotaryLowering {
public:
  RotaryLowering(KernelLowering &k, RotaryOp op)
      : k(k), b(k.b), x(k.windowOf(op.getX())), cos(k.windowOf(op.getCos())),
        sin(k.windowOf(op.getSin())), type(op.getType()) {
    ArrayRef<int64_t> shape = type.getShape();
    int64_t rank = shape.size();
    dim = shape[rank - 1];
    half = dim / 2;
    positions = rank >= 2 ? shape[rank - 2] : 1;
    heads = rank >= 3 ? shape[rank - 3] : 1;
    lead.assign(shape.begin(), shape.begin() + std::max<int64_t>(0, rank - 3));
    out = {k.resultBuffer(op.getResult()), 0,
           contiguousStrides(type.getShape())};
    elt = type.getElementType();
    eltBytes = std::max<int64_t>(1, elt.getIntOrFloatBitWidth() / 8);
  }

  void lower() {
    const int64_t p = k.target.partitions;
    // r positions per partition: runs of up to the DMA's saturating size.
    perPartition = 1;
    while (perPartition * 2 * p <= positions &&
           perPartition * 2 * dim * eltBytes <=
               k.target.dmaSaturationBytesPerPartition)
      perPartition *= 2;
    // Heads per tile: the most that divide H within a streamed tile.
    headsPerTile = 1;
    for (int64_t h = 1; h <= heads; ++h)
      if (heads % h == 0 && h * perPartition * dim * eltBytes <= k.tileBytes)
        headsPerTile = h;
    RotaryStrides xs = rotaryStrides(x.strides),
                  cs = rotaryStrides(cos.strides),
                  ss = rotaryStrides(sin.strides),
                  os = rotaryStrides(out.strides);
    // cos and sin once per block of positions where the heads share them.
    sharedOverHeads = (cs.head == 0 && ss.head == 0) || heads == 1;

    SmallVector<PositionBlock> blocks;
    int64_t step = p * perPartition, full = positions / step;
    for (int64_t i = 0; i < full; ++i)
      blocks.push_back({i * step, p, perPartition});
    int64_t done = full * step, rest = positions - done;
    if (rest >= p) {
      blocks.push_back({done, p, rest / p});
      done += rest / p * p;
    }
    if (positions > done)
      blocks.push_back({done, positions - done, 1});

    TileScope scope(k);
    int64_t width = headsPerTile * perPartition * dim;
    int64_t tableWidth =
        (sharedOverHeads ? 1 : headsPerTile) * perPartition * dim;
    for (Value *t : {&xTiles, &firstTiles, &secondTiles, &outTiles})
      *t = k.tile(MemorySpace::sbuf, {p, kSlots * width}, elt);
    int64_t tableSlots = sharedOverHeads ? 2 : kSlots;
    cosTiles = k.tile(MemorySpace::sbuf, {p, tableSlots * tableWidth}, elt);
    sinTiles = k.tile(MemorySpace::sbuf, {p, tableSlots * tableWidth}, elt);

    int64_t leadCount = 1;
    for (int64_t n : lead)
      leadCount *= n;
    int64_t blockIndex = 0;
    for (int64_t l = 0; l < leadCount; ++l) {
      // Element offsets of lead index l in x, cos, sin and the output.
      int64_t xo = x.offset, co = cos.offset, so = sin.offset, oo = 0;
      for (int64_t d = lead.size(), rem = l; d-- > 0; rem /= lead[d]) {
        int64_t i = rem % lead[d];
        xo += i * xs.lead[d];
        co += i * cs.lead[d];
        so += i * ss.lead[d];
        oo += i * os.lead[d];
      }
      for (const PositionBlock &blk : blocks) {
        Where at{blk, xo, co, so, oo,
                 xs,  cs, ss, os, sharedOverHeads ? blockIndex++ % 2 : 0};
        if (sharedOverHeads) {
          loadTable(at, cos, cosTiles, at.cosOffset, cs, Value(), at.table);
          loadTable(at, sin, sinTiles, at.sinOffset, ss, Value(), at.table);
        }
        chunks(at, heads / headsPerTile);
      }
    }
  }

private:
  using TileScope = TileBuilder::TileScope;
  using Window = TileBuilder::Window;
  /// x tiles in flight: one loading, one computing, one storing.
  static constexpr int64_t kSlots = 3;

  /// A block of positions of one lead index: its element offsets in x, cos,
  /// sin and the output, the tensors' strides, and its cos/sin slot.
  struct Where {
    PositionBlock blk;
    int64_t xOffset, cosOffset, sinOffset, outOffset;
    RotaryStrides xs, cs, ss, os;
    int64_t table;
  };

  /// [parts, heads, r, D] of a tensor from `offset` at chunk `chunk` of
  /// heads (null: the first head).
  Value hbmView(const Window &w, int64_t offset, const RotaryStrides &s,
                const Where &at, Value chunk, int64_t headCount) {
    const PositionBlock &blk = at.blk;
    Value start = k.index(offset + blk.first * s.pos);
    if (chunk)
      start = k.addOffsets(start, k.scale(chunk, headsPerTile * s.head));
    return k.view(w.buffer, start,
                  {blk.parts, headCount, blk.perPartition, dim},
                  {blk.perPartition * s.pos, s.head, s.pos, s.d});
  }

  /// Slot `slot` of `tiles` as [parts, heads, r, D] (heads from a tile of
  /// `tileHeads`, read with a zero stride when it holds one).
  Value tileView(Value tiles, int64_t tileHeads, int64_t slot,
                 const PositionBlock &blk, int64_t col, int64_t cols) {
    int64_t rowWidth = tileHeads * perPartition * dim;
    int64_t headStride = tileHeads == 1 ? 0 : blk.perPartition * dim;
    int64_t slots = cast<MemRefType>(tiles.getType()).getShape()[1] / rowWidth;
    return k.view(tiles, k.index(slot * rowWidth + col),
                  {blk.parts, headsPerTile, blk.perPartition, cols},
                  {slots * rowWidth, headStride, dim, 1});
  }

  void loadTable(const Where &at, const Window &w, Value tiles, int64_t offset,
                 const RotaryStrides &s, Value chunk, int64_t slot) {
    int64_t tileHeads = sharedOverHeads ? 1 : headsPerTile;
    int64_t rowWidth = tileHeads * perPartition * dim;
    int64_t slots = cast<MemRefType>(tiles.getType()).getShape()[1] / rowWidth;
    Value dst = k.view(tiles, k.index(slot * rowWidth),
                       {at.blk.parts, tileHeads, at.blk.perPartition, dim},
                       {slots * rowWidth, at.blk.perPartition * dim, dim, 1});
    k.dma(hbmView(w, offset, s, at, chunk, tileHeads), dst);
  }

  void load(const Where &at, Value chunk, int64_t slot) {
    k.dma(hbmView(x, at.xOffset, at.xs, at, chunk, headsPerTile),
          tileView(xTiles, headsPerTile, slot, at.blk, 0, dim));
    if (!sharedOverHeads) {
      loadTable(at, cos, cosTiles, at.cosOffset, at.cs, chunk, slot);
      loadTable(at, sin, sinTiles, at.sinOffset, at.ss, chunk, slot);
    }
  }

  /// The blocks of heads of one block of positions, software-pipelined:
  /// step i loads block i + 2, takes block i's products and block i - 1's
  /// sums, so each engine's queue holds work that does not wait for the
  /// other's latest (VectorE's sums wait for GpSimd's products).
  void chunks(const Where &at, int64_t count) {
    auto stepAt = [&](Value i, int64_t slot, bool loads, bool sums) {
      if (loads)
        load(at, k.addOffset(i, 2), (slot + 2) % kSlots);
      products(at, slot);
      if (sums)
        sumAndStore(at, k.addOffset(i, -1), (slot + kSlots - 1) % kSlots);
    };
    for (int64_t i = 0; i < std::min<int64_t>(2, count); ++i)
      load(at, k.index(i), i);
    stepAt(k.index(0), 0, count > 2, false);
    int64_t steady = std::max<int64_t>(0, count - 3);
    k.forEachRotating(1, steady, kSlots, [&](Value i, int64_t slot) {
      stepAt(i, slot, true, true);
    });
    for (int64_t i = 1 + steady; i < count; ++i)
      stepAt(k.index(i), i % kSlots, i + 2 < count, true);
    sumAndStore(at, k.index(count - 1), (count - 1) % kSlots);
  }

  /// Columns [col, col + cols) of each row of D in slot `slot` of a
  /// working tile (x, the two products, the output) or of cos or sin.
  Value slotView(Value tiles, const Where &where, int64_t slot, int64_t col,
                 int64_t cols) {
    bool table = tiles == cosTiles || tiles == sinTiles;
    if (table && sharedOverHeads)
      return tileView(tiles, 1, where.table, where.blk, col, cols);
    return tileView(tiles, headsPerTile, slot, where.blk, col, cols);
  }

  void products(const Where &w, int64_t slot) {
    using nisa::AluOp;
    b.create<nisa::TensorTensorOp>(
        AluOp::multiply, slotView(xTiles, w, slot, 0, dim),
        slotView(cosTiles, w, slot, 0, dim),
        slotView(firstTiles, w, slot, 0, dim), nisa::Engine::vector);
    b.create<nisa::TensorTensorOp>(
        AluOp::multiply, slotView(xTiles, w, slot, half, half),
        slotView(sinTiles, w, slot, 0, half),
        slotView(secondTiles, w, slot, 0, half), nisa::Engine::gpsimd);
    b.create<nisa::TensorTensorOp>(
        AluOp::multiply, slotView(xTiles, w, slot, 0, half),
        slotView(sinTiles, w, slot, half, half),
        slotView(secondTiles, w, slot, half, half), nisa::Engine::gpsimd);
  }

  void sumAndStore(const Where &w, Value chunk, int64_t slot) {
    using nisa::AluOp;
    b.create<nisa::TensorTensorOp>(
        AluOp::subtract, slotView(firstTiles, w, slot, 0, half),
        slotView(secondTiles, w, slot, 0, half),
        slotView(outTiles, w, slot, 0, half), nisa::Engine::vector);
    // VectorE streams 16-bit tensor_tensor at one element per cycle,
    // GpSimd at half a cycle's rate of its faster clock: one slot's second
    // sum on GpSimd balances them (VectorE 1.83 passes over x, GpSimd 1.17).
    b.create<nisa::TensorTensorOp>(
        AluOp::add, slotView(firstTiles, w, slot, half, half),
        slotView(secondTiles, w, slot, half, half),
        slotView(outTiles, w, slot, half, half),
        slot == kSlots - 1 ? nisa::Engine::gpsimd : nisa::Engine::vector);
    // From ScalarE's queue: SyncE's carries the loads ahead.
    b.create<nisa::DmaCopyOp>(
        slotView(outTiles, w, slot, 0, dim),
        hbmView(out, w.outOffset, w.os, w, chunk, headsPerTile),
        nisa::Engine::scalar);
  }

  KernelLowering &k;
  ImplicitLocOpBuilder &b;
  Window x, cos, sin, out;
  RankedTensorType type;
  Type elt;
  int64_t eltBytes, dim, half, positions, heads;
  SmallVector<int64_t> lead;
  int64_t perPartition = 1, headsPerTile = 1;
  bool sharedOverHeads = true;
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
