//===- LowerReduce.cpp - neuron.reduce over the innermost dims
//--------------===//
//
// Rows on the partitions, the reduced dims on the free axis in chunks:
// tensor_reduce per chunk, combined in fp32. Sums over leading dims go to
// LowerColumnSum.cpp.
//
//===----------------------------------------------------------------------===//

#include "passes/tile/KernelLowering.h"
#include "passes/tile/TilePattern.h"

namespace mlir::neuron {

void KernelLowering::lowerReduce(ReduceOp op) {
  if (lowerColumnSum(op))
    return;
  auto inType = tensorType(op.getInput());
  int64_t cols = product(inType.getShape().take_back(op.getCount()));
  int64_t rows = product(inType.getShape().drop_back(op.getCount()));
  Value in = bufferOf(op.getInput()), out = resultBuffer(op.getResult());
  nisa::AluOp alu = aluFor(op.getFn());
  Type f32 = b.getF32Type();
  int64_t chunk = std::max<int64_t>(1, tileBytes / 4);
  forTiles(rows, target.partitions, [&](Value r0, int64_t rt) {
    TileScope scope(*this);
    Value acc = tile(MemorySpace::sbuf, {rt, 1}, f32);
    Value rowBase = scale(r0, cols);
    int64_t first = std::min(cols, chunk);
    {
      TileScope s(*this);
      Value t = load(in, rowBase, rt, first, cols);
      b.create<nisa::TensorReduceOp>(alu, t, acc);
    }
    if (cols > first)
      forTiles(cols - first, chunk, [&](Value c0, int64_t ct) {
        TileScope s(*this);
        Value t =
            load(in, addOffsets(rowBase, addOffset(c0, first)), rt, ct, cols);
        Value part = tile(MemorySpace::sbuf, {rt, 1}, f32);
        b.create<nisa::TensorReduceOp>(alu, t, part);
        b.create<nisa::TensorTensorOp>(alu, acc, part, acc);
      });
    Value result = tile(MemorySpace::sbuf, {rt, 1}, inType.getElementType());
    b.create<nisa::CopyOp>(acc, result);
    dma(result, view(out, r0, {rt, 1}, {1, 1}));
  });
}

namespace {
struct ReducePattern : OpTilePattern<ReducePattern, ReduceOp> {
  LogicalResult lowerOp(ReduceOp op, KernelLowering &k) const {
    k.lowerReduce(op);
    return success();
  }
};
} // namespace

void populateReducePatterns(TilePatternSet &patterns) {
  patterns.push_back(std::make_unique<ReducePattern>());
}

} // namespace mlir::neuron
