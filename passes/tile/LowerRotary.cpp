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
// A tile holds [P, shared block, r, D] or [P, r, shared block, D], in the
// output's memory order (x's where the kernel allocates the output), so its
// DMAs move runs of r * D elements (x as [B, H, L, D]) or of the block's
// heads (x a projection's heads split, [B, L, H, D] in memory). cos and sin
// load once per block of the across dim and every shared block reads them
// through a zero stride on chip. The tiles form one software pipeline. Per
// tile, five instructions on x's tile and two scratch tiles of its type:
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

#include <numeric>

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
    out = outputWindow(op.getResult());
    // A tile's middle dims in the output's memory order (x's where the
    // kernel allocates it), so stores move runs as long as the output's: the
    // r indices of the across dim inner (as [B, H, L, D]) or the shared
    // block inner (as [B, L, H, D], a projection's heads split).
    acrossInner =
        sharedDim < 0 || acrossDim < 0 ||
        std::abs(out.strides[acrossDim]) <= std::abs(out.strides[sharedDim]);
  }

  void lower() {
    const int64_t p = k.target.partitions;
    // r indices per partition and a shared block of `sharedPerTile` within
    // a streamed tile, the inner of the two as large as it may be: a tile's
    // runs are r * D elements (acrossInner), else sharedPerTile * D.
    int64_t rowBytes = dim * eltBytes;
    auto blockFor = [&](int64_t r) {
      int64_t best = 1;
      for (int64_t h = 1; h <= shared; ++h)
        if (shared % h == 0 && h * r * rowBytes <= k.tileBytes)
          best = h;
      return best;
    };
    auto growR = [&](int64_t limitBytes) {
      perPartition = 1;
      while (perPartition * 2 * p <= across &&
             perPartition * 2 * rowBytes <= limitBytes)
        perPartition *= 2;
    };
    if (acrossInner) {
      growR(k.target.dmaSaturationBytesPerPartition);
      sharedPerTile = blockFor(perPartition);
    } else {
      sharedPerTile = blockFor(1);
      growR(k.tileBytes / sharedPerTile);
    }
    xs = byRole(x.strides);
    cs = byRole(cos.strides);
    ss = byRole(sin.strides);
    os = byRole(out.strides);

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
    // A slot per block of the across dim in flight (a block may be one
    // step).
    cosTiles = k.tile(MemorySpace::sbuf, {p, kSlots * perPartition * dim}, elt);
    sinTiles = k.tile(MemorySpace::sbuf, {p, kSlots * perPartition * dim}, elt);

    int64_t loops = 1;
    for (int64_t d : loopedDims)
      loops *= shape[d];
    SmallVector<Step> steps;
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
        Where w{blk, xo, co, so, oo, blockIndex++ % kSlots};
        for (int64_t c = 0; c < shared / sharedPerTile; ++c)
          steps.push_back({w, c});
      }
    }
    emitSteps(steps);
  }

