//===- LowerRand.cpp - neuron.rand on GpSimd
//--------------------------------===//
//
// Random numbers from GpSimd's counter-based generator, numbered as the
// result's elements in row-major order.
//
//===----------------------------------------------------------------------===//

#include "passes/tile/KernelLowering.h"
#include "passes/tile/TilePattern.h"

namespace mlir::neuron {

/// GpSimd numbers the result's elements in row-major order, P x F at a
/// time (rows of F, then one short row), each partition under the same key:
/// the seed, broadcast to every partition by one DMA.
void KernelLowering::lowerRand(RandOp op) {
  auto type = tensorType(op.getResult());
  int64_t n = type.getNumElements(), p = target.partitions;
  int64_t eltBytes = std::max<int64_t>(1, type.getElementTypeBitWidth() / 8);
  int64_t cols = std::clamp<int64_t>(n / p, 1, tileBytes / eltBytes);
  Value out = resultBuffer(op.getResult());
  TileScope scope(*this);
  Value seed = tile(MemorySpace::sbuf, {p, 2}, b.getI32Type());
  dma(view(bufferOf(op.getSeed()), index(0), {p, 2}, {0, 1}), seed);
  auto rand = [&](Value base, int64_t rows, int64_t width) {
    TileScope s(*this);
    Value t = tile(MemorySpace::sbuf, {rows, width}, type.getElementType());
    b.create<nisa::RandOp>(t, view(seed, index(0), {rows, 2}, {2, 1}), base,
                           op.getStream(), APFloat(double(cols)),
                           ArrayRef<double>{1.0});
    dma(t, view(out, base, {rows, width}, {cols, 1}));
  };
  forTiles(n, p * cols, [&](Value base, int64_t count) {
    if (count / cols)
      rand(base, count / cols, cols);
    if (count % cols)
      rand(addOffset(base, count / cols * cols), 1, count % cols);
  });
}

namespace {
struct RandPattern : OpTilePattern<RandPattern, RandOp> {
  LogicalResult lowerOp(RandOp op, KernelLowering &k) const {
    k.lowerRand(op);
    return success();
  }
};
} // namespace

void populateRandPatterns(TilePatternSet &patterns) {
  patterns.push_back(std::make_unique<RandPattern>());
}

} // namespace mlir::neuron
