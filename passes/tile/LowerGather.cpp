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

/// Steps of up to 128 indexed rows: each loads its indices (and with
/// `source`, a scatter's, its rows of it) and calls `body` per chunk of
/// columns with an SBUF tile for those rows. The tiles rotate over a few
/// slots and the loads run ahead of the indirect DMAs, so that GpSimd
/// generates descriptors back to back: a step's load never waits on SyncE's
/// queue behind the store of the step before (gather), nor its indirect DMA
/// for a load queued behind such a wait.
void KernelLowering::forEachIndexedRows(Value idx, int64_t rows, int64_t width,
                                        Type elt, Value source,
                                        IndexedRowsBody body) {
  if (rows == 0 || width == 0)
    return;
  int64_t parts = std::min<int64_t>(rows, target.partitions);
  int64_t slots = std::min<int64_t>(3, (rows + parts - 1) / parts);
  int64_t eltBytes = std::max<int64_t>(1, elt.getIntOrFloatBitWidth() / 8);
  // Rows land in SBUF; the slots together keep within a few tiles' bytes.
  int64_t chunk =
      std::min(width, std::max<int64_t>(1, 4 * tileBytes / slots / eltBytes));
  // Source rows that fit one chunk load ahead with their indices.
  bool rowsAhead = source && chunk == width;
  Type idxElt = cast<MemRefType>(idx.getType()).getElementType();
  TileScope scope(*this);
  SmallVector<Value> idxTiles, rowTiles;
  for (int64_t i = 0; i < slots; ++i) {
    idxTiles.push_back(tile(MemorySpace::sbuf, {parts, 1}, idxElt));
    rowTiles.push_back(tile(MemorySpace::sbuf, {parts, chunk}, elt));
  }
  auto rowsOf = [&](int64_t rt, int64_t ct, int64_t slot) {
    return view(rowTiles[slot], index(0), {rt, ct}, {chunk, 1});
  };
  auto loadRows = [&](Value r0, Value c0, int64_t rt, int64_t ct,
                      int64_t slot) {
    dma(view(source, addOffsets(scale(r0, width), c0), {rt, ct}, {width, 1}),
        rowsOf(rt, ct, slot));
  };
  auto load = [&](Value r0, int64_t rt, int64_t slot) {
    dma(rowView(idx, r0, rt, 1, 1),
        view(idxTiles[slot], index(0), {rt, 1}, {1, 1}));
    if (rowsAhead)
      loadRows(r0, index(0), rt, width, slot);
  };
  auto compute = [&](Value r0, int64_t rt, int64_t slot) {
    Value indices = view(idxTiles[slot], index(0), {rt, 1}, {1, 1});
    forTiles(width, chunk, [&](Value c0, int64_t ct) {
      if (source && !rowsAhead)
        loadRows(r0, c0, rt, ct, slot);
      body(r0, indices, c0, rowsOf(rt, ct, slot));
    });
  };
  int64_t full = rows / parts;
  forEachPipelined(
      full, slots,
      [&](Value s, int64_t slot) { load(scale(s, parts), parts, slot); },
      [&](Value s, int64_t slot) { compute(scale(s, parts), parts, slot); });
  if (int64_t rest = rows % parts) {
    load(index(full * parts), rest, full % slots);
    compute(index(full * parts), rest, full % slots);
  }
}

void KernelLowering::lowerGather(GatherOp op) {
  auto tableType = tensorType(op.getTable());
  int64_t width = product(tableType.getShape().drop_front());
  int64_t vocab = tableType.getDimSize(0);
  Value table = bufferOf(op.getTable());
  Value out = resultBuffer(op.getResult());
  forEachIndexedRows(
      bufferOf(op.getIndices()), tensorType(op.getIndices()).getNumElements(),
      width, tableType.getElementType(), Value(),
      [&](Value r0, Value indices, Value c0, Value rowsTile) {
        auto shape = cast<MemRefType>(rowsTile.getType()).getShape();
        b.create<nisa::DmaGatherOp>(
            view(table, c0, {vocab, shape[1]}, {width, 1}), indices, rowsTile);
        dma(rowsTile,
            view(out, addOffsets(scale(r0, width), c0), shape, {width, 1}));
      });
}

void KernelLowering::lowerScatter(ScatterOp op) {
  auto inputType = tensorType(op.getInput());
  int64_t width = product(inputType.getShape().drop_front());
  int64_t vocab = inputType.getDimSize(0);
  Value values = bufferOf(op.getValues());
  Value out = resultBuffer(op.getResult());
  // The rows no index names keep the input's values: one HBM-to-HBM copy,
  // which every scatter below waits for (they write the whole table).
  dma(view(bufferOf(op.getInput()), index(0), {vocab, width}, {width, 1}),
      view(out, index(0), {vocab, width}, {width, 1}));
  forEachIndexedRows(
      bufferOf(op.getIndices()), tensorType(op.getIndices()).getNumElements(),
      width, inputType.getElementType(), values,
      [&](Value, Value indices, Value c0, Value rowsTile) {
        auto shape = cast<MemRefType>(rowsTile.getType()).getShape();
        b.create<nisa::DmaScatterOp>(
            rowsTile, indices, view(out, c0, {vocab, shape[1]}, {width, 1}),
            op.getAccumulate());
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