private:
  using Window = TileBuilder::Window;
  /// x tiles in flight: one loading, one computing, one storing.
  static constexpr int64_t kSlots = 3;

  /// A block of the across dim at one looped index: its element offsets in
  /// x, cos, sin and the output, and the slot of its cos and sin.
  struct Where {
    AcrossBlock blk;
    int64_t xOffset, cosOffset, sinOffset, outOffset;
    int64_t table;
  };
  /// One tile: shared block `chunk` of an across block.
  struct Step {
    Where w;
    int64_t chunk;
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

  /// The output in x's memory order where the kernel allocates it (a
  /// returned tensor goes to its output argument, row-major): stores then
  /// move runs as long as the loads do.
  Window outputWindow(Value result) {
    if (k.hasDestination(result))
      return {k.resultBuffer(result), 0, contiguousStrides(shape), {}};
    SmallVector<int64_t> order(shape.size());
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t c) {
      return std::abs(x.strides[a]) > std::abs(x.strides[c]);
    });
    SmallVector<int64_t> physical;
    for (int64_t d : order)
      physical.push_back(shape[d]);
    SmallVector<int64_t> physicalStrides = contiguousStrides(physical);
    SmallVector<int64_t> strides(shape.size());
    for (auto [i, d] : llvm::enumerate(order))
      strides[d] = physicalStrides[i];
    Value buffer = b.create<memref::AllocOp>(TileBuilder::hbmType(
        RankedTensorType::get(physical, type.getElementType())));
    Window w{buffer, 0, strides, {}};
    k.bindWindow(result, w, result.getLoc());
    return w;
  }

  /// A view [parts, middle dims, cols] from `start`: the shared block of
  /// `sharedCount` and the r indices of the across dim in the tile's order
  /// (acrossInner), with these strides.
  Value view(Value buffer, Value start, const AcrossBlock &blk,
             int64_t sharedCount, int64_t cols, int64_t partStride,
             int64_t sharedStride, int64_t acrossStride, int64_t colStride) {
    SmallVector<int64_t> sizes{blk.parts}, strides{partStride};
    std::pair<int64_t, int64_t> sharedPart{sharedCount, sharedStride},
        acrossPart{blk.perPartition, acrossStride};
    for (auto [n, st] : acrossInner ? std::array{sharedPart, acrossPart}
                                    : std::array{acrossPart, sharedPart}) {
      sizes.push_back(n);
      strides.push_back(st);
    }
    sizes.push_back(cols);
    strides.push_back(colStride);
    return k.view(buffer, start, sizes, strides);
  }

  /// A tensor's rows of block `blk` from `offset`, at shared block `chunk`.
  Value hbmView(const Window &t, int64_t offset, const RotaryStrides &s,
                const AcrossBlock &blk, int64_t chunk, int64_t sharedCount) {
    int64_t start =
        offset + blk.first * s.across + chunk * sharedPerTile * s.shared;
    return view(t.buffer, k.index(start), blk, sharedCount, dim,
                blk.perPartition * s.across, s.shared, s.across, s.d);
  }

  /// Columns [col, col + cols) of each row of D in slot `slot` of `tiles`:
  /// a working tile (x, the products, the output), or cos or sin ([P, r,
  /// D] a slot, read with a zero stride over the shared block).
  Value slotView(Value tiles, const AcrossBlock &blk, int64_t slot, int64_t col,
                 int64_t cols) {
    bool table = tiles == cosTiles || tiles == sinTiles;
    int64_t rowWidth = (table ? 1 : sharedPerTile) * perPartition * dim;
    int64_t slots = cast<MemRefType>(tiles.getType()).getShape()[1] / rowWidth;
    int64_t sharedStride = table         ? 0
                           : acrossInner ? blk.perPartition * dim
                                         : dim;
    int64_t acrossStride = table || acrossInner ? dim : sharedPerTile * dim;
    return view(tiles, k.index(slot * rowWidth + col), blk, sharedPerTile, cols,
                slots * rowWidth, sharedStride, acrossStride, 1);
  }

  void loadTable(const Where &w, const Window &t, Value tiles, int64_t offset,
                 const RotaryStrides &s) {
    int64_t rowWidth = perPartition * dim;
    k.dma(hbmView(t, offset, s, w.blk, 0, 1),
          view(tiles, k.index(w.table * rowWidth), w.blk, 1, dim,
               kSlots * rowWidth, 0, dim, 1));
  }

  void load(const Where &w, int64_t chunk, int64_t slot) {
    k.dma(hbmView(x, w.xOffset, xs, w.blk, chunk, sharedPerTile),
          slotView(xTiles, w.blk, slot, 0, dim));
  }

  /// The steps in order, software-pipelined: step i loads step i + 2 (and
  /// its across block's cos and sin with its first step), takes step i's
  /// products and step i - 1's sums, so each engine's queue holds work that
  /// does not wait for the other's latest (VectorE's sums wait for GpSimd's
  /// products), across blocks of both dims.
  void emitSteps(ArrayRef<Step> steps) {
    int64_t n = steps.size();
    auto loadStep = [&](int64_t i) {
      const Where &w = steps[i].w;
      if (steps[i].chunk == 0) {
        loadTable(w, cos, cosTiles, w.cosOffset, cs);
        loadTable(w, sin, sinTiles, w.sinOffset, ss);
      }
      load(w, steps[i].chunk, i % kSlots);
    };
    for (int64_t i = 0; i < std::min<int64_t>(2, n); ++i)
      loadStep(i);
    for (int64_t i = 0; i < n; ++i) {
      if (i + 2 < n)
        loadStep(i + 2);
      products(steps[i].w, i % kSlots);
      if (i > 0)
        sumAndStore(steps[i - 1].w, steps[i - 1].chunk, (i - 1) % kSlots);
    }
    if (n)
      sumAndStore(steps[n - 1].w, steps[n - 1].chunk, (n - 1) % kSlots);
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

  void sumAndStore(const Where &w, int64_t chunk, int64_t slot) {
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
        hbmView(out, w.outOffset, os, blk, chunk, sharedPerTile),
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
  /// x's, cos's, sin's and the output's strides by role.
  RotaryStrides xs, cs, ss, os;
  bool acrossInner = true;
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
