//===- LowerGather.cpp - neuron.gather as indirect DMA
//----------------------===//
//
// Rows of a table gathered by index: the indices loaded per 128 rows, each
// chunk of the gathered rows brought into SBUF by dma_gather and stored.
//
//===----------------------------------------------------------------------===//

#include "passes/tile/KernelLowering.h"
#include "passes/tile/TilePattern.h"

namespace mlir::neuron {

void KernelLowering::lowerGather(GatherOp op) {
  auto tableType = tensorType(op.getTable());
  auto idxType = tensorType(op.getIndices());
  int64_t rows = idxType.getNumElements();
  int64_t width = product(tableType.getShape().drop_front());
  int64_t vocab = tableType.getDimSize(0);
  Value table = bufferOf(op.getTable()), idx = bufferOf(op.getIndices());
  Value out = resultBuffer(op.getResult());
  // Gathered rows land in SBUF; keep each chunk within a few tiles' bytes.
  int64_t eltBytes =
      std::max<int64_t>(1, tableType.getElementTypeBitWidth() / 8);
  int64_t chunk = std::max<int64_t>(1, 4 * tileBytes / eltBytes);
  forTiles(rows, target.partitions, [&](Value r0, int64_t rt) {
    TileScope scope(*this);
    Value indices = load(idx, r0, rt, 1, 1);
    forTiles(width, chunk, [&](Value c0, int64_t ct) {
      TileScope s(*this);
      Value rowsTile =
          tile(MemorySpace::sbuf, {rt, ct}, tableType.getElementType());
      b.create<nisa::DmaGatherOp>(view(table, c0, {vocab, ct}, {width, 1}),
                                  indices, rowsTile);
      dma(rowsTile,
          view(out, addOffsets(scale(r0, width), c0), {rt, ct}, {width, 1}));
    });
  });
}

namespace {
struct GatherPattern : OpTilePattern<GatherPattern, GatherOp> {
  LogicalResult lowerOp(GatherOp op, KernelLowering &k) const {
    k.lowerGather(op);
    return success();
  }
};
} // namespace

void populateGatherPatterns(TilePatternSet &patterns) {
  patterns.push_back(std::make_unique<GatherPattern>());
}

} // namespace mlir::neuron
