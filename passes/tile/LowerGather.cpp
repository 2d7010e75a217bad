//===- LowerGather.cpp - neuron.gather and neuron.scatter as indirect DMA ===//
//
// Rows of a table gathered by index: the indices loaded per 128 rows, each
// chunk of the gathered rows brought into SBUF by dma_gather and stored.
// Rows written by index (scatter): the input copied to the result, then per
// 128 rows the indices and each chunk of the values loaded and written (or
// added) into the result's rows by dma_scatter.
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

void KernelLowering::lowerScatter(ScatterOp op) {
  auto inputType = tensorType(op.getInput());
  auto idxType = tensorType(op.getIndices());
  int64_t rows = idxType.getNumElements();
  int64_t width = product(inputType.getShape().drop_front());
  int64_t vocab = inputType.getDimSize(0);
  Value idx = bufferOf(op.getIndices()), values = bufferOf(op.getValues());
  Value out = resultBuffer(op.getResult());
  // The rows no index names keep the input's values: one HBM-to-HBM copy,
  // which every scatter below waits for (they write the whole table).
  Value whole = view(out, index(0), {vocab, width}, {width, 1});
  dma(view(bufferOf(op.getInput()), index(0), {vocab, width}, {width, 1}),
      whole);
  int64_t eltBytes =
      std::max<int64_t>(1, inputType.getElementTypeBitWidth() / 8);
  int64_t chunk = std::max<int64_t>(1, 4 * tileBytes / eltBytes);
  forTiles(rows, target.partitions, [&](Value r0, int64_t rt) {
    TileScope scope(*this);
    Value indices = load(idx, r0, rt, 1, 1);
    forTiles(width, chunk, [&](Value c0, int64_t ct) {
      TileScope s(*this);
      Value rowsTile =
          load(values, addOffsets(scale(r0, width), c0), rt, ct, width);
      b.create<nisa::DmaScatterOp>(rowsTile, indices,
                                   view(out, c0, {vocab, ct}, {width, 1}),
                                   op.getAccumulate());
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

struct ScatterPattern : OpTilePattern<ScatterPattern, ScatterOp> {
  LogicalResult lowerOp(ScatterOp op, KernelLowering &k) const {
    k.lowerScatter(op);
    return success();
  }
};
} // namespace

void populateGatherPatterns(TilePatternSet &patterns) {
  patterns.push_back(std::make_unique<GatherPattern>());
  patterns.push_back(std::make_unique<ScatterPattern>());
}

} // namespace mlir::neuron
